//! [`Zipf`]: ranks `1..=n` drawn with probability proportional to `1 / k^s`,
//! by rejection-inversion (Hörmann and Derflinger, 1996), over [`SplitMix64`]
//! so that a synthetic embedding workload is the same on every machine. The ids
//! of recommendation data follow such a law: a few rows are read by most
//! examples, most rows by few.

use crate::rng::SplitMix64;

/// A Zipf distribution over `1..=n` with exponent `s > 0`.
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    /// The distribution over `1..=n` (at least 1) with exponent `s`.
    ///
    /// # Panics
    /// When `s` is not finite and positive.
    pub fn new(n: u64, s: f64) -> Self {
        assert!(
            s.is_finite() && s > 0.0,
            "a Zipf exponent must be > 0, got {s}"
        );
        let n = n.max(1) as f64;
        let mut zipf = Self {
            n,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        zipf.h_integral_x1 = zipf.h_integral(1.5) - 1.0;
        zipf.h_integral_n = zipf.h_integral(n + 0.5);
        zipf.threshold = 2.0 - zipf.h_integral_inverse(zipf.h_integral(2.5) - zipf.h(2.0));
        zipf
    }

    /// One rank in `1..=n`.
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        loop {
            let u = self.h_integral_n + rng.next_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (ln1p_over(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, accurate near 0.
fn ln1p_over(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, accurate near 0.
fn expm1_over(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequencies_follow_the_law() {
        let (n, s) = (1000u64, 1.05);
        let zipf = Zipf::new(n, s);
        let mut rng = SplitMix64::new(1);
        let draws = 200_000;
        let mut counts = vec![0u64; n as usize + 1];
        for _ in 0..draws {
            let k = zipf.sample(&mut rng);
            assert!((1..=n).contains(&k));
            counts[k as usize] += 1;
        }
        let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        for k in [1u64, 2, 10] {
            let want = draws as f64 * (k as f64).powf(-s) / norm;
            let got = counts[k as usize] as f64;
            assert!(
                (got - want).abs() < 0.05 * want,
                "rank {k}: {got} draws, expected {want:.0}"
            );
        }
    }

    #[test]
    fn one_element_and_huge_ranges_stay_in_bounds() {
        let mut rng = SplitMix64::new(2);
        assert_eq!(Zipf::new(1, 1.05).sample(&mut rng), 1);
        let big = Zipf::new(10_000_000, 1.05);
        assert!((0..1000).all(|_| (1..=10_000_000).contains(&big.sample(&mut rng))));
    }
}
