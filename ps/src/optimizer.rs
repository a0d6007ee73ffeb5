//! Server-side optimizers: SGD, SGD with momentum, and Adam(W).
//!
//! Values and optimizer state are kept in `f32` whatever the wire dtype; which
//! parts of each update run in `f64` is the kernels' (`kernels`). The
//! arithmetic follows PyTorch's `SGD` (momentum, Nesterov, L2 weight decay) and
//! candle-nn's `AdamW` (decoupled weight decay, bias correction), term by term.

use std::fmt;
use std::ops::Range;

use ps_proto::codec::{DType, F32Run, TensorData};
use ps_proto::hyper;
use ps_proto::v1;

use crate::kernels::{self, Kernel};
use crate::parallel;

/// An optimizer and its hyper-parameters, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum OptimizerSpec {
    /// `w -= lr * (g + weight_decay * w)`.
    Sgd {
        /// Learning rate.
        lr: f64,
        /// L2 penalty.
        weight_decay: f64,
    },
    /// SGD with (optionally Nesterov) momentum.
    Momentum {
        /// Learning rate.
        lr: f64,
        /// Momentum factor.
        momentum: f64,
        /// L2 penalty.
        weight_decay: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// Adam with decoupled weight decay.
    Adam {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Denominator term.
        eps: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

/// Why an optimizer from the wire cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidOptimizer {
    /// None was given.
    #[error(
        "no optimizer given; set exactly one of optimizer.sgd, optimizer.momentum, optimizer.adam"
    )]
    Missing,
    /// A hyper-parameter outside its range.
    #[error("{name} must be {range}, got {value}")]
    OutOfRange {
        /// The hyper-parameter.
        name: &'static str,
        /// What it must be.
        range: &'static str,
        /// What it was.
        value: f64,
    },
}

impl OptimizerSpec {
    /// Validates an optimizer from the wire, filling documented defaults.
    ///
    /// # Errors
    /// [`InvalidOptimizer`]: none given, or a hyper-parameter out of range.
    pub fn from_proto(optimizer: Option<&v1::Optimizer>) -> Result<Self, InvalidOptimizer> {
        use v1::optimizer::Kind;
        let kind = optimizer
            .and_then(|o| o.kind.as_ref())
            .ok_or(InvalidOptimizer::Missing)?;
        let spec = match kind {
            Kind::Sgd(s) => OptimizerSpec::Sgd {
                lr: s.lr,
                weight_decay: s.weight_decay,
            },
            Kind::Momentum(m) => OptimizerSpec::Momentum {
                lr: m.lr,
                momentum: m.momentum,
                weight_decay: m.weight_decay,
                nesterov: m.nesterov,
            },
            Kind::Adam(a) => OptimizerSpec::Adam {
                lr: a.lr,
                beta1: default_if_zero(a.beta1, hyper::ADAM_BETA1),
                beta2: default_if_zero(a.beta2, hyper::ADAM_BETA2),
                eps: default_if_zero(a.eps, hyper::ADAM_EPS),
                weight_decay: a.weight_decay,
            },
        };
        spec.validate()?;
        Ok(spec)
    }

    /// The wire form of this optimizer.
    pub fn to_proto(&self) -> v1::Optimizer {
        use v1::optimizer::Kind;
        let kind = match *self {
            OptimizerSpec::Sgd { lr, weight_decay } => Kind::Sgd(v1::Sgd { lr, weight_decay }),
            OptimizerSpec::Momentum {
                lr,
                momentum,
                weight_decay,
                nesterov,
            } => Kind::Momentum(v1::Momentum {
                lr,
                momentum,
                weight_decay,
                nesterov,
            }),
            OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => Kind::Adam(v1::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            }),
        };
        v1::Optimizer { kind: Some(kind) }
    }

    fn validate(&self) -> Result<(), InvalidOptimizer> {
        let (lr, weight_decay) = match *self {
            OptimizerSpec::Sgd { lr, weight_decay } => (lr, weight_decay),
            OptimizerSpec::Momentum {
                lr,
                momentum,
                weight_decay,
                ..
            } => {
                check_unit_interval("momentum", momentum)?;
                (lr, weight_decay)
            }
            OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                check_unit_interval("beta1", beta1)?;
                check_unit_interval("beta2", beta2)?;
                check("eps", "finite and > 0", eps, eps.is_finite() && eps > 0.0)?;
                (lr, weight_decay)
            }
        };
        check(
            "learning rate",
            "finite and > 0",
            lr,
            lr.is_finite() && lr > 0.0,
        )?;
        check(
            "weight_decay",
            "finite and >= 0",
            weight_decay,
            weight_decay.is_finite() && weight_decay >= 0.0,
        )
    }

    /// `f32` state values kept per parameter element.
    pub fn state_per_element(&self) -> usize {
        match self {
            OptimizerSpec::Sgd { .. } => 0,
            OptimizerSpec::Momentum { .. } => 1,
            OptimizerSpec::Adam { .. } => 2,
        }
    }
}

fn default_if_zero(value: f64, default: f64) -> f64 {
    if value == 0.0 { default } else { value }
}

fn check_unit_interval(name: &'static str, value: f64) -> Result<(), InvalidOptimizer> {
    check(name, "in [0, 1)", value, (0.0..1.0).contains(&value))
}

fn check(
    name: &'static str,
    range: &'static str,
    value: f64,
    ok: bool,
) -> Result<(), InvalidOptimizer> {
    if ok {
        Ok(())
    } else {
        Err(InvalidOptimizer::OutOfRange { name, range, value })
    }
}

impl fmt::Display for OptimizerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptimizerSpec::Sgd { lr, weight_decay } => {
                write!(f, "sgd(lr={lr}, weight_decay={weight_decay})")
            }
            OptimizerSpec::Momentum {
                lr,
                momentum,
                weight_decay,
                nesterov,
            } => write!(
                f,
                "momentum(lr={lr}, momentum={momentum}, weight_decay={weight_decay}, nesterov={nesterov})"
            ),
            OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => write!(
                f,
                "adam(lr={lr}, beta1={beta1}, beta2={beta2}, eps={eps}, weight_decay={weight_decay})"
            ),
        }
    }
}

/// A gradient to apply: straight from the wire, or an accumulated dense sum.
#[derive(Debug, Clone, Copy)]
pub enum Gradient<'a> {
    /// A validated wire tensor (possibly in several segments, possibly unaligned).
    Wire(&'a TensorData),
    /// Dense `f32` values.
    Dense(&'a [f32]),
}

/// Runs `$body` with `$g` bound to an [`F32Run`]'s elements, whichever way they
/// lie, so that each kernel is compiled for both.
macro_rules! with_lanes {
    ($run:expr, |$g:ident| $body:expr) => {
        match $run {
            F32Run::Values($g) => $body,
            F32Run::LittleEndian($g) => $body,
        }
    };
}

impl Gradient<'_> {
    /// True when the gradient is `f32`, read where it lies: a part of it costs
    /// only its own elements (half precision is widened from the start).
    fn is_f32(self) -> bool {
        match self {
            Gradient::Wire(tensor) => tensor.dtype() == DType::F32,
            Gradient::Dense(_) => true,
        }
    }

    /// Calls `f(start, run)` over the runs of elements `range`, with `start`
    /// counted from `range.start`.
    fn for_each_run_in(self, range: Range<usize>, mut f: impl FnMut(usize, F32Run<'_>)) {
        match self {
            Gradient::Dense(values) => f(0, F32Run::Values(&values[range])),
            Gradient::Wire(tensor) => tensor.for_each_f32_run(|start, run| {
                let from = start.max(range.start);
                let to = (start + run.len()).min(range.end);
                if from < to {
                    f(from - range.start, run.slice(from - start..to - start));
                }
            }),
        }
    }

    /// Adds `scale * gradient` into `sum`, in parts on several cores for a large key.
    pub fn add_scaled_into(self, sum: &mut [f32], scale: f32) {
        let parts = parallel::parts(sum.len(), self.is_f32());
        parallel::split(parts, sum, &mut [], &mut [], |part| {
            self.for_each_run_in(part.range(), |start, g| {
                let sum = &mut part.values[start..start + g.len()];
                with_lanes!(g, |g| kernels::add_scaled(sum, g, scale));
            });
        });
    }
}

/// An optimizer with its per-element state for one key.
#[derive(Debug, Clone)]
pub struct Optimizer {
    spec: OptimizerSpec,
    /// Momentum buffer, or Adam's first moment.
    first: Vec<f32>,
    /// Adam's second moment.
    second: Vec<f32>,
    /// Updates applied so far (Adam's `t`).
    updates: u64,
}

impl Optimizer {
    /// A fresh optimizer for a parameter of `len` elements.
    pub fn new(spec: OptimizerSpec, len: usize) -> Self {
        let state = spec.state_per_element();
        Self {
            spec,
            first: if state >= 1 {
                vec![0.0; len]
            } else {
                Vec::new()
            },
            second: if state >= 2 {
                vec![0.0; len]
            } else {
                Vec::new()
            },
            updates: 0,
        }
    }

    /// The state to checkpoint: first moment (or momentum), second moment, updates.
    pub fn state(&self) -> (&[f32], &[f32], u64) {
        (&self.first, &self.second, self.updates)
    }

    /// An optimizer resumed from checkpointed state, or `None` when the state does
    /// not fit `spec` and `len` elements.
    pub fn with_state(
        spec: OptimizerSpec,
        len: usize,
        first: Vec<f32>,
        second: Vec<f32>,
        updates: u64,
    ) -> Option<Self> {
        let fresh = Self::new(spec, len);
        (first.len() == fresh.first.len() && second.len() == fresh.second.len()).then_some(Self {
            first,
            second,
            updates,
            ..fresh
        })
    }

    /// Bytes of optimizer state.
    pub fn state_bytes(&self) -> usize {
        (self.first.len() + self.second.len()) * std::mem::size_of::<f32>()
    }

    /// Applies one update with gradient `scale * grad` to `values`.
    ///
    /// Each element's arithmetic runs in `f64` and is stored back as `f32`, so the
    /// result is the exact update rounded once, not a chain of `f32` roundings.
    /// A large key is updated in parts on several cores ([`crate::parallel`]).
    pub fn apply(&mut self, values: &mut [f32], grad: Gradient<'_>, scale: f32) {
        self.updates += 1;
        let kernel = self.kernel(scale);
        let parts = parallel::parts(values.len(), grad.is_f32());
        parallel::split(parts, values, &mut self.first, &mut self.second, |part| {
            grad.for_each_run_in(part.range(), |start, g| {
                let range = start..start + g.len();
                let w = &mut part.values[range.clone()];
                let first = state_window(part.first, range.clone());
                let second = state_window(part.second, range);
                with_lanes!(g, |g| kernel.run(w, first, second, g));
            });
        });
    }

    /// The arithmetic of the next update (`self.updates` already counts it).
    fn kernel(&self, scale: f32) -> Kernel {
        match self.spec {
            OptimizerSpec::Sgd { lr, weight_decay } => Kernel::Sgd(kernels::Sgd {
                lr,
                weight_decay,
                scale: f64::from(scale),
            }),
            OptimizerSpec::Momentum {
                lr,
                momentum,
                weight_decay,
                nesterov,
            } => Kernel::Momentum(kernels::Momentum {
                lr,
                momentum,
                weight_decay,
                nesterov,
                scale: f64::from(scale),
            }),
            OptimizerSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let t = i32::try_from(self.updates).unwrap_or(i32::MAX);
                let params = kernels::AdamParams {
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                };
                let k = kernels::Adam::new(params, t, scale);
                Kernel::Adam(k)
            }
        }
    }
}

/// `range` of an optimizer state buffer, or the empty buffer of a state the
/// optimizer does not keep.
fn state_window(state: &mut [f32], range: std::ops::Range<usize>) -> &mut [f32] {
    if state.is_empty() {
        state
    } else {
        &mut state[range]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent float64 re-implementation, written from the formulas.
    struct Reference {
        spec: OptimizerSpec,
        w: Vec<f64>,
        a: Vec<f64>,
        b: Vec<f64>,
        t: i32,
    }

    impl Reference {
        fn new(spec: OptimizerSpec, w: &[f32]) -> Self {
            let w: Vec<f64> = w.iter().map(|&x| x as f64).collect();
            let n = w.len();
            Self {
                spec,
                w,
                a: vec![0.0; n],
                b: vec![0.0; n],
                t: 0,
            }
        }

        // Indexing mirrors the formulas, one element at a time.
        #[allow(clippy::needless_range_loop)]
        fn step(&mut self, grad: &[f64]) {
            self.t += 1;
            for i in 0..self.w.len() {
                let g = grad[i];
                match self.spec {
                    OptimizerSpec::Sgd { lr, weight_decay } => {
                        self.w[i] -= lr * (g + weight_decay * self.w[i]);
                    }
                    OptimizerSpec::Momentum {
                        lr,
                        momentum,
                        weight_decay,
                        nesterov,
                    } => {
                        let g = g + weight_decay * self.w[i];
                        self.a[i] = momentum * self.a[i] + g;
                        let d = if nesterov {
                            g + momentum * self.a[i]
                        } else {
                            self.a[i]
                        };
                        self.w[i] -= lr * d;
                    }
                    OptimizerSpec::Adam {
                        lr,
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                    } => {
                        self.w[i] *= 1.0 - lr * weight_decay;
                        self.a[i] = beta1 * self.a[i] + (1.0 - beta1) * g;
                        self.b[i] = beta2 * self.b[i] + (1.0 - beta2) * g * g;
                        let m_hat = self.a[i] / (1.0 - beta1.powi(self.t));
                        let v_hat = self.b[i] / (1.0 - beta2.powi(self.t));
                        self.w[i] -= lr * m_hat / (v_hat.sqrt() + eps);
                    }
                }
            }
        }
    }

    /// Deterministic pseudo-random values in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Relative error against the reference; values are kept away from zero by the
    /// chosen hyper-parameters, where f32 storage alone cannot hold 1e-6 relative.
    fn assert_close(got: &[f32], want: &[f64], what: &str) {
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let rel = ((g as f64) - w).abs() / w.abs().max(1e-3);
            assert!(
                rel <= 1e-6,
                "{what}: element {i}: got {g}, reference {w}, relative error {rel:e}"
            );
        }
    }

    fn specs() -> Vec<OptimizerSpec> {
        vec![
            OptimizerSpec::Sgd {
                lr: 0.05,
                weight_decay: 0.0,
            },
            OptimizerSpec::Sgd {
                lr: 0.01,
                weight_decay: 0.1,
            },
            OptimizerSpec::Momentum {
                lr: 0.005,
                momentum: 0.9,
                weight_decay: 0.0,
                nesterov: false,
            },
            OptimizerSpec::Momentum {
                lr: 0.01,
                momentum: 0.8,
                weight_decay: 0.01,
                nesterov: true,
            },
            OptimizerSpec::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
            },
            OptimizerSpec::Adam {
                lr: 0.003,
                beta1: 0.8,
                beta2: 0.99,
                eps: 1e-6,
                weight_decay: 0.05,
            },
        ]
    }

    /// `values` as a wire tensor read from frames: at an odd address, in two
    /// segments cut between elements.
    fn unaligned_in_two_segments(values: &[f32]) -> TensorData {
        let mut raw = vec![0u8];
        raw.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let raw = bytes::Bytes::from(raw);
        let cut = 1 + 4 * (values.len() / 3);
        let segments = vec![raw.slice(1..cut), raw.slice(cut..)];
        TensorData::from_segments(DType::F32, vec![values.len()], segments).unwrap()
    }

    /// Applies `steps` gradients (noise seeded `grad_seed + step`, on wire as
    /// `wire(step, grad)`) to a key of `n` elements (initial noise seeded
    /// `init_seed`) under every spec, and checks each against the reference.
    fn assert_matches_reference(
        n: usize,
        (init_seed, grad_seed): (u64, u64),
        steps: u64,
        wire: impl Fn(u64, &[f32]) -> TensorData,
    ) {
        for spec in specs() {
            let init: Vec<f32> = noise(init_seed, n).iter().map(|x| 1.0 + 0.5 * x).collect();
            let mut values = init.clone();
            let mut optimizer = Optimizer::new(spec.clone(), n);
            let mut reference = Reference::new(spec.clone(), &init);
            for step in 0..steps {
                let grad = noise(grad_seed + step, n);
                optimizer.apply(&mut values, Gradient::Wire(&wire(step, &grad)), 1.0);
                reference.step(&grad.iter().map(|&g| g as f64).collect::<Vec<_>>());
            }
            assert_close(&values, &reference.w, &spec.to_string());
        }
    }

    #[test]
    fn matches_float64_reference_over_many_steps() {
        let n = 2048;
        assert_matches_reference(n, (1, 100), 10, |step, grad| match step % 2 {
            0 => TensorData::from_f32(DType::F32, vec![n], grad),
            _ => unaligned_in_two_segments(grad),
        });
    }

    #[test]
    fn a_key_updated_in_parts_on_several_cores_matches_the_reference() {
        let n = 2 * crate::parallel::PARALLEL_FROM_ELEMENTS + 5;
        assert_matches_reference(n, (3, 200), 2, |_, grad| unaligned_in_two_segments(grad));
        let mut sum = vec![1f32; n];
        let grad = noise(7, n);
        Gradient::Wire(&unaligned_in_two_segments(&grad)).add_scaled_into(&mut sum, 2.0);
        let want: Vec<f32> = grad.iter().map(|g| 1.0 + 2.0 * g).collect();
        assert_eq!(sum, want, "accumulated in parts");
    }

    #[test]
    fn scale_averages_the_gradient() {
        let spec = OptimizerSpec::Sgd {
            lr: 1.0,
            weight_decay: 0.0,
        };
        let mut optimizer = Optimizer::new(spec, 2);
        let mut values = vec![1.0, 1.0];
        optimizer.apply(&mut values, Gradient::Dense(&[2.0, 4.0]), 0.5);
        assert_eq!(values, vec![0.0, -1.0]);
    }

    #[test]
    fn hyper_parameters_are_validated() {
        let bad = [
            v1::optimizer::Kind::Sgd(v1::Sgd {
                lr: 0.0,
                weight_decay: 0.0,
            }),
            v1::optimizer::Kind::Sgd(v1::Sgd {
                lr: f64::NAN,
                weight_decay: 0.0,
            }),
            v1::optimizer::Kind::Sgd(v1::Sgd {
                lr: 0.1,
                weight_decay: -1.0,
            }),
            v1::optimizer::Kind::Momentum(v1::Momentum {
                lr: 0.1,
                momentum: 1.0,
                ..Default::default()
            }),
            v1::optimizer::Kind::Adam(v1::Adam {
                lr: 0.1,
                beta1: 1.5,
                ..Default::default()
            }),
            v1::optimizer::Kind::Adam(v1::Adam {
                lr: 0.1,
                eps: -1.0,
                ..Default::default()
            }),
        ];
        for kind in bad {
            let optimizer = v1::Optimizer { kind: Some(kind) };
            assert!(
                OptimizerSpec::from_proto(Some(&optimizer)).is_err(),
                "{kind:?} accepted"
            );
        }
        assert_eq!(
            OptimizerSpec::from_proto(None),
            Err(InvalidOptimizer::Missing)
        );
    }

    #[test]
    fn adam_defaults_are_filled() {
        let wire = v1::Optimizer {
            kind: Some(v1::optimizer::Kind::Adam(v1::Adam {
                lr: 0.001,
                ..Default::default()
            })),
        };
        let spec = OptimizerSpec::from_proto(Some(&wire)).unwrap();
        assert_eq!(
            spec,
            OptimizerSpec::Adam {
                lr: 0.001,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0
            }
        );
        assert_eq!(
            OptimizerSpec::from_proto(Some(&spec.to_proto())).unwrap(),
            spec
        );
    }
}
