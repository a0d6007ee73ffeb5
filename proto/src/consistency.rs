//! [`Consistency`]: how a server combines pushes from different workers, and which
//! version a worker must pull after pushing a step.
//!
//! - BSP: the gradients of step `t` from every worker of the group are averaged and
//!   applied once; the version becomes `t + 1`.
//! - SSP(k): each push is applied at once; the version is the group's clock (the
//!   lowest `step + 1` pushed by any group worker); a worker may run `k` steps ahead.
//! - ASP: each push is applied at once and bumps the version by one.

use std::fmt;
use std::str::FromStr;

use crate::ids::{Step, Version};

/// How pushes from different workers are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// Bulk-synchronous: one averaged update per step.
    Bsp,
    /// Asynchronous: every push applied at once.
    Asp,
    /// Stale-synchronous: asynchronous, but no worker more than `staleness` steps
    /// ahead of the slowest.
    Ssp {
        /// How many steps a worker may run ahead of the slowest one.
        staleness: u64,
    },
}

impl Consistency {
    /// True when the server knows a fixed group of workers (BSP and SSP).
    pub fn has_group(self) -> bool {
        !matches!(self, Consistency::Asp)
    }

    /// The version a worker that just pushed `step` must pull before computing the next
    /// step: BSP waits for the step, SSP(k) for the slowest worker to be within k steps,
    /// ASP for nothing.
    pub fn version_after(self, step: Step) -> Version {
        match self {
            Consistency::Bsp => Version::after(step),
            Consistency::Ssp { staleness } => {
                Version(Version::after(step).get().saturating_sub(staleness))
            }
            Consistency::Asp => Version(0),
        }
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Consistency::Bsp => f.write_str("bsp"),
            Consistency::Asp => f.write_str("asp"),
            Consistency::Ssp { staleness } => write!(f, "ssp:{staleness}"),
        }
    }
}

impl FromStr for Consistency {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        match lower.as_str() {
            "bsp" => Ok(Consistency::Bsp),
            "asp" => Ok(Consistency::Asp),
            other => other
                .strip_prefix("ssp:")
                .and_then(|k| k.parse().ok())
                .map(|staleness| Consistency::Ssp { staleness })
                .ok_or_else(|| {
                    format!(
                        "unknown consistency `{s}`; use bsp, asp or ssp:K (K = staleness in steps)"
                    )
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_model() {
        for (text, model) in [
            ("bsp", Consistency::Bsp),
            ("asp", Consistency::Asp),
            ("ssp:3", Consistency::Ssp { staleness: 3 }),
        ] {
            assert_eq!(text.parse::<Consistency>(), Ok(model));
            assert_eq!(model.to_string(), text);
        }
        assert!("ssp".parse::<Consistency>().unwrap_err().contains("ssp:K"));
        assert!("sync".parse::<Consistency>().is_err());
    }

    #[test]
    fn version_to_pull_after_a_push() {
        let after_4 = |model: Consistency| model.version_after(Step(4)).get();
        assert_eq!(after_4(Consistency::Bsp), 5);
        assert_eq!(after_4(Consistency::Ssp { staleness: 2 }), 3);
        assert_eq!(after_4(Consistency::Ssp { staleness: 9 }), 0);
        assert_eq!(after_4(Consistency::Asp), 0);
    }
}
