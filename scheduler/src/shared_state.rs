//! [`SchedulerState`]: what the scheduler's handlers and its expiry ticker share —
//! the membership, the registrations' owners, the barriers, the state file and
//! the change counter that wakes every waiter. Locks are held for one call and never across `.await`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::barrier::{BarrierState, Barriers};
use crate::config::SchedulerConfig;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::membership::{Event, Membership, Node};
use crate::owners::Owners;
use crate::state_file::{self, SavedState, StateError};

/// The scheduler's state, shared by the handlers and the expiry ticker.
#[derive(Debug)]
pub struct SchedulerState {
    membership: Mutex<Membership>,
    /// What the state file holds, so it is rewritten only when that changes.
    saved: Mutex<Option<SavedState>>,
    barriers: Mutex<Barriers>,
    changes: watch::Sender<u64>,
    /// Who owns each registration; saved with the membership.
    pub(crate) owners: Owners,
    /// Nodes declared dead, by kind (`server`, `worker`), for the metrics.
    pub(crate) declared_dead: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// How long workers waited at barriers until released, for the metrics.
    pub(crate) barrier_waits: Histogram,
    pub(crate) config: SchedulerConfig,
}

impl SchedulerState {
    /// A scheduler with nobody registered yet, or resumed from its state file.
    ///
    /// # Errors
    /// [`StateError`] when the state file exists but cannot be read, or holds a
    /// job that has finished.
    pub fn new(config: SchedulerConfig) -> Result<Self, StateError> {
        let saved = match &config.state_file {
            Some(path) => state_file::load(path)?,
            None => None,
        };
        let membership = match saved.clone() {
            Some(saved) => {
                tracing::info!(
                    map_version = %saved.version,
                    servers = saved.servers.len(),
                    workers = saved.workers.len(),
                    "resumed from the state file: same shard map, ids and ranks"
                );
                let (timeout, min_servers) = (config.heartbeat_timeout, config.min_servers);
                let resumed = Membership::from_saved(saved, timeout, min_servers, Instant::now());
                // The job keeps the parts it was cut in, whatever this start says.
                if resumed.partition_bytes() != config.partition_bytes {
                    tracing::warn!(
                        job = resumed.partition_bytes(),
                        given = config.partition_bytes,
                        "the resumed job's parameters were cut with another --partition-bytes; it keeps its own"
                    );
                }
                resumed
            }
            None => Membership::new(config.heartbeat_timeout, config.workers, config.min_servers)
                .with_partition_bytes(config.partition_bytes),
        }
        .with_join_window(config.join_window);
        if let (true, Some(path)) = (membership.job_done(), &config.state_file) {
            return Err(StateError::Finished {
                path: path.display().to_string(),
            });
        }
        let owners = saved.as_ref().map(Owners::from_saved).unwrap_or_default();
        Ok(Self {
            membership: Mutex::new(membership),
            owners,
            declared_dead: Family::default(),
            // 1 ms to about 9 minutes, doubling.
            barrier_waits: Histogram::new(exponential_buckets(1e-3, 2.0, 20)),
            saved: Mutex::new(saved),
            barriers: Mutex::default(),
            changes: watch::Sender::new(0),
            config,
        })
    }

    /// Rewrites the state file when what it would hold changed.
    fn persist(&self, membership: &Membership) {
        let Some(path) = &self.config.state_file else {
            return;
        };
        let mut now = membership.saved();
        self.owners.stamp(&mut now);
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        if saved.as_ref() == Some(&now) {
            return;
        }
        match state_file::save(path, &now) {
            Ok(()) => *saved = Some(now),
            Err(error) => tracing::error!(%error, "cannot save the scheduler's state"),
        }
    }

    /// Runs `f` on the membership and wakes every waiter.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> R {
        let mut membership = self.membership.lock().unwrap_or_else(|p| p.into_inner());
        let result = f(&mut membership);
        self.persist(&membership);
        drop(membership);
        self.changes.send_modify(|c| *c += 1);
        result
    }

    pub(crate) fn read<R>(&self, f: impl FnOnce(&Membership) -> R) -> R {
        f(&self.membership.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Declares silent nodes dead and logs each by name.
    pub fn tick(&self) {
        self.tick_at(Instant::now());
    }

    /// [`SchedulerState::tick`] as if it were `now`.
    pub fn tick_at(&self, now: Instant) {
        let events = self.update(|m| m.tick(now));
        for event in events {
            match event {
                Event::Dead { node, name, silent } => {
                    tracing::warn!(%node, name, ?silent, timeout = ?self.config.heartbeat_timeout, "declared dead: no heartbeat within the timeout");
                    let kind = match node {
                        Node::Server(_) => "server",
                        Node::Worker(_) => "worker",
                    };
                    self.declared_dead
                        .get_or_create(&vec![("kind", kind)])
                        .inc();
                }
                Event::GroupFormed { workers } => {
                    tracing::info!(workers, window = ?self.config.join_window, "worker group formed: no registration within the join window");
                }
            }
        }
    }

    /// Waits until `check` returns a value, or the deadline passes.
    pub(crate) async fn wait_for<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&Self) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.changes.subscribe();
        loop {
            changes.borrow_and_update();
            if let Some(value) = check(self) {
                return Some(value);
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Resolves once every worker of the group has left on purpose.
    pub async fn job_done(&self) {
        let mut changes = self.changes.subscribe();
        loop {
            changes.borrow_and_update();
            if self.read(Membership::job_done) {
                return;
            }
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// How long a request may wait: its own wish within the maximum, or the default.
    pub(crate) fn wait_time(&self, requested_ms: u64) -> Duration {
        match requested_ms {
            0 => self.config.default_wait,
            ms => Duration::from_millis(ms).min(self.config.max_wait),
        }
    }

    /// Runs `f` on the membership without waking waiters: for calls that change
    /// no map (heartbeats).
    pub(crate) fn quietly<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> R {
        f(&mut self.membership.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs `f` on the barriers and wakes every waiter.
    pub(crate) fn update_barriers(&self, f: impl FnOnce(&mut Barriers)) {
        f(&mut self.barriers.lock().unwrap_or_else(|p| p.into_inner()));
        self.changes.send_modify(|c| *c += 1);
    }

    /// Barrier `name` given the workers alive now.
    pub(crate) fn barrier(&self, name: &str) -> BarrierState {
        let live = self.read(Membership::live_workers);
        let barriers = self.barriers.lock().unwrap_or_else(|p| p.into_inner());
        barriers.state(name, &live)
    }
}
