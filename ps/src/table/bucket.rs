//! `Bucket`: one bucket of a table as a server holds it: its rows and their
//! optimizer state, its version and each worker's last step (exactly once),
//! and under BSP the row gradients of the step in progress — what
//! `crate::param::KeyState` is for a dense key.
//!
//! Rows are stored contiguously, `width` elements each, in the order they were
//! made; an id's slot is found through a hash map. A row is made the first
//! time a step applies a gradient to it; a pull of a row never pushed reads
//! its initial values without storing them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ps_proto::ids::{Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_proto::rows::extend_rows;

use super::init::RowStarts;
use super::row_optimizer::{RowSlices, initial_state, update_row};
use super::spec::TableSpec;
use crate::announced::Announced;
use crate::budget::Charge;
use crate::checkpoint::KeyCheckpoint;
use crate::consistency::{Admission, Consistency, admit, group_clock};
use crate::param::Group;

/// Row ids to slots.
type IdMap = HashMap<u64, u32, foldhash::fast::FixedState>;

/// One stored bucket: its name as a key `(table, bucket)`, its state behind its
/// own lock, and its announced version, which pulls wait on.
#[derive(Debug)]
pub(crate) struct Bucket {
    pub(crate) key: ParamKey,
    pub(crate) state: Mutex<BucketState>,
    pub(crate) version: Announced,
}

impl Bucket {
    /// A bucket named `key` holding `state`.
    pub(crate) fn new(key: ParamKey, state: BucketState) -> Self {
        let version = Announced::new(state.version);
        Self {
            key,
            state: Mutex::new(state),
            version,
        }
    }

    /// Tells waiting pulls about `version`; never lowers an announced version.
    pub(crate) fn announce(&self, version: Version) {
        self.version.announce(version);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, BucketState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The row gradients of a BSP step in progress, summed over the workers.
#[derive(Debug, Default)]
struct PendingRows {
    workers: BTreeSet<Rank>,
    index: IdMap,
    ids: Vec<u64>,
    sums: Vec<f32>,
    started: Option<Instant>,
    /// The accumulator's share of the memory budget (`sums`).
    charge: Option<Charge>,
    /// Bytes of the bucket's charge held for rows this step will make when it
    /// completes (given back if it is dropped instead), and how many rows.
    reserved: usize,
    reserved_rows: usize,
}

/// Bytes a push would add to a bucket: rows it makes, and (under BSP) the
/// accumulator rows it opens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NewBytes {
    pub(crate) rows: usize,
    pub(crate) pending: usize,
    /// Rows it makes (or reserves, under BSP).
    pub(crate) rows_made: usize,
}

/// One worker's push to a bucket, admitted by [`BucketState::admit`]:
/// `grads` holds one row per id, and `charge` what [`BucketState::new_bytes`]
/// counted for them.
#[derive(Debug)]
pub(crate) struct PushedRows<'a> {
    pub(crate) worker: Rank,
    pub(crate) step: Step,
    pub(crate) ids: &'a [u64],
    pub(crate) grads: &'a [f32],
    pub(crate) charge: Charge,
    pub(crate) new: NewBytes,
}

/// The mutable state of one bucket.
#[derive(Debug)]
pub struct BucketState {
    width: usize,
    starts: RowStarts,
    index: IdMap,
    ids: Vec<u64>,
    values: Vec<f32>,
    first: Vec<f32>,
    second: Vec<f32>,
    updates: u64,
    version: Version,
    last_step: HashMap<Rank, Step>,
    pending: PendingRows,
    /// The stored rows' share of the memory budget.
    charge: Charge,
}

impl BucketState {
    /// An empty bucket of `table` at version 0; `charge` (empty) grows with its rows.
    pub fn new(table: &TableSpec, charge: Charge) -> Self {
        Self {
            width: table.width,
            starts: RowStarts::of(table),
            index: IdMap::default(),
            ids: Vec::new(),
            values: Vec::new(),
            first: Vec::new(),
            second: Vec::new(),
            updates: 0,
            version: Version(0),
            last_step: HashMap::new(),
            pending: PendingRows::default(),
            charge,
        }
    }

    /// The bucket as a checkpoint holds it, named `key` (see
    /// [`crate::checkpoint::bucket_key`]). A push to the BSP step in progress
    /// is not saved and does not count as pushed, as for a dense key.
    pub fn checkpoint(&self, table: &TableSpec, key: ParamKey) -> KeyCheckpoint {
        let mut steps = self.last_step.clone();
        for worker in &self.pending.workers {
            match self.version.last_step() {
                Some(done) => steps.insert(*worker, done),
                None => steps.remove(worker),
            };
        }
        KeyCheckpoint {
            key,
            spec: table.to_string(),
            layout: None,
            values: self.values.clone(),
            first: self.first.clone(),
            second: self.second.clone(),
            updates: self.updates,
            version: self.version.get(),
            last_step: steps.into_iter().map(|(r, s)| (r.get(), s.get())).collect(),
            rows: Some(self.ids.clone()),
        }
    }

    /// A bucket resumed from `saved`, its rows charged to `charge` (empty);
    /// `Ok(None)` when it was saved with another spec or does not fit it.
    ///
    /// # Errors
    /// `OverBudget` when its rows do not fit the memory budget.
    pub(crate) fn from_checkpoint(
        table: &TableSpec,
        saved: &KeyCheckpoint,
        mut charge: Charge,
    ) -> crate::error::Result<Option<Self>> {
        let Some(ids) = saved.rows.as_ref() else {
            return Ok(None);
        };
        let elements = ids.len() * table.width;
        let kept = table.optimizer.state_per_element();
        let state_len = |n: usize| if kept >= n { elements } else { 0 };
        let fits = saved.spec == table.to_string()
            && saved.values.len() == elements
            && saved.first.len() == state_len(1)
            && saved.second.len() == state_len(2);
        if !fits {
            return Ok(None);
        }
        charge.grow(ids.len() * table.row_bytes(), || {
            format!("restoring {} rows of {}", ids.len(), saved.key)
        })?;
        let index = ids
            .iter()
            .enumerate()
            .map(|(slot, id)| (*id, slot as u32))
            .collect();
        Ok(Some(Self {
            width: table.width,
            starts: RowStarts::of(table),
            index,
            ids: ids.clone(),
            values: saved.values.clone(),
            first: saved.first.clone(),
            second: saved.second.clone(),
            updates: saved.updates,
            version: Version(saved.version),
            last_step: saved
                .last_step
                .iter()
                .map(|(&rank, &step)| (Rank(rank), Step(step)))
                .collect(),
            pending: PendingRows::default(),
            charge,
        }))
    }

    /// Moves the bucket forward to `version`, the step the job is at, when it
    /// is behind (it was restored from an older checkpoint, or made empty):
    /// the updates in between are lost, every step before `version` counts as
    /// pushed by each of the group's `ranks`, and a step in progress is
    /// dropped (with the charge for the rows it would have made). Returns
    /// whether it moved.
    pub fn fast_forward(&mut self, version: Version, ranks: u32) -> bool {
        if version <= self.version {
            return false;
        }
        self.version = version;
        let dropped = std::mem::take(&mut self.pending);
        drop(self.charge.split_off(dropped.reserved));
        if let Some(done) = version.last_step() {
            for rank in (0..ranks).map(Rank) {
                let last = self.last_step.entry(rank).or_insert(done);
                *last = (*last).max(done);
            }
        }
        true
    }

    /// Current version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Rows stored.
    pub fn rows(&self) -> usize {
        self.ids.len()
    }

    /// Rows stored and rows the step in progress will make.
    pub(crate) fn rows_with_pending(&self) -> usize {
        self.ids.len() + self.pending.reserved_rows
    }

    /// Bytes charged for the stored rows and the step in progress.
    pub fn held_bytes(&self) -> usize {
        self.charge.bytes() + self.pending.charge.as_ref().map_or(0, Charge::bytes)
    }

    /// Whether a push of `step` by `worker` would be taken now.
    pub fn admit(&self, consistency: Consistency, worker: Rank, step: Step) -> Admission {
        admit(
            consistency,
            self.version,
            self.last_step.get(&worker).copied(),
            step,
        )
    }

    /// What taking a push of `ids` would add: rows neither stored nor already
    /// waiting in the step in progress, and (under BSP with several workers)
    /// accumulator rows not yet open.
    pub(crate) fn new_bytes(&self, table: &TableSpec, group: Group, ids: &[u64]) -> NewBytes {
        let fresh = ids
            .iter()
            .filter(|id| !self.index.contains_key(id) && !self.pending.index.contains_key(id))
            .count();
        let accumulates = group.consistency == Consistency::Bsp && group.workers > 1;
        let pending = if accumulates {
            ids.iter()
                .filter(|id| !self.pending.index.contains_key(id))
                .count()
                * self.width
                * 4
        } else {
            0
        };
        NewBytes {
            rows: fresh * table.row_bytes(),
            pending,
            rows_made: fresh,
        }
    }

    /// Takes `push`; `live` are the workers a BSP step waits for. When this
    /// push completed a BSP step of several workers: how long the step waited
    /// since its first push.
    pub(crate) fn accept(
        &mut self,
        table: &TableSpec,
        group: Group,
        live: &BTreeSet<Rank>,
        push: PushedRows<'_>,
    ) -> Option<Duration> {
        let PushedRows {
            worker,
            step,
            ids,
            grads,
            mut charge,
            new,
        } = push;
        self.last_step.insert(worker, step);
        let scale = 1.0 / group.workers.max(1) as f32;
        match group.consistency {
            Consistency::Bsp if group.workers > 1 => {
                let pending = charge.split_off(new.pending);
                self.pending.reserved += charge.bytes();
                self.pending.reserved_rows += new.rows_made;
                self.charge.merge(charge);
                self.accumulate(worker, ids, grads, pending);
                return self.complete(table, Consistency::Bsp, live);
            }
            Consistency::Bsp => {
                self.charge.merge(charge);
                self.apply(table, ids, grads, scale);
                self.version = Version::after(step);
            }
            Consistency::Ssp { .. } => {
                self.charge.merge(charge);
                self.apply(table, ids, grads, scale);
                self.version = group_clock(&self.last_step, live);
            }
            Consistency::Asp => {
                self.charge.merge(charge);
                self.apply(table, ids, grads, scale);
                self.version = self.version.next();
            }
        }
        None
    }

    fn accumulate(&mut self, worker: Rank, ids: &[u64], grads: &[f32], charge: Charge) {
        let pending = &mut self.pending;
        if pending.workers.is_empty() {
            pending.started = Some(Instant::now());
        }
        match &mut pending.charge {
            Some(held) => held.merge(charge),
            None => pending.charge = Some(charge),
        }
        for (id, grad) in ids.iter().zip(grads.chunks_exact(self.width)) {
            let slot = *pending.index.entry(*id).or_insert_with(|| {
                pending.ids.push(*id);
                pending.sums.resize(pending.sums.len() + self.width, 0.0);
                (pending.ids.len() - 1) as u32
            }) as usize;
            let sum = &mut pending.sums[slot * self.width..(slot + 1) * self.width];
            for (s, g) in sum.iter_mut().zip(grad) {
                *s += g;
            }
        }
        pending.workers.insert(worker);
    }

    /// Under BSP, applies the step in progress once every worker in `live` has
    /// pushed it: each row's summed gradient divided by the workers that pushed
    /// the step (a worker whose batch missed a row adds zero to it, as a dense
    /// gradient's zero does). Returns how long the step waited when it applied
    /// one. Called after each push and whenever the live set shrinks.
    pub(crate) fn complete(
        &mut self,
        table: &TableSpec,
        consistency: Consistency,
        live: &BTreeSet<Rank>,
    ) -> Option<Duration> {
        let ready = consistency == Consistency::Bsp
            && !self.pending.workers.is_empty()
            && live.iter().all(|w| self.pending.workers.contains(w));
        if !ready {
            return None;
        }
        let pending = std::mem::take(&mut self.pending);
        let scale = 1.0 / pending.workers.len() as f32;
        self.apply(table, &pending.ids, &pending.sums, scale);
        self.version = self.version.next();
        Some(pending.started.map_or(Duration::ZERO, |s| s.elapsed()))
    }

    /// One update: `grads * scale` applied to the rows of `ids`, each made
    /// first if it is new.
    fn apply(&mut self, table: &TableSpec, ids: &[u64], grads: &[f32], scale: f32) {
        self.updates += 1;
        let width = self.width;
        for (id, grad) in ids.iter().zip(grads.chunks_exact(width)) {
            let slot = self.slot_or_insert(table, *id);
            let span = slot * width..(slot + 1) * width;
            let row = RowSlices {
                values: &mut self.values[span.clone()],
                first: state_row(&mut self.first, span.clone()),
                second: state_row(&mut self.second, span),
            };
            update_row(&table.optimizer, row, grad, scale, self.updates);
        }
    }

    fn slot_or_insert(&mut self, table: &TableSpec, id: u64) -> usize {
        if let Some(&slot) = self.index.get(&id) {
            return slot as usize;
        }
        let slot = self.ids.len();
        self.ids.push(id);
        self.index.insert(id, slot as u32);
        let start = self.values.len();
        self.values.resize(start + self.width, 0.0);
        self.starts.fill(id, &mut self.values[start..]);
        let state = initial_state(&table.optimizer);
        let kept = table.optimizer.state_per_element();
        if kept >= 1 {
            self.first.resize(start + self.width, state);
        }
        if kept >= 2 {
            self.second.resize(start + self.width, 0.0);
        }
        slot
    }

    /// Appends the rows of `ids` to `out` as little-endian `f32`s: stored rows
    /// as they are, the others as they start.
    pub fn read_into(&self, ids: &[u64], out: &mut Vec<u8>) {
        let mut fresh = vec![0.0f32; self.width];
        for id in ids {
            let row = match self.index.get(id) {
                Some(&slot) => {
                    let start = slot as usize * self.width;
                    &self.values[start..start + self.width]
                }
                None => {
                    self.starts.fill(*id, &mut fresh);
                    &fresh
                }
            };
            extend_rows(out, row);
        }
    }

    /// The workers of the group that have not yet pushed the step the bucket
    /// waits for.
    pub fn missing_workers(&self, group: Group, live: &BTreeSet<Rank>) -> Vec<Rank> {
        let pushed = &self.pending.workers;
        crate::consistency::missing_workers(group.consistency, pushed, &self.last_step, live)
    }
}

/// The state slice of a row, or an empty one when the optimizer keeps none.
fn state_row(state: &mut [f32], span: std::ops::Range<usize>) -> &mut [f32] {
    if state.is_empty() {
        &mut []
    } else {
        &mut state[span]
    }
}
