//! `ps-throughput`: M real `ps-server` processes and N simulated workers pushing and
//! pulling the tensors of a model under BSP, as a training job would, reporting
//! aggregate bytes/s, RPCs/s and each server's load, next to raw TCP measured on
//! the same machine in the same run. With metrics on, the servers serve
//! Prometheus metrics and are scraped every second, which is what metrics cost.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use futures::future::try_join_all;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, ParamBytes, PsClient, PulledParam};
use ps_common::processes::ServerProcess;
use ps_proto::codec::{DType, encode_f32};
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::transport::{DEFAULT_MAX_MESSAGE_BYTES, TransportConfig, http_uri};
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;

use crate::report::ResultRow;
use crate::tcp::{BaselineServer, TcpPeer};
use crate::tuning::Tuning;
use ps_common::size::{format_size, parse_sizes};

/// The tensors the workers move: a fixture or a list of sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTensors {
    /// Name for reports.
    pub name: String,
    /// Parameters.
    pub params: Vec<ParamInfo>,
}

impl FromStr for ModelTensors {
    type Err = String;

    /// `resnet50`, `bert-base`, or `sizes:1MiB,4MiB` (f32 tensors of those sizes).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let params: Vec<ParamInfo> = if let Some(sizes) = s.strip_prefix("sizes:") {
            parse_sizes(sizes)?
                .into_iter()
                .enumerate()
                .map(|(i, bytes)| ParamInfo {
                    name: format!("t{i}"),
                    shape: vec![(bytes / 4).max(1)],
                    dtype: DType::F32,
                })
                .collect()
        } else {
            ps_common::fixtures::by_name(s)
                .ok_or_else(|| {
                    format!("unknown model `{s}`; use resnet50, bert-base or sizes:1MiB,4MiB")
                })?
                .into_iter()
                .map(|(name, shape)| ParamInfo {
                    name,
                    shape,
                    dtype: DType::F32,
                })
                .collect()
        };
        Ok(Self {
            name: s.to_string(),
            params,
        })
    }
}

impl ModelTensors {
    fn bytes(&self) -> usize {
        self.params.iter().map(|p| p.len() * p.dtype.size()).sum()
    }
}

/// The shape of the run.
#[derive(Debug, Clone)]
pub struct ThroughputPlan {
    /// Parameter-server processes.
    pub servers: usize,
    /// Simulated workers.
    pub workers: u32,
    /// What they move.
    pub model: ModelTensors,
    /// Measured steps.
    pub steps: u64,
    /// Unmeasured steps first.
    pub warmup_steps: u64,
    /// Servers serve Prometheus metrics, scraped every second as Prometheus
    /// would, so that the run pays what metrics cost.
    pub metrics: bool,
}

struct Worker {
    client: PsClient,
    rank: Rank,
    grads: Vec<ParamBytes>,
    /// The values pulled, their buffers reused from step to step as a
    /// training loop that keeps them does (`PsClient::pull_into`).
    pulled: tokio::sync::Mutex<BTreeMap<String, PulledParam>>,
    phases: Mutex<Phases>,
}

/// Where a simulated worker's steps went: pushing, held by the servers for the
/// step (as they report it), and the rest of the pulls (the transfer).
#[derive(Debug, Clone, Copy, Default)]
struct Phases {
    push: Duration,
    wait: Duration,
    pull: Duration,
}

impl Worker {
    async fn new(
        addrs: Vec<String>,
        rank: u32,
        model: &ModelTensors,
        tuning: &Tuning,
    ) -> anyhow::Result<Self> {
        let mut config = ClientConfig::new(addrs);
        // The tuned windows and frames, with the parameter servers' message limit.
        let tuned = tuning.transport()?;
        config.transport = TransportConfig {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            ..tuned
        };
        config.chunk_bytes = tuning
            .chunk
            .min(config.transport.max_message_bytes - (64 << 10));
        config.requests_per_server = tuning.requests_per_server;
        let mut client = PsClient::connect(config).await?;
        client.place(&model.params).await?;
        let zeros: Vec<ParamBytes> = model
            .params
            .iter()
            .map(|p| ParamBytes::new(&p.name, Bytes::from(vec![0u8; p.len() * 4])))
            .collect();
        client.register(&zeros, &ps_client::sgd(1e-6)).await?;
        let grads = model
            .params
            .iter()
            .map(|p| ParamBytes::new(&p.name, encode_f32(DType::F32, &vec![1e-3; p.len()])))
            .collect();
        Ok(Self {
            client,
            rank: Rank(rank),
            grads,
            pulled: tokio::sync::Mutex::default(),
            phases: Mutex::default(),
        })
    }

    async fn step(&self, step: Step) -> anyhow::Result<()> {
        let pushing = Instant::now();
        self.client.push(self.rank, step, &self.grads).await?;
        let pulling = Instant::now();
        let mut pulled = self.pulled.lock().await;
        let waited = self
            .client
            .pull_into(Version::after(step), &mut pulled)
            .await?;
        let pulled = pulling.elapsed();
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        phases.push += pulling - pushing;
        phases.wait += waited.min(pulled);
        phases.pull += pulled - waited.min(pulled);
        Ok(())
    }

    /// The phases since the last call, which starts them again.
    fn take_phases(&self) -> Phases {
        std::mem::take(&mut *self.phases.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

async fn run_steps(workers: &[Worker], steps: std::ops::Range<u64>) -> anyhow::Result<()> {
    for step in steps {
        try_join_all(workers.iter().map(|w| w.step(Step(step)))).await?;
    }
    Ok(())
}

/// RPCs one worker makes per step: a push and a pull, each a few requests to
/// every server holding a part.
fn rpcs_per_worker_step(client: &PsClient) -> usize {
    client.requests_per_operation() * 2
}

async fn server_loads(addrs: &[String]) -> anyhow::Result<serde_json::Value> {
    let mut loads = Vec::new();
    for addr in addrs {
        let mut client = ParameterServerClient::connect(http_uri(addr)).await?;
        let stats = client.stats(v1::StatsRequest {}).await?.into_inner();
        loads.push(serde_json::json!({
            "addr": addr, "keys": stats.keys, "bytes_held": stats.bytes, "pushes": stats.pushes, "pulls": stats.pulls,
        }));
    }
    Ok(serde_json::Value::Array(loads))
}

/// Raw TCP one-way throughput on this machine with 4 MiB messages, for one second.
async fn tcp_baseline() -> anyhow::Result<f64> {
    let server = BaselineServer::start(std::net::TcpListener::bind("127.0.0.1:0")?)?;
    let mut peer = TcpPeer::connect(&server.addr().to_string()).await?;
    tokio::task::spawn_blocking(move || {
        let data = vec![0x5au8; 4 << 20];
        let (start, mut bytes) = (Instant::now(), 0u64);
        while start.elapsed() < Duration::from_secs(1) {
            bytes += peer.sink(&data)?;
        }
        drop(server);
        Ok(bytes as f64 / start.elapsed().as_secs_f64())
    })
    .await?
}

/// Scrapes `GET /metrics` from every address once a second until dropped.
struct Scraper {
    task: tokio::task::JoinHandle<()>,
}

impl Scraper {
    fn start(addrs: Vec<String>) -> Self {
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                for addr in &addrs {
                    if let Err(error) = ps_common::metrics::http_get(addr, "/metrics").await {
                        tracing::warn!(addr, %error, "a metrics scrape failed");
                    }
                }
            }
        });
        Self { task }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback address with a port free now, for a server's metrics listener.
fn free_loopback_addr() -> anyhow::Result<String> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(probe.local_addr()?.to_string())
}

fn server_args(plan: &ThroughputPlan, tuning: &Tuning) -> Vec<String> {
    vec![
        "--workers".into(),
        plan.workers.to_string(),
        format!("--stream-window={}", tuning.stream_window),
        format!("--connection-window={}", tuning.connection_window),
        format!("--max-frame={}", tuning.max_frame),
        format!("--max-tensor={}", plan.model.bytes().max(1 << 20)),
    ]
}

/// Runs the plan and reports one row.
///
/// # Errors
/// When a server cannot be started or a worker fails.
pub async fn run(plan: &ThroughputPlan, tuning: &Tuning) -> anyhow::Result<ResultRow> {
    let mut servers = Vec::new();
    let mut metrics_addrs = Vec::new();
    for _ in 0..plan.servers {
        let mut args = server_args(plan, tuning);
        if plan.metrics {
            let addr = free_loopback_addr()?;
            args.extend(["--metrics-listen".to_string(), addr.clone()]);
            metrics_addrs.push(addr);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        servers.push(ServerProcess::start(&args).await);
    }
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let scraper = plan.metrics.then(|| Scraper::start(metrics_addrs));
    let workers = try_join_all(
        (0..plan.workers).map(|rank| Worker::new(addrs.clone(), rank, &plan.model, tuning)),
    )
    .await
    .context("setting up workers")?;
    run_steps(&workers, 0..plan.warmup_steps)
        .await
        .context("warm-up steps")?;
    for worker in &workers {
        worker.take_phases();
    }
    let start = Instant::now();
    run_steps(&workers, plan.warmup_steps..plan.warmup_steps + plan.steps)
        .await
        .context("measured steps")?;
    let seconds = start.elapsed().as_secs_f64();
    drop(scraper);
    let worker_seconds = seconds * plan.workers as f64;
    let total = workers
        .iter()
        .map(Worker::take_phases)
        .fold(Phases::default(), |a, b| Phases {
            push: a.push + b.push,
            wait: a.wait + b.wait,
            pull: a.pull + b.pull,
        });
    let share = |d: Duration| Some(d.as_secs_f64() / worker_seconds.max(1e-9));
    let loads = server_loads(&addrs).await?;
    let tcp = tcp_baseline().await?;
    for server in servers {
        server.stop().await;
    }
    let model_bytes = plan.model.bytes();
    let moved = 2.0 * model_bytes as f64 * plan.steps as f64 * plan.workers as f64;
    let rpcs =
        (rpcs_per_worker_step(&workers[0].client) as u64 * plan.steps * plan.workers as u64) as f64;
    let throughput = moved / seconds.max(1e-9);
    Ok(ResultRow {
        bench: "ps-throughput".into(),
        mode: Some(match plan.metrics {
            true => "bsp, metrics on".into(),
            false => "bsp".into(),
        }),
        encoding: "bytes".into(),
        payload: format!(
            "{} ({}) {}x{}",
            plan.model.name,
            format_size(model_bytes),
            plan.servers,
            plan.workers
        ),
        size_bytes: model_bytes as u64,
        messages: plan.steps,
        throughput_bytes_per_sec: Some(throughput),
        tcp_throughput_bytes_per_sec: Some(tcp),
        ratio_vs_tcp: Some(throughput / tcp.max(1e-9)),
        rpcs_per_sec: Some(rpcs / seconds.max(1e-9)),
        reps: 1,
        servers: Some(loads),
        push_share: share(total.push),
        wait_share: share(total.wait),
        pull_share: share(total.pull),
        ..ResultRow::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_parse() {
        assert_eq!(
            "resnet50".parse::<ModelTensors>().unwrap().params.len(),
            161
        );
        let sizes: ModelTensors = "sizes:4KiB,1MiB".parse().unwrap();
        assert_eq!(sizes.bytes(), 4096 + (1 << 20));
        assert!(
            "vgg"
                .parse::<ModelTensors>()
                .unwrap_err()
                .contains("resnet50")
        );
    }
}
