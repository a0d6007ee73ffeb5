//! [`SchedulerService`]: the thin gRPC layer over [`Membership`]. Each handler
//! validates, calls the membership under its lock (never across `.await`), and
//! maps the outcome to a precise status. Waits (for a map, for a barrier) watch a
//! change counter and end at their deadline with a message naming what is missing.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ps_proto::codec::DType;
use ps_proto::v1;
use ps_proto::v1::scheduler_server::{Scheduler, SchedulerServer};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::config::SchedulerConfig;
use crate::membership::{Event, Membership, MembershipError, Node, ShardMap};
use crate::placement::Param;
use crate::state::{self, SavedState, StateError};

/// The scheduler's state, shared by the handlers and the expiry ticker.
#[derive(Debug)]
pub struct SchedulerState {
    membership: Mutex<Membership>,
    /// What the state file holds, so it is rewritten only when that changes.
    saved: Mutex<Option<SavedState>>,
    barriers: Mutex<HashMap<String, BTreeSet<u32>>>,
    changes: watch::Sender<u64>,
    config: SchedulerConfig,
}

impl SchedulerState {
    /// A scheduler with nobody registered yet, or resumed from its state file.
    ///
    /// # Errors
    /// [`StateError`] when the state file exists but cannot be read, or holds a
    /// job that has finished.
    pub fn new(config: SchedulerConfig) -> Result<Self, StateError> {
        let saved = match &config.state_file {
            Some(path) => state::load(path)?,
            None => None,
        };
        let membership = match saved.clone() {
            Some(saved) => {
                tracing::info!(
                    map_version = saved.version,
                    servers = saved.servers.len(),
                    workers = saved.workers.len(),
                    "resumed from the state file: same shard map, ids and ranks"
                );
                let (timeout, min_servers) = (config.heartbeat_timeout, config.min_servers);
                Membership::from_saved(saved, timeout, min_servers, Instant::now())
            }
            None => Membership::new(config.heartbeat_timeout, config.workers, config.min_servers),
        }
        .with_join_window(config.join_window);
        if let (true, Some(path)) = (membership.job_done(), &config.state_file) {
            return Err(StateError::Finished {
                path: path.display().to_string(),
            });
        }
        Ok(Self {
            membership: Mutex::new(membership),
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
        let now = membership.saved();
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        if saved.as_ref() == Some(&now) {
            return;
        }
        match state::save(path, &now) {
            Ok(()) => *saved = Some(now),
            Err(error) => tracing::error!(%error, "cannot save the scheduler's state"),
        }
    }

    /// Runs `f` on the membership and wakes every waiter.
    fn update<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> R {
        let mut membership = self.membership.lock().unwrap_or_else(|p| p.into_inner());
        let result = f(&mut membership);
        self.persist(&membership);
        drop(membership);
        self.changes.send_modify(|c| *c += 1);
        result
    }

    fn read<R>(&self, f: impl FnOnce(&Membership) -> R) -> R {
        f(&self.membership.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Declares silent nodes dead and logs each by name.
    pub fn tick(&self) {
        let events = self.update(|m| m.tick(Instant::now()));
        for event in events {
            match event {
                Event::Dead { node, name, silent } => {
                    tracing::warn!(%node, name, ?silent, timeout = ?self.config.heartbeat_timeout, "declared dead: no heartbeat within the timeout");
                }
                Event::GroupFormed { workers } => {
                    tracing::info!(workers, window = ?self.config.join_window, "worker group formed: no registration within the join window");
                }
            }
        }
    }

    /// Waits until `check` returns a value, or the deadline passes.
    async fn wait_for<T>(
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

    fn wait_time(&self, requested_ms: u64) -> Duration {
        match requested_ms {
            0 => self.config.default_wait,
            ms => Duration::from_millis(ms).min(self.config.max_wait),
        }
    }
}

/// The `ps.v1.Scheduler` service.
#[derive(Debug, Clone)]
pub struct SchedulerService {
    state: Arc<SchedulerState>,
}

impl SchedulerService {
    /// A service over `state`.
    pub fn new(state: Arc<SchedulerState>) -> Self {
        Self { state }
    }

    /// The tonic server.
    pub fn into_server(self) -> SchedulerServer<Self> {
        SchedulerServer::new(self)
    }
}

fn membership_status(error: MembershipError) -> Status {
    match error {
        MembershipError::GroupFull { .. } => Status::resource_exhausted(error.to_string()),
        MembershipError::UnknownNode { .. } => Status::not_found(error.to_string()),
        MembershipError::ParamsConflict { .. } => Status::failed_precondition(error.to_string()),
    }
}

fn node_of(request: &v1::HeartbeatRequest) -> Result<Node, Status> {
    match request.node {
        Some(v1::heartbeat_request::Node::ServerId(id)) => Ok(Node::Server(id)),
        Some(v1::heartbeat_request::Node::WorkerRank(rank)) => Ok(Node::Worker(rank)),
        None => Err(Status::invalid_argument(
            "set node.server_id or node.worker_rank",
        )),
    }
}

/// The wire form of a shard map.
pub fn map_to_proto(map: &ShardMap) -> v1::ShardMap {
    v1::ShardMap {
        version: map.version,
        servers: map
            .servers
            .iter()
            .map(|(id, addr)| v1::MapServer {
                id: *id,
                addr: addr.clone(),
            })
            .collect(),
        parts: map
            .assignments
            .iter()
            .map(|a| v1::MapPart {
                name: map.params[a.param].name.clone(),
                part: a.part,
                start: a.start as u64,
                len: a.len as u64,
                server: a.server as u32,
            })
            .collect(),
        workers: map.workers.clone(),
        group_size: map.group_size,
    }
}

fn interval_ms(config: &SchedulerConfig) -> u64 {
    config.heartbeat_interval.as_millis() as u64
}

#[tonic::async_trait]
impl Scheduler for SchedulerService {
    async fn register_server(
        &self,
        request: Request<v1::RegisterServerRequest>,
    ) -> Result<Response<v1::RegisterServerResponse>, Status> {
        let addr = request.into_inner().addr;
        if addr.is_empty() {
            return Err(Status::invalid_argument(
                "RegisterServer needs the address workers reach the server at",
            ));
        }
        let server_id = self
            .state
            .update(|m| m.register_server(&addr, Instant::now()));
        tracing::info!(server_id, addr, "server registered");
        Ok(Response::new(v1::RegisterServerResponse {
            server_id,
            heartbeat_interval_ms: interval_ms(&self.state.config),
        }))
    }

    async fn register_worker(
        &self,
        request: Request<v1::RegisterWorkerRequest>,
    ) -> Result<Response<v1::RegisterWorkerResponse>, Status> {
        let client_id = request.into_inner().client_id;
        if client_id.is_empty() {
            return Err(Status::invalid_argument(
                "RegisterWorker needs a client_id unique to the worker process",
            ));
        }
        let rank = self
            .state
            .update(|m| m.register_worker(&client_id, Instant::now()))
            .map_err(membership_status)?;
        tracing::info!(rank, client_id, "worker registered");
        let config = &self.state.config;
        let wait = config.default_wait;
        let workers = self
            .state
            .wait_for(wait, |s| s.read(Membership::group_size))
            .await
            .ok_or_else(|| {
                Status::deadline_exceeded(format!(
                    "waited {wait:?} for the worker group to form: {}",
                    self.state.read(Membership::missing)
                ))
            })?;
        Ok(Response::new(v1::RegisterWorkerResponse {
            rank,
            workers,
            consistency: config.consistency.to_string(),
            heartbeat_interval_ms: interval_ms(config),
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let request = request.into_inner();
        let node = node_of(&request)?;
        // A heartbeat changes no map, so it wakes no waiter.
        let (beat, job_done) = {
            let mut membership = self
                .state
                .membership
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let beat = membership.heartbeat(node, request.step, Instant::now());
            let ending = self.state.config.exit_when_done && membership.job_done();
            (beat, ending)
        };
        let map_version = beat.map_err(membership_status)?;
        Ok(Response::new(v1::HeartbeatResponse {
            map_version,
            job_done,
        }))
    }

    async fn leave(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::LeaveResponse>, Status> {
        let node = node_of(request.get_ref())?;
        let step = request.get_ref().step;
        self.state.update(|m| m.leave(node, step));
        tracing::info!(%node, step, "left the cluster");
        Ok(Response::new(v1::LeaveResponse {}))
    }

    async fn declare_params(
        &self,
        request: Request<v1::DeclareParamsRequest>,
    ) -> Result<Response<v1::DeclareParamsResponse>, Status> {
        let declared = request.into_inner().params;
        if declared.is_empty() {
            return Err(Status::invalid_argument(
                "DeclareParams needs at least one parameter",
            ));
        }
        let mut params = Vec::with_capacity(declared.len());
        for p in declared {
            let dtype = DType::from_proto(p.dtype)
                .map_err(|e| Status::invalid_argument(format!("parameter {}: {e}", p.name)))?;
            let elements = usize::try_from(p.elements).map_err(|_| {
                Status::invalid_argument(format!("parameter {} is too large", p.name))
            })?;
            params.push(Param {
                name: p.name,
                elements,
                elem_size: dtype.size(),
            });
        }
        self.state
            .update(|m| m.declare_params(params))
            .map_err(membership_status)?;
        Ok(Response::new(v1::DeclareParamsResponse {}))
    }

    async fn get_shard_map(
        &self,
        request: Request<v1::GetShardMapRequest>,
    ) -> Result<Response<v1::ShardMap>, Status> {
        let request = request.into_inner();
        let wait = self.state.wait_time(request.timeout_ms);
        let wanted = request.min_version.max(1);
        let found = self
            .state
            .wait_for(wait, |s| {
                s.read(|m| {
                    m.map()
                        .filter(|map| map.version >= wanted)
                        .map(map_to_proto)
                })
            })
            .await;
        found.map(Response::new).ok_or_else(|| {
            let missing = self.state.read(Membership::missing);
            let detail = if missing.is_empty() {
                format!("the map is older than version {wanted}")
            } else {
                missing
            };
            Status::deadline_exceeded(format!("waited {wait:?} for a shard map: {detail}"))
        })
    }

    async fn barrier(
        &self,
        request: Request<v1::BarrierRequest>,
    ) -> Result<Response<v1::BarrierResponse>, Status> {
        let request = request.into_inner();
        if request.name.is_empty() {
            return Err(Status::invalid_argument("a barrier needs a name"));
        }
        let wait = self.state.wait_time(request.timeout_ms);
        self.state
            .barriers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(request.name.clone())
            .or_default()
            .insert(request.rank);
        self.state.changes.send_modify(|c| *c += 1);
        let name = request.name.clone();
        let waiting = |s: &SchedulerState| -> Vec<u32> {
            let arrived = s
                .barriers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&name)
                .cloned()
                .unwrap_or_default();
            s.read(|m| {
                m.workers()
                    .into_iter()
                    .filter(|w| w.alive && !arrived.contains(&w.id))
                    .map(|w| w.id)
                    .collect()
            })
        };
        let released = self
            .state
            .wait_for(wait, |s| {
                waiting(s).is_empty().then(|| {
                    s.barriers.lock().unwrap_or_else(|p| p.into_inner())[&name]
                        .iter()
                        .copied()
                        .collect()
                })
            })
            .await;
        released
            .map(|workers| Response::new(v1::BarrierResponse { workers }))
            .ok_or_else(|| {
                Status::deadline_exceeded(format!(
                    "waited {wait:?} at barrier `{}`: live workers {:?} have not arrived",
                    request.name,
                    waiting(&self.state)
                ))
            })
    }

    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let response = self.state.read(|m| {
            let map = m.map();
            let owned = |index: usize| -> (u64, u64) {
                map.map_or((0, 0), |map| {
                    let parts = map.assignments.iter().filter(|a| a.server == index);
                    parts.fold((0, 0), |(n, b), a| {
                        (n + 1, b + (a.len * map.params[a.param].elem_size) as u64)
                    })
                })
            };
            let servers = m
                .servers()
                .into_iter()
                .map(|server| {
                    let index =
                        map.and_then(|map| map.servers.iter().position(|(id, _)| *id == server.id));
                    let (parts, bytes) = index.map_or((0, 0), owned);
                    v1::ServerStatus {
                        id: server.id,
                        addr: server.name,
                        alive: server.alive,
                        parts,
                        bytes,
                        left: server.left,
                    }
                })
                .collect();
            let workers = m
                .workers()
                .into_iter()
                .map(|worker| v1::WorkerStatus {
                    rank: worker.id,
                    alive: worker.alive,
                    last_step: worker.last_step,
                    left: worker.left,
                })
                .collect();
            v1::StatusResponse {
                servers,
                workers,
                map_version: map.map_or(0, |m| m.version),
                waiting_for: m.missing(),
            }
        });
        Ok(Response::new(response))
    }
}
