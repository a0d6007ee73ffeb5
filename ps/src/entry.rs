//! `Entry`: one stored key (its spec, its state behind its own lock, and its
//! announced version, which pulls wait on), and what a request does to a set of
//! entries: `apply_all` applies one push to its keys, all or nothing, and
//! `snapshot` reads a key's values.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use ps_proto::codec::TensorData;
use ps_proto::header::TensorHeader;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::key::ParamKey;
use smallvec::SmallVec;

use crate::announced::Announced;
use crate::budget::Charge;
use crate::consistency::Admission;
use crate::error::{Error, Result};
use crate::param::{Group, KeyState, ParamSpec};
use crate::step_waits::StepWaits;

/// One stored key: its immutable spec, its state, and its announced version.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) spec: ParamSpec,
    pub(crate) state: Mutex<KeyState>,
    pub(crate) version: Announced,
    /// The key's share of the memory budget, held for as long as the key.
    pub(crate) _charge: Charge,
}

impl Entry {
    /// Tells waiting pulls about `version`; never lowers an announced version.
    /// Called with the key locked, so one key's announcements follow its updates.
    pub(crate) fn announce(&self, version: Version) {
        self.version.announce(version);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, KeyState> {
        // A panic under the lock cannot leave a half-applied update visible to the
        // next request any more than it already is; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The outcome of pushing to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The key.
    pub key: ParamKey,
    /// False when `(worker, step)` had been taken before.
    pub accepted: bool,
    /// The key's version afterwards.
    pub version: Version,
}

/// One key's values as pulled.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The key, wire dtype and shape.
    pub header: TensorHeader,
    /// Encoded values, shared with every other pull of this version.
    pub data: Bytes,
    /// Version of the values.
    pub version: Version,
}

/// Keys one push holds at once without allocating for them (a small
/// operation's one or two).
const KEYS_INLINE: usize = 4;

/// Locks every entry in key order, checks every admission, then applies: all or nothing.
pub(crate) fn apply_all(
    entries: &[Arc<Entry>],
    grads: &[(ParamKey, TensorData)],
    group: Group,
    live: &BTreeSet<Rank>,
    worker: Rank,
    step: Step,
    waits: &StepWaits,
) -> Result<Vec<Pushed>> {
    let mut order: SmallVec<[usize; KEYS_INLINE]> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| grads[a].0.cmp(&grads[b].0));
    let mut guards: SmallVec<[Option<MutexGuard<'_, KeyState>>; KEYS_INLINE]> =
        (0..entries.len()).map(|_| None).collect();
    for &i in &order {
        guards[i] = Some(entries[i].lock());
    }
    let mut guards: SmallVec<[MutexGuard<'_, KeyState>; KEYS_INLINE]> =
        guards.into_iter().flatten().collect();
    let mut admissions: SmallVec<[Admission; KEYS_INLINE]> = SmallVec::new();
    for (state, (key, _)) in guards.iter().zip(grads) {
        let admission = state.admit(group, worker, step);
        let version = state.version();
        match admission {
            Admission::Future { max_step } => {
                return Err(Error::FutureStep {
                    key: key.clone(),
                    worker,
                    step,
                    version,
                    max_step,
                });
            }
            Admission::Stale => {
                return Err(Error::StaleStep {
                    key: key.clone(),
                    worker,
                    step,
                    version,
                });
            }
            Admission::Accept | Admission::Duplicate => admissions.push(admission),
        }
    }
    let outcomes = guards
        .iter_mut()
        .zip(grads)
        .zip(admissions)
        .map(|((state, (key, grad)), admission)| {
            let accepted = admission == Admission::Accept;
            if accepted && let Some(waited) = state.accept(group, live, worker, step, grad) {
                waits.record(waited, Some(worker));
            }
            Pushed {
                key: key.clone(),
                accepted,
                version: state.version(),
            }
        })
        .collect::<Vec<Pushed>>();
    // Announce new versions while the keys are still locked, so announcements of one
    // key happen in the order of its updates; and never lower an announced version.
    for (entry, outcome) in entries.iter().zip(&outcomes) {
        entry.announce(outcome.version);
    }
    drop(guards);
    Ok(outcomes)
}

/// The key's values at its current version, encoded once per version.
pub(crate) fn snapshot(entry: &Entry) -> Pulled {
    let (data, version) = entry.lock().snapshot(entry.spec.header.dtype);
    Pulled {
        header: entry.spec.header.clone(),
        data,
        version,
    }
}
