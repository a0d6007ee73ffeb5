//! [`run`]: serve the scheduler on a bound listener until `shutdown`, with a ticker
//! that declares silent nodes dead and the gRPC health service beside it, and
//! Prometheus metrics on a second listener when asked ([`run_with_metrics`]).

use std::future::Future;
use std::sync::Arc;

use ps_proto::v1::scheduler_server::SchedulerServer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::config::SchedulerConfig;
use crate::service::{SchedulerService, SchedulerState};

pub use ps_common::process::ServeError;

/// With `exit_when_done`: resolves a few heartbeats after every worker left, so
/// each server hears `job_done` and stops too. Otherwise never.
async fn job_done(state: &SchedulerState, config: &SchedulerConfig) {
    if !config.exit_when_done {
        return std::future::pending().await;
    }
    state.job_done().await;
    let linger = config.heartbeat_interval * 3;
    tracing::info!(
        ?linger,
        "every worker has finished: telling the servers, then exiting"
    );
    tokio::time::sleep(linger).await;
}

/// Serves the scheduler on `listener` until `shutdown` resolves.
///
/// # Errors
/// [`ServeError`] when the configuration is invalid or the server fails.
pub async fn run(
    listener: TcpListener,
    config: SchedulerConfig,
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
    config: SchedulerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    config
        .validate()
        .map_err(|e| ServeError::Config(e.to_string()))?;
    let addr = listener.local_addr()?;
    let state =
        SchedulerState::new(config.clone()).map_err(|e| ServeError::Config(e.to_string()))?;
    let state = Arc::new(state);
    let ticker = tokio::spawn({
        let state = Arc::clone(&state);
        let period = config.heartbeat_interval / 2;
        async move {
            let mut interval = tokio::time::interval(period);
            loop {
                interval.tick().await;
                state.tick();
            }
        }
    });
    let metrics = metrics.map(|listener| {
        let exposition = Arc::new(crate::metrics::exposition(Arc::clone(&state)));
        tokio::spawn(ps_common::metrics::serve(
            listener,
            exposition,
            std::future::pending(),
        ))
    });
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<SchedulerServer<SchedulerService>>()
        .await;
    tracing::info!(%addr, workers = %config.workers, min_servers = config.min_servers, timeout = ?config.heartbeat_timeout, tls = config.transport.is_tls(), "ps-scheduler listening");
    ps_common::process::warn_if_plain(&format!("ps-scheduler at {addr}"), addr, &config.transport);
    let incoming = ps_common::connections::bounded(
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        config.transport.max_connections,
        config.transport.idle_connection_timeout,
        format!("ps-scheduler at {addr}"),
    );
    let served = config
        .transport
        .server()?
        .layer(ps_common::idle::TrackRequestsLayer)
        .add_service(health_service)
        .add_service(
            config
                .transport
                .guarded(SchedulerService::new(Arc::clone(&state)).into_server()),
        )
        .serve_with_incoming_shutdown(incoming, async {
            tokio::select! {
                () = shutdown => tracing::info!(%addr, "ps-scheduler shutting down"),
                () = job_done(&state, &config) => {}
            }
        })
        .await;
    ticker.abort();
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    served?;
    tracing::info!(%addr, "ps-scheduler stopped");
    Ok(())
}
