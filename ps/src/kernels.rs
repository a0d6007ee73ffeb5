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
//!
//! Adam keeps its moments out of the subnormal numbers, and makes none from
//! a gradient or a moment ([`zero_if_tiny`], [`square`], [`second_moment`]):
//! on x86-64 each operation that makes or reads one costs a microcode assist
//! of a hundred cycles or more, and a trained model's moments reach them (a
//! gradient of 1e-20 squares to one, and the moments of a unit whose
//! gradient stays zero decay through them for thousands of steps). Measured
//! here: 4,810 elements took 44-102 µs against 2.3 µs, and a digits
//! worker's step over shared memory spent 1.7x as long in its exchange
//! (docs/benchmarks.md, "Adam without subnormal numbers"). A weight that
//! decays into them, or a moment restored from a checkpoint, is still read
//! as it is. SGD and momentum, in `f64`, are not slowed by them.

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

/// Applies Adam(W) to `w` and its moments `m`, `v` with gradient block `g`,
/// making no subnormal number from a gradient or a moment ([`zero_if_tiny`],
/// [`SQUARED_FROM`], [`SECOND_MOMENT_FLOOR`]).
pub(crate) fn adam<G: Lane>(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[G], k: Adam) {
    Arch::new().dispatch(AdamPass { w, m, v, g, k });
}

/// One Adam pass, handed to `pulp` as a [`pulp::WithSimd`] whose body is
/// always inlined into the function compiled for the vector unit: as a
/// closure, the loop with its bounds grew past what the compiler inlined,
/// and ran for the baseline processor, scalar (a third of the speed).
struct AdamPass<'a, G> {
    w: &'a mut [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    g: &'a [G],
    k: Adam,
}

impl<G: Lane> pulp::WithSimd for AdamPass<'_, G> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let Self { w, m, v, g, k } = self;
        let moments = m.iter_mut().zip(v.iter_mut());
        for ((w, (m, v)), &g) in w.iter_mut().zip(moments).zip(g) {
            let g = k.scale * zero_if_tiny(g.value());
            let m1 = zero_if_tiny(k.beta1 * *m + k.one_minus_beta1 * g);
            let v1 = second_moment((k.beta2, k.one_minus_beta2), *v, g);
            let step = (m1 * k.m_scale) / ((v1 * k.v_scale).sqrt() + k.eps);
            *w = (f64::from(*w) * k.decay - k.lr * f64::from(step)) as f32;
            (*m, *v) = (m1, v1);
        }
    }
}

/// The least magnitude Adam's lanes keep in a gradient as it arrives and in
/// a first moment: 2^-100. From there, a moment times a decay from 2^-26 up
/// stays normal, as does a moment over a denominator up to 2^26 (a second
/// moment up to 2^52); what it zeroes moves an `f32` weight by at most `lr`
/// times the first moment's bias correction (up to 10 at beta1 0.9) times
/// 2^-100 / `eps`, far below its last bit.
const LEAST_KEPT_BITS: u32 = (127 - 100) << 23;

/// A gradient's magnitude is taken as at least this (2^-50) where the second
/// moment squares it: the square, 2^-100, times `1 - beta2` from 2^-26 up,
/// stays normal. It adds at most 2^-100 to the moment, whose root with the
/// moment's bias correction (up to 1000 at beta2 0.999) then adds at most
/// about 3e-14 to the denominator's `eps`.
const SQUARED_FROM: f32 = 1.0 / (1u128 << 50) as f32;

/// The least second moment kept: 2^-100, so the moment decaying while a
/// unit's gradient stays zero never reaches the subnormals (its root is
/// below 1e-13 even at the first step's bias correction, against an `eps`
/// of 1e-8).
const SECOND_MOMENT_FLOOR: f32 = 1.0 / (1u128 << 100) as f32;

/// `x`, or zero when its magnitude is below 2^-100 (subnormals included).
/// The test is on the bits with integer operations only: comparing a
/// subnormal as a float costs the same assist as arithmetic on it.
#[inline(always)]
pub(crate) fn zero_if_tiny(x: f32) -> f32 {
    let bits = x.to_bits();
    let kept = u32::from((bits & 0x7fff_ffff) >= LEAST_KEPT_BITS).wrapping_neg();
    f32::from_bits(bits & kept)
}

/// The second moment Adam's lanes keep for `v` and a gradient `g`:
/// `beta2 * v + (1 - beta2) * g^2` (`decays` is `(beta2, 1 - beta2)`), with
/// `g`'s magnitude taken as at least [`SQUARED_FROM`] and the result as at
/// least [`SECOND_MOMENT_FLOOR`].
#[inline(always)]
pub(crate) fn second_moment((beta2, one_minus_beta2): (f32, f32), v: f32, g: f32) -> f32 {
    at_least(beta2 * v + one_minus_beta2 * square(g), SECOND_MOMENT_FLOOR)
}

/// `g` squared, its magnitude taken as at least [`SQUARED_FROM`], so that
/// the square (at least 2^-100) is never subnormal.
#[inline(always)]
pub(crate) fn square(g: f32) -> f32 {
    let magnitude = at_least(g.abs(), SQUARED_FROM);
    magnitude * magnitude
}

/// The larger of `x` and `least`, compared by their bits, for `x` positive
/// or +0.0 (a magnitude or a sum of non-negative terms) and `least` positive:
/// the order of such floats is their bits'. A NaN's bits are above any
/// finite value's, so a NaN is kept, where `f32::max` would give `least`.
#[inline(always)]
fn at_least(x: f32, least: f32) -> f32 {
    f32::from_bits(x.to_bits().max(least.to_bits()))
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
pub(crate) mod tests {
    use super::*;

    /// Whether `x` is subnormal: neither zero nor normal.
    pub(crate) fn subnormal(x: f32) -> bool {
        x != 0.0 && !x.is_normal()
    }

    fn default_adam(t: i32) -> Adam {
        let params = AdamParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        };
        Adam::new(params, t, 0.5)
    }

    #[test]
    fn adam_never_leaves_a_subnormal_moment_whatever_the_magnitudes() {
        // Gradients and moments from the least subnormal to 1, every power
        // of two between, of both signs.
        let magnitudes: Vec<f32> = (-149..=0).map(|p| 2f32.powi(p)).collect();
        let signed: Vec<f32> = magnitudes.iter().flat_map(|&x| [x, -x]).collect();
        for t in [1, 10, 10_000] {
            let k = default_adam(t);
            for &m0 in &signed {
                let n = signed.len();
                let mut w = vec![0.25f32; n];
                let mut m = vec![m0; n];
                let mut v = vec![m0.abs(); n];
                adam(&mut w, &mut m, &mut v, &signed, k);
                for i in 0..n {
                    assert!(
                        !subnormal(m[i]) && !subnormal(v[i]) && w[i].is_normal(),
                        "t {t} g {} m0 {m0}: m {} v {} w {}",
                        signed[i],
                        m[i],
                        v[i],
                        w[i]
                    );
                }
            }
        }
    }

    #[test]
    fn adam_takes_tiny_values_as_zero_and_keeps_the_rest_exactly() {
        let k = default_adam(3);
        // A gradient of 1e-20 squares to a subnormal: the second moment
        // stays at its floor, the first moment keeps the gradient.
        let (mut w, mut m, mut v) = ([0.25f32], [0.0f32], [0.0f32]);
        adam(&mut w, &mut m, &mut v, &[1e-20f32], k);
        assert_eq!(v, [SECOND_MOMENT_FLOOR]);
        assert_eq!(m, [k.one_minus_beta1 * (k.scale * 1e-20)]);
        // Moments that decayed into the subnormals, and a subnormal gradient,
        // are taken as zero: the weight only decays.
        let (mut w, mut m, mut v) = ([0.25f32], [1e-39f32], [1e-39f32]);
        adam(&mut w, &mut m, &mut v, &[-1e-40f32], k);
        assert_eq!((m, v), ([0.0], [SECOND_MOMENT_FLOOR]));
        assert_eq!(w, [(0.25f64 * k.decay) as f32]);
        // Ordinary magnitudes go through the same arithmetic as before.
        let (g, m0, v0) = (0.02f32, -0.01f32, 0.0004f32);
        let (mut w, mut m, mut v) = ([0.25f32], [m0], [v0]);
        adam(&mut w, &mut m, &mut v, &[g], k);
        let g = k.scale * g;
        let m1 = k.beta1 * m0 + k.one_minus_beta1 * g;
        let v1 = k.beta2 * v0 + k.one_minus_beta2 * (g * g);
        let step = (m1 * k.m_scale) / ((v1 * k.v_scale).sqrt() + k.eps);
        assert_eq!((m, v), ([m1], [v1]));
        assert_eq!(w, [(0.25f64 * k.decay - k.lr * f64::from(step)) as f32]);
    }

    #[test]
    fn tiny_means_below_two_to_the_minus_100() {
        let least = 2f32.powi(-100);
        assert_eq!(SQUARED_FROM, 2f32.powi(-50));
        assert_eq!(SECOND_MOMENT_FLOOR, least);
        for x in [least, -least, 1.0, f32::INFINITY, f32::MAX] {
            assert_eq!(zero_if_tiny(x).to_bits(), x.to_bits(), "{x}");
        }
        for x in [least * 0.999, -least * 0.5, 1e-39, -1e-45, 0.0, -0.0] {
            assert_eq!(zero_if_tiny(x), 0.0, "{x}");
        }
        assert!(zero_if_tiny(f32::NAN).is_nan(), "a NaN is not tiny");
        // The second moment's helper is the lanes' own formula.
        let decays = (0.999, 1.0 - 0.999);
        assert_eq!(second_moment(decays, 0.0, 1e-20), SECOND_MOMENT_FLOOR);
        let v = second_moment(decays, 0.0004, 0.01);
        assert_eq!(v, 0.999 * 0.0004 + (1.0 - 0.999) * (0.01 * 0.01));
        assert_eq!((square(-0.5), square(1e-30)), (0.25, 2f32.powi(-100)));
    }

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
