//! [`SchedulerService`]: the thin gRPC layer over the [`SchedulerState`]. Who may
//! call each method is the access layer's ([`crate::methods`]). Each handler
//! validates, calls the membership under its lock (never across
//! `.await`), and maps the outcome to a precise status. Waits (for a map, for a
//! barrier) watch a change counter and end at their deadline with a message
//! naming what is missing.

use std::sync::Arc;
use std::time::Instant;

use ps_common::access::Access;
use ps_proto::ids::{MapVersion, Rank, ServerId, Step};
use ps_proto::v1;
use ps_proto::v1::scheduler_server::{Scheduler, SchedulerServer};
use tonic::{Request, Response, Status};

use crate::barrier::BarrierState;
use crate::config::SchedulerConfig;
use crate::declared::declared_params;
use crate::membership::{Membership, MembershipError, Node};
use crate::roster::Load;
use crate::shard_map::ShardMap;

pub use crate::shared_state::SchedulerState;

/// The `ps.v1.Scheduler` service.
#[derive(Debug, Clone)]
pub struct SchedulerService {
    state: Arc<SchedulerState>,
}

/// A new registration's secret.
fn new_secret() -> Result<String, Status> {
    ps_common::certs::random_token().map_err(|e| {
        Status::internal(format!(
            "cannot make a registration secret (the system's random source: {e})"
        ))
    })
}

impl SchedulerService {
    /// A service over `state`.
    pub fn new(state: Arc<SchedulerState>) -> Self {
        Self { state }
    }

    /// The tonic server, reading and writing messages of up to the
    /// transport's limit, behind the access layer that checks each method's
    /// role ([`crate::methods::METHODS`]).
    pub fn into_server(self) -> Access<SchedulerServer<Self>> {
        let transport = self.state.config.transport.clone();
        let server = transport.limited(SchedulerServer::new(self));
        Access::new(server, crate::methods::METHODS, None)
    }
}

/// The longest server address taken: a DNS name (253 bytes) and a port.
const MAX_ADDRESS_BYTES: usize = 260;

fn membership_status(error: MembershipError) -> Status {
    match error {
        MembershipError::GroupFull { .. } | MembershipError::TooManyServers { .. } => {
            Status::resource_exhausted(error.to_string())
        }
        MembershipError::UnknownNode { .. } => Status::not_found(error.to_string()),
        MembershipError::ParamsConflict { .. } => Status::failed_precondition(error.to_string()),
    }
}

fn node_of(request: &v1::HeartbeatRequest) -> Result<Node, Status> {
    match request.node {
        Some(v1::heartbeat_request::Node::ServerId(id)) => Ok(Node::Server(ServerId(id))),
        Some(v1::heartbeat_request::Node::WorkerRank(rank)) => Ok(Node::Worker(Rank(rank))),
        None => Err(Status::invalid_argument(
            "set node.server_id or node.worker_rank",
        )),
    }
}

/// The wire form of a shard map.
pub fn map_to_proto(map: &ShardMap) -> v1::ShardMap {
    v1::ShardMap {
        version: map.version.get(),
        servers: map
            .servers
            .iter()
            .map(|(id, addr)| v1::MapServer {
                id: id.get(),
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
        workers: map.workers.iter().map(|r| r.get()).collect(),
        group_size: map.group_size,
    }
}

/// Refuses to send a map larger than one message may be: servers registered
/// after the parameters were declared can split them into more parts than the
/// declaration was checked for.
fn check_map_size(map: &v1::ShardMap, limit: usize) -> Result<(), Status> {
    use prost::Message;
    let bytes = map.encoded_len();
    if bytes <= limit {
        return Ok(());
    }
    Err(Status::resource_exhausted(format!(
        "shard map version {} takes {bytes} bytes ({} parts over {} servers), past the {limit} bytes one message may take; declare fewer or larger parameters, or run fewer servers",
        map.version,
        map.parts.len(),
        map.servers.len()
    )))
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
        if addr.is_empty() || addr.len() > MAX_ADDRESS_BYTES {
            return Err(Status::invalid_argument(format!(
                "RegisterServer needs the address workers reach the server at, host:port of at most {MAX_ADDRESS_BYTES} bytes (got {} bytes)",
                addr.len()
            )));
        }
        let secret = new_secret()?;
        let server_id = self
            .state
            .update(|m| {
                let id = m.register_server(&addr, Instant::now())?;
                self.state.owners.grant(Node::Server(id), &secret);
                Ok(id)
            })
            .map_err(membership_status)?;
        tracing::info!(%server_id, addr, "server registered");
        Ok(Response::new(v1::RegisterServerResponse {
            server_id: server_id.get(),
            heartbeat_interval_ms: interval_ms(&self.state.config),
            secret,
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
        let secret = new_secret()?;
        let rank = self
            .state
            .update(|m| {
                let rank = m.register_worker(&client_id, Instant::now())?;
                self.state.owners.grant(Node::Worker(rank), &secret);
                Ok(rank)
            })
            .map_err(membership_status)?;
        tracing::info!(%rank, client_id, "worker registered");
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
            rank: rank.get(),
            workers,
            consistency: config.consistency.to_string(),
            heartbeat_interval_ms: interval_ms(config),
            secret,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let request = request.into_inner();
        let node = node_of(&request)?;
        self.state
            .owners
            .check(node, &request.secret, "Heartbeat")?;
        // A heartbeat changes no map, so it wakes no waiter.
        let exit_when_done = self.state.config.exit_when_done;
        let (beat, job_done) = self.state.quietly(|membership| {
            let beat = membership.heartbeat(node, Step(request.step), Instant::now());
            let load = Load {
                pushes: request.pushes,
                push_bytes: request.push_bytes,
            };
            membership.record_load(node, load);
            (beat, exit_when_done && membership.job_done())
        });
        let map_version = beat.map_err(membership_status)?;
        Ok(Response::new(v1::HeartbeatResponse {
            map_version: map_version.get(),
            job_done,
        }))
    }

    async fn leave(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::LeaveResponse>, Status> {
        let node = node_of(request.get_ref())?;
        self.state
            .owners
            .check(node, &request.get_ref().secret, "Leave")?;
        let step = Step(request.get_ref().step);
        self.state.update(|m| m.leave(node, step));
        tracing::info!(%node, %step, "left the cluster");
        Ok(Response::new(v1::LeaveResponse {}))
    }

    async fn declare_params(
        &self,
        request: Request<v1::DeclareParamsRequest>,
    ) -> Result<Response<v1::DeclareParamsResponse>, Status> {
        let declared = request.into_inner().params;
        let servers = self.state.read(Membership::planning_servers);
        let params = declared_params(declared, servers)?;
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
        let wanted = MapVersion(request.min_version.max(1));
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
        if let Some(map) = &found {
            check_map_size(map, self.state.config.transport.max_message_bytes)?;
        }
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
        let name = request.name;
        let arrived = Instant::now();
        self.state
            .update_barriers(|b| b.arrive(&name, Rank(request.rank)));
        let released = self
            .state
            .wait_for(wait, |s| match s.barrier(&name) {
                BarrierState::Released(workers) => Some(workers),
                BarrierState::Waiting(_) => None,
            })
            .await;
        released
            .map(|workers| {
                let waited = arrived.elapsed().as_secs_f64();
                self.state.barrier_waits.observe(waited);
                let workers = workers.iter().map(|r| r.get()).collect();
                Response::new(v1::BarrierResponse { workers })
            })
            .ok_or_else(|| {
                let waiting = match self.state.barrier(&name) {
                    BarrierState::Waiting(waiting) => waiting,
                    BarrierState::Released(_) => Vec::new(),
                };
                Status::deadline_exceeded(format!(
                    "waited {wait:?} at barrier `{name}`: live workers {waiting:?} have not arrived"
                ))
            })
    }

    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let now = Instant::now();
        let silent_ms = |seen: Instant| now.saturating_duration_since(seen).as_millis() as u64;
        let response = self.state.read(|m| {
            let map = m.map();
            let owned = |index: usize| map.map_or((0, 0), |map| map.owned_by(index));
            let servers = m
                .servers()
                .into_iter()
                .map(|server| {
                    let index =
                        map.and_then(|map| map.servers.iter().position(|(id, _)| *id == server.id));
                    let (parts, bytes) = index.map_or((0, 0), owned);
                    v1::ServerStatus {
                        id: server.id.get(),
                        addr: server.name,
                        alive: server.alive,
                        parts,
                        bytes,
                        left: server.left,
                        pushes: server.load.pushes,
                        push_bytes: server.load.push_bytes,
                        silent_ms: silent_ms(server.last_seen),
                    }
                })
                .collect();
            let workers = m
                .workers()
                .into_iter()
                .map(|worker| v1::WorkerStatus {
                    rank: worker.id.get(),
                    alive: worker.alive,
                    last_step: worker.last_step.get(),
                    left: worker.left,
                    silent_ms: silent_ms(worker.last_seen),
                })
                .collect();
            v1::StatusResponse {
                servers,
                workers,
                map_version: map.map_or(0, |m| m.version.get()),
                waiting_for: m.missing(),
            }
        });
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_past_the_message_limit_is_refused_with_its_size() {
        let part = |i: u32| v1::MapPart {
            name: format!("{i:0>200}"),
            ..v1::MapPart::default()
        };
        let map = v1::ShardMap {
            version: 7,
            parts: (0..100).map(part).collect(),
            ..v1::ShardMap::default()
        };
        assert!(check_map_size(&map, 1 << 20).is_ok());
        let refused = check_map_size(&map, 10_000).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        for words in ["version 7", "100 parts", "past the 10000 bytes"] {
            assert!(refused.message().contains(words), "{}", refused.message());
        }
    }
}
