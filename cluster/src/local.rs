//! [`run_local`]: parameter servers and workers in one process train a model
//! together; every worker gets its own slice of the data by rank.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ps_client::GroupInfo;
use ps_client::retry::RetryTally;
use ps_client::{ClientConfig, PsClient};
use ps_proto::consistency::Consistency;
use ps_proto::ids::Rank;
use ps_proto::tls::TlsConfig;
use ps_proto::transport::TransportConfig;
use ps_scheduler::SchedulerConfig;
use ps_server::ServerConfig;
use ps_server::checkpointer::{
    CheckpointConfig, DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_EVERY_STEPS,
};
use ps_worker::data::Dataset;
use ps_worker::metrics::WorkerMetrics;
use ps_worker::train::{TrainConfig, TrainSummary, train};
use serde::Serialize;
use tokio::net::TcpListener;
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

    async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
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

/// Starts the servers, trains with every worker concurrently, and stops the servers.
///
/// # Errors
/// The first failure of a server or worker, with what it was doing.
pub async fn run_local(
    spec: &LocalSpec,
    data: Arc<Dataset>,
    config: &TrainConfig,
) -> anyhow::Result<LocalSummary> {
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
    let server_config = ServerConfig {
        workers: spec.workers,
        consistency: spec.consistency,
        checkpoint: spec.checkpoint_dir.clone().map(|root| CheckpointConfig {
            root,
            folder: String::new(),
            every_steps: DEFAULT_CHECKPOINT_EVERY_STEPS,
            every: DEFAULT_CHECKPOINT_EVERY,
        }),
        transport: spec.transport(),
        ..ServerConfig::default()
    };
    let servers = LocalServers::start_with_metrics(
        spec.servers,
        server_config,
        scheduler_addr.as_deref(),
        &mut metrics_ports,
    )
    .await?;
    let stop_worker_metrics = CancellationToken::new();
    tracing::info!(scheduler = ?scheduler_addr, servers = ?servers.addrs(), workers = spec.workers, consistency = %spec.consistency, "local cluster up");
    let mut tasks = Vec::new();
    for rank in 0..spec.workers {
        let (client, group) = match &scheduler_addr {
            Some(addr) => {
                let mut client = PsClient::connect(ClientConfig {
                    scheduler: Some(addr.clone()),
                    transport: spec.transport(),
                    ..ClientConfig::new(Vec::new())
                })
                .await?;
                let group = client.join(&format!("ps-local-worker-{rank}")).await?;
                (client, group)
            }
            None => (
                servers.client().await?,
                GroupInfo {
                    rank: Rank(rank),
                    workers: spec.workers,
                    consistency: spec.consistency,
                },
            ),
        };
        let metrics = metrics_ports
            .next(&format!("worker {}", group.rank))
            .await?;
        let config = TrainConfig {
            progress: config.progress && group.rank == Rank(0),
            // Every worker ends with the same parameters: one file is enough.
            save: config.save.clone().filter(|_| group.rank == Rank(0)),
            metrics: metrics.map(|listener| {
                serve_worker_metrics(listener, client.retry_tally(), &stop_worker_metrics)
            }),
            ..config.clone()
        };
        let data = Arc::clone(&data);
        tasks.push(tokio::spawn(async move {
            train(client, group, &data, &config).await
        }));
    }
    let mut per_worker = Vec::new();
    for (rank, task) in tasks.into_iter().enumerate() {
        let summary = task
            .await?
            .map_err(|e| anyhow::anyhow!("worker {rank}: {e}"))?;
        per_worker.push(summary);
    }
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
