//! [`Store`]: the keys of one shard and the operations on them.
//!
//! Each key sits behind its own `std::sync::Mutex`, never held across `.await`.
//! A request that touches several keys validates everything first, then locks
//! its keys in sorted order (so two requests cannot deadlock) and checks and
//! applies in one synchronous section: it changes all its keys or none.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ps_proto::codec::{DType, TensorData, first_non_finite};
use ps_proto::header::TensorHeader;
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_shm::arena::Arena;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::announced::Announced;
use crate::applied_map::AppliedMap;
use crate::budget::{Charge, MemoryBudget};
use crate::entry::{Entry, apply_all, snapshot};
pub use crate::entry::{Pulled, Pushed};
use crate::error::{Error, Result};
use crate::param::{Group, HeldBytes, ParamSpec};
use crate::restore::{Archive, Offered, new_key, refresh_key};
use crate::step_waits::StepWaits;
use crate::table::Tables;

mod rows;
pub use rows::{DeclaredBucket, PulledRows, PulledTable, PushedBucket, RowBlock};

/// The outcome of registering one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The key.
    pub key: ParamKey,
    /// True when this call created it.
    pub created: bool,
    /// Its version.
    pub version: Version,
}

/// Per-key figures for [`Stats`].
#[derive(Debug, Clone)]
pub struct KeySummary {
    /// The key's spec.
    pub spec: ParamSpec,
    /// Its version.
    pub version: Version,
    /// Bytes held for it.
    pub bytes: usize,
    /// The same bytes, by kind.
    pub held: HeldBytes,
}

/// Push requests a store took since it was made, and their gradient bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushLoad {
    /// Push requests applied or taken as retries.
    pub pushes: u64,
    /// Their gradient bytes.
    pub push_bytes: u64,
}

/// What the store holds and has served.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Per key, sorted.
    pub keys: Vec<KeySummary>,
    /// Push requests answered OK.
    pub pushes: u64,
    /// Pull requests answered OK.
    pub pulls: u64,
    /// Gradients acknowledged as retries.
    pub duplicate_pushes: u64,
    /// Requests refused.
    pub rejected: u64,
    /// Bytes charged to the memory budget.
    pub memory_held: usize,
    /// The memory budget.
    pub memory_budget: usize,
}

/// Rules the store enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreRules {
    /// Consistency model and group size.
    pub group: Group,
    /// Refuse NaN and infinite gradients and initial values.
    pub reject_non_finite: bool,
    /// Largest parameter that may be registered, in bytes of values.
    pub max_tensor_bytes: usize,
    /// Bytes the store may hold (see [`MemoryBudget`]).
    pub memory_budget: usize,
}

#[derive(Debug, Default)]
struct Counters {
    pushes: AtomicU64,
    push_bytes: AtomicU64,
    pulls: AtomicU64,
    duplicate_pushes: AtomicU64,
    rejected: AtomicU64,
}

/// The keys of one parameter-server shard.
#[derive(Debug)]
pub struct Store {
    rules: StoreRules,
    keys: RwLock<HashMap<ParamKey, Arc<Entry>>>,
    live: RwLock<Arc<BTreeSet<Rank>>>,
    workers: AtomicU32,
    map: AppliedMap,
    archive: Option<Archive>,
    /// Where `f32` keys' values of 2 KiB or more go, for workers on this host to read.
    arena: Option<Arc<Arena>>,
    budget: Arc<MemoryBudget>,
    counters: Counters,
    step_waits: StepWaits,
    shutdown: CancellationToken,
    tables: Tables,
}

impl Store {
    /// An empty store. Waits end with [`Error::ShuttingDown`] once `shutdown` is cancelled.
    pub fn new(rules: StoreRules, shutdown: CancellationToken) -> Self {
        Self {
            rules,
            keys: RwLock::new(HashMap::new()),
            live: RwLock::new(Arc::new((0..rules.group.workers).map(Rank).collect())),
            workers: AtomicU32::new(rules.group.workers),
            map: AppliedMap::default(),
            archive: None,
            arena: None,
            budget: MemoryBudget::new(rules.memory_budget),
            counters: Counters::default(),
            step_waits: StepWaits::default(),
            shutdown,
            tables: Tables::default(),
        }
    }

    /// The memory budget every allocation a request causes is charged to.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// The workers a BSP step waits for (all of the group until told otherwise).
    pub fn live_workers(&self) -> Arc<BTreeSet<Rank>> {
        Arc::clone(&self.live.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Loads the checkpoints under `root` now, and reads them again when a key
    /// must be restored.
    pub fn with_archive(mut self, root: impl Into<std::path::PathBuf>) -> Self {
        self.archive = Some(Archive::load(root));
        self
    }

    /// Keeps `f32` keys' values of 2 KiB or more in `arena`, which workers with a shared-memory
    /// session map read-only, so that their pulls copy the values once.
    pub fn with_arena(mut self, arena: Option<Arc<Arena>>) -> Self {
        if let Some(arena) = &arena {
            self.map.mirror_into(Arc::clone(arena));
        }
        self.arena = arena;
        self
    }

    /// Every stored key, taken out from under the map's lock, so each can then
    /// be locked on its own.
    fn all_entries(&self) -> Vec<Arc<Entry>> {
        let map = self.keys.read().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }

    /// Every key's and table bucket's state as a checkpoint holds it, each
    /// read under its lock.
    pub fn checkpoint_keys(&self) -> Vec<crate::checkpoint::KeyCheckpoint> {
        let entries = self.all_entries();
        let mut keys: Vec<_> = entries
            .iter()
            .map(|entry| entry.lock().checkpoint(&entry.spec))
            .collect();
        keys.extend(self.checkpoint_buckets());
        keys
    }

    /// The highest version of any key or bucket (0 when empty): how far
    /// training has come.
    pub fn max_version(&self) -> Version {
        let map = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let dense = map.values().map(|e| e.version.get()).max();
        dense.unwrap_or_default().max(self.max_bucket_version())
    }

    /// The shard-map version this server has applied, and the check of requests
    /// against it.
    pub fn map(&self) -> &AppliedMap {
        &self.map
    }

    /// The consistency model and the current group size.
    pub fn group(&self) -> Group {
        Group {
            consistency: self.rules.group.consistency,
            workers: self.workers.load(Ordering::Relaxed),
        }
    }

    /// Sets the group size and the workers a BSP step waits for (from the scheduler's
    /// shard map), and completes every step that was waiting only for workers no
    /// longer live. Returns how many keys advanced.
    pub fn set_group(&self, workers: u32, live: BTreeSet<Rank>) -> usize {
        self.workers.store(workers.max(1), Ordering::Relaxed);
        self.set_live_workers(live)
    }

    /// Sets the workers a BSP step waits for and completes every step that was waiting
    /// only for workers no longer live. Returns how many keys advanced.
    pub fn set_live_workers(&self, live: BTreeSet<Rank>) -> usize {
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(live.clone());
        let entries = self.all_entries();
        let mut advanced = 0;
        for entry in entries {
            let mut state = entry.lock();
            if let Some(waited) = state.complete(self.rules.group.consistency, &live) {
                self.step_waits.record(waited, None);
                advanced += 1;
                entry.announce(state.version());
            }
        }
        advanced + self.complete_buckets(&live)
    }

    /// The rules this store enforces.
    pub fn rules(&self) -> StoreRules {
        self.rules
    }

    /// Counts a refused request; returns the error for chaining.
    pub fn reject(&self, error: Error) -> Error {
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%error, "request refused");
        error
    }

    pub(crate) fn check_serving(&self) -> Result<()> {
        if self.shutdown.is_cancelled() {
            Err(Error::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// Registers parameters with optional initial values (zeros when absent).
    /// Idempotent per key; all or nothing.
    ///
    /// # Errors
    /// `ShuttingDown`; `EmptyRequest`; `RepeatedKey`; `TensorTooLarge`;
    /// `DtypeMismatch` or `ShapeMismatch` for initial values that do not fit
    /// their spec; `NonFinite`; `SpecConflict` with a key held under another
    /// spec; `OverBudget` for new keys' footprint.
    pub fn register(
        &self,
        params: Vec<(ParamSpec, Option<TensorData>)>,
        restore_version: Version,
    ) -> Result<Vec<Registered>> {
        self.check_serving()?;
        if params.is_empty() {
            return Err(Error::EmptyRequest {
                what: "no parameters to register",
            });
        }
        check_unique(params.iter().map(|(spec, _)| &spec.header.key))?;
        for (spec, initial) in &params {
            self.check_size(spec)?;
            self.check_initial(spec, initial.as_ref())?;
        }
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        for (spec, _) in &params {
            if let Some(existing) = keys.get(&spec.header.key).filter(|e| e.spec != *spec) {
                return Err(Error::SpecConflict {
                    key: spec.header.key.clone(),
                    existing: existing.spec.describe(),
                    requested: spec.describe(),
                });
            }
        }
        let group = self.group();
        let ranks = if group.consistency.has_group() {
            group.workers
        } else {
            0
        };
        let mut charge = self.charge_new_keys(&keys, &params)?;
        let registered = params
            .into_iter()
            .map(|(spec, initial)| {
                let footprint = spec.footprint(group.consistency);
                let share = charge.split_off(if keys.contains_key(&spec.header.key) {
                    0
                } else {
                    footprint
                });
                let values = initial.map(|t| t.to_f32_vec());
                let offered = Offered {
                    values: values.as_deref(),
                    version: restore_version,
                    ranks,
                };
                insert_or_refresh(
                    &mut keys,
                    spec,
                    offered,
                    share,
                    (self.archive.as_ref(), self.arena.as_ref()),
                )
            })
            .collect();
        Ok(registered)
    }

    /// Charges the footprint of every key of `params` that `keys` lacks, all at once.
    fn charge_new_keys(
        &self,
        keys: &HashMap<ParamKey, Arc<Entry>>,
        params: &[(ParamSpec, Option<TensorData>)],
    ) -> Result<Charge> {
        let consistency = self.group().consistency;
        let new: Vec<&ParamSpec> = params
            .iter()
            .map(|(spec, _)| spec)
            .filter(|spec| !keys.contains_key(&spec.header.key))
            .collect();
        let bytes = new.iter().fold(0usize, |sum, spec| {
            sum.saturating_add(spec.footprint(consistency))
        });
        self.budget.charge(bytes, || match new.as_slice() {
            [one] => format!("registering {} ({})", one.header.key, one.describe()),
            many => format!("registering {} new keys", many.len()),
        })
    }

    /// Refuses a parameter larger than the configured limit.
    ///
    /// # Errors
    /// `TensorTooLarge`.
    pub fn check_size(&self, spec: &ParamSpec) -> Result<()> {
        let bytes = spec.len() * spec.header.dtype.size();
        let limit = self.rules.max_tensor_bytes;
        if bytes > limit {
            return Err(Error::TensorTooLarge {
                key: spec.header.key.clone(),
                bytes,
                limit,
            });
        }
        Ok(())
    }

    /// Checks the first chunk of a streamed gradient against the key it names, so a
    /// stream for an unknown key or the wrong shape is refused before it is read.
    ///
    /// # Errors
    /// `UnknownKey`, `DtypeMismatch`, `ShapeMismatch`.
    pub fn check_gradient_header(&self, header: &TensorHeader) -> Result<()> {
        let entry = self.entries(std::iter::once(&header.key))?.remove(0);
        check_dtype_and_shape(&entry.spec, header.dtype, &header.shape)
    }

    /// Checks one chunk of a streamed gradient for NaN and infinity as it arrives,
    /// while its bytes are still in cache, so that a bad stream is refused at the
    /// chunk that holds the element. A stream checked this way is applied with
    /// [`Store::push_checked`].
    ///
    /// # Errors
    /// `NonFinite`, naming the element's index in the whole gradient.
    pub fn check_gradient_chunk(
        &self,
        header: &TensorHeader,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        if !self.rules.reject_non_finite {
            return Ok(());
        }
        match first_non_finite(header.dtype, data) {
            Some((index, value)) => Err(Error::NonFinite {
                key: header.key.clone(),
                what: "gradient",
                index: usize::try_from(offset).unwrap_or(usize::MAX) / header.dtype.size() + index,
                value,
            }),
            None => Ok(()),
        }
    }

    fn check_initial(&self, spec: &ParamSpec, initial: Option<&TensorData>) -> Result<()> {
        let Some(initial) = initial else {
            return Ok(());
        };
        check_dtype_and_shape(spec, initial.dtype(), initial.shape())?;
        self.check_finite(&spec.header.key, "initial value", initial)
    }

    fn check_finite(&self, key: &ParamKey, what: &'static str, tensor: &TensorData) -> Result<()> {
        if !self.rules.reject_non_finite {
            return Ok(());
        }
        match tensor.first_non_finite() {
            Some((index, value)) => Err(Error::NonFinite {
                key: key.clone(),
                what,
                index,
                value,
            }),
            None => Ok(()),
        }
    }

    fn entries<'a>(&self, keys: impl Iterator<Item = &'a ParamKey>) -> Result<Vec<Arc<Entry>>> {
        let map = self.keys.read().unwrap_or_else(|p| p.into_inner());
        keys.map(|key| {
            map.get(key).cloned().ok_or_else(|| Error::UnknownKey {
                key: key.clone(),
                known: map.len(),
            })
        })
        .collect()
    }

    /// The bytes of `keys`' values in their wire dtype: what a pull of them carries.
    ///
    /// # Errors
    /// `UnknownKey`.
    pub fn pull_bytes(&self, keys: &[ParamKey]) -> Result<usize> {
        let entries = self.entries(keys.iter())?;
        Ok(entries.iter().fold(0usize, |sum, entry| {
            sum.saturating_add(
                entry
                    .spec
                    .len()
                    .saturating_mul(entry.spec.header.dtype.size()),
            )
        }))
    }

    /// Pushes `worker`'s gradients of `step`. All or nothing; a gradient whose
    /// `(worker, step)` was taken before is acknowledged with `accepted: false`.
    ///
    /// # Errors
    /// `EmptyRequest`, `WorkerOutsideGroup`, `RepeatedKey`, `UnknownKey`, `DtypeMismatch`,
    /// `ShapeMismatch`, `NonFinite`, `FutureStep`, `StaleStep`, `ShuttingDown`.
    pub fn push(
        &self,
        worker: Rank,
        step: Step,
        grads: Vec<(ParamKey, TensorData)>,
    ) -> Result<Vec<Pushed>> {
        self.push_with(worker, step, grads, Finite::Unchecked)
    }

    /// [`Store::push`] of gradients already checked for NaN and infinity
    /// (every chunk of a stream by [`Store::check_gradient_chunk`]; a
    /// shared-memory push tested as it was copied off the ring, any piece
    /// holding one given to it): they are not scanned again.
    ///
    /// # Errors
    /// As [`Store::push`], but never `NonFinite`.
    pub fn push_checked(
        &self,
        worker: Rank,
        step: Step,
        grads: Vec<(ParamKey, TensorData)>,
    ) -> Result<Vec<Pushed>> {
        self.push_with(worker, step, grads, Finite::Checked)
    }

    fn push_with(
        &self,
        worker: Rank,
        step: Step,
        grads: Vec<(ParamKey, TensorData)>,
        finite: Finite,
    ) -> Result<Vec<Pushed>> {
        self.check_serving()?;
        let group = self.group();
        if grads.is_empty() {
            return Err(Error::EmptyRequest {
                what: "no gradients to push",
            });
        }
        if group.consistency.has_group() && worker.get() >= group.workers {
            return Err(Error::WorkerOutsideGroup {
                worker,
                group: group.workers,
            });
        }
        check_unique(grads.iter().map(|(key, _)| key))?;
        let entries = self.entries(grads.iter().map(|(key, _)| key))?;
        for (entry, (_, grad)) in entries.iter().zip(&grads) {
            check_dtype_and_shape(&entry.spec, grad.dtype(), grad.shape())?;
            if finite == Finite::Unchecked {
                self.check_finite(&entry.spec.header.key, "gradient", grad)?;
            }
        }
        let live = self.live_workers();
        let pushed = apply_all(
            &entries,
            &grads,
            group,
            &live,
            worker,
            step,
            &self.step_waits,
        )?;
        let duplicates = pushed.iter().filter(|p| !p.accepted).count() as u64;
        self.counters
            .duplicate_pushes
            .fetch_add(duplicates, Ordering::Relaxed);
        self.counters.pushes.fetch_add(1, Ordering::Relaxed);
        let bytes: usize = grads.iter().map(|(_, grad)| grad.byte_len()).sum();
        self.counters
            .push_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(pushed)
    }

    /// Reads `keys`, first waiting up to `timeout` until each is at `min_version` or
    /// later. A wait ends with `StaleMap` when a shard map newer than `routed_by`
    /// (the request's; 0 for none) is applied meanwhile.
    ///
    /// # Errors
    /// `EmptyRequest`, `RepeatedKey`, `UnknownKey`, `PullTimeout`, `ShuttingDown`.
    pub async fn pull(
        &self,
        keys: &[ParamKey],
        min_version: Version,
        timeout: Duration,
        routed_by: MapVersion,
    ) -> Result<Vec<Pulled>> {
        self.check_serving()?;
        if keys.is_empty() {
            return Err(Error::EmptyRequest {
                what: "no keys to pull",
            });
        }
        check_unique(keys.iter())?;
        let entries = self.entries(keys.iter())?;
        for entry in &entries {
            self.check_reachable(entry, min_version)?;
        }
        let version: fn(&Arc<Entry>) -> &Announced = |entry| &entry.version;
        if let Some(late) = self
            .wait_for_versions((&entries, version), min_version, timeout, routed_by)
            .await?
        {
            return Err(self.timeout_error(&entries[late], min_version, timeout));
        }
        let pulled = entries.iter().map(|entry| snapshot(entry)).collect();
        self.counters.pulls.fetch_add(1, Ordering::Relaxed);
        Ok(pulled)
    }

    /// Under BSP, refuses a pull for more than one step past the key's version
    /// at once, which no push can bring: a worker pulls version `s + 1` only
    /// after this server took its push of step `s`, and a push of a step past
    /// the version is refused. Such a pull comes from a worker whose pushes went
    /// to an earlier incarnation of this server; told the key's version, it
    /// offers its newer copy instead of waiting out the timeout while the other
    /// workers wait for it.
    fn check_reachable(&self, entry: &Entry, wanted: Version) -> Result<()> {
        let version = entry.version.get();
        let bsp = self.group().consistency == crate::consistency::Consistency::Bsp;
        if bsp && wanted.get() > version.get().saturating_add(1) {
            return Err(Error::PullAhead {
                key: entry.spec.header.key.clone(),
                wanted,
                version,
            });
        }
        Ok(())
    }

    /// Waits until the version of each of `items` (as `version` finds it)
    /// announces `wanted` or later, all within one `timeout` from the first
    /// that has to wait (one already there costs no wait and no clock read):
    /// `None` when all did, else the index of the first that did not.
    ///
    /// # Errors
    /// `StaleMap` when a shard map newer than `routed_by` is applied
    /// meanwhile; `ShuttingDown`.
    pub(crate) async fn wait_for_versions<T>(
        &self,
        (items, version): (&[T], fn(&T) -> &Announced),
        wanted: Version,
        timeout: Duration,
        routed_by: MapVersion,
    ) -> Result<Option<usize>> {
        let mut waits_end = None;
        for (index, announced) in items.iter().map(version).enumerate() {
            if announced.get() >= wanted {
                continue;
            }
            let deadline = *waits_end.get_or_insert_with(|| Instant::now() + timeout);
            let reached = tokio::select! {
                reached = self.reached(announced, wanted, deadline) => reached?,
                () = self.map.moved_past(routed_by) => return Err(Error::StaleMap {
                    requested: routed_by,
                    current: self.map.current(),
                }),
            };
            if !reached {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }

    /// Waits until `versions` announces `wanted` or later (true) or `deadline`
    /// passes (false).
    ///
    /// # Errors
    /// `ShuttingDown`.
    async fn reached(
        &self,
        versions: &Announced,
        wanted: Version,
        deadline: Instant,
    ) -> Result<bool> {
        tokio::select! {
            reached = tokio::time::timeout_at(deadline, versions.reached(wanted)) => Ok(reached.is_ok()),
            () = self.shutdown.cancelled() => Err(Error::ShuttingDown),
        }
    }

    fn timeout_error(&self, entry: &Entry, wanted: Version, waited: Duration) -> Error {
        let state = entry.lock();
        let missing = state.missing_workers(self.group(), &self.live_workers());
        let key = entry.spec.header.key.clone();
        self.pull_timeout(key, (wanted, state.version()), waited, &missing, "pushes")
    }

    /// A pull of `key` that waited `waited` for version `wanted` and found
    /// `have`: the workers whose `pushes` (what they send) it still waits
    /// for are named.
    pub(crate) fn pull_timeout(
        &self,
        key: ParamKey,
        (wanted, have): (Version, Version),
        waited: Duration,
        missing: &[Rank],
        pushes: &str,
    ) -> Error {
        let group = self.group();
        let detail = if missing.is_empty() {
            String::new()
        } else {
            format!(
                " ({} of {} workers; still waiting for {pushes} from workers {missing:?})",
                group.consistency, group.workers
            )
        };
        Error::PullTimeout {
            key,
            wanted,
            have,
            waited,
            detail,
        }
    }

    /// Push requests applied (or taken as retries) and their gradient bytes,
    /// since the store was made: what a server reports with its heartbeats.
    pub fn push_load(&self) -> PushLoad {
        PushLoad {
            pushes: self.counters.pushes.load(Ordering::Relaxed),
            push_bytes: self.counters.push_bytes.load(Ordering::Relaxed),
        }
    }

    /// How long BSP steps waited for their last push, and whose it was.
    pub fn step_waits(&self) -> &StepWaits {
        &self.step_waits
    }

    /// What the store holds and has served.
    pub fn stats(&self) -> Stats {
        let entries = self.all_entries();
        let mut keys: Vec<KeySummary> = entries
            .iter()
            .map(|entry| {
                let state = entry.lock();
                let held = state.held();
                KeySummary {
                    spec: entry.spec.clone(),
                    version: state.version(),
                    bytes: held.total(),
                    held,
                }
            })
            .collect();
        keys.sort_by(|a, b| a.spec.header.key.cmp(&b.spec.header.key));
        Stats {
            keys,
            pushes: self.counters.pushes.load(Ordering::Relaxed),
            pulls: self.counters.pulls.load(Ordering::Relaxed),
            duplicate_pushes: self.counters.duplicate_pushes.load(Ordering::Relaxed),
            rejected: self.counters.rejected.load(Ordering::Relaxed),
            memory_held: self.budget.held(),
            memory_budget: self.budget.limit(),
        }
    }
}

/// Whether a push's gradients are still to be checked for NaN and infinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finite {
    Unchecked,
    Checked,
}

fn check_dtype_and_shape(spec: &ParamSpec, dtype: DType, shape: &[usize]) -> Result<()> {
    let key = &spec.header.key;
    if dtype != spec.header.dtype {
        return Err(Error::DtypeMismatch {
            key: key.clone(),
            expected: spec.header.dtype,
            got: dtype,
        });
    }
    if shape != spec.header.shape {
        let (expected, got) = (spec.header.shape.clone(), shape.to_vec());
        return Err(Error::ShapeMismatch {
            key: key.clone(),
            expected,
            got,
        });
    }
    Ok(())
}

pub(crate) fn check_unique<'a>(keys: impl Iterator<Item = &'a ParamKey> + Clone) -> Result<()> {
    let repeated = if keys.clone().nth(COMPARED_UP_TO).is_none() {
        // Few keys (a small operation's one or two): each against those
        // before it, with no set made.
        keys.clone()
            .enumerate()
            .find(|&(i, key)| keys.clone().take(i).any(|before| before == key))
            .map(|(_, key)| key)
    } else {
        let mut seen = HashSet::new();
        keys.into_iter().find(|&key| !seen.insert(key))
    };
    match repeated {
        Some(key) => Err(Error::RepeatedKey { key: key.clone() }),
        None => Ok(()),
    }
}

/// Up to this many keys, [`check_unique`] compares each with those before
/// it (at most 120 comparisons) rather than building a set.
const COMPARED_UP_TO: usize = 16;

fn insert_or_refresh(
    keys: &mut HashMap<ParamKey, Arc<Entry>>,
    spec: ParamSpec,
    offered: Offered<'_>,
    charge: Charge,
    (archive, arena): (Option<&Archive>, Option<&Arc<Arena>>),
) -> Registered {
    if let Some(existing) = keys.get(&spec.header.key) {
        let mut state = existing.lock();
        if refresh_key(&existing.spec, &mut state, offered, arena) {
            existing.announce(state.version());
        }
        return Registered {
            key: spec.header.key,
            created: false,
            version: state.version(),
        };
    }
    let mut state = new_key(&spec, offered, (archive, arena));
    // A key resumed from a checkpoint comes on the heap.
    if let Some(arena) = spec.arena_for(arena) {
        state.place_in(arena);
    }
    let version = state.version();
    let key = spec.header.key.clone();
    let entry = Entry {
        state: Mutex::new(state),
        spec,
        version: Announced::new(version),
        _charge: charge,
    };
    tracing::debug!(%key, spec = %entry.spec.describe(), %version, "registered");
    keys.insert(key.clone(), Arc::new(entry));
    Registered {
        key,
        // Resumed from a checkpoint: the worker's values were not the ones taken.
        created: version == offered.version,
        version,
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
