//! Where a worker's training time goes, step by step:
//!
//! - **compute**: the forward pass, the loss and the backward pass;
//! - **gather**: copying the gradients off the model's device into the buffers
//!   the push sends;
//! - **push**: sending the gradients until every server took them;
//! - **wait**: the servers holding the pull until its version exists (under
//!   BSP, until every worker pushed the step), as the servers report it;
//! - **pull**: the rest of the pull, the values' transfer;
//! - **apply**: writing the pulled values into the model's variables (onto its
//!   device);
//! - **other**: the rest of the wall time (batches, evaluation, repairs).
//!
//! When a step's push and pull travel as one operation (`PushPull` on the
//! session stream, one round trip), there is no line between them: its time
//! less the wait is booked half as push and half as pull.
//!
//! `ps-worker --json` reports each part in seconds and as a share of the wall
//! time; the shares add up to 1.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The time spent in each part of the steps so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Forward, loss and backward.
    pub compute: Duration,
    /// Copying gradients off the device into push buffers.
    pub gather: Duration,
    /// Pushing gradients.
    pub push: Duration,
    /// Pulls held by the servers until their version existed.
    pub wait: Duration,
    /// The rest of the pulls: the transfer.
    pub pull: Duration,
    /// Writing pulled values into the model.
    pub apply: Duration,
}

/// The measured phases, in the order [`StepTimes::phases`] gives them.
pub const PHASES: [&str; 6] = ["compute", "gather", "push", "wait", "pull", "apply"];

impl StepTimes {
    /// Each measured phase's time, in the order of [`PHASES`].
    pub fn phases(&self) -> [Duration; 6] {
        [
            self.compute,
            self.gather,
            self.push,
            self.wait,
            self.pull,
            self.apply,
        ]
    }

    /// Books a pull that took `took` in all, of which a server reported it held
    /// it `waited`: the wait (never more than the whole), and the transfer.
    pub fn pulled(&mut self, took: Duration, waited: Duration) {
        let waited = waited.min(took);
        self.wait += waited;
        self.pull += took - waited;
    }

    /// Books a push and pull made as one operation that took `took`, of which
    /// the servers held it `waited`: the wait as wait, the rest half as push
    /// and half as pull.
    pub fn exchanged(&mut self, took: Duration, waited: Duration) {
        let waited = waited.min(took);
        let transfer = took - waited;
        self.wait += waited;
        self.push += transfer / 2;
        self.pull += transfer - transfer / 2;
    }

    /// The time spent in each part since `earlier` (a snapshot of the same
    /// trainer's times): one step's, when taken around it.
    pub fn since(&self, earlier: &StepTimes) -> StepTimes {
        StepTimes {
            compute: self.compute.saturating_sub(earlier.compute),
            gather: self.gather.saturating_sub(earlier.gather),
            push: self.push.saturating_sub(earlier.push),
            wait: self.wait.saturating_sub(earlier.wait),
            pull: self.pull.saturating_sub(earlier.pull),
            apply: self.apply.saturating_sub(earlier.apply),
        }
    }

    /// The split of `wall`: each part in seconds and as a share of it, with
    /// what no part accounts for as `other`.
    pub fn split(&self, wall: Duration) -> TimeSplit {
        let wall_seconds = wall.as_secs_f64().max(1e-9);
        let part = |d: Duration| Part {
            seconds: d.as_secs_f64(),
            share: d.as_secs_f64() / wall_seconds,
        };
        let counted: Duration = self.phases().iter().sum();
        TimeSplit {
            compute: part(self.compute),
            gather: part(self.gather),
            push: part(self.push),
            wait: part(self.wait),
            pull: part(self.pull),
            apply: part(self.apply),
            other: part(wall.saturating_sub(counted)),
        }
    }
}

/// One part of the wall time.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Part {
    /// Seconds spent in it.
    pub seconds: f64,
    /// Its share of the wall time.
    pub share: f64,
}

/// The wall time, split into its parts (see the module's documentation).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct TimeSplit {
    /// Forward, loss and backward.
    pub compute: Part,
    /// Copying gradients off the device into push buffers.
    pub gather: Part,
    /// Pushing gradients.
    pub push: Part,
    /// Pulls held until their version existed.
    pub wait: Part,
    /// The transfer part of the pulls.
    pub pull: Part,
    /// Writing pulled values into the model.
    pub apply: Part,
    /// Everything else.
    pub other: Part,
}

impl TimeSplit {
    /// The parts in order, named.
    pub fn parts(&self) -> [(&'static str, Part); 7] {
        [
            ("compute", self.compute),
            ("gather", self.gather),
            ("push", self.push),
            ("wait", self.wait),
            ("pull", self.pull),
            ("apply", self.apply),
            ("other", self.other),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_parts_and_the_rest_add_up_to_the_wall_time() {
        let mut times = StepTimes {
            compute: 30 * MS,
            gather: 3 * MS,
            push: 10 * MS,
            apply: 5 * MS,
            ..StepTimes::default()
        };
        times.pulled(40 * MS, 25 * MS);
        let split = times.split(100 * MS);
        assert!((split.gather.seconds - 0.003).abs() < 1e-9);
        assert!((split.wait.seconds - 0.025).abs() < 1e-9);
        assert!((split.pull.seconds - 0.015).abs() < 1e-9);
        assert!((split.other.seconds - 0.012).abs() < 1e-9);
        let shares: f64 = split.parts().iter().map(|(_, p)| p.share).sum();
        assert!((shares - 1.0).abs() < 1e-9, "{split:?}");
    }

    #[test]
    fn a_push_and_pull_in_one_round_trip_splits_its_transfer_evenly() {
        let mut times = StepTimes::default();
        times.exchanged(31 * MS, 11 * MS);
        assert_eq!(
            (times.wait, times.push, times.pull),
            (11 * MS, 10 * MS, 10 * MS)
        );
        times.exchanged(3 * MS, 5 * MS);
        assert_eq!(
            (times.wait, times.push, times.pull),
            (14 * MS, 10 * MS, 10 * MS)
        );
    }

    #[test]
    fn a_reported_wait_longer_than_the_pull_counts_as_the_whole_pull() {
        let mut times = StepTimes::default();
        times.pulled(10 * MS, 50 * MS);
        assert_eq!((times.wait, times.pull), (10 * MS, Duration::ZERO));
    }
}
