//! `kv`: the parameter server's own work, key by key, against raw TCP in the
//! same run. For each size, one `f32` key split evenly over `--servers` real
//! `ps-server` processes (ASP, SGD applied on arrival) is pushed, then pulled, by
//! `--workers` worker **processes** (`ps-microbench kv-worker`). Each worker
//! measures p50/p99 with one operation in flight, then operations per second
//! with `--window` in flight. Every server's CPU (cores used) and peak RSS are
//! read from `/proc` (Linux). With `--tls`, every server and worker talks TLS,
//! with a CA and certificate made for the run. Raw TCP runs once before a size's
//! phases and once after them; ratios are to the mean of the two, and both are
//! in the JSON (`servers.tcp_runs_bytes_per_sec`), since this machine's loopback
//! throughput drifts by a quarter within minutes. With `--tls`, the same baseline
//! also runs over rustls straight on the socket, with the gRPC path's cipher
//! suites: that is what TLS itself costs here, and each row says how much of it
//! the gRPC path reaches (`servers.tls_tcp_bytes_per_sec`, `ratio_vs_tls_tcp`).
//! With `--sgd-floor`, raw TCP runs a third time with a receiver that applies
//! every message with the server's SGD before acknowledging it: the least any
//! parameter server that applies each push does on these cores, read against
//! each push row (`servers.tcp_sgd_bytes_per_sec`, `ratio_vs_tcp_sgd`).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::future::join_all;
use hdrhistogram::Histogram;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, ParamBytes, PsClient, PulledParam, sgd};
use ps_common::processes::{ServerProcess, peak_rss_bytes};
use ps_common::size::format_size;
use ps_proto::codec::{DType, encode_f32};
use ps_proto::dial::UNIX_PREFIX;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::tls::TlsConfig;
use ps_shm::DataPathMode;
use serde::{Deserialize, Serialize};

use crate::cpu::{proc_cpu_seconds, process_cpu_seconds};
use crate::floors::Floors;
use crate::kv_path::KvPath;
use crate::report::ResultRow;
use crate::tcp::{BaselineServer, TcpPeer};
use crate::tls_files::TlsFiles;

/// Push or pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum Op {
    /// Push a gradient of the whole key.
    Push,
    /// Pull the whole key.
    Pull,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Push => "push",
            Op::Pull => "pull",
        })
    }
}

/// The shape of a run.
#[derive(Debug, Clone)]
pub struct KvPlan {
    /// ps-server processes.
    pub servers: usize,
    /// Worker processes.
    pub workers: usize,
    /// Key sizes in bytes.
    pub sizes: Vec<usize>,
    /// Operations in flight per worker in the throughput phase.
    pub window: usize,
    /// Seconds each phase runs.
    pub seconds: f64,
    /// Run the servers and workers over TLS.
    pub tls: bool,
    /// Also run the raw TCP baseline whose receiver applies SGD.
    pub sgd_floor: bool,
    /// Every operation a unary call (no session stream).
    pub unary: bool,
    /// The data paths the workers take, each measured in turn at every size
    /// (the servers offer shared memory, and with `uds` also serve gRPC on a
    /// Unix-domain socket).
    pub data_paths: Vec<KvPath>,
}

/// How a worker reaches the servers: over TLS or not, and whether operations
/// that fit one message travel on a session stream.
#[derive(Debug, Clone)]
pub struct Reach {
    /// TLS settings; plain TCP when `None`.
    pub tls: Option<TlsConfig>,
    /// Use the session stream.
    pub session: bool,
    /// Shared memory or gRPC.
    pub data_path: DataPathMode,
}

/// What one worker process measured, printed as one JSON line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Median latency with one operation in flight, microseconds.
    pub p50_us: f64,
    /// 99th percentile with one operation in flight, microseconds.
    pub p99_us: f64,
    /// Operations completed in the throughput phase.
    pub ops: u64,
    /// Seconds the throughput phase ran.
    pub seconds: f64,
    /// CPU seconds this process used in both phases.
    pub cpu_seconds: f64,
    /// Seconds both phases ran.
    pub wall_seconds: f64,
    /// CPU seconds this process used in the throughput phase.
    pub throughput_cpu_seconds: f64,
    /// When the throughput phase began and ended, in seconds of the system's
    /// clock (the same in every process, so the workers' phases can be
    /// lined up).
    pub throughput_span: (f64, f64),
    /// The CPU seconds each watched process (the servers, by pid) had used
    /// when the throughput phase began, and when it ended (from `/proc`).
    pub watched_cpu_seconds: (Vec<f64>, Vec<f64>),
}

/// Seconds of the system's clock, comparable between processes.
fn system_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// The key a run of `size` bytes uses.
fn key_name(size: usize) -> String {
    format!("kv-{size}")
}

fn key_info(size: usize) -> ParamInfo {
    ParamInfo {
        name: key_name(size),
        shape: vec![(size / 4).max(1)],
        dtype: DType::F32,
    }
}

/// A client whose placement splits the key evenly over `servers`.
async fn placed_client(servers: &[String], size: usize, reach: Reach) -> anyhow::Result<PsClient> {
    let mut config = ClientConfig::new(servers.to_vec());
    config.transport.tls = reach.tls;
    config.session = reach.session;
    config.data_path = reach.data_path;
    config.partition_bytes = size.div_ceil(servers.len()).max(4);
    let mut client = PsClient::connect(config).await?;
    client.place(&[key_info(size)]).await?;
    Ok(client)
}

/// One worker process's part: latency with one operation in flight, then
/// throughput with `window` in flight, for `seconds` each; the CPU that the
/// `watched` processes (the servers) used in the throughput phase is read
/// too. Worker `index` pushes as ranks of its own, one per operation slot, so
/// concurrent pushes are never taken for retries.
///
/// # Errors
/// When a server cannot be reached or refuses an operation.
pub async fn run_worker(
    servers: &[String],
    (size, op): (usize, Op),
    (window, seconds): (usize, f64),
    index: u32,
    reach: Reach,
    watched: &[u32],
) -> anyhow::Result<WorkerReport> {
    let client = placed_client(servers, size, reach).await?;
    let grad = [ParamBytes::new(key_name(size), gradient(size))];
    let first_rank = index * (window as u32 + 1);
    let (start, cpu) = (Instant::now(), process_cpu_seconds());
    let phase = Duration::from_secs_f64(seconds);

    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut slot = Slot::new(Rank(first_rank));
    let latency_end = Instant::now() + phase;
    while Instant::now() < latency_end {
        let began = Instant::now();
        slot.run(&client, op, &grad).await?;
        latency.record(began.elapsed().as_micros().max(1) as u64)?;
    }

    let watched_cpu = || watched.iter().map(|&pid| proc_cpu_seconds(pid)).collect();
    let watched_before: Vec<f64> = watched_cpu();
    let throughput_cpu = process_cpu_seconds();
    let began = system_seconds();
    let throughput_start = Instant::now();
    let end = throughput_start + phase;
    let slots = (1..=window as u32).map(|s| {
        let (client, grad) = (&client, &grad);
        async move {
            let mut slot = Slot::new(Rank(first_rank + s));
            let mut ops = 0u64;
            while Instant::now() < end {
                slot.run(client, op, grad).await?;
                ops += 1;
            }
            anyhow::Ok(ops)
        }
    });
    let mut ops = 0;
    for done in join_all(slots).await {
        ops += done?;
    }
    let seconds = throughput_start.elapsed().as_secs_f64();
    let throughput_span = (began, system_seconds());
    let cpu_now = process_cpu_seconds();
    let watched_cpu_seconds = (watched_before, watched_cpu());
    Ok(WorkerReport {
        p50_us: latency.value_at_quantile(0.5) as f64,
        p99_us: latency.value_at_quantile(0.99) as f64,
        ops,
        seconds,
        cpu_seconds: cpu_now - cpu,
        wall_seconds: start.elapsed().as_secs_f64(),
        throughput_cpu_seconds: cpu_now - throughput_cpu,
        throughput_span,
        watched_cpu_seconds,
    })
}

/// One operation slot: its own rank and next step, and the buffers it pulls into.
struct Slot {
    rank: Rank,
    step: Step,
    pulled: BTreeMap<String, PulledParam>,
}

impl Slot {
    fn new(rank: Rank) -> Self {
        Self {
            rank,
            step: Step(0),
            pulled: BTreeMap::new(),
        }
    }

    async fn run(&mut self, client: &PsClient, op: Op, grad: &[ParamBytes]) -> anyhow::Result<()> {
        match op {
            Op::Push => {
                let taken = client.push(self.rank, self.step, grad).await?;
                if taken == 0 {
                    bail!("{} step {} was taken for a retry", self.rank, self.step);
                }
                self.step = self.step.next();
            }
            Op::Pull => {
                client.pull_into(Version(0), &mut self.pulled).await?;
            }
        }
        Ok(())
    }
}

/// A small finite gradient, so SGD really changes the values.
fn gradient(size: usize) -> Bytes {
    let values: Vec<f32> = (0..(size / 4).max(1))
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-6)
        .collect();
    encode_f32(DType::F32, &values)
}

/// Runs the plan: one push row and one pull row per size.
///
/// # Errors
/// When a server or a worker process fails.
pub async fn run(plan: &KvPlan) -> anyhow::Result<Vec<ResultRow>> {
    let tls = plan.tls.then(TlsFiles::new).transpose()?;
    // The servers' sockets, in a folder of this run's (removed with it).
    let socket_dir = match plan.data_paths.contains(&KvPath::Uds) {
        true => Some(tempfile::tempdir().context("a folder for the servers' sockets")?),
        false => None,
    };
    let sockets: Vec<PathBuf> = (0..plan.servers)
        .filter_map(|i| Some(socket_dir.as_ref()?.path().join(format!("server-{i}.sock"))))
        .collect();
    let servers = start_servers(plan, tls.as_ref(), &sockets).await;
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let socket_addrs: Vec<String> = sockets
        .iter()
        .map(|path| format!("{UNIX_PREFIX}{}", path.display()))
        .collect();
    let pids: Vec<u32> = servers.iter().filter_map(ServerProcess::pid).collect();
    let mut rows = Vec::new();
    for &size in &plan.sizes {
        let parts = register_key(&addrs, size, tls.as_ref()).await?;
        // Raw baselines before and after the phases, so that the machine
        // drifting between them shows in the spread instead of in the ratio.
        let before = Baselines::measure(plan, size, tls.as_ref()).await?;
        let mut phases = Vec::new();
        for &path in &plan.data_paths {
            let reached = match path {
                KvPath::Uds => &socket_addrs,
                KvPath::Mode(_) => &addrs,
            };
            for op in [Op::Push, Op::Pull] {
                let phase = run_phase(plan, reached, &pids, size, (op, path), tls.as_ref())?;
                phases.push((op, path, phase));
            }
        }
        let after = Baselines::measure(plan, size, tls.as_ref()).await?;
        let baselines = before.mean_with(after);
        for (op, path, (reports, servers_used)) in phases {
            let row = row(
                plan,
                size,
                (op, path),
                parts,
                &reports,
                &baselines,
                servers_used,
            );
            rows.push(row);
        }
    }
    for server in servers {
        server.stop().await;
    }
    Ok(rows)
}

/// The plan's ps-server processes: ASP, taking the largest key, over TLS in
/// `--tls` runs, server `i` also on `sockets[i]` when given.
async fn start_servers(
    plan: &KvPlan,
    tls: Option<&TlsFiles>,
    sockets: &[PathBuf],
) -> Vec<ServerProcess> {
    let largest = plan.sizes.iter().copied().max().unwrap_or(1 << 20);
    let mut args = vec![
        "--consistency".to_string(),
        "asp".to_string(),
        format!("--max-tensor={}", largest.max(1 << 20)),
    ];
    args.extend(tls.iter().flat_map(|files| files.server_args()));
    let mut servers = Vec::new();
    for i in 0..plan.servers {
        let mut args = args.clone();
        if let Some(socket) = sockets.get(i) {
            args.push(format!("--listen-unix={}", socket.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        servers.push(ServerProcess::start(&args).await);
    }
    servers
}

/// Registers the key of `size` bytes over `addrs`; the parts it is cut into.
async fn register_key(
    addrs: &[String],
    size: usize,
    tls: Option<&TlsFiles>,
) -> anyhow::Result<usize> {
    let reach = Reach {
        tls: tls.map(|t| t.config.clone()),
        session: true,
        data_path: DataPathMode::Grpc,
    };
    let client = placed_client(addrs, size, reach).await?;
    let initial = [ParamBytes::new(
        key_name(size),
        encode_f32(DType::F32, &vec![0.5; (size / 4).max(1)]),
    )];
    client.register(&initial, &sgd(0.01)).await?;
    let placement = client.placement();
    Ok(placement.params().map(|p| p.parts.len()).sum())
}

/// One phase (`op` on the key of `size` bytes) by the worker processes: their
/// reports, and the cores and peak memory each server used meanwhile.
fn run_phase(
    plan: &KvPlan,
    addrs: &[String],
    pids: &[u32],
    size: usize,
    (op, path): (Op, KvPath),
    tls: Option<&TlsFiles>,
) -> anyhow::Result<(Vec<WorkerReport>, Vec<serde_json::Value>)> {
    let before: Vec<f64> = pids.iter().map(|&pid| proc_cpu_seconds(pid)).collect();
    let wall = Instant::now();
    let tls_args: Vec<String> = tls.iter().flat_map(|files| files.client_args()).collect();
    let reports = spawn_workers(plan, (addrs, pids), size, (op, path), &tls_args)?;
    let wall = wall.elapsed().as_secs_f64();
    let servers_used = pids
        .iter()
        .zip(&before)
        .map(|(&pid, before)| {
            serde_json::json!({
                "cores": (proc_cpu_seconds(pid) - before) / wall,
                "peak_rss_bytes": peak_rss_bytes(pid),
            })
        })
        .collect();
    Ok((reports, servers_used))
}

/// The raw baselines a size's rows are read against.
struct Baselines {
    tcp: TcpFigures,
    /// The same over TLS, in `--tls` runs.
    tls_tcp: Option<TcpFigures>,
    /// Plain TCP with SGD applied by the receiver, in `--sgd-floor` runs.
    tcp_sgd: Option<TcpFigures>,
    /// One core's memcpy and copy-then-SGD, and the ring between two
    /// threads, in runs with shared memory.
    floors: Option<Floors>,
}

impl Baselines {
    /// One run of each baseline the plan asks for, at `size`.
    async fn measure(plan: &KvPlan, size: usize, tls: Option<&TlsFiles>) -> anyhow::Result<Self> {
        let baseline = |kind| tcp_baseline(size, plan.window, plan.seconds, kind);
        let tcp = baseline(Baseline::Tcp).await?;
        let tls_tcp = match tls {
            Some(files) => Some(baseline(Baseline::Tls(files)).await?),
            None => None,
        };
        let tcp_sgd = match plan.sgd_floor {
            true => Some(baseline(Baseline::TcpSgd).await?),
            false => None,
        };
        let shm = plan.data_paths.iter().any(|path| path.tries_shm());
        let floors = match shm {
            true => {
                let (seconds, shape, window) =
                    (plan.seconds, (plan.servers, plan.workers), plan.window);
                Some(
                    tokio::task::spawn_blocking(move || {
                        Floors::measure(size, seconds, shape, window)
                    })
                    .await??,
                )
            }
            false => None,
        };
        Ok(Self {
            tcp,
            tls_tcp,
            tcp_sgd,
            floors,
        })
    }

    /// The mean of these runs and `after`'s, each run's throughput listed.
    fn mean_with(self, after: Self) -> Self {
        let mean = |a: Option<TcpFigures>, b: Option<TcpFigures>| {
            a.zip(b).map(|(a, b)| TcpFigures::mean(&[a, b]))
        };
        Self {
            tcp: TcpFigures::mean(&[self.tcp, after.tcp]),
            tls_tcp: mean(self.tls_tcp, after.tls_tcp),
            tcp_sgd: mean(self.tcp_sgd, after.tcp_sgd),
            floors: self.floors.zip(after.floors).map(|(a, b)| a.mean_with(b)),
        }
    }
}

fn row(
    plan: &KvPlan,
    size: usize,
    (op, path): (Op, KvPath),
    parts: usize,
    reports: &[WorkerReport],
    baselines: &Baselines,
    servers: Vec<serde_json::Value>,
) -> ResultRow {
    let tcp = &baselines.tcp;
    let ops: u64 = reports.iter().map(|r| r.ops).sum();
    let seconds = reports.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let throughput = (ops as f64 * size as f64) / seconds.max(1e-9);
    let mut p50: Vec<f64> = reports.iter().map(|r| r.p50_us).collect();
    let p50_us = crate::report::median(&mut p50);
    let mut p99: Vec<f64> = reports.iter().map(|r| r.p99_us).collect();
    let workers: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| serde_json::json!({ "cores": r.cpu_seconds / r.wall_seconds.max(1e-9) }))
        .collect();
    let mut figures = serde_json::json!({
        "servers": servers,
        "workers": workers,
        "tcp_runs_bytes_per_sec": tcp.runs_bytes_per_sec,
        "tcp_cores": tcp.cores,
    });
    if tcp.bytes_per_sec > 0.0 {
        figures["tcp_cpu_sec_per_gb"] = (tcp.cores / (tcp.bytes_per_sec / 1e9)).into();
    }
    if let Some(tls_tcp) = &baselines.tls_tcp {
        figures["tls_tcp_bytes_per_sec"] = tls_tcp.bytes_per_sec.into();
        figures["tls_tcp_runs_bytes_per_sec"] = tls_tcp.runs_bytes_per_sec.clone().into();
        figures["tls_tcp_cores"] = tls_tcp.cores.into();
        figures["ratio_vs_tls_tcp"] = (throughput / tls_tcp.bytes_per_sec.max(1e-9)).into();
    }
    if let Some(tcp_sgd) = baselines.tcp_sgd.as_ref().filter(|_| op == Op::Push) {
        figures["tcp_sgd_bytes_per_sec"] = tcp_sgd.bytes_per_sec.into();
        figures["tcp_sgd_runs_bytes_per_sec"] = tcp_sgd.runs_bytes_per_sec.clone().into();
        figures["tcp_sgd_cores"] = tcp_sgd.cores.into();
        figures["tcp_sgd_p50_us"] = tcp_sgd.p50_us.into();
        figures["ratio_vs_tcp_sgd"] = (throughput / tcp_sgd.bytes_per_sec.max(1e-9)).into();
    }
    if let Some(floors) = &baselines.floors {
        // A pull is at best one copy; a push, a copy and the SGD over it.
        let floor = match op {
            Op::Pull => floors.memcpy_bytes_per_sec,
            Op::Push => floors.copy_apply_bytes_per_sec,
        };
        figures["memcpy_bytes_per_sec"] = floors.memcpy_bytes_per_sec.into();
        figures["memcpy_window_bytes_per_sec"] = floors.memcpy_window_bytes_per_sec.into();
        if op == Op::Pull {
            // The same copy into as many buffers as the worker pulls into:
            // at 1 MiB and a window of 8 they no longer fit a core's L2.
            figures["ratio_vs_memcpy_window"] =
                (throughput / floors.memcpy_window_bytes_per_sec.max(1e-9)).into();
        }
        figures["copy_sgd_bytes_per_sec"] = floors.copy_apply_bytes_per_sec.into();
        figures["floor_bytes_per_sec"] = floor.into();
        figures["ratio_vs_floor"] = (throughput / floor.max(1e-9)).into();
        // A shared-memory row's bytes cross between two cores, no faster
        // than the ring alone carries them (shown on every row of the run).
        figures["ring_bytes_per_sec"] = floors.ring_bytes_per_sec.into();
        figures["ratio_vs_ring"] = (throughput / floors.ring_bytes_per_sec.max(1e-9)).into();
        // A push's p50 is no lower than the rings' round trip carrying the
        // key to the servers, between as many threads as the run has
        // servers and workers. (A pull carries it the other way: at small
        // sizes the same, but not read against it.)
        figures["round_trip_p50_us"] = floors.round_trip_p50_us.into();
        if let Some(p50_us) = p50_us.filter(|_| op == Op::Push) {
            figures["p50_vs_round_trip"] = (p50_us / floors.round_trip_p50_us.max(1e-9)).into();
        }
        // Operations per second with the run's window in flight are no
        // more than those round trips' rate (shown on every row; small
        // keys are the ones it bounds).
        let operations = ops as f64 / seconds.max(1e-9);
        figures["round_trips_per_sec"] = floors.round_trips_per_sec.into();
        figures["ops_vs_round_trips"] = (operations / floors.round_trips_per_sec.max(1e-9)).into();
    }
    let tls = if plan.tls { " tls" } else { "" };
    ResultRow {
        bench: "kv".into(),
        mode: Some(op.to_string()),
        encoding: format!("f32{tls} {path}"),
        payload: format!(
            "{} {}x{} W={} ({parts} parts)",
            format_size(size),
            plan.servers,
            plan.workers,
            plan.window
        ),
        size_bytes: size as u64,
        messages: ops,
        throughput_bytes_per_sec: Some(throughput),
        tcp_throughput_bytes_per_sec: Some(tcp.bytes_per_sec),
        ratio_vs_tcp: Some(throughput / tcp.bytes_per_sec.max(1e-9)),
        rpcs_per_sec: Some(ops as f64 / seconds.max(1e-9)),
        p50_us,
        p99_us: crate::report::median(&mut p99),
        tcp_p50_us: Some(tcp.p50_us),
        client_cpu_sec_per_gb: workers_cpu_per_gb(reports, size),
        server_cpu_sec_per_gb: servers_cpu_per_gb(reports, size),
        reps: 1,
        servers: Some(figures),
        ..ResultRow::default()
    }
}

/// The workers' CPU seconds in the throughput phase, per GB that they moved in it.
fn workers_cpu_per_gb(reports: &[WorkerReport], size: usize) -> Option<f64> {
    let moved = reports
        .iter()
        .map(|r| r.ops as f64 * size as f64)
        .sum::<f64>()
        / 1e9;
    let cpu: f64 = reports.iter().map(|r| r.throughput_cpu_seconds).sum();
    (moved > 0.0).then_some(cpu / moved)
}

/// The servers' CPU seconds while every worker was in its throughput phase
/// (from the last of them to begin to the first to end), per GB that the
/// workers moved meanwhile at their combined rate.
fn servers_cpu_per_gb(reports: &[WorkerReport], size: usize) -> Option<f64> {
    let last_in = reports
        .iter()
        .max_by(|a, b| a.throughput_span.0.total_cmp(&b.throughput_span.0))?;
    let first_out = reports
        .iter()
        .min_by(|a, b| a.throughput_span.1.total_cmp(&b.throughput_span.1))?;
    let both = first_out.throughput_span.1 - last_in.throughput_span.0;
    let cpu = first_out.watched_cpu_seconds.1.iter().sum::<f64>()
        - last_in.watched_cpu_seconds.0.iter().sum::<f64>();
    let rate: f64 = reports
        .iter()
        .map(|r| r.ops as f64 * size as f64 / r.seconds.max(1e-9))
        .sum();
    let moved = rate * both / 1e9;
    let watched = !first_out.watched_cpu_seconds.1.is_empty();
    (watched && both > 0.0 && moved > 0.0).then_some(cpu / moved)
}

/// A row's CPU seconds per GB: the workers', the servers' and raw TCP's
/// (both of its ends), as the table shows them.
fn cpu_per_gb(row: &ResultRow) -> String {
    let tcp = row
        .servers
        .as_ref()
        .and_then(|figures| figures["tcp_cpu_sec_per_gb"].as_f64());
    [row.client_cpu_sec_per_gb, row.server_cpu_sec_per_gb, tcp]
        .map(|v| v.map_or("-".to_string(), |v| format!("{v:.2}")))
        .join("/")
}

/// Starts the worker processes of one phase and reads each one's report.
fn spawn_workers(
    plan: &KvPlan,
    (addrs, pids): (&[String], &[u32]),
    size: usize,
    (op, path): (Op, KvPath),
    tls_args: &[String],
) -> anyhow::Result<Vec<WorkerReport>> {
    let exe = std::env::current_exe().context("the benchmark's own path")?;
    // Each data path's workers push as ranks of their own: a rank's steps
    // start at 0 again, and would be taken for retries of an earlier phase's.
    let path_index = plan.data_paths.iter().position(|&p| p == path).unwrap_or(0);
    let first_index = path_index * plan.workers;
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let watch = (!pids.is_empty()).then(|| ["--watch-pids".to_string(), pids.join(",")]);
    let children = (0..plan.workers)
        .map(|index| {
            Command::new(&exe)
                .args(["kv-worker", "--servers", &addrs.join(",")])
                .args(watch.iter().flatten())
                .args(["--size", &size.to_string(), "--op", &op.to_string()])
                .args(["--window", &plan.window.to_string()])
                .args(["--seconds", &plan.seconds.to_string()])
                .args(["--index", &(first_index + index).to_string()])
                .args(plan.unary.then_some("--unary"))
                .args(["--data-path", &path.mode().to_string()])
                .args(tls_args)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting a kv-worker process")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    worker_reports(children, "kv-worker")
}

/// The report each of `children` (worker processes of the benchmark, named
/// `what`) prints as its first line of stdout, once it has exited cleanly.
///
/// # Errors
/// A worker that printed no report, exited with a failure, or printed a line
/// that is not a report.
pub(crate) fn worker_reports<R: serde::de::DeserializeOwned>(
    children: Vec<std::process::Child>,
    what: &str,
) -> anyhow::Result<Vec<R>> {
    children
        .into_iter()
        .map(|mut child| {
            let stdout = child.stdout.take().context("the worker's stdout")?;
            let line = std::io::BufReader::new(stdout)
                .lines()
                .next()
                .with_context(|| format!("a {what} exited without a report"))??;
            let status = child.wait()?;
            if !status.success() {
                bail!("a {what} failed ({status})");
            }
            Ok(serde_json::from_str(&line)?)
        })
        .collect()
}

/// Raw TCP in the same run: `window` connections sending `size`-byte messages and
/// waiting for each acknowledgement, and the median of one at a time; of one
/// run, or the mean of several with each run's throughput kept.
struct TcpFigures {
    bytes_per_sec: f64,
    p50_us: f64,
    runs_bytes_per_sec: Vec<f64>,
    /// Cores both ends used together in the throughput phase (they are threads of
    /// this process): near the machine's count, the baseline is CPU-bound.
    cores: f64,
}

impl TcpFigures {
    /// The mean throughput and latency of `runs`, each run's throughput listed.
    fn mean(runs: &[TcpFigures]) -> TcpFigures {
        let n = runs.len().max(1) as f64;
        TcpFigures {
            bytes_per_sec: runs.iter().map(|r| r.bytes_per_sec).sum::<f64>() / n,
            p50_us: runs.iter().map(|r| r.p50_us).sum::<f64>() / n,
            cores: runs.iter().map(|r| r.cores).sum::<f64>() / n,
            runs_bytes_per_sec: runs
                .iter()
                .flat_map(|r| r.runs_bytes_per_sec.clone())
                .collect(),
        }
    }
}

/// Which raw baseline runs.
#[derive(Clone, Copy)]
enum Baseline<'a> {
    /// Plain TCP.
    Tcp,
    /// TLS with the run's certificates.
    Tls(&'a TlsFiles),
    /// Plain TCP, each message applied with SGD before it is acknowledged.
    TcpSgd,
}

/// One raw baseline's figures.
async fn tcp_baseline(
    size: usize,
    window: usize,
    seconds: f64,
    kind: Baseline<'_>,
) -> anyhow::Result<TcpFigures> {
    let tls = match kind {
        Baseline::Tls(files) => Some(files),
        Baseline::Tcp | Baseline::TcpSgd => None,
    };
    let send = match kind {
        Baseline::TcpSgd => TcpPeer::apply,
        Baseline::Tcp | Baseline::Tls(_) => TcpPeer::sink,
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let server = match tls {
        None => BaselineServer::start(listener)?,
        Some(files) => BaselineServer::start_tls(listener, files.baseline_server()?)?,
    };
    let addr = server.addr().to_string();
    let client = match tls {
        Some(files) => Some((files.baseline_client()?, files.server_name())),
        None => None,
    };
    let mut peers = Vec::new();
    for _ in 0..window.max(1) {
        peers.push(match &client {
            None => TcpPeer::connect(&addr).await?,
            Some((config, name)) => TcpPeer::connect_tls(&addr, Arc::clone(config), name).await?,
        });
    }
    let phase = Duration::from_secs_f64(seconds);
    let figures = tokio::task::spawn_blocking(move || -> anyhow::Result<TcpFigures> {
        let data = vec![0x5au8; size];
        let mut latencies = Vec::new();
        let end = Instant::now() + phase;
        while Instant::now() < end {
            let began = Instant::now();
            send(&mut peers[0], &data)?;
            latencies.push(began.elapsed().as_secs_f64() * 1e6);
        }
        let cpu_before = process_cpu_seconds();
        let start = Instant::now();
        let end = start + phase;
        let bytes: u64 = std::thread::scope(|scope| {
            let threads: Vec<_> = peers
                .iter_mut()
                .map(|peer| {
                    let data = &data;
                    scope.spawn(move || -> std::io::Result<u64> {
                        let mut sent = 0;
                        while Instant::now() < end {
                            send(peer, data)?;
                            sent += data.len() as u64;
                        }
                        Ok(sent)
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a TCP thread").unwrap_or(0))
                .sum()
        });
        let wall = start.elapsed().as_secs_f64();
        let bytes_per_sec = bytes as f64 / wall;
        Ok(TcpFigures {
            bytes_per_sec,
            cores: (process_cpu_seconds() - cpu_before) / wall,
            p50_us: crate::report::median(&mut latencies).unwrap_or(0.0),
            runs_bytes_per_sec: vec![bytes_per_sec],
        })
    })
    .await??;
    drop(server);
    Ok(figures)
}

/// The rows as a table with the figures `kv` is for: latency at one in flight,
/// throughput at the window, raw TCP beside them, and what each process used.
pub fn table(rows: &[ResultRow]) -> String {
    let extra = |row: &ResultRow, speed: &str, ratio: &str| {
        let figures = row.servers.as_ref()?;
        Some((figures[speed].as_f64()?, figures[ratio].as_f64()?))
    };
    let tls_tcp = |row: &ResultRow| extra(row, "tls_tcp_bytes_per_sec", "ratio_vs_tls_tcp");
    let tcp_sgd = |row: &ResultRow| extra(row, "tcp_sgd_bytes_per_sec", "ratio_vs_tcp_sgd");
    let floor = |row: &ResultRow| extra(row, "floor_bytes_per_sec", "ratio_vs_floor");
    let window_floor =
        |row: &ResultRow| extra(row, "memcpy_window_bytes_per_sec", "ratio_vs_memcpy_window");
    let with_tls = rows.iter().any(|row| tls_tcp(row).is_some());
    let with_sgd = rows.iter().any(|row| tcp_sgd(row).is_some());
    let with_floor = rows.iter().any(|row| floor(row).is_some());
    let mut out = format!(
        "{:<28} {:>4} {:>4} {:>9} {:>9} {:>10} {:>9} {:>10} {:>6} {:>9} {:>13} {:>18} {:>18}",
        "key",
        "op",
        "path",
        "p50 µs",
        "p99 µs",
        "GB/s",
        "ops/s",
        "TCP GB/s",
        "ratio",
        "TCP p50",
        "worker cores",
        "server cores / RSS",
        "CPU s/GB w/s/TCP"
    );
    if with_tls {
        out += &format!(" {:>12} {:>6}", "TLS TCP GB/s", "ratio");
    }
    if with_sgd {
        out += &format!(" {:>12} {:>6}", "TCP+SGD GB/s", "ratio");
    }
    if with_floor {
        out += &format!(" {:>12} {:>6}", "floor GB/s", "ratio");
        out += &format!(" {:>12} {:>6}", "copy×W GB/s", "ratio");
    }
    out += "\n";
    for row in rows {
        let figures = row.servers.clone().unwrap_or_default();
        let servers: Vec<String> = figures["servers"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|s| {
                        format!(
                            "{:.2}/{}",
                            s["cores"].as_f64().unwrap_or(0.0),
                            format_size(s["peak_rss_bytes"].as_u64().unwrap_or(0) as usize)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let workers: Vec<String> = figures["workers"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|w| format!("{:.2}", w["cores"].as_f64().unwrap_or(0.0)))
                    .collect()
            })
            .unwrap_or_default();
        let gb = |v: Option<f64>| v.map_or(0.0, |v| v / 1e9);
        out += &format!(
            "{:<28} {:>4} {:>4} {:>9.0} {:>9.0} {:>10.3} {:>9.0} {:>10.3} {:>6.2} {:>9.0} {:>13} {:>18} {:>18}",
            row.payload,
            row.mode.as_deref().unwrap_or(""),
            row.encoding.rsplit(' ').next().unwrap_or(""),
            row.p50_us.unwrap_or(0.0),
            row.p99_us.unwrap_or(0.0),
            gb(row.throughput_bytes_per_sec),
            row.rpcs_per_sec.unwrap_or(0.0),
            gb(row.tcp_throughput_bytes_per_sec),
            row.ratio_vs_tcp.unwrap_or(0.0),
            row.tcp_p50_us.unwrap_or(0.0),
            workers.join(","),
            servers.join(","),
            cpu_per_gb(row),
        );
        let extras = [
            (with_tls, tls_tcp(row)),
            (with_sgd, tcp_sgd(row)),
            (with_floor, floor(row)),
            (with_floor, window_floor(row)),
        ];
        for (present, figures) in extras {
            out += &match figures {
                Some((bytes_per_sec, ratio)) => {
                    format!(" {:>12.3} {ratio:>6.2}", bytes_per_sec / 1e9)
                }
                None if present => format!(" {:>12} {:>6}", "-", "-"),
                None => String::new(),
            };
        }
        out += "\n";
    }
    out
}
