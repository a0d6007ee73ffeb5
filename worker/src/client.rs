//! [`PsClient`]: a worker's connection to every parameter server.
//!
//! It knows where each parameter's parts live ([`Placement`]), sends each request to
//! all servers concurrently, cuts large requests into chunk streams, reassembles
//! partitioned tensors, and retries transient failures with backoff. A retried push
//! keeps its `(worker_id, step)`, so the server applies it exactly once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::try_join_all;
use ps_proto::chunk::{Assembler, ChunkHeader, DEFAULT_CHUNK_BYTES, to_wire_chunks};
use ps_proto::codec::{TensorData, wire_shape};
use ps_proto::consistency::Consistency;
use ps_proto::key::ParamKey;
use ps_proto::metadata;
use ps_common::rendezvous::{Peer, RendezvousError, rendezvous};
use ps_proto::transport::{TransportConfig, http_uri};
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::scheduler_client::SchedulerClient;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::Status;
use tonic::transport::Channel;

use crate::placement::{DEFAULT_PARTITION_BYTES, ParamInfo, Part, Placed, Placement};
use crate::retry::RetryPolicy;

/// A part of a parameter and the bytes it carries.
type PartData<'a> = (&'a Placed, Part, Bytes);

/// One pulled key with its values and their version.
type PulledKey = (ParamKey, (TensorData, u64));

/// Why a parameter-server call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made.
    #[error("cannot connect to parameter server {addr}: {source}; is it running and reachable?")]
    Connect {
        /// The server's address.
        addr: String,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// A server refused or failed a request.
    #[error("{what} on {addr} failed: {code:?}: {message}", code = status.code(), message = status.message())]
    Rpc {
        /// What was being done.
        what: &'static str,
        /// The server's address.
        addr: String,
        /// Its answer.
        status: Status,
    },
    /// A peer never came up, or is not what it should be.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// A server answered with something that does not fit the request.
    #[error("{addr} answered {what} with an unexpected response: {reason}")]
    Protocol {
        /// What was being done.
        what: &'static str,
        /// The server's address.
        addr: String,
        /// What does not fit.
        reason: String,
    },
    /// The client was given no servers, or a parameter it has not placed.
    #[error("{0}")]
    Usage(String),
}

impl ClientError {
    /// The newer shard-map version a server named when it refused this client's map.
    pub fn stale_map(&self) -> Option<u64> {
        self.status_version(metadata::MAP_VERSION)
    }

    /// The version a key was at when a server refused this worker's push of a
    /// step the key cannot take: above the step when the group completed it
    /// without this worker, at or below it when the key is behind this worker
    /// (restored from an older copy).
    pub fn key_version(&self) -> Option<u64> {
        self.status_version(metadata::KEY_VERSION)
    }

    fn status_version(&self, key: &'static str) -> Option<u64> {
        match self {
            ClientError::Rpc { status, .. } => metadata::version_in(status, key),
            _ => None,
        }
    }

    /// True when a server answered but no longer holds a key it was sent: it
    /// restarted empty at the same address (or just took the key over), so it
    /// needs the keys again, not a new map.
    pub fn server_emptied(&self) -> bool {
        matches!(self, ClientError::Rpc { status, .. } if status.code() == tonic::Code::NotFound)
    }

    /// True when the scheduler had no newer shard map within the wait.
    pub fn no_newer_map(&self) -> bool {
        matches!(self, ClientError::Rpc { what: "GetShardMap", status, .. } if status.code() == tonic::Code::DeadlineExceeded)
    }

    /// True when a server looks lost rather than the request wrong: it is
    /// unreachable (after the retries), or it no longer holds a key it was sent
    /// (it restarted empty, or took the key over). Placement and keys need
    /// repairing: a newer shard map, then the keys registered again.
    pub fn server_lost(&self) -> bool {
        match self {
            ClientError::Connect { .. } => true,
            ClientError::Rpc { status, .. } => {
                crate::retry::is_transient(status) || status.code() == tonic::Code::NotFound
            }
            _ => false,
        }
    }
}

/// How long a client waits for its peers to come up, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// How a client reaches the parameter servers.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server addresses (`host:port` or URIs); parameters are spread over all of them.
    pub servers: Vec<String>,
    /// HTTP/2 and message-size settings.
    pub transport: TransportConfig,
    /// Tensors larger than this are split over servers.
    pub partition_bytes: usize,
    /// Chunk size of streamed requests.
    pub chunk_bytes: usize,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// How long a pull waits for its version (and a start-up wait for the shard map).
    pub pull_timeout: Duration,
    /// How long [`PsClient::connect`] waits for the servers (or the scheduler) to
    /// come up.
    pub connect_timeout: Duration,
    /// A scheduler to take ranks, placement and servers from (instead of `servers`).
    pub scheduler: Option<String>,
}

impl ClientConfig {
    /// Defaults for `servers`.
    pub fn new(servers: Vec<String>) -> Self {
        Self {
            servers,
            transport: TransportConfig::default(),
            partition_bytes: DEFAULT_PARTITION_BYTES,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            retry: RetryPolicy::default(),
            pull_timeout: Duration::from_secs(60),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            scheduler: None,
        }
    }
}

/// What `JoinGroup` tells a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupInfo {
    /// This worker's rank (its `worker_id`).
    pub rank: u32,
    /// Workers in the group.
    pub workers: u32,
    /// How the servers combine pushes.
    pub consistency: Consistency,
}

/// What a worker was started with, checked by the server or the scheduler when
/// it joins, so that a worker started for another job fails at once instead of
/// waiting for a step that never comes. `None`: whatever the group has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expected {
    /// The rank the worker chose.
    pub rank: Option<u32>,
    /// The group size the worker was started with.
    pub workers: Option<u32>,
    /// The consistency model the worker was started with.
    pub consistency: Option<Consistency>,
}

impl Expected {
    /// Refuses a group that is not the one expected.
    ///
    /// # Errors
    /// [`ClientError::Usage`] naming the flag that differs.
    fn check(&self, group: &GroupInfo, joined: &str) -> Result<(), ClientError> {
        let mismatch = |setting: &str, theirs: String, ours: String| {
            ClientError::Usage(format!(
                "{joined}'s group has {setting} {theirs}, but this worker was started with --{setting} {ours}; start every process of the job with the same --{setting}"
            ))
        };
        if let Some(ours) = self.consistency.filter(|c| *c != group.consistency) {
            return Err(mismatch(
                "consistency",
                group.consistency.to_string(),
                ours.to_string(),
            ));
        }
        let has_group = group.consistency.has_group();
        if let Some(ours) = self.workers.filter(|w| has_group && *w != group.workers) {
            return Err(mismatch(
                "workers",
                group.workers.to_string(),
                ours.to_string(),
            ));
        }
        Ok(())
    }
}

/// A parameter's values as pulled, reassembled from its parts.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledParam {
    /// All elements, row-major.
    pub values: Vec<f32>,
    /// The lowest version among its parts.
    pub version: u64,
}

#[derive(Clone)]
struct Server {
    addr: String,
    client: ParameterServerClient<Channel>,
}

/// A worker's connection to every parameter server.
pub struct PsClient {
    config: ClientConfig,
    servers: Vec<Server>,
    placement: Placement,
    scheduler: Option<SchedulerClient<Channel>>,
    step: Arc<AtomicU64>,
    heartbeat: Option<JoinHandle<()>>,
    params: Vec<ParamInfo>,
    map_version: u64,
    latest_map: Arc<AtomicU64>,
    rank: Option<u32>,
}

impl Drop for PsClient {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
    }
}

impl PsClient {
    /// Connects to every server in `config` (or to its scheduler), waiting up to
    /// `config.connect_timeout` for each to come up. A lone server address that
    /// turns out to be a scheduler is used as one.
    ///
    /// # Errors
    /// [`ClientError::Rendezvous`] naming a peer that never came up or is not a
    /// parameter server; [`ClientError::Usage`] for no servers.
    pub async fn connect(mut config: ClientConfig) -> Result<Self, ClientError> {
        let (transport, wait) = (config.transport.clone(), config.connect_timeout);
        let mut scheduler = None;
        let mut servers = Vec::new();
        match (&config.scheduler, config.servers.as_slice()) {
            (Some(addr), _) => {
                let (_, channel) = rendezvous(addr, &[Peer::Scheduler], &transport, wait).await?;
                scheduler = Some(SchedulerClient::new(channel));
            }
            (None, []) => {
                return Err(ClientError::Usage(
                    "no parameter servers given; pass --server ADDR".into(),
                ));
            }
            (None, [addr]) => {
                let either = [Peer::ParameterServer, Peer::Scheduler];
                match rendezvous(addr, &either, &transport, wait).await? {
                    (Peer::Scheduler, channel) => {
                        tracing::info!(
                            addr,
                            "the address is a scheduler; taking rank and shard map from it"
                        );
                        scheduler = Some(SchedulerClient::new(channel));
                        config.scheduler = Some(addr.clone());
                    }
                    (_, channel) => servers.push(Server::new(addr, channel, &transport)),
                }
            }
            (None, addrs) => {
                let up = addrs.iter().map(|addr| async {
                    let (_, channel) =
                        rendezvous(addr, &[Peer::ParameterServer], &transport, wait).await?;
                    Ok::<_, ClientError>(Server::new(addr, channel, &transport))
                });
                servers = try_join_all(up).await?;
            }
        }
        Ok(Self {
            config,
            servers,
            placement: Placement::default(),
            scheduler,
            step: Arc::default(),
            heartbeat: None,
            params: Vec::new(),
            map_version: 0,
            latest_map: Arc::default(),
            rank: None,
        })
    }

    /// True when ranks, placement and servers come from a scheduler.
    pub fn has_scheduler(&self) -> bool {
        self.scheduler.is_some()
    }

    /// How long a pull waits for its version; also the bound on waiting for a
    /// repaired placement.
    pub fn pull_timeout(&self) -> Duration {
        self.config.pull_timeout
    }

    /// The server addresses.
    pub fn servers(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// The current placement.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Asks the first server for a rank in its worker group.
    ///
    /// # Errors
    /// [`ClientError::Rpc`], for example when the group is full.
    pub async fn join(&mut self, client_id: &str) -> Result<GroupInfo, ClientError> {
        self.join_expecting(client_id, Expected::default()).await
    }

    /// [`PsClient::join`] for a worker started with a rank, group size or
    /// consistency model: the server (or scheduler) refuses a group that differs.
    ///
    /// # Errors
    /// As [`PsClient::join`]; [`ClientError::Rpc`] with `FAILED_PRECONDITION` or
    /// [`ClientError::Usage`] naming the setting that differs.
    pub async fn join_expecting(
        &mut self,
        client_id: &str,
        expected: Expected,
    ) -> Result<GroupInfo, ClientError> {
        if self.scheduler.is_some() {
            let group = self.register_with_scheduler(client_id).await?;
            expected.check(&group, &format!("scheduler {}", self.scheduler_addr()))?;
            return Ok(group);
        }
        let server = self.servers[0].clone();
        let request = v1::JoinGroupRequest {
            client_id: client_id.into(),
            expected_workers: expected.workers.unwrap_or(0),
            expected_consistency: expected
                .consistency
                .map_or_else(String::new, |c| c.to_string()),
            rank: expected.rank,
        };
        let joined = self
            .call(&server, "JoinGroup", |mut client| {
                let request = request.clone();
                async move { client.join_group(request).await }
            })
            .await;
        let server = &server;
        let response = joined?;
        let consistency = response
            .consistency
            .parse()
            .map_err(|reason| ClientError::Protocol {
                what: "JoinGroup",
                addr: server.addr.clone(),
                reason,
            })?;
        let group = GroupInfo {
            rank: response.rank,
            workers: response.workers,
            consistency,
        };
        // A server that predates the expectations in JoinGroup ignores them.
        expected.check(&group, &format!("parameter server {}", server.addr))?;
        Ok(group)
    }

    async fn register_with_scheduler(&mut self, client_id: &str) -> Result<GroupInfo, ClientError> {
        let scheduler = self.scheduler.clone().expect("scheduler mode");
        let addr = self.scheduler_addr();
        let rpc = |what, status| ClientError::Rpc {
            what,
            addr: addr.clone(),
            status,
        };
        let request = v1::RegisterWorkerRequest {
            client_id: client_id.into(),
        };
        // A restarted worker may find every rank taken until the scheduler declares its
        // former self dead (one heartbeat timeout): wait for that, within the deadline.
        let deadline = tokio::time::Instant::now() + self.config.pull_timeout;
        let response = loop {
            let registered = self
                .config
                .retry
                .run("RegisterWorker", || {
                    let (mut s, r) = (scheduler.clone(), request.clone());
                    async move { s.register_worker(r).await }
                })
                .await;
            match registered {
                Err(status)
                    if status.code() == tonic::Code::ResourceExhausted
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::info!(
                        message = status.message(),
                        "every rank is taken; waiting for the scheduler to free a dead worker's rank"
                    );
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                other => break other.map_err(|s| rpc("RegisterWorker", s))?.into_inner(),
            }
        };
        let consistency = response
            .consistency
            .parse()
            .map_err(|reason| ClientError::Protocol {
                what: "RegisterWorker",
                addr: addr.clone(),
                reason,
            })?;
        let interval = Duration::from_millis(response.heartbeat_interval_ms.max(50));
        let beat = Heartbeat {
            rank: response.rank,
            step: Arc::clone(&self.step),
            latest_map: Arc::clone(&self.latest_map),
            interval,
        };
        self.heartbeat = Some(tokio::spawn(heartbeat(scheduler, beat)));
        self.rank = Some(response.rank);
        Ok(GroupInfo {
            rank: response.rank,
            workers: response.workers,
            consistency,
        })
    }

    /// The shard-map version this client routes with (0: no scheduler).
    pub fn map_version(&self) -> u64 {
        self.map_version
    }

    /// A newer shard-map version the scheduler announced than the one in use, if any.
    pub fn newer_map(&self) -> Option<u64> {
        let latest = self.latest_map.load(Ordering::Relaxed);
        (self.scheduler.is_some() && latest > self.map_version).then_some(latest)
    }

    /// Tells the scheduler this worker is done, so the group stops waiting for it at
    /// once rather than after the heartbeat timeout. Best effort: nothing to do
    /// without a scheduler, and a scheduler that does not answer within 2 seconds
    /// learns it from the missing heartbeats.
    pub async fn leave(&mut self) {
        let (Some(mut scheduler), Some(rank)) = (self.scheduler.clone(), self.rank) else {
            return;
        };
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        let node = Some(v1::heartbeat_request::Node::WorkerRank(rank));
        let leave = scheduler.leave(v1::HeartbeatRequest {
            node,
            step: self.step.load(Ordering::Relaxed),
        });
        if tokio::time::timeout(Duration::from_secs(2), leave)
            .await
            .is_ok_and(|r| r.is_ok())
        {
            tracing::info!(rank, "left the cluster");
        }
    }

    fn scheduler_addr(&self) -> String {
        self.config
            .scheduler
            .clone()
            .or_else(|| self.config.servers.first().cloned())
            .unwrap_or_default()
    }

    /// Decides where `params` live: from the scheduler's shard map (declaring the
    /// parameters first, then waiting for the map up to the pull timeout), or, with
    /// fixed servers, by the same local plan on every worker.
    ///
    /// # Errors
    /// [`ClientError`] when the scheduler refuses the parameters, no map comes in
    /// time (the message names what the scheduler still waits for), or a server in
    /// the map cannot be reached.
    pub async fn place(&mut self, params: &[ParamInfo]) -> Result<(), ClientError> {
        let Some(scheduler) = self.scheduler.clone() else {
            self.placement =
                Placement::plan(params, self.servers.len(), self.config.partition_bytes);
            return Ok(());
        };
        let addr = self.scheduler_addr();
        let rpc = |what, status| ClientError::Rpc {
            what,
            addr: addr.clone(),
            status,
        };
        let declared = params
            .iter()
            .map(|p| v1::DeclaredParam {
                name: p.name.clone(),
                elements: p.len() as u64,
                dtype: p.dtype.to_proto(),
            })
            .collect();
        let declare = v1::DeclareParamsRequest { params: declared };
        self.config
            .retry
            .run("DeclareParams", || {
                let (mut s, r) = (scheduler.clone(), declare.clone());
                async move { s.declare_params(r).await }
            })
            .await
            .map_err(|s| rpc("DeclareParams", s))?;
        self.params = params.to_vec();
        self.refresh(1).await
    }

    /// Fetches the scheduler's shard map at `min_version` or later and routes by it
    /// from now on (after a server answered that the map in use is stale).
    ///
    /// # Errors
    /// [`ClientError`] when no such map comes within the pull timeout or a server in
    /// it cannot be reached.
    pub async fn refresh(&mut self, min_version: u64) -> Result<(), ClientError> {
        self.refresh_within(min_version, self.config.pull_timeout)
            .await
    }

    /// [`PsClient::refresh`], waiting at most `wait` for the map: the scheduler
    /// answers `DEADLINE_EXCEEDED` ([`ClientError::no_newer_map`]) when none came.
    ///
    /// # Errors
    /// As [`PsClient::refresh`].
    pub async fn refresh_within(
        &mut self,
        min_version: u64,
        wait: Duration,
    ) -> Result<(), ClientError> {
        let Some(scheduler) = self.scheduler.clone() else {
            return Err(ClientError::Usage(
                "there is no scheduler to refresh the shard map from".into(),
            ));
        };
        let addr = self.scheduler_addr();
        let wait = v1::GetShardMapRequest {
            min_version: min_version.max(1),
            timeout_ms: wait.as_millis() as u64,
        };
        let fetched = self
            .config
            .retry
            .run("GetShardMap", || {
                let mut s = scheduler.clone();
                async move { s.get_shard_map(wait).await }
            })
            .await;
        let map = fetched
            .map_err(|status| ClientError::Rpc {
                what: "GetShardMap",
                addr: addr.clone(),
                status,
            })?
            .into_inner();
        self.servers = try_join_all(
            map.servers
                .iter()
                .map(|s| connect(&self.config.transport, &s.addr)),
        )
        .await?;
        let parts: Vec<(String, Part)> = map
            .parts
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    Part {
                        part: p.part,
                        server: p.server as usize,
                        start: p.start as usize,
                        len: p.len as usize,
                    },
                )
            })
            .collect();
        let placement = Placement::from_map(&self.params, &parts, self.servers.len());
        self.placement = placement.map_err(|reason| ClientError::Protocol {
            what: "GetShardMap",
            addr: addr.clone(),
            reason,
        })?;
        self.map_version = map.version;
        tracing::info!(version = map.version, servers = ?self.servers(), "placement from the scheduler's shard map");
        Ok(())
    }

    async fn call<T, F, Fut>(
        &self,
        server: &Server,
        what: &'static str,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(ParameterServerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_with(self.config.retry, server, what, call).await
    }

    /// The retries of a pull: none. A pull is never retried by itself: when its
    /// connection broke, the server may have restarted and lost this worker's
    /// push of the step (another worker may even have restored the key since),
    /// so the pull would wait for a push that is never repeated. The trainer
    /// repeats the whole step instead, push included; a repeated push is applied
    /// once.
    fn pull_retry(&self) -> RetryPolicy {
        RetryPolicy {
            attempts: 1,
            ..self.config.retry
        }
    }

    async fn call_with<T, F, Fut>(
        &self,
        retry: RetryPolicy,
        server: &Server,
        what: &'static str,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(ParameterServerClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        retry
            .run(what, || call(server.client.clone()))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| ClientError::Rpc {
                what,
                addr: server.addr.clone(),
                status,
            })
    }

    fn unary_limit(&self) -> usize {
        self.config.transport.payload_limit()
    }

    /// The parts each server holds, with the bytes of each part cut from `data`.
    fn parts_by_server<'a>(
        &'a self,
        data: &'a [(String, Bytes)],
    ) -> Result<Vec<Vec<PartData<'a>>>, ClientError> {
        let mut by_server = vec![Vec::new(); self.servers.len()];
        for (name, bytes) in data {
            let placed = self.placed(name)?;
            let size = placed.info.dtype.size();
            if bytes.len() != placed.info.len() * size {
                let reason = format!(
                    "{name} has {} bytes, but its shape {:?} needs {}",
                    bytes.len(),
                    placed.info.shape,
                    placed.info.len() * size
                );
                return Err(ClientError::Usage(reason));
            }
            for part in &placed.parts {
                let slice = bytes.slice(part.start * size..(part.start + part.len) * size);
                by_server[part.server].push((placed, *part, slice));
            }
        }
        Ok(by_server)
    }

    fn placed(&self, name: &str) -> Result<&Placed, ClientError> {
        self.placement.get(name).ok_or_else(|| {
            ClientError::Usage(format!(
                "parameter {name} was never placed; call place() first"
            ))
        })
    }

    /// Registers every placed parameter with its initial values in `values` (by name)
    /// and `optimizer`. Returns true when this call created every key (this worker's
    /// values won), false when they existed already.
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn register(
        &self,
        values: &[(String, Bytes)],
        optimizer: &v1::Optimizer,
    ) -> Result<bool, ClientError> {
        self.register_copy(values, optimizer, 0).await
    }

    /// Registers every placed parameter again with this worker's copy of its values
    /// at `version` (0: initial values), so a server that lost or newly owns a key
    /// restores it (from its checkpoints, or from this copy when that is newer).
    /// Returns true when every key took these values.
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn register_copy(
        &self,
        values: &[(String, Bytes)],
        optimizer: &v1::Optimizer,
        version: u64,
    ) -> Result<bool, ClientError> {
        let by_server = self.parts_by_server(values)?;
        let calls = by_server
            .iter()
            .enumerate()
            .filter(|(_, parts)| !parts.is_empty())
            .map(|(s, parts)| {
                let inits: Vec<(v1::ParameterSpec, Bytes)> = parts
                    .iter()
                    .map(|(placed, part, data)| (spec_of(placed, part, optimizer), data.clone()))
                    .collect();
                self.register_on(&self.servers[s], inits, version)
            });
        let created = try_join_all(calls).await?;
        Ok(created.into_iter().all(|c| c))
    }

    async fn register_on(
        &self,
        server: &Server,
        inits: Vec<(v1::ParameterSpec, Bytes)>,
        restore_version: u64,
    ) -> Result<bool, ClientError> {
        let bytes: usize = inits.iter().map(|(_, data)| data.len()).sum();
        let response = if bytes <= self.unary_limit() {
            let params: Vec<_> = inits
                .into_iter()
                .map(|(spec, initial)| v1::ParameterInit {
                    spec: Some(spec),
                    initial,
                })
                .collect();
            let request = v1::RegisterRequest {
                params,
                map_version: self.map_version,
                restore_version,
            };
            self.call(server, "Register", |mut c| {
                let request = request.clone();
                async move { c.register(request).await }
            })
            .await?
        } else {
            let chunks: Vec<v1::RegisterChunk> = inits
                .iter()
                .flat_map(|(spec, data)| {
                    let (chunk_bytes, map_version) = (self.config.chunk_bytes, self.map_version);
                    register_chunks(spec, data, chunk_bytes, (map_version, restore_version))
                })
                .collect();
            self.call(server, "RegisterStream", |mut c| {
                let chunks = chunks.clone();
                async move { c.register_stream(tokio_stream::iter(chunks)).await }
            })
            .await?
        };
        Ok(response.keys.iter().all(|k| k.created))
    }

    /// Pushes the gradients of `step` (by parameter name) to every server concurrently.
    /// Returns how many keys took them (the rest were retries already taken).
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn push(
        &self,
        worker: u32,
        step: u64,
        grads: &[(String, Bytes)],
    ) -> Result<usize, ClientError> {
        self.step.store(step, Ordering::Relaxed);
        let by_server = self.parts_by_server(grads)?;
        let calls = by_server
            .iter()
            .enumerate()
            .filter(|(_, parts)| !parts.is_empty())
            .map(|(s, parts)| {
                let tensors: Vec<v1::Tensor> = parts
                    .iter()
                    .map(|(placed, part, data)| tensor_of(placed, part, data.clone()))
                    .collect();
                self.push_on(&self.servers[s], worker, step, tensors)
            });
        // Every server's push runs to its end, so that when one refuses a step the
        // group completed without this worker, the others have taken theirs (or
        // refused too) before the worker joins at the newer step.
        let outcomes = futures::future::join_all(calls).await;
        Ok(settled(outcomes)?.into_iter().sum())
    }

    async fn push_on(
        &self,
        server: &Server,
        worker_id: u32,
        step: u64,
        grads: Vec<v1::Tensor>,
    ) -> Result<usize, ClientError> {
        let bytes: usize = grads.iter().map(|t| t.data.len()).sum();
        let response = if bytes <= self.unary_limit() {
            let request = v1::PushRequest {
                map_version: self.map_version,
                worker_id,
                step,
                grads,
            };
            self.call(server, "Push", |mut c| {
                let request = request.clone();
                async move { c.push(request).await }
            })
            .await?
        } else {
            let chunks: Vec<v1::PushChunk> = grads
                .iter()
                .flat_map(|t| tensor_chunks(t, self.config.chunk_bytes))
                .map(|chunk| v1::PushChunk {
                    map_version: self.map_version,
                    worker_id,
                    step,
                    chunk: Some(chunk),
                })
                .collect();
            self.call(server, "PushStream", |mut c| {
                let chunks = chunks.clone();
                async move { c.push_stream(tokio_stream::iter(chunks)).await }
            })
            .await?
        };
        Ok(response.keys.iter().filter(|k| k.accepted).count())
    }

    /// Pulls every placed parameter once each of its parts reaches `min_version`.
    ///
    /// # Errors
    /// [`ClientError`] from any server, for example `DEADLINE_EXCEEDED` naming the
    /// workers a BSP step still waits for.
    pub async fn pull(
        &self,
        min_version: u64,
    ) -> Result<BTreeMap<String, PulledParam>, ClientError> {
        let mut keys_by_server: Vec<Vec<(ParamKey, usize)>> = vec![Vec::new(); self.servers.len()];
        for placed in self.placement.params() {
            for part in &placed.parts {
                let bytes = part.len * placed.info.dtype.size();
                keys_by_server[part.server]
                    .push((ParamKey::new(&placed.info.name, part.part), bytes));
            }
        }
        let calls = keys_by_server
            .iter()
            .enumerate()
            .filter(|(_, keys)| !keys.is_empty())
            .map(|(s, keys)| self.pull_on(&self.servers[s], keys, min_version));
        let pulled: BTreeMap<ParamKey, (TensorData, u64)> =
            try_join_all(calls).await?.into_iter().flatten().collect();
        self.placement
            .params()
            .map(|placed| Ok((placed.info.name.clone(), reassemble(placed, &pulled)?)))
            .collect()
    }

    async fn pull_on(
        &self,
        server: &Server,
        keys: &[(ParamKey, usize)],
        min_version: u64,
    ) -> Result<Vec<PulledKey>, ClientError> {
        let request = v1::PullRequest {
            map_version: self.map_version,
            keys: keys
                .iter()
                .map(|(k, _)| v1::KeyRef {
                    name: k.name.clone(),
                    part: k.part,
                })
                .collect(),
            min_version,
            timeout_ms: self.config.pull_timeout.as_millis() as u64,
            chunk_bytes: self.config.chunk_bytes as u64,
        };
        let bytes: usize = keys.iter().map(|(_, b)| b).sum();
        let protocol = |reason: String| ClientError::Protocol {
            what: "Pull",
            addr: server.addr.clone(),
            reason,
        };
        if bytes <= self.unary_limit() {
            let response = self
                .call_with(self.pull_retry(), server, "Pull", |mut c| {
                    let request = request.clone();
                    async move { c.pull(request).await }
                })
                .await?;
            return response
                .tensors
                .iter()
                .map(|p| decode_pulled(p).map_err(protocol))
                .collect();
        }
        let chunks = self
            .call_with(self.pull_retry(), server, "PullStream", |mut c| {
                let request = request.clone();
                async move {
                    let response = c.pull_stream(request).await?;
                    let (metadata, stream, extensions) = response.into_parts();
                    let chunks: Vec<v1::PullChunk> = stream.collect::<Result<_, Status>>().await?;
                    Ok(tonic::Response::from_parts(metadata, chunks, extensions))
                }
            })
            .await?;
        assemble_pulled(chunks).map_err(protocol)
    }
}

/// The values of calls that all ran to their end, or the error to act on: the
/// highest key version a refused step named when any server named one (a step
/// completed without this worker wins over a key behind it), otherwise the
/// first error.
fn settled<T>(outcomes: Vec<Result<T, ClientError>>) -> Result<Vec<T>, ClientError> {
    let mut values = Vec::with_capacity(outcomes.len());
    let mut chosen: Option<ClientError> = None;
    for outcome in outcomes {
        match outcome {
            Ok(value) => values.push(value),
            Err(error) => {
                let newer = |c: &ClientError| error.key_version() > c.key_version();
                if chosen.as_ref().is_none_or(newer) {
                    chosen = Some(error);
                }
            }
        }
    }
    chosen.map_or(Ok(values), Err)
}

/// What the heartbeat task reports and records.
struct Heartbeat {
    rank: u32,
    step: Arc<AtomicU64>,
    latest_map: Arc<AtomicU64>,
    interval: Duration,
}

/// Tells the scheduler every interval that this worker lives, with its step, and
/// records the map version it answers with.
async fn heartbeat(mut scheduler: SchedulerClient<Channel>, beat: Heartbeat) {
    let (rank, mut reachable) = (beat.rank, true);
    loop {
        tokio::time::sleep(beat.interval).await;
        let node = Some(v1::heartbeat_request::Node::WorkerRank(rank));
        match scheduler
            .heartbeat(v1::HeartbeatRequest {
                node,
                step: beat.step.load(Ordering::Relaxed),
            })
            .await
        {
            Ok(response) => {
                beat.latest_map
                    .fetch_max(response.into_inner().map_version, Ordering::Relaxed);
                if !reachable {
                    tracing::info!(rank, "the scheduler is reachable again");
                    reachable = true;
                }
            }
            Err(status) if status.code() == tonic::Code::NotFound => {
                tracing::error!(
                    rank,
                    "the scheduler declared this worker dead (missed heartbeats); its group goes on without it"
                );
                return;
            }
            Err(status) if reachable => {
                tracing::warn!(
                    rank,
                    message = status.message(),
                    "scheduler unreachable; training goes on with the last shard map"
                );
                reachable = false;
            }
            Err(_) => {}
        }
    }
}

/// Opens an HTTP/2 channel to `addr`, failing within the connect timeout.
async fn open_channel(transport: &TransportConfig, addr: &str) -> Result<Channel, ClientError> {
    let connect_error = |source| ClientError::Connect {
        addr: addr.to_string(),
        source,
    };
    transport
        .endpoint(http_uri(addr))
        .map_err(connect_error)?
        .connect()
        .await
        .map_err(connect_error)
}

impl Server {
    /// The parameter server at `addr` over `channel`, with the configured message limits.
    fn new(addr: &str, channel: Channel, transport: &TransportConfig) -> Self {
        let limit = transport.max_message_bytes;
        let client = ParameterServerClient::new(channel)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        Server {
            addr: addr.to_string(),
            client,
        }
    }
}

/// Connects to the parameter server at `addr` now (it is in the shard map, so it
/// should be up: no waiting for it).
async fn connect(transport: &TransportConfig, addr: &str) -> Result<Server, ClientError> {
    let channel = open_channel(transport, addr).await?;
    Ok(Server::new(addr, channel, transport))
}

fn spec_of(placed: &Placed, part: &Part, optimizer: &v1::Optimizer) -> v1::ParameterSpec {
    v1::ParameterSpec {
        name: placed.info.name.clone(),
        part: part.part,
        dtype: placed.info.dtype.to_proto(),
        shape: wire_shape(&placed.part_shape(part)),
        optimizer: Some(*optimizer),
        whole_shape: if placed.parts.len() > 1 {
            wire_shape(&placed.info.shape)
        } else {
            Vec::new()
        },
    }
}

fn tensor_of(placed: &Placed, part: &Part, data: Bytes) -> v1::Tensor {
    v1::Tensor {
        name: placed.info.name.clone(),
        part: part.part,
        dtype: placed.info.dtype.to_proto(),
        shape: wire_shape(&placed.part_shape(part)),
        data,
    }
}

fn header_of(name: &str, part: u32, dtype: i32, shape: &[u64]) -> ChunkHeader {
    ChunkHeader::from_wire(name, part, dtype, shape).expect("headers built from a valid placement")
}

fn tensor_chunks(tensor: &v1::Tensor, chunk_bytes: usize) -> Vec<v1::TensorChunk> {
    let header = header_of(&tensor.name, tensor.part, tensor.dtype, &tensor.shape);
    to_wire_chunks(&header, &tensor.data, chunk_bytes)
}

fn register_chunks(
    spec: &v1::ParameterSpec,
    data: &Bytes,
    chunk_bytes: usize,
    (map_version, restore_version): (u64, u64),
) -> Vec<v1::RegisterChunk> {
    let header = header_of(&spec.name, spec.part, spec.dtype, &spec.shape);
    to_wire_chunks(&header, data, chunk_bytes)
        .into_iter()
        .map(|chunk| v1::RegisterChunk {
            map_version,
            restore_version,
            spec: Some(spec.clone()),
            offset: chunk.offset,
            data: chunk.data,
        })
        .collect()
}

fn decode_pulled(pulled: &v1::PulledTensor) -> Result<(ParamKey, (TensorData, u64)), String> {
    let tensor = pulled
        .tensor
        .as_ref()
        .ok_or("a PulledTensor without a tensor")?;
    let data = TensorData::from_proto(tensor).map_err(|e| e.to_string())?;
    Ok((
        ParamKey::new(&tensor.name, tensor.part),
        (data, pulled.version),
    ))
}

fn assemble_pulled(chunks: Vec<v1::PullChunk>) -> Result<Vec<PulledKey>, String> {
    let mut assembler = Assembler::new();
    let mut versions = BTreeMap::new();
    for message in chunks {
        let chunk = message.chunk.ok_or("a PullChunk without a chunk")?;
        versions.insert(ParamKey::new(&chunk.name, chunk.part), message.version);
        assembler.add_chunk(&chunk).map_err(|e| e.to_string())?;
    }
    let tensors = assembler.finish().map_err(|e| e.to_string())?;
    Ok(tensors
        .into_iter()
        .map(|(key, data)| {
            let version = versions[&key];
            (key, (data, version))
        })
        .collect())
}

fn reassemble(
    placed: &Placed,
    pulled: &BTreeMap<ParamKey, (TensorData, u64)>,
) -> Result<PulledParam, ClientError> {
    let mut values = vec![0f32; placed.info.len()];
    let mut version = u64::MAX;
    for part in &placed.parts {
        let key = ParamKey::new(&placed.info.name, part.part);
        let (data, part_version) = pulled
            .get(&key)
            .ok_or_else(|| ClientError::Usage(format!("no values came back for {key}")))?;
        if data.len() != part.len {
            return Err(ClientError::Usage(format!(
                "{key} came back with {} elements, expected {}",
                data.len(),
                part.len
            )));
        }
        let target = &mut values[part.start..part.start + part.len];
        data.for_each_f32_block(|start, block| {
            target[start..start + block.len()].copy_from_slice(block)
        });
        version = version.min(*part_version);
    }
    Ok(PulledParam {
        values,
        version: if version == u64::MAX { 0 } else { version },
    })
}
