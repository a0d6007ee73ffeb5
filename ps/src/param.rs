//! One key's state: its spec, values, optimizer, version, the last step each
//! worker pushed, and the BSP accumulator of the step in progress.
//!
//! Every method here is synchronous and runs under the key's lock, so a mutation
//! happens entirely or not at all even when the request's future is dropped.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_proto::codec::{DType, TensorData, encode_f32};
use ps_proto::header::TensorHeader;
use ps_proto::ids::{Rank, Step, Version};
use ps_shm::arena::Arena;

use crate::checkpoint::{KeyCheckpoint, Layout};
use crate::consistency::{Admission, Consistency, admit};
use crate::optimizer::{Gradient, Optimizer, OptimizerSpec};
use crate::values::Values;

/// What a key is: immutable once registered.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The key, the wire dtype of values and gradients, and the shape.
    pub header: TensorHeader,
    /// For a partition, the whole parameter's shape; empty for a whole parameter.
    pub whole_shape: Vec<usize>,
    /// Optimizer and hyper-parameters.
    pub optimizer: OptimizerSpec,
}

impl ParamSpec {
    /// The layout a checkpoint records for this key.
    pub fn layout(&self) -> Layout {
        Layout {
            dtype: self.header.dtype,
            shape: self.header.shape.clone(),
            whole_shape: self.whole_shape.clone(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.header.len()
    }

    /// `arena`, for a key whose values it may hold: one pulled in `f32`.
    /// Workers copy only `f32` values out of the arena (a half-precision
    /// pull is a snapshot on the heap), so another dtype's values there
    /// would only take whole pages for nothing.
    pub fn arena_for<'a>(&self, arena: Option<&'a Arc<Arena>>) -> Option<&'a Arc<Arena>> {
        arena.filter(|_| self.header.dtype == DType::F32)
    }

    /// The most bytes a key of this spec holds, charged to the memory budget when
    /// it is registered: its `f32` values, optimizer state, a BSP accumulator
    /// (whenever the consistency model is BSP, whose group may grow) and one
    /// more copy in the wire dtype: a half-precision pull snapshot, or the `f32`
    /// values a pull still holds when an update copies them.
    pub fn footprint(&self, consistency: Consistency) -> usize {
        let accumulator = usize::from(consistency == Consistency::Bsp);
        let f32_copies = 1 + self.optimizer.state_per_element() + accumulator;
        let per_element = f32_copies * std::mem::size_of::<f32>() + self.header.dtype.size();
        self.len().saturating_mul(per_element)
    }

    /// True when the parameter has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A one-line description, for error messages.
    pub fn describe(&self) -> String {
        let header = self.header.describe();
        if self.whole_shape.is_empty() {
            format!("{header} with {}", self.optimizer)
        } else {
            format!("{header} of {:?} with {}", self.whole_shape, self.optimizer)
        }
    }
}

/// How pushes combine: the consistency model and the size of the worker group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Consistency model.
    pub consistency: Consistency,
    /// Number of workers. Under ASP and SSP each gradient is applied scaled by
    /// `1 / workers`; a BSP step is the mean over the workers that pushed it
    /// (`1 / pushed`, which is `1 / workers` unless the live set shrank).
    pub workers: u32,
}

/// The BSP step being accumulated.
#[derive(Debug, Default)]
struct Pending {
    workers: BTreeSet<Rank>,
    sum: Vec<f32>,
    /// When the step's first push came.
    started: Option<Instant>,
}

/// The bytes one key holds, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldBytes {
    /// The parameter's values.
    pub values: usize,
    /// The optimizer's state (moments).
    pub optimizer: usize,
    /// The BSP step's gradient sum.
    pub accumulator: usize,
    /// The encoded values that pulls are answered from.
    pub snapshot: usize,
}

impl HeldBytes {
    /// All of them.
    pub fn total(&self) -> usize {
        self.values + self.optimizer + self.accumulator + self.snapshot
    }

    /// Each kind with its name, as metrics label them.
    pub fn by_kind(&self) -> [(&'static str, usize); 4] {
        [
            ("values", self.values),
            ("optimizer_state", self.optimizer),
            ("accumulator", self.accumulator),
            ("pull_snapshot", self.snapshot),
        ]
    }
}

impl std::ops::AddAssign for HeldBytes {
    fn add_assign(&mut self, other: Self) {
        self.values += other.values;
        self.optimizer += other.optimizer;
        self.accumulator += other.accumulator;
        self.snapshot += other.snapshot;
    }
}

/// The mutable state of one key.
#[derive(Debug)]
pub struct KeyState {
    values: Values,
    optimizer: Optimizer,
    version: Version,
    last_step: HashMap<Rank, Step>,
    pending: Pending,
    snapshot: Option<Bytes>,
}

impl KeyState {
    /// A key at version 0 holding `values`.
    pub fn new(spec: &ParamSpec, values: impl Into<Values>) -> Self {
        let values = values.into();
        values.publish(Version(0));
        Self {
            optimizer: Optimizer::new(spec.optimizer.clone(), values.len()),
            values,
            version: Version(0),
            last_step: HashMap::new(),
            pending: Pending::default(),
            snapshot: None,
        }
    }

    /// The key as a checkpoint holds it.
    pub fn checkpoint(&self, spec: &ParamSpec) -> KeyCheckpoint {
        let (first, second, updates) = self.optimizer.state();
        KeyCheckpoint {
            key: spec.header.key.clone(),
            spec: spec.describe(),
            layout: Some(spec.layout()),
            values: self.values.as_slice().to_vec(),
            first: first.to_vec(),
            second: second.to_vec(),
            updates,
            version: self.version.get(),
            last_step: self
                .steps_in_values()
                .into_iter()
                .map(|(rank, step)| (rank.get(), step.get()))
                .collect(),
            rows: None,
        }
    }

    /// The last step of each worker that the values hold. A push to the BSP step
    /// in progress sits in the accumulator, which a checkpoint does not keep: it
    /// does not count, so that after a restore the worker's repeat of it is taken
    /// rather than acknowledged as a duplicate and lost (which left the step
    /// waiting for that worker for ever).
    fn steps_in_values(&self) -> HashMap<Rank, Step> {
        let mut steps = self.last_step.clone();
        for worker in &self.pending.workers {
            match self.version.last_step() {
                Some(done) => steps.insert(*worker, done),
                None => steps.remove(worker),
            };
        }
        steps
    }

    /// A key resumed from `checkpoint`, or `None` when it was saved with another spec.
    pub fn from_checkpoint(spec: &ParamSpec, checkpoint: &KeyCheckpoint) -> Option<Self> {
        if checkpoint.spec != spec.describe() || checkpoint.values.len() != spec.len() {
            return None;
        }
        let optimizer = Optimizer::with_state(
            spec.optimizer.clone(),
            spec.len(),
            checkpoint.first.clone(),
            checkpoint.second.clone(),
            checkpoint.updates,
        )?;
        Some(Self {
            values: Values::new(checkpoint.values.clone()),
            optimizer,
            version: Version(checkpoint.version),
            last_step: checkpoint
                .last_step
                .iter()
                .map(|(&rank, &step)| (Rank(rank), Step(step)))
                .collect(),
            pending: Pending::default(),
            snapshot: None,
        })
    }

    /// Takes `values` at `version` from a worker's copy (the key was lost with its
    /// server): every step before `version` counts as pushed by each of the group's
    /// `ranks`, so a retried push of such a step is a duplicate, and a step in
    /// progress is dropped (its pushes are repeated by the workers).
    pub fn restore(&mut self, values: impl Into<Values>, version: Version, ranks: u32) {
        self.values = values.into();
        self.version = version;
        self.values.publish(version);
        self.pending = Pending::default();
        self.snapshot = None;
        if let Some(done) = version.last_step() {
            for rank in (0..ranks).map(Rank) {
                let last = self.last_step.entry(rank).or_insert(done);
                *last = (*last).max(done);
            }
        }
    }

    /// Moves the values into `arena` when they belong there
    /// ([`Values::placed_in`]).
    pub fn place_in(&mut self, arena: &Arc<Arena>) {
        let values = std::mem::replace(&mut self.values, Values::new(Vec::new()));
        self.values = values.placed_in(arena);
        self.values.publish(self.version);
    }

    /// Current version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Bytes held, by what they hold.
    pub fn held(&self) -> HeldBytes {
        let f32_bytes = std::mem::size_of::<f32>();
        HeldBytes {
            values: self.values.len() * f32_bytes,
            optimizer: self.optimizer.state_bytes(),
            accumulator: self.pending.sum.capacity() * f32_bytes,
            snapshot: self.snapshot.as_ref().map_or(0, Bytes::len),
        }
    }

    /// Whether a push of `step` by `worker` would be taken now.
    pub fn admit(&self, group: Group, worker: Rank, step: Step) -> Admission {
        let last = self.last_step.get(&worker).copied();
        admit(group.consistency, self.version, last, step)
    }

    /// Takes a gradient already admitted by [`KeyState::admit`]; `live` are the
    /// workers a BSP step waits for. When this push completed a BSP step of
    /// several workers: how long the step waited since its first push.
    pub fn accept(
        &mut self,
        group: Group,
        live: &BTreeSet<Rank>,
        worker: Rank,
        step: Step,
        grad: &TensorData,
    ) -> Option<Duration> {
        self.last_step.insert(worker, step);
        let scale = 1.0 / group.workers.max(1) as f32;
        match group.consistency {
            Consistency::Bsp if group.workers <= 1 => {
                self.update(Gradient::Wire(grad), scale, Version::after(step));
                None
            }
            Consistency::Bsp => self.accumulate(live, worker, grad),
            Consistency::Ssp { .. } => {
                let version = self.group_clock(live);
                self.update(Gradient::Wire(grad), scale, version);
                None
            }
            Consistency::Asp => {
                self.update(Gradient::Wire(grad), scale, self.version.next());
                None
            }
        }
    }

    fn accumulate(
        &mut self,
        live: &BTreeSet<Rank>,
        worker: Rank,
        grad: &TensorData,
    ) -> Option<Duration> {
        if self.pending.workers.is_empty() {
            self.pending.sum.clear();
            self.pending.sum.resize(self.values.len(), 0.0);
            self.pending.started = Some(Instant::now());
        }
        Gradient::Wire(grad).add_scaled_into(&mut self.pending.sum, 1.0);
        self.pending.workers.insert(worker);
        self.complete(Consistency::Bsp, live)
    }

    /// Under BSP, applies the step in progress once every worker in `live` has pushed
    /// it, averaging over the workers that did; returns how long the step waited
    /// since its first push when it applied one. Called after each push and
    /// whenever the live set shrinks.
    pub fn complete(
        &mut self,
        consistency: Consistency,
        live: &BTreeSet<Rank>,
    ) -> Option<Duration> {
        let ready = consistency == Consistency::Bsp
            && !self.pending.workers.is_empty()
            && live.iter().all(|w| self.pending.workers.contains(w));
        if !ready {
            return None;
        }
        let sum = std::mem::take(&mut self.pending.sum);
        let scale = 1.0 / self.pending.workers.len() as f32;
        self.update(Gradient::Dense(&sum), scale, self.version.next());
        self.pending.sum = sum;
        self.pending.workers.clear();
        let started = self.pending.started.take();
        Some(started.map_or(Duration::ZERO, |s| s.elapsed()))
    }

    /// Applies `grad` times `scale` to the values, which makes them the
    /// key's values at `version` (said in their stamp in the same change,
    /// [`Values::update`]).
    fn update(&mut self, grad: Gradient<'_>, scale: f32, version: Version) {
        let optimizer = &mut self.optimizer;
        self.values
            .update(version, |values| optimizer.apply(values, grad, scale));
        self.version = version;
        self.snapshot = None;
    }

    /// The lowest `step + 1` pushed by any live worker (0 if one never pushed).
    fn group_clock(&self, live: &BTreeSet<Rank>) -> Version {
        crate::consistency::group_clock(&self.last_step, live)
    }

    /// The values encoded in `dtype` and their version. In `f32` they are the
    /// stored values themselves, shared until the next update; otherwise they are
    /// encoded once per version and shared by every pull of it.
    pub fn snapshot(&mut self, dtype: DType) -> (Bytes, Version) {
        if let Some(shared) = self.values.share_as(dtype) {
            return (shared, self.version);
        }
        let values = &self.values;
        let bytes = self
            .snapshot
            .get_or_insert_with(|| encode_f32(dtype, values.as_slice()))
            .clone();
        (bytes, self.version)
    }

    /// The workers of the group that have not yet pushed the step the key waits for.
    pub fn missing_workers(&self, group: Group, live: &BTreeSet<Rank>) -> Vec<Rank> {
        let pushed = &self.pending.workers;
        crate::consistency::missing_workers(group.consistency, pushed, &self.last_step, live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::key::ParamKey;

    fn spec(len: usize) -> ParamSpec {
        ParamSpec {
            header: TensorHeader::new(ParamKey::new("w", 0), DType::F32, vec![len]),
            whole_shape: Vec::new(),
            optimizer: OptimizerSpec::Sgd {
                lr: 1.0,
                weight_decay: 0.0,
            },
        }
    }

    fn grad(values: &[f32]) -> TensorData {
        TensorData::from_f32(DType::F32, vec![values.len()], values)
    }

    fn all(workers: u32) -> BTreeSet<Rank> {
        (0..workers).map(Rank).collect()
    }

    #[test]
    fn a_shrinking_group_completes_the_step_with_the_live_workers() {
        let mut state = KeyState::new(&spec(1), vec![0.0]);
        let group = Group {
            consistency: Consistency::Bsp,
            workers: 3,
        };
        state.accept(group, &all(3), Rank(0), Step(0), &grad(&[3.0]));
        state.accept(group, &all(3), Rank(2), Step(0), &grad(&[1.0]));
        assert_eq!(
            (state.version(), state.missing_workers(group, &all(3))),
            (Version(0), vec![Rank(1)])
        );
        let without_1: BTreeSet<Rank> = [Rank(0), Rank(2)].into();
        assert!(state.complete(Consistency::Bsp, &without_1).is_some());
        assert_eq!(state.version(), Version(1));
        assert_eq!(
            state.values.as_slice(),
            [-2.0],
            "the average of the two pushes that came"
        );
        assert!(
            state.complete(Consistency::Bsp, &without_1).is_none(),
            "nothing pending any more"
        );
        state.accept(group, &without_1, Rank(0), Step(1), &grad(&[1.0]));
        state.accept(group, &without_1, Rank(2), Step(1), &grad(&[1.0]));
        assert_eq!(
            state.version(),
            Version(2),
            "later steps wait for the live workers only"
        );
    }

    const BSP2: Group = Group {
        consistency: Consistency::Bsp,
        workers: 2,
    };

    #[test]
    fn bsp_applies_the_average_once_when_the_group_is_complete() {
        let mut state = KeyState::new(&spec(2), vec![0.0, 0.0]);
        state.accept(BSP2, &all(2), Rank(0), Step(0), &grad(&[2.0, 4.0]));
        assert_eq!(state.version(), Version(0));
        assert_eq!(state.values.as_slice(), [0.0, 0.0]);
        assert_eq!(state.missing_workers(BSP2, &all(2)), vec![Rank(1)]);
        assert_eq!(state.admit(BSP2, Rank(0), Step(0)), Admission::Duplicate);
        state.accept(BSP2, &all(2), Rank(1), Step(0), &grad(&[4.0, 0.0]));
        assert_eq!(state.version(), Version(1));
        assert_eq!(state.values.as_slice(), [-3.0, -2.0]);
        assert_eq!(state.admit(BSP2, Rank(1), Step(0)), Admission::Duplicate);
        assert_eq!(
            state.admit(BSP2, Rank(0), Step(2)),
            Admission::Future { max_step: Step(1) }
        );
    }

    #[test]
    fn a_push_to_the_step_in_progress_is_taken_again_after_a_restore_from_a_checkpoint() {
        for version in [0, 5] {
            let mut state = KeyState::new(&spec(1), vec![0.0]);
            state.restore(vec![0.0], Version(version), 2);
            state.accept(BSP2, &all(2), Rank(0), Step(version), &grad(&[2.0]));
            let saved = state.checkpoint(&spec(1));
            let mut restored = KeyState::from_checkpoint(&spec(1), &saved).expect("same spec");
            assert_eq!(
                restored.admit(BSP2, Rank(0), Step(version)),
                Admission::Accept,
                "worker 0's push of step {version} is not in the saved values"
            );
            restored.accept(BSP2, &all(2), Rank(0), Step(version), &grad(&[2.0]));
            restored.accept(BSP2, &all(2), Rank(1), Step(version), &grad(&[4.0]));
            assert_eq!(
                (restored.version(), restored.values.as_slice()),
                (Version(version + 1), &[-3.0][..]),
                "the step completes with both pushes, each once"
            );
        }
    }

    #[test]
    fn ssp_version_is_the_slowest_workers_clock() {
        let group = Group {
            consistency: Consistency::Ssp { staleness: 1 },
            workers: 2,
        };
        let mut state = KeyState::new(&spec(1), vec![0.0]);
        state.accept(group, &all(group.workers), Rank(0), Step(0), &grad(&[1.0]));
        assert_eq!(state.version(), Version(0), "worker 1 has not pushed");
        assert_eq!(state.admit(group, Rank(0), Step(1)), Admission::Accept);
        state.accept(group, &all(group.workers), Rank(0), Step(1), &grad(&[1.0]));
        assert_eq!(
            state.admit(group, Rank(0), Step(2)),
            Admission::Future { max_step: Step(1) }
        );
        assert_eq!(
            state.missing_workers(group, &all(group.workers)),
            vec![Rank(1)]
        );
        state.accept(group, &all(group.workers), Rank(1), Step(0), &grad(&[1.0]));
        assert_eq!(state.version(), Version(1));
        assert_eq!(
            state.values.as_slice(),
            [-1.5],
            "three pushes, each scaled by 1/2"
        );
    }

    #[test]
    fn asp_bumps_the_version_per_push() {
        let group = Group {
            consistency: Consistency::Asp,
            workers: 1,
        };
        let mut state = KeyState::new(&spec(1), vec![0.0]);
        state.accept(group, &all(group.workers), Rank(7), Step(0), &grad(&[1.0]));
        state.accept(group, &all(group.workers), Rank(3), Step(5), &grad(&[1.0]));
        assert_eq!(state.version(), Version(2));
        assert_eq!(state.admit(group, Rank(3), Step(5)), Admission::Duplicate);
    }

    #[test]
    fn snapshot_is_reencoded_after_an_update() {
        let group = Group {
            consistency: Consistency::Bsp,
            workers: 1,
        };
        let mut state = KeyState::new(&spec(1), vec![1.0]);
        let (before, v0) = state.snapshot(DType::F32);
        state.accept(group, &all(group.workers), Rank(0), Step(0), &grad(&[1.0]));
        let (after, v1) = state.snapshot(DType::F32);
        assert_eq!((v0, v1), (Version(0), Version(1)));
        assert_eq!(before.as_ref(), 1.0f32.to_le_bytes());
        assert_eq!(after.as_ref(), 0.0f32.to_le_bytes());
    }
}
