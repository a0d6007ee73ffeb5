//! [`run`]: serve a parameter-server shard on a bound listener until `shutdown`
//! resolves, with the gRPC health service beside it, and Prometheus metrics on
//! a second listener when asked ([`run_with_metrics`]).
//!
//! On shutdown the health status turns to NOT_SERVING, pulls waiting for a version
//! end with `UNAVAILABLE`, requests in flight finish (for at most the configured
//! grace period, after which remaining connections are closed), and `run` returns.

use std::future::Future;
use std::sync::Arc;

use ps_proto::v1::parameter_server_server::ParameterServerServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

use crate::checkpointer::Checkpointer;
use crate::config::ServerConfig;
use crate::follower::{await_scheduler, follow};
use crate::metrics::ServerMetrics;
use crate::service::ParameterService;
use crate::store::Store;

pub use ps_common::process::ServeError;

/// Serves one shard on `listener` until `shutdown` resolves.
///
/// # Errors
/// [`ServeError`] when the configuration is invalid or the server fails.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    run_with_metrics(listener, None, config, shutdown).await
}

/// [`run`], also serving Prometheus metrics (`GET /metrics`) on `metrics`.
///
/// # Errors
/// As [`run`].
pub async fn run_with_metrics(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    config.validate().map_err(ServeError::Config)?;
    if let Some(link) = &config.scheduler {
        await_scheduler(link, &config.transport)
            .await
            .map_err(|error| ServeError::Config(format!("--scheduler: {error}")))?;
    }
    let addr = listener.local_addr()?;
    let stop_waits = CancellationToken::new();
    let mut store = Store::new(config.store_rules(), stop_waits.clone());
    if let Some(checkpoint) = &config.checkpoint {
        store = store.with_archive(&checkpoint.root);
    }
    let store = Arc::new(store);
    let checkpointer = config.checkpoint.clone().map(|checkpoint| {
        tracing::info!(dir = %checkpoint.dir().display(), every_steps = checkpoint.every_steps, every = ?checkpoint.every, "checkpoints on");
        Arc::new(Checkpointer::new(Arc::clone(&store), checkpoint))
    });
    let checkpoints_stop = CancellationToken::new();
    let checkpointing = checkpointer
        .clone()
        .map(|c| tokio::spawn(c.run(checkpoints_stop.clone())));
    let job_done = CancellationToken::new();
    let follower = config.scheduler.clone().map(|link| {
        let (store, stop) = (Arc::clone(&store), stop_waits.clone());
        let transport = config.transport.clone();
        tokio::spawn(follow(link, transport, store, stop, job_done.clone()))
    });
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ParameterServerServer<ParameterService>>()
        .await;
    // A server that follows a scheduler takes its group size from the shard maps.
    let workers = match &config.scheduler {
        Some(link) => format!("from the scheduler at {}", link.scheduler),
        None => config.workers.to_string(),
    };
    tracing::info!(
        %addr,
        consistency = %config.consistency,
        %workers,
        max_message_bytes = config.transport.max_message_bytes,
        memory_budget = %ps_common::size::format_size(config.memory_budget),
        tls = config.transport.is_tls(),
        "ps-server listening"
    );
    ps_common::process::warn_if_plain(&format!("ps-server at {addr}"), addr, &config.transport);
    let checkpoint_times = checkpointer.as_ref().map(|c| c.times().clone());
    let mut service = ParameterService::new(Arc::clone(&store), config.clone(), checkpointer);
    let metrics_stop = CancellationToken::new();
    if let Some(listener) = metrics {
        let (metrics, exposition) = ServerMetrics::new(store, checkpoint_times);
        service = service.with_metrics(metrics);
        let stop = metrics_stop.clone();
        let exposition = Arc::new(exposition);
        tokio::spawn(ps_common::metrics::serve(
            listener,
            exposition,
            async move {
                stop.cancelled().await;
            },
        ));
    }
    let router = config
        .transport
        .server()?
        .layer(ps_common::idle::TrackRequestsLayer)
        .add_service(health_service)
        .add_service(config.transport.guarded(service.into_server()));
    let incoming = ps_common::connections::bounded(
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        config.transport.max_connections,
        config.transport.idle_connection_timeout,
        format!("ps-server at {addr}"),
    );
    let stop_on_signal = stop_waits.clone();
    let on_shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = job_done.cancelled() => {}
        }
        tracing::info!(%addr, "ps-server shutting down: finishing requests in flight");
        health
            .set_not_serving::<ParameterServerServer<ParameterService>>()
            .await;
        stop_on_signal.cancel();
    };
    let serve = router.serve_with_incoming_shutdown(incoming, on_shutdown);
    let grace = config.shutdown_grace;
    // The grace period starts when shutdown cancels the token.
    let shutting_down = stop_waits.clone();
    let grace_expired = async move {
        shutting_down.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = serve => served?,
        () = grace_expired => tracing::warn!(
            %addr, ?grace, "connections still open after the shutdown grace period; closing them"
        ),
    }
    stop_waits.cancel();
    if let Some(follower) = follower {
        let _ = follower.await;
    }
    metrics_stop.cancel();
    checkpoints_stop.cancel();
    if let Some(checkpointing) = checkpointing {
        let _ = checkpointing.await;
    }
    tracing::info!(%addr, "ps-server stopped");
    Ok(())
}
