//! [`run`]: serve a parameter-server shard on a bound listener until `shutdown`
//! resolves, with the gRPC health service beside it, and Prometheus metrics on
//! a second listener when asked ([`run_with_metrics`]).
//!
//! With `unix_socket` set, the same services are served on a Unix-domain
//! socket too (`crate::unix_socket`), bound before the server says it listens.
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
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

use crate::checkpointer::Checkpointer;
use crate::config::ServerConfig;
use crate::follower::{await_scheduler, follow};
use crate::metrics::ServerMetrics;
use crate::service::ParameterService;
use crate::store::Store;
use ps_shm::arena::Arena;

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
/// Two signals order the shutdown: `shutdown_begun` (the caller's `shutdown`
/// resolved, or the scheduler said the job is done) ends waiting pulls and
/// starts the grace period; `stopped` (serving ended) stops the background
/// tasks.
///
/// # Errors
/// As [`run`].
pub async fn run_with_metrics(
    listener: TcpListener,
    metrics: Option<TcpListener>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    config
        .validate()
        .map_err(|e| ServeError::Config(e.to_string()))?;
    if let Some(link) = &config.scheduler {
        await_scheduler(link, &config.transport)
            .await
            .map_err(|error| ServeError::Config(format!("--scheduler: {error}")))?;
    }
    let addr = listener.local_addr()?;
    // Bound before the server says it is ready, so that whoever reads that
    // line finds the socket there.
    let unix_socket = config
        .unix_socket
        .as_deref()
        .map(crate::unix_socket::bind)
        .transpose()?;
    let shutdown_begun = CancellationToken::new();
    // Whatever way this returns, the shutdown has begun: the socket's
    // serving (a task of its own) ends with it.
    let _begun_on_return = shutdown_begun.clone().drop_guard();
    let stopped = CancellationToken::new();
    let arena = crate::shared_memory::arena(&config);
    let store = open_store(&config, &shutdown_begun, arena.clone());
    let checkpointer = start_checkpoints(&config, &store, &stopped);
    let follower = config.scheduler.clone().map(|link| {
        let (store, transport) = (Arc::clone(&store), config.transport.clone());
        tokio::spawn(follow(link, transport, store, shutdown_begun.clone()))
    });
    let (health, _) = tonic_health::server::health_reporter();
    health
        .set_serving::<ParameterServerServer<ParameterService>>()
        .await;
    log_listening(addr, &config);
    let checkpoint_times = checkpointer.as_ref().map(|(c, _)| c.times().clone());
    let service = ParameterService::new(
        Arc::clone(&store),
        config.clone(),
        checkpointer.as_ref().map(|(c, _)| Arc::clone(c)),
    );
    let shared_memory = crate::shared_memory::bind(&config, arena.clone())?;
    let service = match &shared_memory {
        Some((offers, _)) => service.with_shared_memory(Arc::clone(offers)),
        None => service,
    };
    let service = serve_metrics(service, metrics, &store, checkpoint_times, &stopped);
    if let Some((offers, listener)) = shared_memory {
        let accepting =
            crate::shared_memory::accept(listener, offers, service.clone(), stopped.clone());
        tokio::spawn(accepting);
    }
    // The one stack each listener serves: the health service (one status for
    // both) beside the shard's, counting requests per connection.
    let routes = |service: ParameterService| {
        let health_service = HealthServer::new(HealthService::from_health_reporter(health.clone()));
        Ok::<_, ps_proto::tls::TlsError>(
            config
                .transport
                .server()?
                .layer(ps_common::idle::TrackRequestsLayer)
                .add_service(health_service)
                .add_service(config.transport.guarded(service.into_server())),
        )
    };
    let unix_serving = match unix_socket {
        Some(socket) => {
            let addr = format!("unix:{}", socket.path().display());
            tracing::info!(%addr, "ps-server also serving gRPC on a Unix-domain socket");
            let router = routes(service.clone())?;
            let (incoming, file) = socket.incoming(
                config.transport.max_connections,
                config.transport.idle_connection_timeout,
            );
            let serving = router
                .serve_with_incoming_shutdown(incoming, shutdown_begun.clone().cancelled_owned());
            let stopping = (shutdown_begun.clone(), config.shutdown_grace);
            Some(tokio::spawn(crate::unix_socket::serve(
                serving, file, stopping,
            )))
        }
        None => None,
    };
    let router = routes(service)?;
    let incoming = ps_common::connections::bounded(
        TcpIncoming::from(listener).with_nodelay(Some(true)),
        config.transport.max_connections,
        config.transport.idle_connection_timeout,
        format!("ps-server at {addr}"),
    );
    let begun = shutdown_begun.clone();
    let on_shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = begun.cancelled() => {}
        }
        tracing::info!(%addr, "ps-server shutting down: finishing requests in flight");
        if let Some(arena) = &arena {
            // Workers on this host stop reading values with no request, as
            // their requests are refused from now on.
            arena.close();
        }
        health
            .set_not_serving::<ParameterServerServer<ParameterService>>()
            .await;
        begun.cancel();
    };
    let serve = router.serve_with_incoming_shutdown(incoming, on_shutdown);
    let grace = config.shutdown_grace;
    // The grace period starts when the shutdown begins.
    let begun = shutdown_begun.clone();
    let grace_expired = async move {
        begun.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = serve => served?,
        () = grace_expired => tracing::warn!(
            %addr, ?grace, "connections still open after the shutdown grace period; closing them"
        ),
    }
    shutdown_begun.cancel();
    if let Some(serving) = unix_serving {
        // It stops as this listener did: its requests had the same grace
        // period, from the same moment; its socket file is gone once it ends.
        match serving.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "serving on the Unix-domain socket failed"),
            Err(error) => {
                tracing::warn!(%error, "serving on the Unix-domain socket ended abnormally")
            }
        }
    }
    if let Some(follower) = follower {
        let _ = follower.await;
    }
    stopped.cancel();
    if let Some((_, checkpointing)) = checkpointer {
        let _ = checkpointing.await;
    }
    tracing::info!(%addr, "ps-server stopped");
    Ok(())
}

/// The shard's store: its pull waits end when the shutdown begins, it
/// restores keys from the checkpoint folder when there is one, and it keeps
/// keys of 2 KiB or more in the values arena when there is one.
fn open_store(
    config: &ServerConfig,
    shutdown_begun: &CancellationToken,
    arena: Option<Arc<Arena>>,
) -> Arc<Store> {
    let mut store = Store::new(config.store_rules(), shutdown_begun.clone()).with_arena(arena);
    if let Some(checkpoint) = &config.checkpoint {
        store = store.with_archive(&checkpoint.root);
    }
    Arc::new(store)
}

/// The checkpointer, when checkpoints are on, with its task (which ends when
/// `stopped` is cancelled).
fn start_checkpoints(
    config: &ServerConfig,
    store: &Arc<Store>,
    stopped: &CancellationToken,
) -> Option<(Arc<Checkpointer>, tokio::task::JoinHandle<()>)> {
    let checkpoint = config.checkpoint.clone()?;
    tracing::info!(dir = %checkpoint.dir().display(), every_steps = checkpoint.every_steps, every = ?checkpoint.every, "checkpoints on");
    let checkpointer = Arc::new(Checkpointer::new(Arc::clone(store), checkpoint));
    let task = tokio::spawn(Arc::clone(&checkpointer).run(stopped.clone()));
    Some((checkpointer, task))
}

/// Says where the shard listens and how it is set up (tests and scripts read
/// the address from this line).
fn log_listening(addr: std::net::SocketAddr, config: &ServerConfig) {
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
}

/// `service`, recording its answers in metrics served on `listener` until
/// `stopped`, when a listener is given.
fn serve_metrics(
    service: ParameterService,
    listener: Option<TcpListener>,
    store: &Arc<Store>,
    checkpoint_times: Option<crate::checkpointer::CheckpointTimes>,
    stopped: &CancellationToken,
) -> ParameterService {
    let Some(listener) = listener else {
        return service;
    };
    let (metrics, exposition) = ServerMetrics::new(Arc::clone(store), checkpoint_times);
    let stopped = stopped.clone();
    tokio::spawn(ps_common::metrics::serve(
        listener,
        Arc::new(exposition),
        async move { stopped.cancelled().await },
    ));
    service.with_metrics(metrics)
}
