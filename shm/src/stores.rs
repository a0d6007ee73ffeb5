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
//! So each writer measures the cost per byte of each kind in rounds:
//! [`MAIN_ROUND`] large writes by the kind that cost less, then
//! [`TRIAL_ROUND`] by the other, so that it sees when the host has changed.
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
    /// Each kind's nanoseconds per byte in its last round, once measured.
    cost: [Option<f64>; 2],
    /// The kind of the round under way.
    kind: Kind,
    /// Whether the round under way tries the dearer kind (or one not yet
    /// measured).
    trial: bool,
    /// Large writes picked in the round under way.
    picked: u64,
    /// The sum of the measured writes' costs per byte, and their number.
    measured: (f64, u64),
}

impl Default for Stores {
    fn default() -> Self {
        Self {
            cost: [None, None],
            kind: Kind::Ordinary,
            trial: true,
            picked: 0,
            measured: (0.0, 0),
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
        let (sum, count) = &mut self.measured;
        *sum += took.as_nanos() as f64 / len as f64;
        *count += 1;
    }

    /// Ends the round under way, keeping its kind's cost, and starts the
    /// next: a kind not measured yet, the other kind after a main round, or
    /// the cheaper after a trial.
    fn next_round(&mut self) {
        let (sum, count) = std::mem::take(&mut self.measured);
        if count > 0 {
            self.cost[self.kind.index()] = Some(sum / count as f64);
        }
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
        let cheaper = if streaming < ordinary {
            Kind::Streaming
        } else {
            Kind::Ordinary
        };
        (self.kind, self.trial) = match self.trial {
            true => (cheaper, false),
            false => (cheaper.other(), true),
        };
    }

    /// Whether both kinds have been measured.
    #[cfg(test)]
    pub(crate) fn picked_both(&self) -> bool {
        self.cost.iter().all(Option::is_some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LARGE: usize = CHOSEN_FROM_BYTES;

    /// Writes `n` large writes, each costing `ordinary` or `streaming`
    /// nanoseconds a byte by the kind picked; the kinds picked.
    fn write(stores: &mut Stores, n: u64, ordinary: u64, streaming: u64) -> Vec<Kind> {
        (0..n)
            .map(|_| {
                let kind = stores.pick(LARGE).expect("a large write is measured");
                let per_byte = match kind {
                    Kind::Ordinary => ordinary,
                    Kind::Streaming => streaming,
                };
                stores.learn(kind, LARGE, Duration::from_nanos(per_byte * LARGE as u64));
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
    fn a_rounds_first_writes_and_one_slow_write_do_not_turn_the_writer() {
        let mut stores = Stores::default();
        // Each round's first writes cost what the other kind left behind.
        let kinds: Vec<Kind> = (0..FIRST + CYCLE)
            .map(|_| {
                let kind = stores.pick(LARGE).unwrap();
                let per_byte = match (kind, stores.picked <= UNMEASURED) {
                    (_, true) => 50,
                    (Kind::Ordinary, false) => 1,
                    (Kind::Streaming, false) => 3,
                };
                stores.learn(kind, LARGE, Duration::from_nanos(per_byte * LARGE as u64));
                kind
            })
            .collect();
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
