//! The control plane: `Directory`, where a client gets its rank, its servers
//! and its placement. With fixed servers the first hands out ranks
//! (`JoinGroup`) and every worker plans placement the same way; with a
//! scheduler, the scheduler hands out ranks, takes heartbeats and a worker's
//! leaving, and publishes shard maps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ps_proto::auth::AuthChannel;
use ps_proto::consistency::Consistency;
use ps_proto::ids::{MapVersion, Rank, Step};
use ps_proto::transport::TransportConfig;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::error::{ClientError, Rpc};
use crate::placement::ParamInfo;
use crate::retry::RetryPolicy;
use crate::server::Server;

/// What joining the group tells a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupInfo {
    /// This worker's rank (its `worker_id`).
    pub rank: Rank,
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
    pub rank: Option<Rank>,
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
    pub(crate) fn check(&self, group: &GroupInfo, joined: &str) -> Result<(), ClientError> {
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

/// Where a client gets its rank, servers and placement.
pub(crate) enum Directory {
    /// Fixed servers: the first hands out ranks, placement is planned locally.
    Fixed,
    /// A scheduler hands out ranks, servers and shard maps.
    Scheduler(Box<SchedulerLink>),
}

/// A worker's link to the scheduler.
pub(crate) struct SchedulerLink {
    pub(crate) addr: String,
    client: SchedulerClient<AuthChannel>,
    /// The step this worker last pushed, reported by the heartbeats.
    step: Arc<AtomicU64>,
    /// The newest map version the scheduler answered a heartbeat with.
    latest_map: Arc<AtomicU64>,
    heartbeat: Option<JoinHandle<()>>,
    rank: Option<u32>,
    /// The secret of this worker's registration, which its heartbeats and `Leave` carry.
    secret: String,
    /// The parameters declared, to read the shard maps against.
    pub(crate) params: Vec<ParamInfo>,
}

impl Drop for SchedulerLink {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
    }
}

/// Asks `server` for a rank in its worker group (the fixed-server directory).
pub(crate) async fn join_group(
    server: &Server,
    retry: &RetryPolicy,
    client_id: &str,
    expected: Expected,
) -> Result<GroupInfo, ClientError> {
    let request = v1::JoinGroupRequest {
        client_id: client_id.into(),
        expected_workers: expected.workers.unwrap_or(0),
        expected_consistency: expected
            .consistency
            .map_or_else(String::new, |c| c.to_string()),
        rank: expected.rank.map(Rank::get),
    };
    let response = server
        .call(retry, Rpc::JoinGroup, |mut client| {
            let request = request.clone();
            async move { client.join_group(request).await }
        })
        .await?;
    let consistency = response
        .consistency
        .parse()
        .map_err(|reason| ClientError::Protocol {
            what: Rpc::JoinGroup,
            addr: server.addr.clone(),
            reason,
        })?;
    let group = GroupInfo {
        rank: Rank(response.rank),
        workers: response.workers,
        consistency,
    };
    // A server that predates the expectations in JoinGroup ignores them.
    expected.check(&group, &format!("parameter server {}", server.addr))?;
    Ok(group)
}

impl SchedulerLink {
    /// A link to the scheduler at `addr` over `channel` (carrying `transport`'s
    /// token); nothing registered yet.
    pub(crate) fn new(addr: &str, channel: Channel, transport: &TransportConfig) -> Self {
        Self {
            addr: addr.to_string(),
            client: SchedulerClient::new(transport.authed(channel)),
            step: Arc::default(),
            latest_map: Arc::default(),
            heartbeat: None,
            rank: None,
            secret: String::new(),
            params: Vec::new(),
        }
    }

    fn rpc(&self, what: Rpc, status: tonic::Status) -> ClientError {
        ClientError::Rpc {
            what,
            addr: self.addr.clone(),
            status,
        }
    }

    /// Registers this worker for a rank, waiting up to `wait` while every rank
    /// is taken (a restarted worker's former self is declared dead after one
    /// heartbeat timeout), then heartbeats in the background.
    pub(crate) async fn register(
        &mut self,
        retry: &RetryPolicy,
        client_id: &str,
        wait: Duration,
    ) -> Result<GroupInfo, ClientError> {
        let request = v1::RegisterWorkerRequest {
            client_id: client_id.into(),
        };
        let deadline = tokio::time::Instant::now() + wait;
        let response = loop {
            let registered = retry
                .run(Rpc::RegisterWorker.name(), || {
                    let (mut s, r) = (self.client.clone(), request.clone());
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
                other => {
                    break other
                        .map_err(|s| self.rpc(Rpc::RegisterWorker, s))?
                        .into_inner();
                }
            }
        };
        let consistency = response
            .consistency
            .parse()
            .map_err(|reason| ClientError::Protocol {
                what: Rpc::RegisterWorker,
                addr: self.addr.clone(),
                reason,
            })?;
        self.secret = response.secret.clone();
        let beat = Heartbeat {
            rank: response.rank,
            secret: response.secret,
            step: Arc::clone(&self.step),
            latest_map: Arc::clone(&self.latest_map),
            interval: Duration::from_millis(response.heartbeat_interval_ms.max(50)),
        };
        self.heartbeat = Some(tokio::spawn(heartbeat(self.client.clone(), beat)));
        self.rank = Some(response.rank);
        Ok(GroupInfo {
            rank: Rank(response.rank),
            workers: response.workers,
            consistency,
        })
    }

    /// Records the step this worker pushes, for the heartbeats.
    pub(crate) fn record_step(&self, step: Step) {
        self.step.store(step.get(), Ordering::Relaxed);
    }

    /// A map version newer than `current` that the scheduler announced, if any.
    pub(crate) fn newer_than(&self, current: MapVersion) -> Option<MapVersion> {
        let latest = MapVersion(self.latest_map.load(Ordering::Relaxed));
        (latest > current).then_some(latest)
    }

    /// Declares the model's parameters, so the scheduler can place them.
    pub(crate) async fn declare(
        &mut self,
        retry: &RetryPolicy,
        params: &[ParamInfo],
    ) -> Result<(), ClientError> {
        let declared = params
            .iter()
            .map(|p| v1::DeclaredParam {
                name: p.name.clone(),
                elements: p.len() as u64,
                dtype: p.dtype.to_proto(),
            })
            .collect();
        let declare = v1::DeclareParamsRequest { params: declared };
        retry
            .run(Rpc::DeclareParams.name(), || {
                let (mut s, r) = (self.client.clone(), declare.clone());
                async move { s.declare_params(r).await }
            })
            .await
            .map_err(|s| self.rpc(Rpc::DeclareParams, s))?;
        self.params = params.to_vec();
        Ok(())
    }

    /// The shard map at `min_version` or later, waiting at most `wait` for it:
    /// the scheduler answers `DEADLINE_EXCEEDED` when none came.
    pub(crate) async fn shard_map(
        &self,
        retry: &RetryPolicy,
        min_version: MapVersion,
        wait: Duration,
    ) -> Result<v1::ShardMap, ClientError> {
        let request = v1::GetShardMapRequest {
            min_version: min_version.get().max(1),
            timeout_ms: wait.as_millis() as u64,
        };
        retry
            .run(Rpc::GetShardMap.name(), || {
                let mut s = self.client.clone();
                async move { s.get_shard_map(request).await }
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.rpc(Rpc::GetShardMap, status))
    }

    /// Tells the scheduler this worker is done, so the group stops waiting for
    /// it at once rather than after the heartbeat timeout. Best effort: a
    /// scheduler that does not answer within 2 seconds learns it from the
    /// missing heartbeats.
    pub(crate) async fn leave(&mut self) {
        let Some(rank) = self.rank else {
            return;
        };
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        let node = Some(v1::heartbeat_request::Node::WorkerRank(rank));
        let leave = self.client.leave(v1::HeartbeatRequest {
            node,
            step: self.step.load(Ordering::Relaxed),
            secret: self.secret.clone(),
            ..v1::HeartbeatRequest::default()
        });
        if tokio::time::timeout(Duration::from_secs(2), leave)
            .await
            .is_ok_and(|r| r.is_ok())
        {
            tracing::info!(rank, "left the cluster");
        }
    }
}

/// What the heartbeat task reports and records.
struct Heartbeat {
    rank: u32,
    /// The secret of this worker's registration.
    secret: String,
    step: Arc<AtomicU64>,
    latest_map: Arc<AtomicU64>,
    interval: Duration,
}

/// Tells the scheduler every interval that this worker lives, with its step, and
/// records the map version it answers with.
async fn heartbeat(mut scheduler: SchedulerClient<AuthChannel>, beat: Heartbeat) {
    let (rank, mut reachable) = (beat.rank, true);
    loop {
        tokio::time::sleep(beat.interval).await;
        let node = Some(v1::heartbeat_request::Node::WorkerRank(rank));
        match scheduler
            .heartbeat(v1::HeartbeatRequest {
                node,
                step: beat.step.load(Ordering::Relaxed),
                secret: beat.secret.clone(),
                ..v1::HeartbeatRequest::default()
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
            Err(status) if status.code() == tonic::Code::PermissionDenied => {
                tracing::error!(
                    rank,
                    reason = status.message(),
                    "another registration holds this worker's rank now; this worker's heartbeats stop"
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
