//! `rows`: embedding rows by id, as a recommendation model moves them. A table
//! of `--rows` rows `--width` floats wide is spread over `--servers` real
//! `ps-server` processes (ASP, Adagrad); `--workers` worker **processes**
//! (`ps-microbench rows-worker`) each draw batches of `--batch` ids from a Zipf
//! law (`--zipf`), deduplicate them as a training worker does, and push, then
//! pull, the rows: p50/p99 with one batch in flight, then rows per second with
//! `--window` batches in flight. Every server's CPU is read from `/proc`, so a
//! row's server cost is known, and its peak RSS.
//!
//! The floor beside each row (`rows_floor`): the same batches over one raw TCP
//! connection per slot into a hash map of rows behind one lock, applied with
//! the same Adagrad, in this process. That is a key-value server with no
//! protocol at all, which is what ps-lite's `KVServer` with a hash-map handle
//! is underneath ZeroMQ: the rows per second that any such server reaches on
//! these cores.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::future::join_all;
use hdrhistogram::Histogram;
use ps_client::table_spec::{RowOptimizerChoice, table};
use ps_client::{ClientConfig, PsClient, UniqueIds};
use ps_common::processes::{ServerProcess, peak_rss_bytes};
use ps_common::rng::SplitMix64;
use ps_common::zipf::Zipf;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::v1;
use ps_shm::DataPathMode;
use serde::{Deserialize, Serialize};

use crate::cpu::{proc_cpu_seconds, process_cpu_seconds};
use crate::kv::{Op, worker_reports};
use crate::report::ResultRow;
use crate::rows_floor::{FloorFigures, measure_floor};

/// The table every worker of a run declares.
const TABLE: &str = "bench-rows";
/// Batches each worker draws before a phase and cycles through.
const BATCHES: usize = 32;
/// Adagrad's learning rate in the benchmark (its value does not change the cost).
const LR: f64 = 0.01;

/// The shape of a run.
#[derive(Debug, Clone)]
pub struct RowsPlan {
    /// ps-server processes.
    pub servers: usize,
    /// Worker processes.
    pub workers: usize,
    /// Ids drawn per batch (before deduplication).
    pub batch: usize,
    /// Floats per row.
    pub width: usize,
    /// Rows in the table (ids are below it).
    pub rows: u64,
    /// The Zipf exponent of the ids.
    pub zipf: f64,
    /// Batches in flight per worker in the throughput phase.
    pub window: usize,
    /// Seconds each phase runs.
    pub seconds: f64,
    /// How workers reach the servers: gRPC (as ps-lite's TCP), or shared
    /// memory on this host (`auto`, `shm`).
    pub data_path: DataPathMode,
}

/// What one worker process measured, printed as one JSON line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowsReport {
    /// Median latency of one batch with one in flight, microseconds.
    pub p50_us: f64,
    /// 99th percentile of the same.
    pub p99_us: f64,
    /// Batches completed in the throughput phase.
    pub batches: u64,
    /// Distinct rows those batches moved.
    pub rows: u64,
    /// Distinct rows the latency phase moved.
    pub latency_rows: u64,
    /// Seconds the throughput phase ran.
    pub seconds: f64,
    /// CPU seconds this process used in both phases.
    pub cpu_seconds: f64,
    /// Seconds both phases ran.
    pub wall_seconds: f64,
}

/// The table of a run. Its rows start at zero, as ps-lite's handle in
/// `bench/pslite/rows_bench.cc` gives zeros for a row never pushed: the pull
/// phase's batches are drawn apart from the push phase's, so many of its rows
/// were never pushed, and a random initialiser would cost the server a draw
/// per element of each (about a seventh of its pull time) that ps-lite skips.
fn table_spec(plan_width: usize, rows: u64) -> v1::TableSpec {
    let init = v1::RowInit {
        kind: None,
        seed: 1,
    };
    let mut spec = table(
        TABLE,
        plan_width as u32,
        init,
        RowOptimizerChoice::Adagrad.with_lr(LR),
    );
    spec.max_rows = rows;
    spec
}

/// `count` batches of `batch` Zipf ids below `rows`, each deduplicated, drawn
/// with `seed`.
pub fn zipf_batches(batch: usize, rows: u64, zipf: f64, count: usize, seed: u64) -> Vec<Vec<u64>> {
    let law = Zipf::new(rows, zipf);
    let mut rng = SplitMix64::new(seed);
    (0..count)
        .map(|_| {
            let ids: Vec<u64> = (0..batch).map(|_| law.sample(&mut rng) - 1).collect();
            UniqueIds::of(&ids).ids
        })
        .collect()
}

/// The arguments a worker process is started with.
#[derive(Debug, Clone)]
pub struct WorkerRun {
    /// Server addresses.
    pub servers: Vec<String>,
    /// Pull or push.
    pub op: Op,
    /// The run's shape.
    pub plan: RowsPlan,
    /// This worker's index (its ranks and its ids' seed).
    pub index: u32,
}

/// One worker process's part: latency with one batch in flight, then
/// throughput with `window` in flight, each slot pushing as a rank of its own.
///
/// # Errors
/// When a server cannot be reached or refuses an operation.
pub async fn run_worker(run: WorkerRun) -> anyhow::Result<RowsReport> {
    let plan = &run.plan;
    let config = ClientConfig {
        data_path: plan.data_path,
        ..ClientConfig::new(run.servers.clone())
    };
    let mut client = PsClient::connect(config).await?;
    client
        .declare_table(table_spec(plan.width, plan.rows))
        .await?;
    let batches = zipf_batches(
        plan.batch,
        plan.rows,
        plan.zipf,
        BATCHES,
        u64::from(run.index),
    );
    let grads: Vec<Vec<f32>> = batches
        .iter()
        .map(|ids| vec![1e-3; ids.len() * plan.width])
        .collect();
    let first_rank = run.index * (plan.window as u32 + 1);
    let (start, cpu) = (Instant::now(), process_cpu_seconds());
    let phase = Duration::from_secs_f64(plan.seconds);
    let slot = |rank: u32| Slot {
        client: &client,
        op: run.op,
        rank: Rank(rank),
        step: Step(0),
        next: rank as usize,
    };

    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut one = slot(first_rank);
    let mut latency_rows = 0u64;
    let end = Instant::now() + phase;
    while Instant::now() < end {
        let began = Instant::now();
        latency_rows += one.run(&batches, &grads).await? as u64;
        latency.record(began.elapsed().as_micros().max(1) as u64)?;
    }

    let throughput_start = Instant::now();
    let end = throughput_start + phase;
    let slots = (1..=plan.window as u32).map(|s| {
        let mut slot = slot(first_rank + s);
        let (batches, grads) = (&batches, &grads);
        async move {
            let (mut done, mut rows) = (0u64, 0u64);
            while Instant::now() < end {
                rows += slot.run(batches, grads).await? as u64;
                done += 1;
            }
            anyhow::Ok((done, rows))
        }
    });
    let (mut done, mut rows) = (0, 0);
    for slot in join_all(slots).await {
        let (d, r) = slot?;
        done += d;
        rows += r;
    }
    Ok(RowsReport {
        p50_us: latency.value_at_quantile(0.5) as f64,
        p99_us: latency.value_at_quantile(0.99) as f64,
        batches: done,
        rows,
        latency_rows,
        seconds: throughput_start.elapsed().as_secs_f64(),
        cpu_seconds: process_cpu_seconds() - cpu,
        wall_seconds: start.elapsed().as_secs_f64(),
    })
}

/// One batch slot: its rank and next step, and which batch it sends next.
struct Slot<'a> {
    client: &'a PsClient,
    op: Op,
    rank: Rank,
    step: Step,
    next: usize,
}

impl Slot<'_> {
    /// Pulls or pushes the next batch; the rows it moved.
    async fn run(&mut self, batches: &[Vec<u64>], grads: &[Vec<f32>]) -> anyhow::Result<usize> {
        let i = self.next % batches.len();
        self.next += 1;
        let ids = &batches[i];
        match self.op {
            Op::Pull => {
                let unique = UniqueIds {
                    ids: ids.clone(),
                    index: Vec::new(),
                };
                self.client
                    .pull_unique_rows(TABLE, &unique, Version(0))
                    .await?;
            }
            Op::Push => {
                let at = (self.rank, self.step);
                let taken = self
                    .client
                    .push_unique_rows(TABLE, at, ids, &grads[i])
                    .await?;
                if taken == 0 {
                    bail!("{} step {} was taken for a retry", self.rank, self.step);
                }
                self.step = self.step.next();
            }
        }
        Ok(ids.len())
    }
}

/// Runs the plan: a push row, then a pull row, each with its floor.
///
/// # Errors
/// When a server or a worker process fails.
pub async fn run(plan: &RowsPlan) -> anyhow::Result<Vec<ResultRow>> {
    let args = ["--consistency", "asp"];
    let mut servers = Vec::new();
    for _ in 0..plan.servers {
        servers.push(ServerProcess::start(&args).await);
    }
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let pids: Vec<u32> = servers.iter().filter_map(ServerProcess::pid).collect();
    let mut rows = Vec::new();
    // Pushes first: the pulls then read rows that exist, as every step of a
    // training run but its first does.
    for op in [Op::Push, Op::Pull] {
        let floor = {
            let plan = plan.clone();
            tokio::task::spawn_blocking(move || measure_floor(&plan, op)).await??
        };
        let before: Vec<f64> = pids.iter().map(|&pid| proc_cpu_seconds(pid)).collect();
        let wall = Instant::now();
        let reports = spawn_workers(plan, &addrs, op)?;
        let wall = wall.elapsed().as_secs_f64();
        let cores: Vec<f64> = pids
            .iter()
            .zip(&before)
            .map(|(&pid, before)| (proc_cpu_seconds(pid) - before) / wall)
            .collect();
        let rss: Vec<u64> = pids.iter().map(|&pid| peak_rss_bytes(pid)).collect();
        rows.push(row(plan, op, &reports, (&cores, &rss), &floor));
    }
    for server in servers {
        server.stop().await;
    }
    Ok(rows)
}

fn row(
    plan: &RowsPlan,
    op: Op,
    reports: &[RowsReport],
    (cores, rss): (&[f64], &[u64]),
    floor: &FloorFigures,
) -> ResultRow {
    let rows: u64 = reports.iter().map(|r| r.rows).sum();
    let batches: u64 = reports.iter().map(|r| r.batches).sum();
    let seconds = reports
        .iter()
        .map(|r| r.seconds)
        .fold(0.0, f64::max)
        .max(1e-9);
    let rows_per_sec = rows as f64 / seconds;
    let row_bytes = (plan.width * 4) as f64;
    // Server cores over the whole phase (latency and throughput), against the
    // rows of both.
    let wall: f64 = reports.iter().map(|r| r.wall_seconds).fold(0.0, f64::max);
    let all_rows: u64 = reports.iter().map(|r| r.rows + r.latency_rows).sum();
    let server_us_per_row = cores.iter().sum::<f64>() * wall / all_rows.max(1) as f64 * 1e6;
    let mut p50: Vec<f64> = reports.iter().map(|r| r.p50_us).collect();
    let mut p99: Vec<f64> = reports.iter().map(|r| r.p99_us).collect();
    let figures = serde_json::json!({
        "rows_per_sec": rows_per_sec,
        "rows_per_batch": rows as f64 / batches.max(1) as f64,
        "server_cores": cores,
        "server_peak_rss_bytes": rss,
        "server_cpu_us_per_row": server_us_per_row,
        "worker_cores": reports.iter().map(|r| r.cpu_seconds / r.wall_seconds.max(1e-9)).collect::<Vec<_>>(),
        "floor_rows_per_sec": floor.rows_per_sec,
        "floor_p50_us": floor.p50_us,
        "ratio_vs_floor": rows_per_sec / floor.rows_per_sec.max(1e-9),
    });
    ResultRow {
        bench: "rows".into(),
        mode: Some(op.to_string()),
        encoding: "f32 adagrad".into(),
        payload: format!(
            "B={} D={} zipf {} over {} rows, {}x{} W={} {}",
            plan.batch,
            plan.width,
            plan.zipf,
            plan.rows,
            plan.servers,
            plan.workers,
            plan.window,
            plan.data_path
        ),
        size_bytes: (plan.width * 4) as u64,
        messages: batches,
        throughput_bytes_per_sec: Some(rows_per_sec * row_bytes),
        tcp_throughput_bytes_per_sec: Some(floor.rows_per_sec * row_bytes),
        ratio_vs_tcp: Some(rows_per_sec / floor.rows_per_sec.max(1e-9)),
        rpcs_per_sec: Some(batches as f64 / seconds),
        p50_us: crate::report::median(&mut p50),
        p99_us: crate::report::median(&mut p99),
        tcp_p50_us: Some(floor.p50_us),
        reps: 1,
        servers: Some(figures),
        ..ResultRow::default()
    }
}

/// Starts the worker processes of one phase and reads each one's report.
fn spawn_workers(plan: &RowsPlan, addrs: &[String], op: Op) -> anyhow::Result<Vec<RowsReport>> {
    let exe = std::env::current_exe().context("the benchmark's own path")?;
    // Each phase's workers are indices of their own (their ranks and ids' seeds).
    let phase = match op {
        Op::Push => 0,
        Op::Pull => plan.workers,
    };
    let children = (0..plan.workers)
        .map(|index| {
            Command::new(&exe)
                .args(["rows-worker", "--servers", &addrs.join(",")])
                .args(["--op", &op.to_string()])
                .args(["--batch", &plan.batch.to_string()])
                .args(["--width", &plan.width.to_string()])
                .args(["--rows", &plan.rows.to_string()])
                .args(["--zipf", &plan.zipf.to_string()])
                .args(["--window", &plan.window.to_string()])
                .args(["--seconds", &plan.seconds.to_string()])
                .args(["--data-path", &plan.data_path.to_string()])
                .args(["--index", &(phase + index).to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting a rows-worker process")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    worker_reports(children, "rows-worker")
}

/// The rows as a table: rows per second and latency beside the floor's, and
/// what each row cost the servers.
pub fn table_of(rows: &[ResultRow]) -> String {
    let mut out = format!(
        "{:<5} {:<48} {:>12} {:>9} {:>9} {:>9} {:>12} {:>7} {:>10} {:>10}\n",
        "op",
        "workload",
        "rows/s",
        "MB/s",
        "p50 us",
        "p99 us",
        "floor rows/s",
        "ratio",
        "srv us/row",
        "srv RSS"
    );
    for row in rows {
        let figures = row.servers.clone().unwrap_or_default();
        let number = |key: &str| figures[key].as_f64().unwrap_or(0.0);
        let rss: u64 = figures["server_peak_rss_bytes"].as_array().map_or(0, |a| {
            a.iter()
                .filter_map(serde_json::Value::as_u64)
                .max()
                .unwrap_or(0)
        });
        out.push_str(&format!(
            "{:<5} {:<48} {:>12.0} {:>9.1} {:>9.0} {:>9.0} {:>12.0} {:>7.2} {:>10.2} {:>10}\n",
            row.mode.as_deref().unwrap_or(""),
            row.payload,
            number("rows_per_sec"),
            row.throughput_bytes_per_sec.unwrap_or(0.0) / 1e6,
            row.p50_us.unwrap_or(0.0),
            row.p99_us.unwrap_or(0.0),
            number("floor_rows_per_sec"),
            number("ratio_vs_floor"),
            number("server_cpu_us_per_row"),
            ps_common::size::format_size(rss as usize),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_batches_are_deduplicated_in_range_and_skewed() {
        let batches = zipf_batches(4096, 10_000_000, 1.05, 4, 1);
        for ids in &batches {
            assert!(ids.len() < 4096, "a Zipf batch of 4096 repeats ids");
            assert!(ids.len() > 1000, "but not most of them: {}", ids.len());
            assert!(ids.iter().all(|id| *id < 10_000_000));
            let unique: std::collections::HashSet<_> = ids.iter().collect();
            assert_eq!(unique.len(), ids.len());
        }
        assert!(
            batches.iter().all(|ids| ids.contains(&0)),
            "id 0 is the most frequent"
        );
    }
}
