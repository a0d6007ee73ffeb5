//! The per-key rule that admits a worker's push under each consistency model.
//!
//! - BSP: the gradients of step `t` from every worker of the group are averaged and
//!   applied once; the key's version becomes `t + 1`.
//! - SSP(k): each push is applied at once; the version is the group's clock (the
//!   lowest `step + 1` pushed by any group worker), and a worker may push step `t`
//!   only while `t <= version + k`.
//! - ASP: each push is applied at once and bumps the version by one.
//!
//! Exactly once: a push whose step is not above the worker's last admitted step for
//! the key is a retry; it is acknowledged and not applied again.

use std::collections::{BTreeSet, HashMap};

pub use ps_proto::consistency::Consistency;
use ps_proto::ids::{Rank, Step, Version};

/// What to do with one key's share of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Take the gradient.
    Accept,
    /// `(worker, step)` was already taken: acknowledge, change nothing.
    Duplicate,
    /// The step is further ahead of the key's version than the model allows.
    Future {
        /// Largest step that would be admitted now.
        max_step: Step,
    },
    /// BSP only: the step was completed without this worker.
    Stale,
}

/// Decides whether a push of `step` by a worker whose last admitted step for this
/// key is `last_step` is admitted, given the key's `version`.
pub fn admit(
    consistency: Consistency,
    version: Version,
    last_step: Option<Step>,
    step: Step,
) -> Admission {
    if last_step.is_some_and(|last| step <= last) {
        return Admission::Duplicate;
    }
    let staleness = match consistency {
        Consistency::Asp => return Admission::Accept,
        Consistency::Bsp => 0,
        Consistency::Ssp { staleness } => staleness,
    };
    let max_step = Step(version.get().saturating_add(staleness));
    if step > max_step {
        Admission::Future { max_step }
    } else if consistency == Consistency::Bsp && step.get() < version.get() {
        Admission::Stale
    } else {
        Admission::Accept
    }
}

/// SSP's clock of a key: the lowest `step + 1` pushed by any live worker,
/// given each worker's last admitted step (0 if one never pushed).
pub fn group_clock(last_step: &HashMap<Rank, Step>, live: &BTreeSet<Rank>) -> Version {
    live.iter()
        .map(|w| last_step.get(w).map_or(Version(0), |s| Version::after(*s)))
        .min()
        .unwrap_or(Version(0))
}

/// The live workers a key (or bucket) still waits for: under BSP those not
/// among `pushed` (the workers of the step in progress), under SSP those at
/// the group's clock, given each worker's last admitted step; none under ASP.
pub fn missing_workers(
    consistency: Consistency,
    pushed: &BTreeSet<Rank>,
    last_step: &HashMap<Rank, Step>,
    live: &BTreeSet<Rank>,
) -> Vec<Rank> {
    match consistency {
        Consistency::Bsp => live
            .iter()
            .copied()
            .filter(|w| !pushed.contains(w))
            .collect(),
        Consistency::Ssp { .. } => {
            let clock = group_clock(last_step, live);
            live.iter()
                .copied()
                .filter(|w| last_step.get(w).map_or(Version(0), |s| Version::after(*s)) == clock)
                .collect()
        }
        Consistency::Asp => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_table() {
        use Admission::*;
        let bsp = Consistency::Bsp;
        let ssp2 = Consistency::Ssp { staleness: 2 };
        let asp = Consistency::Asp;
        // (model, version, last step, step) -> admission
        let cases = [
            (bsp, 0, None, 0, Accept),
            (bsp, 0, Some(0), 0, Duplicate),
            (bsp, 3, Some(2), 3, Accept),
            (bsp, 3, Some(3), 3, Duplicate),
            (bsp, 3, Some(2), 2, Duplicate),
            (bsp, 3, Some(2), 4, Future { max_step: Step(3) }),
            (bsp, 3, None, 1, Stale),
            (ssp2, 3, Some(4), 5, Accept),
            (ssp2, 3, Some(5), 6, Future { max_step: Step(5) }),
            (ssp2, 3, Some(5), 5, Duplicate),
            (asp, 0, Some(10), 11, Accept),
            (asp, 0, Some(10), 10, Duplicate),
            (asp, 0, None, 1_000, Accept),
        ];
        for (model, version, last, step, expected) in cases {
            assert_eq!(
                admit(model, Version(version), last.map(Step), Step(step)),
                expected,
                "{model} version {version} last {last:?} step {step}"
            );
        }
    }
}
