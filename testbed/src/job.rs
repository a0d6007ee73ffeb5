//! One job in the emulated cluster: the scheduler, then every server, then
//! every worker, each on its own host (or a server beside a worker, on the
//! worker's host); the job ends when the workers do.
//! Around it the link counters are read (once before the workers start, once
//! after they end) and every process's CPU time is sampled.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ps_worker::train::TrainSummary;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::hosts::{Host, Role};
use crate::netns::{LinkBytes, NetError, Network};
use crate::process::{HostProcess, ProcessError, cpu_seconds};

/// The port every process listens on, on its own host's address.
pub const PORT: u16 = 7000;

/// What a job runs.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// Where logs and the report go.
    pub out: PathBuf,
    /// Arguments every worker gets after `--scheduler ADDR --json`.
    pub worker_args: Vec<String>,
    /// Arguments every server gets after `--listen` and `--scheduler`.
    pub server_args: Vec<String>,
    /// Arguments the scheduler gets after its own (`--consistency`).
    pub scheduler_args: Vec<String>,
    /// How long the workers may take.
    pub timeout: Duration,
}

/// What went wrong running a job.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The network.
    #[error(transparent)]
    Net(#[from] NetError),
    /// A process.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A worker failed.
    #[error("{host}'s worker {why}; see its log, {log}")]
    Worker {
        /// Its host.
        host: String,
        /// What happened.
        why: String,
        /// Its log file.
        log: String,
    },
    /// The workers took too long.
    #[error("the workers did not finish within {0:?} (--timeout); logs are in the output folder")]
    Timeout(Duration),
}

/// What a job left: each worker's summary, each link's bytes during the
/// workers' run, each process's CPU time, and how long the workers ran.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    /// Each worker host's summary, in host order.
    pub workers: Vec<(String, TrainSummary)>,
    /// Each host's link bytes from the workers' start to their end.
    pub links: Vec<(Host, LinkBytes)>,
    /// CPU seconds per process (named after its host, or `worker1-server`
    /// beside a worker), over its whole life.
    pub cpu: BTreeMap<String, f64>,
    /// Seconds from the workers' start to the last one's end.
    pub seconds: f64,
}

/// The address `host` listens on.
fn listen(host: &Host) -> String {
    format!("{}:{PORT}", host.addr)
}

/// Runs the job in `network`.
///
/// # Errors
/// [`JobError`] saying which host failed and where its log is.
pub async fn run(network: &Network, spec: &JobSpec) -> Result<JobOutcome, JobError> {
    let hosts = network.hosts();
    let scheduler_host = hosts
        .iter()
        .find(|h| h.role == Role::Scheduler)
        .expect("a plan has a scheduler");
    let count = |role| hosts.iter().filter(|h| h.role == role).count();
    let scheduler_addr = listen(scheduler_host);
    // A process is named after its host, or `worker1-server` beside a worker.
    let start =
        |(host, name): (&Host, &str), binary: &str, args: Vec<String>, ready: Option<&str>| {
            let ns = network.namespace(host);
            HostProcess::start(
                (name, &ns),
                &spec.bin_dir.join(binary),
                &args,
                &spec.out,
                ready,
                // Only a worker's stdout is read: its summary.
                binary == "ps-worker",
            )
        };
    let cpu = CpuWatch::default();

    let mut scheduler_args = vec![
        "--listen".into(),
        scheduler_addr.clone(),
        "--workers".into(),
        count(Role::Worker).to_string(),
        "--servers".into(),
        hosts.iter().filter(|h| h.serves).count().to_string(),
        "--exit-when-done".into(),
    ];
    scheduler_args.extend(spec.scheduler_args.iter().cloned());
    let mut scheduler = start(
        (scheduler_host, &scheduler_host.name),
        "ps-scheduler",
        scheduler_args,
        Some("ps-scheduler listening"),
    )?;
    cpu.watch(&scheduler);
    scheduler.ready().await?;

    let mut servers = Vec::new();
    for host in hosts.iter().filter(|h| h.serves) {
        let mut args = vec![
            "--listen".into(),
            listen(host),
            "--scheduler".into(),
            scheduler_addr.clone(),
        ];
        args.extend(spec.server_args.iter().cloned());
        let name = host.server_name();
        let server = start(
            (host, &name),
            "ps-server",
            args,
            Some("ps-server listening"),
        )?;
        cpu.watch(&server);
        servers.push(server);
    }
    for server in &mut servers {
        server.ready().await?;
    }

    let before = network.counters()?;
    let began = Instant::now();
    let mut workers = Vec::new();
    for host in hosts.iter().filter(|h| h.role == Role::Worker) {
        let mut args = vec![
            "--scheduler".into(),
            scheduler_addr.clone(),
            "--json".into(),
        ];
        args.extend(spec.worker_args.iter().cloned());
        let worker = start((host, &host.name), "ps-worker", args, None)?;
        cpu.watch(&worker);
        workers.push(worker);
    }
    let summaries = tokio::time::timeout(spec.timeout, finish_all(&mut workers))
        .await
        .map_err(|_| JobError::Timeout(spec.timeout))??;
    let seconds = began.elapsed().as_secs_f64();
    let after = network.counters()?;

    let grace = Duration::from_secs(10);
    for server in &mut servers {
        cpu.record(server);
        server.stop(grace).await;
    }
    cpu.record(&scheduler);
    scheduler.stop(grace).await;
    let links = hosts
        .iter()
        .cloned()
        .zip(before.iter().zip(&after))
        .map(|(host, (b, a))| {
            let bytes = LinkBytes {
                sent: a.sent.saturating_sub(b.sent),
                received: a.received.saturating_sub(b.received),
            };
            (host, bytes)
        })
        .collect();
    Ok(JobOutcome {
        workers: summaries,
        links,
        cpu: cpu.seconds(),
        seconds,
    })
}

/// Waits for every worker, and reads each one's JSON summary (its last line
/// of stdout).
async fn finish_all(workers: &mut [HostProcess]) -> Result<Vec<(String, TrainSummary)>, JobError> {
    let reads = workers.iter_mut().map(|worker| async move {
        let (host, log) = (worker.host.clone(), worker.log.display().to_string());
        let failed = |why: String| JobError::Worker {
            host: host.clone(),
            why,
            log: log.clone(),
        };
        let stdout = worker
            .stdout()
            .ok_or_else(|| failed("has no stdout".into()))?;
        let mut lines = BufReader::new(stdout).lines();
        let mut last = None;
        while let Ok(Some(line)) = lines.next_line().await {
            last = Some(line);
        }
        if !worker.wait().await {
            return Err(failed("exited with an error".into()));
        }
        let line = last.ok_or_else(|| failed("printed no summary".into()))?;
        let summary: TrainSummary = serde_json::from_str(&line).map_err(|e| {
            failed(format!(
                "printed a summary that does not parse ({e}): {line}"
            ))
        })?;
        Ok((host.clone(), summary))
    });
    futures::future::try_join_all(reads).await
}

/// Samples each watched process's CPU time every 200 ms, keeping the last
/// value read, so a process that has exited still has its total.
#[derive(Debug, Clone, Default)]
struct CpuWatch {
    last: Arc<Mutex<BTreeMap<String, f64>>>,
}

impl CpuWatch {
    fn watch(&self, process: &HostProcess) {
        let (pid, host, last) = (process.pid, process.host.clone(), self.last.clone());
        tokio::spawn(async move {
            while let Some(seconds) = cpu_seconds(pid) {
                last.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(host.clone(), seconds);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// Reads `process`'s CPU time now (before it is stopped).
    fn record(&self, process: &HostProcess) {
        if let Some(seconds) = cpu_seconds(process.pid) {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            last.insert(process.host.clone(), seconds);
        }
    }

    fn seconds(&self) -> BTreeMap<String, f64> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
