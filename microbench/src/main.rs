//! `ps-microbench`: latency, bandwidth and parameter-server throughput of the RPC
//! layer, each printed with raw TCP measured in the same run.
//!
//! ```text
//! ps-microbench latency --sizes 64B,4KiB
//! ps-microbench bandwidth --sizes 1MiB,16MiB --json
//! ps-microbench bandwidth --scheme skew --encoding bytes,floats --out results/
//! ps-microbench ps-throughput --servers 2 --workers 2 --model resnet50
//! ps-microbench kv --servers 2 --workers 2 --sizes 4KiB,1MiB,16MiB --window 8
//! ps-microbench apply --size 64MiB
//! ps-microbench tcp-check --sizes 64B,1MiB,16MiB
//! ps-microbench serve --listen 0.0.0.0:7080 --tcp-listen 0.0.0.0:7081
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use ps_common::security_args::SecurityArgs;
use ps_common::size::parse_size;
use ps_microbench::apply::{self, ApplyPlan};
use ps_microbench::bandwidth::{self, BandwidthPlan, Mode};
use ps_microbench::kv::{self, KvPlan, Op};
use ps_microbench::latency::{self, LatencyPlan};
use ps_microbench::payload::{CategorySizes, Encoding, Scheme};
use ps_microbench::peer::{Peer, READY_PREFIX};
use ps_microbench::report::{ResultRow, payload_label, print_json, print_table, write_csv};
use ps_microbench::rows_cli::{RowsArgs, RowsWorkerArgs, run_rows, run_rows_worker};
use ps_microbench::stdout;
use ps_microbench::throughput::{self, ModelTensors, ThroughputPlan};
use ps_microbench::tuning::Tuning;
use ps_microbench::{plot, progress, server, tcp_check};
use ps_proto::auth::Role;

/// jemalloc keeps freed buffers for reuse: with the system allocator each
/// message-sized buffer went back to the kernel and came again page by page,
/// which cost 1 MiB pushes a third of their throughput (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// gRPC tensor-transport benchmarks, side by side with raw TCP.
#[derive(Debug, Parser)]
#[command(name = "ps-microbench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Runtime threads of this process (default: half the cores, at least one).
    /// Given as PS_RUNTIME_THREADS, it sizes the ps-servers and worker processes
    /// that a run starts as well.
    #[arg(long, global = true, env = "PS_RUNTIME_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    runtime_threads: Option<u16>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the Bench service and the TCP baseline (what the benchmarks measure).
    Serve(ServeArgs),
    /// Round-trip latency percentiles.
    Latency(LatencyArgs),
    /// One-way throughput, unary and streamed.
    Bandwidth(BandwidthArgs),
    /// M ps-server processes x N workers pushing and pulling a model's tensors.
    PsThroughput(ThroughputArgs),
    /// One key per size pushed and pulled by worker processes against M ps-servers.
    Kv(KvArgs),
    /// One worker process of `kv` (started by it; prints one JSON report).
    #[command(hide = true)]
    KvWorker(KvWorkerArgs),
    /// Embedding rows by id (Zipf ids, deduplicated) pulled and pushed by
    /// worker processes against M ps-servers, beside a hash-map floor.
    Rows(RowsArgs),
    /// One worker process of `rows` (started by it; prints one JSON report).
    #[command(hide = true)]
    RowsWorker(RowsWorkerArgs),
    /// The server's optimizer apply over one key, against a memcpy of it.
    Apply(ApplyArgs),
    /// The TCP baseline against the plainest send-and-ack loop, in the same run.
    TcpCheck(TcpCheckArgs),
    /// Exit 0 when the benchmark server at --server serves (a container health check).
    Health {
        /// The benchmark server's gRPC address.
        #[arg(long, default_value = "127.0.0.1:7080")]
        server: String,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// gRPC address.
    #[arg(long, default_value = "0.0.0.0:7080")]
    listen: String,
    /// Raw TCP baseline address.
    #[arg(long, default_value = "0.0.0.0:7081")]
    tcp_listen: String,
    #[command(flatten)]
    tuning: Tuning,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Debug, Args)]
struct PayloadArgs {
    /// Single-buffer payload sizes, comma-separated (for example 64B,4KiB,1MiB,16MiB).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// Multi-buffer payload scheme: uniform[:small|:medium|:large], random or skew.
    #[arg(long)]
    scheme: Option<Scheme>,
    /// Buffers per scheme payload.
    #[arg(long, default_value_t = 10)]
    buffers: usize,
    /// Size of small buffers.
    #[arg(long, value_parser = parse_size, default_value = "10B")]
    small: usize,
    /// Size of medium buffers.
    #[arg(long, value_parser = parse_size, default_value = "10KiB")]
    medium: usize,
    /// Size of large buffers.
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    large: usize,
    /// Encodings, comma-separated: bytes (zero-copy) and/or floats (packed repeated float).
    #[arg(
        long,
        value_delimiter = ',',
        hide_possible_values = true,
        default_value = "bytes"
    )]
    encoding: Vec<Encoding>,
    /// Seed of the random scheme.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl PayloadArgs {
    /// `(label, buffer sizes)` of every payload to measure.
    fn payloads(&self, default_sizes: &[usize]) -> Vec<(String, Vec<usize>)> {
        let mut payloads = Vec::new();
        let sizes = match (&self.sizes, self.scheme) {
            (Some(sizes), _) => sizes.clone(),
            (None, None) => default_sizes.to_vec(),
            (None, Some(_)) => Vec::new(),
        };
        payloads.extend(
            sizes
                .into_iter()
                .map(|s| (payload_label(None, &[s]), vec![s])),
        );
        if let Some(scheme) = self.scheme {
            let categories = CategorySizes {
                small: self.small,
                medium: self.medium,
                large: self.large,
            };
            let buffers = scheme.buffer_sizes(self.buffers, categories, self.seed);
            payloads.push((payload_label(Some(scheme.to_string()), &buffers), buffers));
        }
        payloads
    }
}

#[derive(Debug, Args)]
struct OutputArgs {
    /// Measure the server at this address instead of starting a local one.
    #[arg(long)]
    target: Option<String>,
    /// Print one JSON object per result line instead of a table.
    #[arg(long)]
    json: bool,
    /// Run the local server over TLS, with a CA and certificate made for the run
    /// (compare with a run without it; the TCP baseline stays plain).
    #[arg(long)]
    tls: bool,
    /// Write the results (latency.csv or bandwidth.csv) and SVG charts into this
    /// directory.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct LatencyArgs {
    #[command(flatten)]
    payload: PayloadArgs,
    /// Round trips per repetition.
    #[arg(long, default_value_t = 2000)]
    count: u64,
    /// Unmeasured round trips before each repetition.
    #[arg(long, default_value_t = 200)]
    warmup: u64,
    /// Repetitions.
    #[arg(long, default_value_t = 3)]
    reps: u32,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    tuning: Tuning,
}

#[derive(Debug, Args)]
struct BandwidthArgs {
    #[command(flatten)]
    payload: PayloadArgs,
    /// Modes, comma-separated: unary and/or stream.
    #[arg(
        long,
        value_delimiter = ',',
        hide_possible_values = true,
        default_value = "unary,stream"
    )]
    mode: Vec<Mode>,
    /// Measured seconds per repetition.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Unmeasured seconds before each repetition.
    #[arg(long, default_value_t = 0.25)]
    warmup_seconds: f64,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: u32,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    tuning: Tuning,
}

#[derive(Debug, Args)]
struct KvArgs {
    /// ps-server processes (each key is split evenly over them).
    #[arg(long, default_value_t = 1)]
    servers: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Key sizes, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4KiB,1MiB,16MiB")]
    sizes: Vec<usize>,
    /// Operations in flight per worker in the throughput phase.
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Seconds each phase (latency, throughput) runs per size and operation.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Print one JSON object per result line instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the results (kv.csv) into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run the servers and workers over TLS, with a CA and certificate made for
    /// the run (compare with a run without it).
    #[arg(long)]
    tls: bool,
    /// Also run raw TCP whose receiver applies every message with the server's
    /// SGD before acknowledging it: the floor for any parameter server that
    /// applies each push on these cores, read against each push row.
    #[arg(long)]
    sgd_floor: bool,
    /// Make every operation a unary call instead of a message on one session
    /// stream per worker and server (compare with a run without it).
    #[arg(long)]
    unary: bool,
    /// The data paths the workers take, comma-separated, each measured at
    /// every size: grpc, shm (shared memory with the servers, which run on
    /// this host), auto, uds (gRPC over each server's Unix-domain socket).
    /// With shm, one core's memcpy and copy-then-SGD run too, the floors of a
    /// pull and a push.
    #[arg(long, value_delimiter = ',', default_value = "grpc")]
    data_path: Vec<ps_microbench::kv_path::KvPath>,
}

#[derive(Debug, Args)]
struct ApplyArgs {
    /// Bytes of the key.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    size: usize,
    /// Timed repetitions of each pass (the median is reported).
    #[arg(long, default_value_t = 9)]
    reps: usize,
    /// Print one JSON object per pass instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct KvWorkerArgs {
    /// The ps-server addresses, comma-separated.
    #[arg(long, value_delimiter = ',')]
    servers: Vec<String>,
    /// Processes (the servers' pids, comma-separated) whose CPU in the
    /// throughput phase the report carries.
    #[arg(long, value_delimiter = ',')]
    watch_pids: Vec<u32>,
    /// The key's size.
    #[arg(long, value_parser = parse_size)]
    size: usize,
    /// What to do.
    #[arg(long)]
    op: Op,
    /// Operations in flight in the throughput phase.
    #[arg(long)]
    window: usize,
    /// Seconds each phase runs.
    #[arg(long)]
    seconds: f64,
    /// This worker's index.
    #[arg(long)]
    index: u32,
    /// Every operation a unary call.
    #[arg(long)]
    unary: bool,
    /// Shared memory or gRPC.
    #[arg(long, default_value = "grpc")]
    data_path: ps_shm::DataPathMode,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Debug, Args)]
struct ThroughputArgs {
    /// ps-server processes.
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// Simulated workers.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Tensors to move: resnet50, bert-base, or sizes:1MiB,4MiB.
    #[arg(long, default_value = "resnet50")]
    model: ModelTensors,
    /// Measured steps.
    #[arg(long, default_value_t = 5)]
    steps: u64,
    /// Unmeasured steps first.
    #[arg(long, default_value_t = 1)]
    warmup_steps: u64,
    /// Servers' Prometheus metrics, scraped every second: off, on, or compare
    /// (each repetition runs off then on, and the cost is the ratio of the
    /// medians).
    #[arg(long, value_enum, default_value_t = MetricsMode::Off)]
    metrics: MetricsMode,
    /// Repetitions (of each setting, with --metrics compare).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// Print one JSON object per result line instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the results (ps-throughput.csv) into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    tuning: Tuning,
}

/// Whether `ps-throughput`'s servers serve metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MetricsMode {
    // Variants without doc comments: `-h` and `--help` print the same (tests/tests/cli_style.rs).
    Off,
    On,
    Compare,
}

#[derive(Debug, Args)]
struct TcpCheckArgs {
    /// Message sizes, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "64B,1MiB,16MiB")]
    sizes: Vec<usize>,
    /// Measured seconds per loop and repetition.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Unmeasured seconds before each loop.
    #[arg(long, default_value_t = 0.25)]
    warmup_seconds: f64,
    /// Repetitions (the medians are reported).
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// Print one JSON object per size instead of a table.
    #[arg(long)]
    json: bool,
}

fn seconds(value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| anyhow::anyhow!("{value} is not a number of seconds"))
}

fn emit(rows: &[ResultRow], json: bool, out: Option<&PathBuf>) -> anyhow::Result<()> {
    if json {
        print_json(rows)?;
    } else {
        print_table(rows)?;
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_csv(
            rows,
            &dir.join(format!(
                "{}.csv",
                rows.first().map_or("results", |r| r.bench.as_str())
            )),
        )?;
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut transport = args.tuning.transport()?;
    args.security.apply(Role::Worker, &mut transport)?;
    let grpc = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let tcp = tokio::net::TcpListener::bind(&args.tcp_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.tcp_listen))?;
    println!(
        "{READY_PREFIX} grpc={} tcp={}",
        grpc.local_addr()?,
        tcp.local_addr()?
    );
    std::io::stdout().flush()?;
    server::serve(grpc, tcp, transport, ps_common::process::shutdown_signal()).await
}

async fn run_latency(args: LatencyArgs) -> anyhow::Result<()> {
    let peer = Peer::open(args.output.target.as_deref(), &args.tuning, args.output.tls).await?;
    let plan = LatencyPlan {
        count: args.count,
        warmup: args.warmup,
        reps: args.reps,
    };
    let mut results = Vec::new();
    for (label, sizes) in args.payload.payloads(&[64]) {
        for &encoding in &args.payload.encoding {
            results.push(latency::measure(&peer, &label, &sizes, encoding, plan).await?);
        }
    }
    peer.close().await;
    let rows: Vec<ResultRow> = results.iter().map(|r| r.row.clone()).collect();
    emit(&rows, args.output.json, args.output.out.as_ref())?;
    if let Some(dir) = &args.output.out {
        let curves: Vec<_> = results
            .into_iter()
            .map(|r| {
                (
                    format!("{} {}", r.row.payload, r.row.encoding),
                    r.grpc,
                    r.tcp,
                )
            })
            .collect();
        plot::latency_cdf(&curves, &dir.join("latency_cdf.svg"))?;
    }
    Ok(())
}

async fn run_bandwidth(args: BandwidthArgs) -> anyhow::Result<()> {
    let peer = Peer::open(args.output.target.as_deref(), &args.tuning, args.output.tls).await?;
    let plan = BandwidthPlan {
        duration: seconds(args.seconds)?,
        warmup: seconds(args.warmup_seconds)?,
        reps: args.reps,
        chunk: args.tuning.chunk,
    };
    let payloads = args.payload.payloads(&[1 << 20, 16 << 20]);
    let runs = args.mode.len() * args.payload.encoding.len() * payloads.len();
    let each = (plan.duration + plan.warmup) * 2 * plan.reps as u32;
    let bar = progress::bar(runs as u64, "bandwidth", each * runs as u32);
    let mut rows = Vec::new();
    for &mode in &args.mode {
        for &encoding in &args.payload.encoding {
            for (label, sizes) in &payloads {
                let what = format!("{mode} {encoding} {label}");
                bar.set_message(what.clone());
                tracing::info!(measuring = %what, done = rows.len(), of = runs, "bandwidth");
                rows.push(bandwidth::measure(&peer, label, sizes, encoding, mode, plan).await?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    peer.close().await;
    emit(&rows, args.output.json, args.output.out.as_ref())?;
    if let Some(dir) = &args.output.out {
        plot::bandwidth_chart(&rows, &dir.join("bandwidth.svg"))?;
    }
    Ok(())
}

async fn run_throughput(args: ThroughputArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.servers >= 1 && args.workers >= 1 && args.steps >= 1,
        "--servers, --workers and --steps must be at least 1"
    );
    let settings: &[bool] = match args.metrics {
        MetricsMode::Off => &[false],
        MetricsMode::On => &[true],
        MetricsMode::Compare => &[false, true],
    };
    let mut rows = Vec::new();
    for _ in 0..args.reps {
        for &metrics in settings {
            let plan = ThroughputPlan {
                servers: args.servers,
                workers: args.workers,
                model: args.model.clone(),
                steps: args.steps,
                warmup_steps: args.warmup_steps,
                metrics,
            };
            rows.push(throughput::run(&plan, &args.tuning).await?);
        }
    }
    if !args.json {
        print_server_loads(&rows);
    }
    if args.metrics == MetricsMode::Compare {
        eprintln!("{}", metrics_cost(&rows));
    }
    emit(&rows, args.json, args.out.as_ref())
}

/// Each server's load in the last row.
fn print_server_loads(rows: &[ResultRow]) {
    let servers = rows.last().and_then(|r| r.servers.as_ref()?.as_array());
    for server in servers.into_iter().flatten() {
        eprintln!(
            "server {}: {} keys, {} bytes held, {} pushes, {} pulls",
            server["addr"], server["keys"], server["bytes_held"], server["pushes"], server["pulls"]
        );
    }
}

/// The median throughput with metrics on against off, as a sentence.
fn metrics_cost(rows: &[ResultRow]) -> String {
    let median = |on: bool| {
        let mut rates: Vec<f64> = rows
            .iter()
            .filter(|r| r.mode.as_deref().is_some_and(|m| m.contains("metrics on")) == on)
            .filter_map(|r| r.throughput_bytes_per_sec)
            .collect();
        rates.sort_by(f64::total_cmp);
        rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (off, on) = (median(false), median(true));
    format!(
        "metrics cost: {:+.1}% of throughput (median off {:.3} GB/s, on {:.3} GB/s, {} runs each)",
        (1.0 - on / off) * 100.0,
        off / 1e9,
        on / 1e9,
        rows.len() / 2
    )
}

async fn run_kv(args: KvArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.servers >= 1
            && args.workers >= 1
            && args.window >= 1
            && args.seconds > 0.0
            && !args.data_path.is_empty(),
        "--servers, --workers and --window must be at least 1, --seconds above 0, and --data-path name at least one"
    );
    let plan = KvPlan {
        servers: args.servers,
        workers: args.workers,
        sizes: args.sizes,
        window: args.window,
        seconds: args.seconds,
        tls: args.tls,
        sgd_floor: args.sgd_floor,
        unary: args.unary,
        data_paths: args.data_path,
    };
    let rows = kv::run(&plan).await?;
    if args.json {
        return emit(&rows, true, args.out.as_ref());
    }
    stdout::text(kv::table(&rows))?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_csv(&rows, &dir.join("kv.csv"))?;
    }
    Ok(())
}

async fn run_kv_worker(args: KvWorkerArgs) -> anyhow::Result<()> {
    let report = kv::run_worker(
        &args.servers,
        (args.size, args.op),
        (args.window, args.seconds),
        args.index,
        kv::Reach {
            tls: args.security.tls()?,
            session: !args.unary,
            data_path: args.data_path,
        },
        &args.watch_pids,
    )
    .await?;
    stdout::line(serde_json::to_string(&report)?)?;
    Ok(())
}

async fn run_apply(args: ApplyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.size >= 4 && args.reps >= 1,
        "--size must be at least 4B (one f32) and --reps at least 1"
    );
    let plan = ApplyPlan {
        size: args.size,
        reps: args.reps,
    };
    let rows = tokio::task::spawn_blocking(move || apply::run(&plan)).await?;
    if args.json {
        for row in &rows {
            stdout::line(serde_json::to_string(row)?)?;
        }
    } else {
        stdout::text(apply::table(&rows))?;
    }
    Ok(())
}

async fn run_tcp_check(args: TcpCheckArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    let plan = tcp_check::CheckPlan {
        duration: seconds(args.seconds)?,
        warmup: seconds(args.warmup_seconds)?,
        reps: args.reps,
    };
    let each = (plan.duration + plan.warmup) * 2 * plan.reps;
    let bar = progress::bar(
        args.sizes.len() as u64,
        "tcp-check",
        each * args.sizes.len() as u32,
    );
    let mut rows = Vec::new();
    for &size in &args.sizes {
        bar.set_message(ps_common::size::format_size(size));
        rows.push(tokio::task::spawn_blocking(move || tcp_check::measure(size, plan)).await??);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if args.json {
        for row in &rows {
            stdout::line(serde_json::to_string(row)?)?;
        }
    } else {
        stdout::text(tcp_check::table(&rows, 0.1))?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let ran = ps_common::runtime::block_on(cli.runtime_threads.map(usize::from), run(cli))
        .context("ps-microbench: cannot start the tokio runtime")?;
    match ran {
        // The reader of the results took what it wanted (`| head`).
        Err(error) if stdout::closed_early(&error) => Ok(()),
        ran => ran,
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    ps_common::process::init_tracing();
    // The parameter-server loops run on the runtime's worker threads, beside
    // the connections they drive. Left on the main thread (where `#[tokio::main]`
    // polls this future), every answer would wake that thread from another,
    // a futex and a context switch per operation: 4 KiB operations ran at
    // 25,000/s that way instead of 35,000-45,000 (docs/benchmarks.md).
    match cli.command {
        Command::Serve(args) => serve(args).await,
        // These two still run on the main thread: their payload loops borrow
        // across awaits in a way `tokio::spawn` cannot take yet.
        Command::Latency(args) => run_latency(args).await,
        Command::Bandwidth(args) => run_bandwidth(args).await,
        Command::PsThroughput(args) => tokio::spawn(run_throughput(args)).await?,
        Command::Kv(args) => run_kv(args).await,
        Command::KvWorker(args) => tokio::spawn(run_kv_worker(args)).await?,
        Command::Rows(args) => run_rows(args).await,
        Command::RowsWorker(args) => tokio::spawn(run_rows_worker(args)).await?,
        Command::Apply(args) => run_apply(args).await,
        Command::TcpCheck(args) => run_tcp_check(args).await,
        Command::Health { server } => {
            std::process::exit(ps_common::health::report(&server, &Default::default()).await)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_on_off_flag_takes_one_from_its_variable() {
        let command = <Cli as clap::CommandFactory>::command();
        let refusing = ps_common::flag::env_flags_refusing_one(&command);
        assert!(refusing.is_empty(), "{refusing:?}");
    }
}
