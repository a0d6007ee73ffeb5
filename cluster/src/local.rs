//! [`run_local`]: parameter servers and workers in one process train a model
//! together; every worker gets its own slice of the data by rank.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ps_client::retry::RetryTally;
use ps_client::{ClientConfig, PsClient};
use ps_client::{ClientError, GroupInfo};
use ps_proto::consistency::Consistency;
use ps_proto::ids::Rank;
use ps_proto::tls::TlsConfig;
use ps_proto::transport::TransportConfig;
use ps_scheduler::SchedulerConfig;
use ps_server::ServerConfig;
use ps_server::checkpointer::{
    CheckpointConfig, DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_EVERY_STEPS,
};
use ps_server::config::SharedMemoryConfig;
use ps_server::server::ServeError;
use ps_shm::DataPathMode;
use ps_worker::data::Dataset;
use ps_worker::metrics::WorkerMetrics;
use ps_worker::train::{TrainConfig, TrainError, TrainSummary, train};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics_ports::MetricsPorts;
use crate::servers::LocalServers;

/// The shape of a local cluster.
#[derive(Debug, Clone)]
pub struct LocalSpec {
    /// Parameter servers.
    pub servers: usize,
    /// Workers.
    pub workers: u32,
    /// Consistency model.
    pub consistency: Consistency,
    /// Run a scheduler for membership and placement (otherwise workers plan alone).
    pub scheduler: bool,
    /// The servers' checkpoint root (each writes a folder in it, and a last
    /// checkpoint when the job ends); none by default.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// TLS on every server and channel of the cluster; plain TCP when `None`.
    pub tls: Option<TlsConfig>,
    /// Serve each part's Prometheus metrics on its own port from this address
    /// up (the scheduler, the servers, then the workers); off when `None`.
    pub metrics_listen: Option<SocketAddr>,
    /// How workers reach the servers: shared memory (`auto`, the default, or
    /// `shm`, which fails without it) or gRPC alone.
    pub data_path: DataPathMode,
    /// Whether each step's push and pull are pipelined per key group (the
    /// default).
    pub pipeline: bool,
    /// The largest part a parameter is cut into across the servers.
    pub partition_bytes: usize,
    /// Requests a push or pull to one server is cut into when not pipelined.
    pub requests_per_server: usize,
}

impl LocalSpec {
    /// The transport every part of the cluster uses.
    fn transport(&self) -> TransportConfig {
        TransportConfig {
            tls: self.tls.clone(),
            ..TransportConfig::default()
        }
    }
}

/// A scheduler running in this process on a loopback port.
struct LocalScheduler {
    addr: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), ps_scheduler::server::ServeError>>,
}

impl LocalScheduler {
    async fn start(spec: &LocalSpec, metrics: Option<TcpListener>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let config = SchedulerConfig {
            workers: spec.workers.into(),
            min_servers: spec.servers,
            consistency: spec.consistency,
            partition_bytes: spec.partition_bytes,
            transport: spec.transport(),
            ..SchedulerConfig::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let task = tokio::spawn(ps_scheduler::run_with_metrics(
            listener, metrics, config, stopped,
        ));
        Ok(Self { addr, stop, task })
    }

    async fn shutdown(self) -> Result<(), LocalError> {
        let _ = self.stop.send(());
        Ok(self.task.await??)
    }
}

/// What `ps-local` reports: the cluster's result and each worker's.
#[derive(Debug, Clone, Serialize)]
pub struct LocalSummary {
    /// Data set name.
    pub dataset: String,
    /// Parameter servers.
    pub servers: usize,
    /// Workers.
    pub workers: usize,
    /// Test accuracy of the trained parameters (worker 0's evaluation).
    pub test_accuracy: f64,
    /// Mean of the workers' last-epoch training losses.
    pub train_loss: f64,
    /// Steps each worker pushed.
    pub steps: u64,
    /// Seconds from start to the end of the last evaluation.
    pub wall_seconds: f64,
    /// Training examples per second, all workers together.
    pub examples_per_second: f64,
    /// Each worker's summary.
    pub per_worker: Vec<TrainSummary>,
}

/// Why a local cluster could not train to the end.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// A port could not be bound.
    #[error("starting the local cluster: {0}")]
    Io(#[from] std::io::Error),
    /// A worker's client could not connect or join.
    #[error("a worker could not join: {0}")]
    Join(#[from] ClientError),
    /// A worker failed.
    #[error("worker {rank}: {source}")]
    Worker {
        /// Its rank.
        rank: Rank,
        /// What failed.
        source: TrainError,
    },
    /// A worker's task panicked.
    #[error("worker {rank} stopped: {source}")]
    Task {
        /// Its rank.
        rank: Rank,
        /// What stopped it.
        source: tokio::task::JoinError,
    },
    /// A server or the scheduler failed.
    #[error("a server or the scheduler failed: {0}")]
    Serve(#[from] ServeError),
    /// The scheduler's task panicked.
    #[error("the scheduler stopped: {0}")]
    Stopped(#[from] tokio::task::JoinError),
}

/// Starts the servers, trains with every worker concurrently, and stops the servers.
///
/// # Errors
/// The first failure of a server or worker, with what it was doing.
pub async fn run_local(
    spec: &LocalSpec,
    data: Arc<Dataset>,
    config: &TrainConfig,
) -> Result<LocalSummary, LocalError> {
    let started = Instant::now();
    let mut metrics_ports = MetricsPorts::new(spec.metrics_listen);
    let scheduler = match spec.scheduler {
        true => {
            let metrics = metrics_ports.next("scheduler").await?;
            Some(LocalScheduler::start(spec, metrics).await?)
        }
        false => None,
    };
    let scheduler_addr = scheduler.as_ref().map(|s| s.addr.clone());
    let servers = LocalServers::start_with_metrics(
        spec.servers,
        server_config(spec),
        scheduler_addr.as_deref(),
        &mut metrics_ports,
    )
    .await?;
    tracing::info!(scheduler = ?scheduler_addr, servers = ?servers.addrs(), workers = spec.workers, consistency = %spec.consistency, "local cluster up");
    let stop_worker_metrics = CancellationToken::new();
    let mut tasks = Vec::new();
    for rank in 0..spec.workers {
        let (client, group) = join(spec, scheduler_addr.as_deref(), &servers, Rank(rank)).await?;
        let metrics = metrics_ports
            .next(&format!("worker {}", group.rank))
            .await?
            .map(|listener| {
                serve_worker_metrics(listener, client.retry_tally(), &stop_worker_metrics)
            });
        let config = worker_config(config, group.rank, metrics);
        let data = Arc::clone(&data);
        let rank = group.rank;
        let task = tokio::spawn(async move { train(client, group, &data, &config).await });
        tasks.push((rank, task));
    }
    let per_worker = finished(tasks).await?;
    stop_worker_metrics.cancel();
    servers.shutdown().await?;
    if let Some(scheduler) = scheduler {
        scheduler.shutdown().await?;
    }
    Ok(summarize(
        spec,
        &data.name,
        per_worker,
        started.elapsed().as_secs_f64(),
    ))
}

/// What every server of `spec` is started with.
fn server_config(spec: &LocalSpec) -> ServerConfig {
    ServerConfig {
        workers: spec.workers,
        consistency: spec.consistency,
        checkpoint: spec.checkpoint_dir.clone().map(|root| CheckpointConfig {
            root,
            folder: String::new(),
            every_steps: DEFAULT_CHECKPOINT_EVERY_STEPS,
            every: DEFAULT_CHECKPOINT_EVERY,
        }),
        transport: spec.transport(),
        shared_memory: SharedMemoryConfig {
            mode: spec.data_path,
            ..SharedMemoryConfig::default()
        },
        ..ServerConfig::default()
    }
}

/// A worker's client and its place in the group: from the scheduler when
/// there is one, otherwise `rank` of a group of every worker of `spec`.
async fn join(
    spec: &LocalSpec,
    scheduler: Option<&str>,
    servers: &LocalServers,
    rank: Rank,
) -> Result<(PsClient, GroupInfo), ClientError> {
    let Some(addr) = scheduler else {
        let group = GroupInfo {
            rank,
            workers: spec.workers,
            consistency: spec.consistency,
        };
        let config = ClientConfig {
            data_path: spec.data_path,
            pipeline: spec.pipeline,
            partition_bytes: spec.partition_bytes,
            requests_per_server: spec.requests_per_server,
            ..ClientConfig::new(Vec::new())
        };
        return Ok((servers.client_with(config).await?, group));
    };
    let mut client = PsClient::connect(ClientConfig {
        scheduler: Some(addr.to_string()),
        transport: spec.transport(),
        data_path: spec.data_path,
        pipeline: spec.pipeline,
        requests_per_server: spec.requests_per_server,
        ..ClientConfig::new(Vec::new())
    })
    .await?;
    let group = client.join(&format!("ps-local-worker-{rank}")).await?;
    Ok((client, group))
}

/// The training settings of worker `rank`: a progress bar and the saved
/// parameters from worker 0 only (every worker ends with the same parameters).
fn worker_config(
    config: &TrainConfig,
    rank: Rank,
    metrics: Option<Arc<WorkerMetrics>>,
) -> TrainConfig {
    TrainConfig {
        progress: config.progress && rank == Rank(0),
        save: config.save.clone().filter(|_| rank == Rank(0)),
        metrics,
        ..config.clone()
    }
}

/// Each worker's summary, once every worker finished; the first failure, by rank.
async fn finished(
    tasks: Vec<(Rank, JoinHandle<Result<TrainSummary, TrainError>>)>,
) -> Result<Vec<TrainSummary>, LocalError> {
    let mut per_worker = Vec::new();
    for (rank, task) in tasks {
        let trained = task
            .await
            .map_err(|source| LocalError::Task { rank, source })?;
        per_worker.push(trained.map_err(|source| LocalError::Worker { rank, source })?);
    }
    Ok(per_worker)
}

/// A worker's metrics, with the retries counted in `tally`, served on
/// `listener` until `stop`.
fn serve_worker_metrics(
    listener: TcpListener,
    tally: RetryTally,
    stop: &CancellationToken,
) -> Arc<WorkerMetrics> {
    let (metrics, exposition) = WorkerMetrics::new(tally);
    let stop = stop.clone();
    tokio::spawn(ps_common::metrics::serve(
        listener,
        Arc::new(exposition),
        async move { stop.cancelled().await },
    ));
    metrics
}

fn summarize(
    spec: &LocalSpec,
    dataset: &str,
    per_worker: Vec<TrainSummary>,
    wall_seconds: f64,
) -> LocalSummary {
    let workers = per_worker.len();
    let examples: f64 = per_worker
        .iter()
        .map(|w| w.steps as f64 * w.batch_size as f64)
        .sum();
    LocalSummary {
        dataset: dataset.to_string(),
        servers: spec.servers,
        workers,
        test_accuracy: per_worker.first().map_or(0.0, |w| w.test_accuracy),
        train_loss: per_worker.iter().map(|w| w.train_loss).sum::<f64>() / workers.max(1) as f64,
        steps: per_worker.iter().map(|w| w.steps).max().unwrap_or(0),
        wall_seconds,
        examples_per_second: examples / wall_seconds.max(1e-9),
        per_worker,
    }
}
