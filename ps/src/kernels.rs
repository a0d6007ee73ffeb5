//! The optimizers' arithmetic over one run of a key: plain loops over slices,
//! written so the compiler vectorises them, and compiled once more for the widest
//! vector unit the processor has (AVX2 and FMA on x86-64, chosen at run time
//! through `pulp`), so one binary is fast on every machine.
//!
//! The gradient is read where it lies: aligned `f32` values, or little-endian
//! bytes at any address straight out of the receive buffers ([`Lane`]), loaded
//! with unaligned vector loads instead of being copied to an aligned buffer first.
//!
//! SGD and momentum compute in `f64` and round once to `f32`. Adam's moments,
//! square root and division run in `f32` lanes (twice as many per instruction,
//! and the moments are stored as `f32` anyway); the step is then applied to the
//! weight in `f64` and rounded once. Within 1e-6 relative of a float64 reference
//! either way (`optimizer` tests).

use pulp::Arch;

/// One gradient element as it lies in memory.
pub(crate) trait Lane: Copy {
    /// Its value.
    fn value(self) -> f32;
}

impl Lane for f32 {
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
}

/// A little-endian `f32` at any alignment.
impl Lane for [u8; 4] {
    #[inline(always)]
    fn value(self) -> f32 {
        f32::from_le_bytes(self)
    }
}

/// SGD: `w -= lr * (scale * g + weight_decay * w)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sgd {
    pub lr: f64,
    pub weight_decay: f64,
    pub scale: f64,
}

/// SGD with momentum (PyTorch's, optionally Nesterov).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Momentum {
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    pub scale: f64,
}

/// One Adam(W) update's coefficients, bias corrections included.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// `1 - lr * weight_decay`: decoupled weight decay.
    pub decay: f64,
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    /// `1 / (1 - beta1^t)`.
    pub m_scale: f32,
    /// `1 / (1 - beta2^t)`.
    pub v_scale: f32,
    pub eps: f32,
    /// The gradient's scale (`1 / workers` when averaging).
    pub scale: f32,
}

/// Adam(W)'s hyper-parameters, as `OptimizerSpec::Adam` holds them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamParams {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator term.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

impl Adam {
    /// The coefficients of update number `t` (from 1).
    pub(crate) fn new(params: AdamParams, t: i32, scale: f32) -> Self {
        let AdamParams {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = params;
        Self {
            lr,
            decay: 1.0 - lr * weight_decay,
            beta1: beta1 as f32,
            one_minus_beta1: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            m_scale: (1.0 / (1.0 - beta1.powi(t))) as f32,
            v_scale: (1.0 / (1.0 - beta2.powi(t))) as f32,
            eps: eps as f32,
            scale,
        }
    }
}

/// One update's arithmetic, whichever optimizer it is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kernel {
    Sgd(Sgd),
    Momentum(Momentum),
    Adam(Adam),
}

impl Kernel {
    /// Applies the update to one run of elements: `w` the values, `first` and
    /// `second` the optimizer's state for the same elements (empty where the
    /// optimizer keeps none), `g` the gradient.
    pub(crate) fn run<G: Lane>(
        self,
        w: &mut [f32],
        first: &mut [f32],
        second: &mut [f32],
        g: &[G],
    ) {
        match self {
            Kernel::Sgd(k) => sgd(w, g, k),
            Kernel::Momentum(k) => momentum(w, first, g, k),
            Kernel::Adam(k) => adam(w, first, second, g, k),
        }
    }
}

/// Applies SGD to `w` with gradient block `g` (same length).
pub(crate) fn sgd<G: Lane>(w: &mut [f32], g: &[G], k: Sgd) {
    Arch::new().dispatch(|| {
        for (w, &g) in w.iter_mut().zip(g) {
            let w64 = f64::from(*w);
            *w = (w64 - k.lr * (k.scale * f64::from(g.value()) + k.weight_decay * w64)) as f32;
        }
    });
}

/// Applies momentum SGD to `w` and its buffer `b` with gradient block `g`.
pub(crate) fn momentum<G: Lane>(w: &mut [f32], b: &mut [f32], g: &[G], k: Momentum) {
    match k.nesterov {
        true => Arch::new().dispatch(|| momentum_loop::<G, true>(w, b, g, k)),
        false => Arch::new().dispatch(|| momentum_loop::<G, false>(w, b, g, k)),
    }
}

/// Momentum's loop with Nesterov chosen outside it, so that it vectorises.
#[inline(always)]
fn momentum_loop<G: Lane, const NESTEROV: bool>(
    w: &mut [f32],
    b: &mut [f32],
    g: &[G],
    k: Momentum,
) {
    for ((w, b), &g) in w.iter_mut().zip(b.iter_mut()).zip(g) {
        let w64 = f64::from(*w);
        let g = k.scale * f64::from(g.value()) + k.weight_decay * w64;
        let b64 = k.momentum * f64::from(*b) + g;
        let step = if NESTEROV { g + k.momentum * b64 } else { b64 };
        *b = b64 as f32;
        *w = (w64 - k.lr * step) as f32;
    }
}

/// Applies Adam(W) to `w` and its moments `m`, `v` with gradient block `g`.
pub(crate) fn adam<G: Lane>(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[G], k: Adam) {
    Arch::new().dispatch(|| {
        let moments = m.iter_mut().zip(v.iter_mut());
        for ((w, (m, v)), &g) in w.iter_mut().zip(moments).zip(g) {
            let g = k.scale * g.value();
            let m1 = k.beta1 * *m + k.one_minus_beta1 * g;
            let v1 = k.beta2 * *v + k.one_minus_beta2 * (g * g);
            let step = (m1 * k.m_scale) / ((v1 * k.v_scale).sqrt() + k.eps);
            *w = (f64::from(*w) * k.decay - k.lr * f64::from(step)) as f32;
            (*m, *v) = (m1, v1);
        }
    });
}

/// Adds `scale * g` into `sum`.
pub(crate) fn add_scaled<G: Lane>(sum: &mut [f32], g: &[G], scale: f32) {
    Arch::new().dispatch(|| {
        for (s, &g) in sum.iter_mut().zip(g) {
            *s += scale * g.value();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_of_a_block_is_updated_whatever_its_length() {
        for len in [1, 7, 8, 9, 63, 64, 65, 1000] {
            let g: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let mut w = vec![1.0f32; len];
            let k = Sgd {
                lr: 0.5,
                weight_decay: 0.0,
                scale: 1.0,
            };
            sgd(&mut w, &g, k);
            let want: Vec<f32> = (0..len).map(|i| 1.0 - 0.5 * i as f32).collect();
            assert_eq!(w, want, "block of {len}");

            let mut sum = vec![1.0f32; len];
            add_scaled(&mut sum, &g, 2.0);
            let want: Vec<f32> = (0..len).map(|i| 1.0 + 2.0 * i as f32).collect();
            assert_eq!(sum, want, "block of {len}");
        }
    }
}
