//! Following the scheduler: a shard registers with it, heartbeats, and applies each
//! new shard map's set of live workers to its store, so a BSP step stops waiting
//! for a worker the scheduler declared dead. While the scheduler is unreachable the
//! shard keeps serving with what it last knew and keeps trying; on shutdown it
//! leaves the cluster. When a scheduler run with `--exit-when-done` says the job is
//! over, the shard shuts down too.

use std::sync::Arc;
use std::time::Duration;

use ps_common::rendezvous::{Peer, RendezvousError, rendezvous};
use ps_proto::auth::AuthChannel;
use ps_proto::ids::{MapVersion, Rank};
use ps_proto::transport::{TransportConfig, http_uri};
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::store::{PushLoad, Store};

/// Where the scheduler is and how this shard is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerLink {
    /// The scheduler's address.
    pub scheduler: String,
    /// The address workers reach this shard at.
    pub advertise: String,
    /// How long to wait at start for the scheduler to come up.
    pub connect_timeout: Duration,
}

/// How long a server waits for its scheduler to come up, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits, at start, until the scheduler of `link` serves, for at most its
/// connect timeout.
///
/// # Errors
/// [`RendezvousError`] naming an address that never came up, or that is not a
/// scheduler.
pub async fn await_scheduler(
    link: &SchedulerLink,
    transport: &TransportConfig,
) -> Result<(), RendezvousError> {
    rendezvous(
        &link.scheduler,
        &[Peer::Scheduler],
        transport,
        link.connect_timeout,
    )
    .await
    .map(drop)
}

/// What the follower knows between heartbeats.
struct Follower {
    client: SchedulerClient<AuthChannel>,
    link: SchedulerLink,
    store: Arc<Store>,
    server_id: Option<u32>,
    /// The secret of this server's registration, which its heartbeats carry.
    secret: String,
    interval: Duration,
    map_version: u64,
    reachable: bool,
    /// Cancelled by the shard's shutdown, and by this follower when the job is done.
    shutdown: CancellationToken,
}

impl Follower {
    async fn register(&mut self) -> Result<u32, tonic::Status> {
        let request = v1::RegisterServerRequest {
            addr: self.link.advertise.clone(),
        };
        let response = self.client.register_server(request).await?.into_inner();
        self.secret = response.secret;
        self.interval = Duration::from_millis(response.heartbeat_interval_ms.max(50));
        tracing::info!(server_id = response.server_id, scheduler = %self.link.scheduler, advertise = %self.link.advertise, "registered with the scheduler");
        Ok(response.server_id)
    }

    async fn beat(&mut self) -> Result<(), tonic::Status> {
        let server_id = match self.server_id {
            Some(id) => id,
            None => {
                let id = self.register().await?;
                self.server_id = Some(id);
                id
            }
        };
        let node = Some(v1::heartbeat_request::Node::ServerId(server_id));
        let PushLoad { pushes, push_bytes } = self.store.push_load();
        let version = match self
            .client
            .heartbeat(v1::HeartbeatRequest {
                node,
                step: 0,
                secret: self.secret.clone(),
                pushes,
                push_bytes,
            })
            .await
        {
            Ok(response) if response.get_ref().job_done => {
                tracing::info!(
                    server_id,
                    "the scheduler says every worker has finished: shutting down"
                );
                self.shutdown.cancel();
                return Ok(());
            }
            Ok(response) => response.into_inner().map_version,
            Err(status) if matches!(status.code(), Code::NotFound | Code::PermissionDenied) => {
                tracing::warn!(
                    server_id,
                    reason = status.message(),
                    "the scheduler no longer knows this registration; registering again"
                );
                self.server_id = None;
                return Ok(());
            }
            Err(status) => return Err(status),
        };
        if version != self.map_version && version > 0 {
            self.apply_map(version).await?;
        }
        Ok(())
    }

    async fn apply_map(&mut self, version: u64) -> Result<(), tonic::Status> {
        let request = v1::GetShardMapRequest {
            min_version: version,
            timeout_ms: 5_000,
        };
        let map = self.client.get_shard_map(request).await?.into_inner();
        let live = map.workers.iter().copied().map(Rank).collect();
        let advanced = self.store.set_group(map.group_size, live);
        self.store.map().set(MapVersion(map.version));
        tracing::info!(
            version = map.version,
            group_size = map.group_size,
            live_workers = ?map.workers,
            keys_completed_by_this_map = advanced,
            "applied shard map"
        );
        self.map_version = map.version;
        Ok(())
    }

    async fn leave(&mut self) {
        let Some(server_id) = self.server_id else {
            return;
        };
        let node = Some(v1::heartbeat_request::Node::ServerId(server_id));
        let leave = self.client.leave(v1::HeartbeatRequest {
            node,
            step: 0,
            secret: self.secret.clone(),
            ..v1::HeartbeatRequest::default()
        });
        if tokio::time::timeout(Duration::from_secs(2), leave)
            .await
            .is_ok()
        {
            tracing::info!(server_id, "left the cluster");
        }
    }
}

/// Follows the scheduler until `shutdown` is cancelled; cancels it itself when
/// the scheduler says every worker has finished and it is exiting, which begins
/// the shard's shutdown.
///
/// # Errors
/// Only when the scheduler address is not a valid URI; an unreachable scheduler is
/// retried for as long as the shard runs.
pub async fn follow(
    link: SchedulerLink,
    transport: TransportConfig,
    store: Arc<Store>,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let channel = transport
        .endpoint(http_uri(&link.scheduler))?
        .connect_lazy();
    store.map().follow();
    let mut follower = Follower {
        client: SchedulerClient::new(transport.authed(channel)),
        link,
        store,
        server_id: None,
        secret: String::new(),
        interval: Duration::from_millis(500),
        map_version: 0,
        reachable: true,
        shutdown: shutdown.clone(),
    };
    loop {
        match follower.beat().await {
            Ok(()) if !follower.reachable => {
                tracing::info!(scheduler = %follower.link.scheduler, "the scheduler is reachable again");
                follower.reachable = true;
            }
            Ok(()) => {}
            Err(status) if follower.reachable => {
                tracing::warn!(scheduler = %follower.link.scheduler, code = ?status.code(), message = status.message(), map_version = follower.map_version, "scheduler unreachable; serving with the last shard map");
                follower.reachable = false;
            }
            Err(_) => {}
        }
        let store = Arc::clone(&follower.store);
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(follower.interval) => {}
            () = store.map().wanted() => {}
        }
    }
    follower.leave().await;
    Ok(())
}
