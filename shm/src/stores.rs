//! [`Stores`]: how a ring writer copies a large write into the region,
//! with ordinary stores or with stores that bypass the cache, chosen by what
//! each has cost this writer lately.
//!
//! Ordinary stores leave the bytes in the writer's cache, where the reader
//! on the other core fetches them: the fastest way while that transfer is
//! cheap. On an AMD EPYC virtual machine here it was not, in a third to a
//! half of runs, by chance (most likely where the host ran the two vCPUs
//! at the time; nothing a process can see): a 1 MiB push then ran at
//! 2.2-2.7 GB/s against 11.5-13.0, the worker's copy into the ring five
//! times as dear a byte, and a C program handing 1 MiB through a ring
//! between two threads did the same (1.7-2.5 GB/s against 25-35).
//! Streaming stores send the lines to memory and take nothing back from the
//! reader: slower than ordinary ones at their best, and never that slow
//! (docs/benchmarks.md, "Large writes copied in the cheaper way").
//!
//! So each writer measures the cost per byte of each kind in rounds, the
//! median of a round's writes:
//! [`MAIN_ROUND`] large writes by the kind that cost less (streaming
//! stores only when they cost less than [`STREAMING_BELOW_SHARE`] of
//! ordinary ones), then [`TRIAL_ROUND`] by the other, so that it sees when
//! the host has changed.
//! A write's cost is its whole time, its waits for room included: where the
//! reader is the slower side, the room it frees is what a kind's stores
//! change (from memory, or from the writer's cache). Timing the copies
//! alone chose streaming stores on a host where ordinary ones moved pushes
//! half again as fast. The first [`UNMEASURED`] writes of a round are not
//! counted: they store over lines the other kind left.

use std::time::Duration;

/// Writes of this many bytes or more are copied by the kind [`Stores`]
/// picks; smaller ones by ordinary stores, since the reader is about to read
/// them and they fit its cache either way.
pub const CHOSEN_FROM_BYTES: usize = 256 << 10;

/// Large writes in a round by the kind that cost less.
pub const MAIN_ROUND: u64 = 248;

/// Large writes in a round by the other kind (and in each kind's first).
pub const TRIAL_ROUND: u64 = 8;

/// Writes at the start of a round that are not measured.
pub const UNMEASURED: u64 = 2;

/// Streaming stores are kept only when they cost the writer less than this
/// share of what ordinary ones cost. They also cost the reader, which then
/// reads the bytes from memory, and the writer's clock does not see that
/// while the ring has room: on an Intel Xeon virtual machine here, with two
/// servers and two workers, the two kinds' costs came within noise of each
/// other, the cheaper by the writer's clock was streaming in half the
/// rounds, and 1 MiB pushes ran at 0.75-0.98 of the floor with a server's
/// CPU per GB up a tenth, against 0.91-1.08 with ordinary stores alone. The
/// slow hand-over this chooser is for made ordinary stores five times as
/// dear (docs/benchmarks.md, "Large writes copied in the cheaper way").
pub const STREAMING_BELOW_SHARE: f64 = 0.5;

/// A kind of store for a large write's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Stores through the cache.
    Ordinary,
    /// Stores that bypass the cache (`copy_streaming`).
    Streaming,
}

impl Kind {
    fn other(self) -> Self {
        match self {
            Self::Ordinary => Self::Streaming,
            Self::Streaming => Self::Ordinary,
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Ordinary => 0,
            Self::Streaming => 1,
        }
    }
}

/// What one writer has learned of the two kinds' costs, and the round
/// under way.
#[derive(Debug)]
pub struct Stores {
    /// Each kind's median nanoseconds per byte in its last round, once
    /// measured.
    cost: [Option<f64>; 2],
    /// The kind of the round under way.
    kind: Kind,
    /// Whether the round under way tries the dearer kind (or one not yet
    /// measured).
    trial: bool,
    /// Large writes picked in the round under way.
    picked: u64,
    /// The measured writes' costs per byte in the round under way.
    measured: Vec<f64>,
}

impl Default for Stores {
    fn default() -> Self {
        Self {
            cost: [None, None],
            kind: Kind::Ordinary,
            trial: true,
            picked: 0,
            measured: Vec::with_capacity(MAIN_ROUND as usize),
        }
    }
}

impl Stores {
    /// The kind for a write of `len` bytes, to be measured and told to
    /// [`Stores::learn`]: the round's, starting the next round when this
    /// one is done. `None` below [`CHOSEN_FROM_BYTES`]: ordinary stores, not
    /// measured.
    pub fn pick(&mut self, len: usize) -> Option<Kind> {
        if len < CHOSEN_FROM_BYTES {
            return None;
        }
        let length = if self.trial { TRIAL_ROUND } else { MAIN_ROUND };
        if self.picked == length {
            self.next_round();
        }
        self.picked += 1;
        Some(self.kind)
    }

    /// Counts a write of `len` bytes by `kind` that took `took`,
    /// unless it is among its round's first [`UNMEASURED`].
    pub fn learn(&mut self, kind: Kind, len: usize, took: Duration) {
        if kind != self.kind || self.picked <= UNMEASURED {
            return;
        }
        self.measured.push(took.as_nanos() as f64 / len as f64);
    }

    /// Ends the round under way, keeping its kind's cost, and starts the
    /// next: a kind not measured yet, the other kind after a main round, or
    /// the cheaper after a trial (streaming only by a wide margin).
    fn next_round(&mut self) {
        if let Some(median) = median(&mut self.measured) {
            self.cost[self.kind.index()] = Some(median);
        }
        self.measured.clear();
        self.picked = 0;
        let [ordinary, streaming] = self.cost;
        let (Some(ordinary), Some(streaming)) = (ordinary, streaming) else {
            self.kind = if ordinary.is_none() {
                Kind::Ordinary
            } else {
                Kind::Streaming
            };
            self.trial = true;
            return;
        };
        let cheaper = if streaming < ordinary * STREAMING_BELOW_SHARE {
            Kind::Streaming
        } else {
            Kind::Ordinary
        };
        (self.kind, self.trial) = match self.trial {
            true => (cheaper, false),
            false => (cheaper.other(), true),
        };
        tracing::debug!(
            ordinary_ns_per_byte = ordinary,
            streaming_ns_per_byte = streaming,
            next = ?self.kind,
            trial = self.trial,
            "a ring writer's large writes: a round ends"
        );
    }

    /// Whether both kinds have been measured.
    #[cfg(test)]
    pub(crate) fn picked_both(&self) -> bool {
        self.cost.iter().all(Option::is_some)
    }
}

/// The middle of `costs` (reordered), `None` for none: a write preempted
/// midway, or one that waited out a reader's time slice, costs many times
/// the rest and would move a mean, most of all a trial round's six.
fn median(costs: &mut [f64]) -> Option<f64> {
    if costs.is_empty() {
        return None;
    }
    let middle = costs.len() / 2;
    let (_, median, _) = costs.select_nth_unstable_by(middle, f64::total_cmp);
    Some(*median)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LARGE: usize = CHOSEN_FROM_BYTES;

    /// Writes `n` large writes, each costing `ordinary` or `streaming`
    /// nanoseconds a byte by the kind picked; the kinds picked.
    fn write(stores: &mut Stores, n: u64, ordinary: u64, streaming: u64) -> Vec<Kind> {
        write_costing(stores, n, |kind, _| match kind {
            Kind::Ordinary => ordinary,
            Kind::Streaming => streaming,
        })
    }

    /// Writes `n` large writes, each costing what `per_byte` says for the
    /// kind picked and the write's place in its round; the kinds picked.
    fn write_costing(
        stores: &mut Stores,
        n: u64,
        mut per_byte: impl FnMut(Kind, u64) -> u64,
    ) -> Vec<Kind> {
        (0..n)
            .map(|_| {
                let kind = stores.pick(LARGE).expect("a large write is measured");
                let cost = per_byte(kind, stores.picked);
                stores.learn(kind, LARGE, Duration::from_nanos(cost * LARGE as u64));
                kind
            })
            .collect()
    }

    fn count(kinds: &[Kind], kind: Kind) -> u64 {
        kinds.iter().filter(|&&k| k == kind).count() as u64
    }

    /// Both kinds' first rounds, then one main round and one trial.
    const FIRST: u64 = 2 * TRIAL_ROUND;
    const CYCLE: u64 = MAIN_ROUND + TRIAL_ROUND;

    #[test]
    fn small_writes_go_by_ordinary_stores_unmeasured() {
        let mut stores = Stores::default();
        assert_eq!(stores.pick(LARGE - 1), None);
        assert_eq!(stores.picked, 0);
        assert_eq!(stores.pick(LARGE), Some(Kind::Ordinary));
    }

    #[test]
    fn each_kind_is_measured_then_the_cheaper_kept_but_for_a_trial_round() {
        let mut stores = Stores::default();
        let kinds = write(&mut stores, FIRST, 1, 3);
        assert_eq!(
            count(&kinds[..TRIAL_ROUND as usize], Kind::Ordinary),
            TRIAL_ROUND
        );
        assert_eq!(
            count(&kinds[TRIAL_ROUND as usize..], Kind::Streaming),
            TRIAL_ROUND
        );
        let kinds = write(&mut stores, 2 * CYCLE, 1, 3);
        assert_eq!(count(&kinds, Kind::Streaming), 2 * TRIAL_ROUND);

        let mut stores = Stores::default();
        let kinds = write(&mut stores, FIRST + 2 * CYCLE, 5, 1);
        assert_eq!(count(&kinds, Kind::Ordinary), 3 * TRIAL_ROUND);
    }

    #[test]
    fn a_host_that_makes_ordinary_stores_dear_turns_the_writer_to_streaming_and_back() {
        let mut stores = Stores::default();
        write(&mut stores, FIRST + CYCLE, 1, 3);
        // Ordinary stores become five times as dear as streaming ones: the
        // main round ends on them, and the writer turns after its trial.
        write(&mut stores, MAIN_ROUND + TRIAL_ROUND, 15, 3);
        let kinds = write(&mut stores, CYCLE, 15, 3);
        assert_eq!(count(&kinds, Kind::Ordinary), TRIAL_ROUND);
        // And the host changes back: the next trial of ordinary stores
        // turns the writer again.
        write(&mut stores, CYCLE, 1, 3);
        let kinds = write(&mut stores, MAIN_ROUND, 1, 3);
        assert_eq!(count(&kinds, Kind::Ordinary), MAIN_ROUND);
    }

    #[test]
    fn streaming_stores_a_little_cheaper_do_not_turn_the_writer() {
        let mut stores = Stores::default();
        // Streaming stores cost the writer three quarters of ordinary ones:
        // within what the reader pays for them, so ordinary stores stay.
        let kinds = write(&mut stores, FIRST + 2 * CYCLE, 4, 3);
        assert_eq!(count(&kinds, Kind::Streaming), 3 * TRIAL_ROUND);
        // At a third they are kept.
        let kinds = write(&mut stores, 2 * CYCLE, 9, 3);
        assert!(count(&kinds, Kind::Streaming) >= MAIN_ROUND);
    }

    #[test]
    fn writes_that_wait_out_a_time_slice_now_and_then_do_not_turn_the_writer() {
        let mut stores = Stores::default();
        write(&mut stores, FIRST, 10, 12);
        // Every eighth ordinary write waits thirty times as long (preempted,
        // or behind a reader that lost its core): their mean would be more
        // than twice streaming stores' cost, their median is not.
        let mut written = 0u64;
        let kinds = write_costing(&mut stores, 2 * CYCLE, |kind, _| {
            written += 1;
            match kind {
                Kind::Ordinary if written.is_multiple_of(8) => 300,
                Kind::Ordinary => 10,
                Kind::Streaming => 12,
            }
        });
        assert_eq!(count(&kinds, Kind::Ordinary), 2 * MAIN_ROUND);
    }

    #[test]
    fn a_rounds_first_writes_and_one_slow_write_do_not_turn_the_writer() {
        let mut stores = Stores::default();
        // Each round's first writes cost what the other kind left behind.
        let kinds = write_costing(&mut stores, FIRST + CYCLE, |kind, picked| {
            match (kind, picked <= UNMEASURED) {
                (_, true) => 50,
                (Kind::Ordinary, false) => 1,
                (Kind::Streaming, false) => 3,
            }
        });
        assert_eq!(count(&kinds[FIRST as usize..], Kind::Ordinary), MAIN_ROUND);
        // A copy preempted midway measures far dearer once.
        stores.learn(
            Kind::Ordinary,
            LARGE,
            Duration::from_nanos(100 * LARGE as u64),
        );
        let kinds = write(&mut stores, CYCLE, 1, 3);
        assert_eq!(count(&kinds, Kind::Ordinary), MAIN_ROUND);
    }
}
