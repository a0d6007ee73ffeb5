//! The row optimizers' arithmetic: one row's values and state updated by one
//! row gradient. Rows and state are stored in `f32`, and each element's update
//! runs in `f32` too, over whole rows at a time so that it vectorises; the
//! per-row scalars (the step size, Adam's bias corrections) are computed once
//! in `f64`. The terms follow the dense optimizers (`crate::optimizer`) and
//! PyTorch's `Adagrad` and `SparseAdam`; the tests hold every optimizer to an
//! `f64` reference over many steps.

use super::spec::RowOptimizer;
use crate::kernels::{second_moment, square, zero_if_tiny};

/// One row's slices: its values and up to two state slices of the same width
/// (empty when the optimizer keeps less).
pub struct RowSlices<'a> {
    /// The row's values.
    pub values: &'a mut [f32],
    /// Adagrad's sum of squares, or Adam's first moment.
    pub first: &'a mut [f32],
    /// Adam's second moment.
    pub second: &'a mut [f32],
}

/// Applies `grad * scale` to `row`; `t` is the 1-based count of updates the
/// row's bucket has applied, for Adam's bias correction.
pub fn update_row(optimizer: &RowOptimizer, row: RowSlices<'_>, grad: &[f32], scale: f32, t: u64) {
    let width = row.values.len();
    let grad = &grad[..width];
    match *optimizer {
        RowOptimizer::Sgd { lr, weight_decay } => {
            let (lr, decay) = (lr as f32, weight_decay as f32);
            for (w, g) in row.values.iter_mut().zip(grad) {
                *w -= lr * (g * scale + decay * *w);
            }
        }
        RowOptimizer::Adagrad { lr, eps, .. } => {
            let (lr, eps) = (lr as f32, eps as f32);
            let sums = &mut row.first[..width];
            // As Adam's, no subnormal made from a gradient: one below
            // 2^-100 counts as zero, and each square added to the sum is at
            // least 2^-100 (n steps add n * 2^-100 at most, whose root
            // beside `eps` is nothing an `f32` weight can show).
            for ((w, s), &g) in row.values.iter_mut().zip(sums.iter_mut()).zip(grad) {
                let g = zero_if_tiny(g) * scale;
                *s += square(g);
                *w -= lr * g / (s.sqrt() + eps);
            }
        }
        RowOptimizer::LazyAdam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let t = i32::try_from(t.max(1)).unwrap_or(i32::MAX);
            let step = (lr / (1.0 - beta1.powi(t))) as f32;
            let root_correct2 = (1.0 - beta2.powi(t)).sqrt() as f32;
            let decay = (1.0 - lr * weight_decay) as f32;
            let (b1, b2, eps) = (beta1 as f32, beta2 as f32, eps as f32);
            let moments = row.first[..width]
                .iter_mut()
                .zip(row.second[..width].iter_mut());
            // As the dense kernel's, moments kept out of the subnormals and
            // none made from a gradient or a moment.
            for ((w, (m, v)), &g) in row.values.iter_mut().zip(moments).zip(grad) {
                let g = zero_if_tiny(g) * scale;
                *m = zero_if_tiny(b1 * *m + (1.0 - b1) * g);
                *v = second_moment((b2, 1.0 - b2), *v, g);
                *w = *w * decay - step * *m / (v.sqrt() / root_correct2 + eps);
            }
        }
    }
}

/// The starting value of a new row's state elements: Adagrad's initial
/// accumulator, zero otherwise.
pub fn initial_state(optimizer: &RowOptimizer) -> f32 {
    match *optimizer {
        RowOptimizer::Adagrad {
            initial_accumulator,
            ..
        } => initial_accumulator as f32,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::tests::subnormal;
    use ps_common::rng::SplitMix64;

    /// The same optimizers with every value and state kept in `f64`.
    fn reference(
        optimizer: &RowOptimizer,
        w: &mut [f64],
        s1: &mut [f64],
        s2: &mut [f64],
        g: &[f64],
        t: u64,
    ) {
        match *optimizer {
            RowOptimizer::Sgd { lr, weight_decay } => {
                for i in 0..w.len() {
                    w[i] -= lr * (g[i] + weight_decay * w[i]);
                }
            }
            RowOptimizer::Adagrad { lr, eps, .. } => {
                for i in 0..w.len() {
                    s1[i] += g[i] * g[i];
                    w[i] -= lr * g[i] / (s1[i].sqrt() + eps);
                }
            }
            RowOptimizer::LazyAdam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let t = t as i32;
                for i in 0..w.len() {
                    w[i] *= 1.0 - lr * weight_decay;
                    s1[i] = beta1 * s1[i] + (1.0 - beta1) * g[i];
                    s2[i] = beta2 * s2[i] + (1.0 - beta2) * g[i] * g[i];
                    let m_hat = s1[i] / (1.0 - beta1.powi(t));
                    let v_hat = s2[i] / (1.0 - beta2.powi(t));
                    w[i] -= lr * m_hat / (v_hat.sqrt() + eps);
                }
            }
        }
    }

    fn optimizers() -> [RowOptimizer; 3] {
        [
            RowOptimizer::Sgd {
                lr: 0.05,
                weight_decay: 0.01,
            },
            RowOptimizer::Adagrad {
                lr: 0.1,
                initial_accumulator: 0.1,
                eps: 1e-10,
            },
            RowOptimizer::LazyAdam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
            },
        ]
    }

    #[test]
    fn lazy_adam_and_adagrad_leave_no_subnormal_from_tiny_gradients_or_moments() {
        let [_, adagrad, adam] = optimizers();
        // Every power of two as a gradient, of both signs, and subnormal
        // moments left from before, as a bucket's state may hold.
        let grad: Vec<f32> = (-149..=0)
            .map(|p| 2f32.powi(p))
            .flat_map(|x| [x, -x])
            .collect();
        let width = grad.len();
        for optimizer in [adagrad, adam] {
            let mut values = vec![0.25f32; width];
            let (mut first, mut second) = (vec![1e-39f32; width], vec![1e-39f32; width]);
            if matches!(optimizer, RowOptimizer::Adagrad { .. }) {
                first.fill(0.0);
                second.clear();
            }
            for t in 1..=3 {
                let row = RowSlices {
                    values: &mut values,
                    first: &mut first,
                    second: &mut second,
                };
                update_row(&optimizer, row, &grad, 0.5, t);
            }
            let left: Vec<f32> = first
                .iter()
                .chain(&second)
                .copied()
                .filter(|&x| subnormal(x))
                .collect();
            assert!(left.is_empty(), "{optimizer:?}: {left:?}");
            assert!(values.iter().all(|w| w.is_normal()), "{optimizer:?}");
        }
    }

    #[test]
    fn every_row_optimizer_matches_a_float64_reference_over_many_steps() {
        let width = 32;
        for optimizer in optimizers() {
            let mut rng = SplitMix64::new(11);
            let mut w: Vec<f32> = (0..width).map(|_| rng.normal()).collect();
            let state = initial_state(&optimizer);
            let (mut s1, mut s2) = (vec![state; width], vec![0.0f32; width]);
            let mut w64: Vec<f64> = w.iter().map(|v| f64::from(*v)).collect();
            let (mut r1, mut r2) = (vec![f64::from(state); width], vec![0.0; width]);
            for t in 1..=200 {
                let grad: Vec<f32> = (0..width).map(|_| rng.normal()).collect();
                // A sum of two workers' gradients, scaled back to their mean.
                let doubled: Vec<f32> = grad.iter().map(|g| g * 2.0).collect();
                let row = RowSlices {
                    values: &mut w,
                    first: &mut s1,
                    second: &mut s2,
                };
                update_row(&optimizer, row, &doubled, 0.5, t);
                let g64: Vec<f64> = grad.iter().map(|v| f64::from(*v)).collect();
                reference(&optimizer, &mut w64, &mut r1, &mut r2, &g64, t);
            }
            for (got, want) in w.iter().zip(&w64) {
                let error = (f64::from(*got) - want).abs();
                assert!(
                    error <= 1e-4 * want.abs().max(1.0),
                    "{optimizer:?}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn adagrad_rows_start_from_the_initial_accumulator() {
        let adagrad = optimizers()[1];
        assert_eq!(initial_state(&adagrad), 0.1);
        assert_eq!(initial_state(&optimizers()[2]), 0.0);
    }
}
