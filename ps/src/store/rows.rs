//! The store's operations on embedding tables (`crate::table`): declaring a
//! table's buckets, pulling rows by id, pushing row gradients. As for dense
//! keys, a request is checked whole first, then its buckets are locked in
//! bucket order and it changes all of them or none.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use ps_proto::codec::{DType, first_non_finite};
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_proto::rows::{MAX_IDS_PER_REQUEST, bucket_of};

use super::Store;
use crate::announced::Announced;
use crate::consistency::{Admission, Consistency};
use crate::error::{Error, Result};
use crate::table::bucket::{Bucket, BucketState, PushedRows};
use crate::table::{Table, TableSpec};

/// The rows of one bucket a request names: ids, and for a push one gradient
/// row per id (`width` elements each).
#[derive(Debug, Clone, PartialEq)]
pub struct RowBlock {
    /// The bucket every id belongs to.
    pub bucket: u32,
    /// The ids.
    pub ids: Vec<u64>,
    /// Push only: the gradient rows, in id order.
    pub rows: Vec<f32>,
}

/// What declaring one bucket did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredBucket {
    /// The bucket.
    pub bucket: u32,
    /// True when this declaration made it.
    pub created: bool,
    /// Its version.
    pub version: Version,
    /// Rows it holds.
    pub rows: usize,
}

/// One bucket's rows, as a pull reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledRows {
    /// The bucket.
    pub bucket: u32,
    /// One row per requested id, little-endian `f32`s: a slice of
    /// [`PulledTable::rows`].
    pub rows: Bytes,
    /// The bucket's version the rows are at.
    pub version: Version,
}

/// What a pull read: each block's rows, read into one buffer in block order.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledTable {
    /// Per block, in request order.
    pub blocks: Vec<PulledRows>,
    /// Every block's rows, in block order.
    pub rows: Bytes,
}

/// The outcome of a row push for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushedBucket {
    /// The bucket.
    pub bucket: u32,
    /// False when `(worker, step)` had been taken before.
    pub accepted: bool,
    /// The bucket's version after the push.
    pub version: Version,
}

/// The most rows one bucket holds (its slots are `u32`).
const MAX_BUCKET_ROWS: usize = u32::MAX as usize;

/// Whether a request's blocks carry gradient rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blocks {
    Pull,
    Push,
}

impl Store {
    /// Declares `spec` and makes the buckets of it in `buckets` that this
    /// server lacks: from the newest checkpoint it can read, else empty. With a
    /// `restore` version (the step a job is at, when a worker declares the
    /// table again after a server was lost), a bucket behind it moves forward
    /// to it (`BucketState::fast_forward`). Idempotent; all or nothing.
    ///
    /// # Errors
    /// `ShuttingDown`; `EmptyRequest`; `InvalidTable` for a bucket past the
    /// table's; `RepeatedKey`; `TableConflict` with a table declared otherwise;
    /// `OverBudget` for the rows of a checkpoint.
    pub fn declare_table(
        &self,
        spec: TableSpec,
        buckets: &[u32],
        restore: Version,
    ) -> Result<Vec<DeclaredBucket>> {
        self.check_serving()?;
        if buckets.is_empty() {
            return Err(Error::EmptyRequest {
                what: "no buckets to declare",
            });
        }
        if let Some(past) = buckets.iter().find(|b| **b >= spec.buckets) {
            return Err(Error::InvalidTable {
                table: spec.name.clone(),
                reason: format!("bucket {past} is past the table's {} buckets", spec.buckets),
            });
        }
        let keys: Vec<ParamKey> = buckets
            .iter()
            .map(|b| ParamKey::new(&spec.name, *b))
            .collect();
        super::check_unique(keys.iter())?;
        if let Some(archive) = self.archive.as_ref().filter(|_| restore > Version(0)) {
            // Once per declaration, before the table's buckets are locked: a
            // peer may have written checkpoints since the last scan.
            archive.rescan();
        }
        let conflict = |existing: Arc<Table>| Error::TableConflict {
            existing: existing.spec.to_string(),
            requested: spec.to_string(),
        };
        // The buckets this server lacks are made (restored, and charged)
        // before anything is declared, so a refusal leaves no trace; one
        // declaration at a time, so each is made once.
        let _one_at_a_time = self
            .tables
            .declaring
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let declared_before = self.tables.get(&spec.name);
        if let Some(existing) = declared_before.clone().filter(|t| t.spec != spec) {
            return Err(conflict(existing));
        }
        let mut made = Vec::new();
        for key in &keys {
            let held = declared_before.as_ref().is_some_and(|t| t.holds(key.part));
            if !held {
                made.push((key.part, self.new_bucket(&spec, key)?));
            }
        }
        // Under the declaration lock the spec checked above still holds.
        let table = self.tables.declare(&spec).map_err(conflict)?;
        let created: Vec<u32> = made.iter().map(|(bucket, _)| *bucket).collect();
        let mut held = table.buckets.write().unwrap_or_else(|p| p.into_inner());
        held.extend(made);
        let ranks = self.group_ranks();
        let declared = keys
            .iter()
            .map(|key| {
                let bucket = &held[&key.part];
                let mut state = bucket.lock();
                if state.fast_forward(restore, ranks) {
                    tracing::warn!(bucket = %key, version = %restore, "bucket behind the job moved forward; its updates since its checkpoint are lost");
                    bucket.announce(state.version());
                }
                DeclaredBucket {
                    bucket: key.part,
                    created: created.contains(&key.part),
                    version: state.version(),
                    rows: state.rows(),
                }
            })
            .collect();
        tracing::debug!(table = %table.spec, buckets = buckets.len(), "table declared");
        Ok(declared)
    }

    /// A bucket this server lacks: from the newest checkpoint it can read,
    /// else empty.
    fn new_bucket(&self, table: &TableSpec, key: &ParamKey) -> Result<Arc<Bucket>> {
        let empty = || self.budget.charge(0, String::new);
        let saved_as = crate::checkpoint::bucket_key(&table.name, key.part);
        let saved = self
            .archive
            .as_ref()
            .and_then(|archive| archive.lookup(&saved_as, false));
        if let Some((path, saved)) = saved {
            match BucketState::from_checkpoint(table, &saved, empty()?)? {
                Some(state) => {
                    tracing::info!(bucket = %key, version = %state.version(), rows = state.rows(), path = %path.display(), "bucket restored from checkpoint: rows and optimizer state");
                    return Ok(Arc::new(Bucket::new(key.clone(), state)));
                }
                None => {
                    tracing::warn!(bucket = %key, path = %path.display(), saved = saved.spec, now = %table, "checkpoint holds this bucket with another spec; not used");
                }
            }
        }
        Ok(Arc::new(Bucket::new(
            key.clone(),
            BucketState::new(table, empty()?),
        )))
    }

    /// The ranks of the group, for the steps a restored version implies (none
    /// under ASP).
    fn group_ranks(&self) -> u32 {
        let group = self.group();
        if group.consistency.has_group() {
            group.workers
        } else {
            0
        }
    }

    /// Every bucket's state as a checkpoint holds it, each read under its lock.
    pub(super) fn checkpoint_buckets(&self) -> Vec<crate::checkpoint::KeyCheckpoint> {
        let mut saved = Vec::new();
        for table in self.tables.all() {
            for bucket in table.all_buckets() {
                let key = crate::checkpoint::bucket_key(&table.spec.name, bucket.key.part);
                saved.push(bucket.lock().checkpoint(&table.spec, key));
            }
        }
        saved
    }

    /// The highest version of any bucket (0 when none).
    pub(super) fn max_bucket_version(&self) -> Version {
        let buckets = self.tables.all().into_iter().flat_map(|t| t.all_buckets());
        buckets.map(|b| b.version.get()).max().unwrap_or_default()
    }

    /// Reads the rows of `blocks` from `table`, first waiting up to `timeout`
    /// until each bucket is at `min_version` or later. A wait ends with
    /// `StaleMap` when a newer shard map than `routed_by` is applied meanwhile.
    ///
    /// # Errors
    /// `ShuttingDown`, `EmptyRequest`, `UnknownTable`, `UnknownBucket`,
    /// `RepeatedKey`, `BadRows`, `PullAhead`, `PullTimeout`, `StaleMap`.
    pub async fn pull_rows(
        &self,
        table: &str,
        blocks: &[RowBlock],
        min_version: Version,
        timeout: Duration,
        routed_by: MapVersion,
    ) -> Result<PulledTable> {
        self.check_serving()?;
        let table = self.table(table)?;
        let buckets = self.checked_buckets(&table, blocks, Blocks::Pull)?;
        let bsp = self.group().consistency == Consistency::Bsp;
        for bucket in &buckets {
            let version = bucket.version.get();
            if bsp && min_version.get() > version.get().saturating_add(1) {
                return Err(Error::PullAhead {
                    key: bucket.key.clone(),
                    wanted: min_version,
                    version,
                });
            }
        }
        let version: fn(&Arc<Bucket>) -> &Announced = |bucket| &bucket.version;
        if let Some(late) = self
            .wait_for_versions((&buckets, version), min_version, timeout, routed_by)
            .await?
        {
            return Err(self.bucket_timeout(&buckets[late], min_version, timeout));
        }
        let ids: usize = blocks.iter().map(|block| block.ids.len()).sum();
        let mut rows = Vec::with_capacity(ids * table.spec.width * 4);
        let mut ends = Vec::with_capacity(blocks.len());
        for (bucket, block) in buckets.iter().zip(blocks) {
            let state = bucket.lock();
            state.read_into(&block.ids, &mut rows);
            ends.push((block.bucket, state.version(), rows.len()));
        }
        let rows = Bytes::from(rows);
        let mut start = 0;
        let blocks = ends
            .into_iter()
            .map(|(bucket, version, end)| {
                let block = PulledRows {
                    bucket,
                    rows: rows.slice(start..end),
                    version,
                };
                start = end;
                block
            })
            .collect();
        self.counters.pulls.fetch_add(1, Ordering::Relaxed);
        Ok(PulledTable { blocks, rows })
    }

    /// Pushes `worker`'s row gradients of `step` to `table`. All or nothing; a
    /// bucket that had taken `(worker, step)` acknowledges it with `accepted: false`.
    ///
    /// # Errors
    /// `ShuttingDown`, `EmptyRequest`, `WorkerOutsideGroup`, `UnknownTable`,
    /// `UnknownBucket`, `RepeatedKey`, `BadRows` (an id twice, out of range or
    /// in another bucket, a row of the wrong width, NaN), `FutureStep`,
    /// `StaleStep`, `OverBudget` for the rows it would make.
    pub fn push_rows(
        &self,
        table: &str,
        worker: Rank,
        step: Step,
        blocks: &[RowBlock],
    ) -> Result<Vec<PushedBucket>> {
        self.check_serving()?;
        let group = self.group();
        if group.consistency.has_group() && worker.get() >= group.workers {
            return Err(Error::WorkerOutsideGroup {
                worker,
                group: group.workers,
            });
        }
        let table = self.table(table)?;
        let buckets = self.checked_buckets(&table, blocks, Blocks::Push)?;
        let mut order: Vec<usize> = (0..blocks.len()).collect();
        order.sort_by_key(|&i| blocks[i].bucket);
        let mut states: Vec<_> = order.iter().map(|&i| (i, buckets[i].lock())).collect();
        states.sort_by_key(|(i, _)| *i);
        let mut news = Vec::with_capacity(blocks.len());
        for ((_, state), (bucket, block)) in states.iter().zip(buckets.iter().zip(blocks)) {
            news.push(match state.admit(group.consistency, worker, step) {
                Admission::Accept => {
                    let new = state.new_bytes(&table.spec, group, &block.ids);
                    if state.rows_with_pending() + new.rows_made > MAX_BUCKET_ROWS {
                        return Err(Error::BadRows {
                            key: bucket.key.clone(),
                            reason: format!(
                                "the bucket would hold more than {MAX_BUCKET_ROWS} rows; declare the table with more buckets"
                            ),
                        });
                    }
                    Some(new)
                }
                Admission::Duplicate => None,
                refused => return Err(refusal(refused, bucket, worker, step, state.version())),
            });
        }
        let total = news.iter().flatten().map(|n| n.rows + n.pending).sum();
        let mut charge = self.budget.charge(total, || {
            format!(
                "{} new rows of table `{}`",
                total / table.spec.row_bytes().max(1),
                table.spec.name
            )
        })?;
        let live = self.live_workers();
        let mut pushed = Vec::with_capacity(blocks.len());
        for (((_, state), new), (bucket, block)) in
            states.iter_mut().zip(news).zip(buckets.iter().zip(blocks))
        {
            if let Some(new) = new {
                let push = PushedRows {
                    worker,
                    step,
                    ids: &block.ids,
                    grads: &block.rows,
                    charge: charge.split_off(new.rows + new.pending),
                    new,
                };
                if let Some(waited) = state.accept(&table.spec, group, &live, push) {
                    self.step_waits.record(waited, Some(worker));
                }
                bucket.announce(state.version());
            }
            pushed.push(PushedBucket {
                bucket: block.bucket,
                accepted: new.is_some(),
                version: state.version(),
            });
        }
        let duplicates = pushed.iter().filter(|p| !p.accepted).count() as u64;
        self.counters
            .duplicate_pushes
            .fetch_add(duplicates, Ordering::Relaxed);
        self.counters.pushes.fetch_add(1, Ordering::Relaxed);
        let bytes: usize = blocks
            .iter()
            .map(|b| b.rows.len() * 4 + b.ids.len() * 8)
            .sum();
        self.counters
            .push_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(pushed)
    }

    /// Completes every bucket's BSP step that was waiting only for workers no
    /// longer in `live`; returns how many buckets advanced.
    pub(super) fn complete_buckets(&self, live: &BTreeSet<Rank>) -> usize {
        let consistency = self.rules.group.consistency;
        let mut advanced = 0;
        for table in self.tables.all() {
            for bucket in table.all_buckets() {
                let mut state = bucket.lock();
                if let Some(waited) = state.complete(&table.spec, consistency, live) {
                    self.step_waits.record(waited, None);
                    advanced += 1;
                    bucket.announce(state.version());
                }
            }
        }
        advanced
    }

    /// Bytes the rows of a pull of `blocks` from `table` take.
    ///
    /// # Errors
    /// `UnknownTable`.
    pub fn pull_rows_bytes(&self, table: &str, blocks: &[RowBlock]) -> Result<usize> {
        let width = self.table(table)?.spec.width;
        Ok(blocks
            .iter()
            .map(|b| b.ids.len())
            .sum::<usize>()
            .saturating_mul(width * 4))
    }

    fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.tables.get(name).ok_or_else(|| Error::UnknownTable {
            table: name.to_string(),
            known: self.tables.len(),
        })
    }

    /// The buckets `blocks` name, in block order, after checking every block
    /// against the table: no bucket twice, each held here, each id in range
    /// and in its block's bucket; a push's rows the table's width, finite,
    /// without an id twice.
    fn checked_buckets(
        &self,
        table: &Table,
        blocks: &[RowBlock],
        kind: Blocks,
    ) -> Result<Vec<Arc<Bucket>>> {
        if blocks.is_empty() {
            return Err(Error::EmptyRequest {
                what: "no row blocks",
            });
        }
        let key = |bucket: u32| ParamKey::new(&table.spec.name, bucket);
        let mut named: Vec<u32> = blocks.iter().map(|b| b.bucket).collect();
        named.sort_unstable();
        if let Some(twice) = named.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Error::RepeatedKey { key: key(twice[0]) });
        }
        let ids: usize = blocks.iter().map(|b| b.ids.len()).sum();
        if ids > MAX_IDS_PER_REQUEST {
            return Err(Error::BadRows {
                key: key(blocks[0].bucket),
                reason: format!(
                    "the request carries {ids} ids, over the limit of {MAX_IDS_PER_REQUEST}; split it"
                ),
            });
        }
        let held = table.buckets.read().unwrap_or_else(|p| p.into_inner());
        blocks
            .iter()
            .map(|block| {
                self.check_block(&table.spec, block, kind)?;
                held.get(&block.bucket)
                    .cloned()
                    .ok_or_else(|| Error::UnknownBucket {
                        key: key(block.bucket),
                    })
            })
            .collect()
    }

    fn check_block(&self, spec: &TableSpec, block: &RowBlock, kind: Blocks) -> Result<()> {
        let bad = |reason: String| Error::BadRows {
            key: ParamKey::new(&spec.name, block.bucket),
            reason,
        };
        if block.bucket >= spec.buckets {
            return Err(bad(format!("the table has only {} buckets", spec.buckets)));
        }
        for &id in &block.ids {
            if let Some(max) = spec.max_rows.filter(|max| id >= *max) {
                return Err(bad(format!(
                    "id {id} is out of range: the table's ids are below {max}"
                )));
            }
            let home = bucket_of(id, spec.buckets);
            if home != block.bucket {
                return Err(bad(format!(
                    "id {id} belongs to bucket {home}; send each id in the block of its bucket (ps_proto::rows::bucket_of)"
                )));
            }
        }
        if kind == Blocks::Pull {
            return Ok(());
        }
        let expected = block.ids.len() * spec.width;
        if block.rows.len() != expected {
            return Err(bad(format!(
                "{} gradient elements for {} ids of width {}: rows must be {expected} elements",
                block.rows.len(),
                block.ids.len(),
                spec.width
            )));
        }
        let mut seen: HashSet<u64, foldhash::fast::FixedState> =
            HashSet::with_capacity_and_hasher(block.ids.len(), Default::default());
        if let Some(id) = block.ids.iter().find(|id| !seen.insert(**id)) {
            return Err(bad(format!(
                "id {id} appears twice in one push; sum its gradient rows into one"
            )));
        }
        // The rows' exponent bits tested where they lie, vectorised.
        let rows: &[u8] = bytemuck::cast_slice(&block.rows);
        if self.rules.reject_non_finite
            && let Some((index, value)) = first_non_finite(DType::F32, rows)
        {
            return Err(bad(format!(
                "the gradient row of id {} has a non-finite value {value} at element {}; fix the model or loss scale, or start the server with --allow-non-finite",
                block.ids[index / spec.width],
                index % spec.width
            )));
        }
        Ok(())
    }

    fn bucket_timeout(&self, bucket: &Bucket, wanted: Version, waited: Duration) -> Error {
        let state = bucket.lock();
        let missing = state.missing_workers(self.group(), &self.live_workers());
        let key = bucket.key.clone();
        self.pull_timeout(
            key,
            (wanted, state.version()),
            waited,
            &missing,
            "row pushes",
        )
    }
}

/// The error for a push the bucket does not admit.
fn refusal(
    admission: Admission,
    bucket: &Bucket,
    worker: Rank,
    step: Step,
    version: Version,
) -> Error {
    let key = bucket.key.clone();
    match admission {
        Admission::Future { max_step } => Error::FutureStep {
            key,
            worker,
            step,
            version,
            max_step,
        },
        _ => Error::StaleStep {
            key,
            worker,
            step,
            version,
        },
    }
}

#[cfg(test)]
#[path = "rows_tests.rs"]
mod tests;
