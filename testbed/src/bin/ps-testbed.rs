//! `ps-testbed`: run a candle-ps job in an emulated cluster whose links are
//! shaped to a rate (needs root, `ip` and `tc`).
//!
//! ```text
//! sudo ps-testbed run --hosts server=2,worker=2 --link 1gbit -- --epochs 2
//! sudo ps-testbed run --link 1gbit -- --dataset synthetic --synthetic-features 1024 \
//!     --hidden 2048,2048 --batch-size 32 --optimizer sgd --epochs 1
//! sudo ps-testbed plan-check  # the cost model of `ps-scheduler plan` against runs
//! sudo ps-testbed calibrate --link 1gbit -- --model mlp:1024,2048,2048,4 --out plan.json
//! sudo ps-testbed clean      # namespaces left by a run that was killed
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ps_common::size::parse_size;
use ps_proto::placement::check_partition_bytes;
use ps_scheduler::plan::Placement;
use ps_testbed::hosts::{HostCounts, LinkOverride, plan};
use ps_testbed::job::{self, JobSpec};
use ps_testbed::netns::{self, Network};
use ps_testbed::rate::LinkRate;
use ps_testbed::report::Report;
use ps_testbed::{calibrate, ceiling, plan_chart, plan_check, planned};

#[derive(Parser)]
#[command(
    version,
    about = "Run a candle-ps job in a cluster emulated with network namespaces and shaped links."
)]
struct Cli {
    #[command(subcommand)]
    command: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Build the cluster, run the job, report, and remove everything.
    Run(RunArgs),
    /// Run a grid of setups and compare each one's step time with what
    /// `ps-scheduler plan`'s cost model predicts (docs/plan.md).
    PlanCheck(PlanCheckArgs),
    /// Run `ps-scheduler plan --measure-link` from a worker host against a
    /// server host across links of --link: the plan's link constants as the
    /// emulated cluster gives them.
    Calibrate(CalibrateArgs),
    /// Remove namespaces that runs under --prefix left when they were killed.
    Clean {
        /// The namespace prefix of the runs to clean up after.
        #[arg(long, default_value = "psbed")]
        prefix: String,
    },
    /// One end of the TCP ceiling: acknowledge each message on one connection.
    #[command(hide = true)]
    TcpSink {
        /// Address to listen on.
        #[arg(long)]
        listen: String,
    },
    /// The other end: send for a while, print the acknowledged bytes per second.
    #[command(hide = true)]
    TcpSource {
        /// Address of the sink.
        #[arg(long)]
        connect: String,
        /// Seconds to send for.
        #[arg(long)]
        seconds: f64,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Hosts per role; the scheduler always has one of its own.
    #[arg(long, default_value = "scheduler=1,server=2,worker=2")]
    hosts: HostCounts,
    /// Run the servers beside the workers instead of on hosts of their own:
    /// server=N puts one on each of the first N worker hosts (at most one
    /// per worker host), where its worker reaches it without the link.
    #[arg(long, conflicts_with = "plan")]
    colocate: bool,
    /// Every link's rate, each direction (kbit, mbit, gbit).
    #[arg(long, default_value = "1gbit")]
    link: LinkRate,
    /// A different rate for a role's links or one host's (server=2.5gbit,
    /// worker1=500mbit); may be repeated.
    #[arg(long = "link-for")]
    link_for: Vec<LinkOverride>,
    /// Namespace names start with this (PREFIX-PID-HOST): runs with different
    /// prefixes never meet.
    #[arg(long, default_value = "psbed")]
    prefix: String,
    /// Folder for each process's log and report.json (default: a new folder
    /// under the system's temporary folder).
    #[arg(long)]
    out: Option<PathBuf>,
    /// How long the workers may run, for example 10m.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// An argument for every ps-server (may be repeated).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// An argument for the ps-scheduler (may be repeated), for example
    /// --scheduler-arg=--partition-bytes=4MiB.
    #[arg(long = "scheduler-arg", allow_hyphen_values = true)]
    scheduler_args: Vec<String>,
    /// Before the job, measure raw TCP between the first host with a server
    /// and the first other worker host for this many seconds, both
    /// directions at once: the ceiling the job's traffic is read against (0:
    /// skip it).
    #[arg(long, default_value_t = 0.0)]
    ceiling: f64,
    /// Print the report as one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Run the setup this plan file (`ps-scheduler plan --out`) chose: its
    /// servers and where they run (instead of --hosts' servers and
    /// --colocate), and its pipelining, backward segments, wire dtype,
    /// partition size and consistency.
    #[arg(long)]
    plan: Option<PathBuf>,
    /// Arguments for every ps-worker, after `--` (default: digits, as ps-local trains).
    #[arg(last = true)]
    worker_args: Vec<String>,
}

#[derive(clap::Args)]
struct PlanCheckArgs {
    /// Link rates of the grid, every host's.
    #[arg(long, value_delimiter = ',', default_value = "500mbit,1gbit,2500mbit")]
    links: Vec<LinkRate>,
    /// Server counts of the grid.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    servers: Vec<usize>,
    /// Where the grid's servers run: dedicated (hosts of their own),
    /// colocated (beside the workers, for server counts up to the workers'),
    /// or both: dedicated,colocated.
    #[arg(long, value_delimiter = ',', default_value = "dedicated", value_parser = placement)]
    placements: Vec<Placement>,
    /// The grid's largest parts (64KiB to 4MiB), as the scheduler's
    /// --partition-bytes.
    #[arg(long, value_delimiter = ',', default_value = "1MiB",
          value_parser = |t: &str| parse_size(t).and_then(check_partition_bytes).map(|b| b as u64))]
    partitions: Vec<u64>,
    /// The grid's wire dtypes: f32, bf16, or both.
    #[arg(long, value_delimiter = ',', default_value = "f32", value_parser = wire_bytes)]
    wires: Vec<u32>,
    /// Run the setups pipelined, push then pull, or both: on,off.
    #[arg(long, value_delimiter = ',', default_value = "off,on", value_parser = on_off)]
    pipelining: Vec<bool>,
    /// Requests per server of the setups run push then pull (1 to 64; a
    /// pipelined step cuts by group bytes and runs with the client's 4).
    #[arg(long, value_delimiter = ',', default_value = "4",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    requests: Vec<u32>,
    /// Worker hosts.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Only the models whose label is given (comm-bound, compute-bound).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Namespace prefix.
    #[arg(long, default_value = "psplan")]
    prefix: String,
    /// Folder for the runs' logs and the results (plan-check.json,
    /// plan-check.md, and the chart of predicted against measured,
    /// plan-check.svg).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run nothing: print the tables of an earlier run's plan-check.json,
    /// predicted again with this build's cost model and choice rule.
    #[arg(long)]
    table: Option<PathBuf>,
    /// Predict with these constants (a plan file's, as `ps-scheduler plan
    /// --measure-link ADDR --measure-compute --out FILE` writes them)
    /// instead of the built-in ones.
    #[arg(long)]
    constants: Option<PathBuf>,
    /// With --table: also draw the predicted against measured chart into this
    /// SVG file.
    #[arg(long, requires = "table")]
    chart: Option<PathBuf>,
}

#[derive(clap::Args)]
struct CalibrateArgs {
    /// Both hosts' link rate, each way.
    #[arg(long, default_value = "1gbit")]
    link: LinkRate,
    /// Namespace prefix.
    #[arg(long, default_value = "pscal")]
    prefix: String,
    /// Folder for the serving side's log.
    #[arg(long)]
    out: Option<PathBuf>,
    /// `ps-scheduler plan`'s other arguments, after `--` (for example
    /// --model mlp:1024,2048,2048,4 --measure-compute --out plan.json).
    #[arg(last = true)]
    plan_args: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    ps_common::process::init_tracing();
    match Cli::parse().command {
        Action::Run(args) => run(args).await,
        Action::PlanCheck(args) => plan_check(args).await,
        Action::Calibrate(args) => calibrate(args).await,
        Action::Clean { prefix } => {
            netns::preflight()?;
            let removed = netns::sweep(&prefix)?;
            println!(
                "removed {} namespace(s): {}",
                removed.len(),
                removed.join(" ")
            );
            Ok(())
        }
        Action::TcpSink { listen } => Ok(ceiling::sink(&listen)?),
        Action::TcpSource { connect, seconds } => {
            println!("{}", ceiling::source(&connect, seconds)?);
            Ok(())
        }
    }
}

/// `--wires`' items, as bytes per value.
fn wire_bytes(text: &str) -> Result<u32, String> {
    match text.trim() {
        "f32" => Ok(4),
        "bf16" => Ok(2),
        other => Err(format!("{other:?}: give f32 or bf16")),
    }
}

/// `--pipelining`' items.
fn on_off(text: &str) -> Result<bool, String> {
    match text.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{other:?}: give on or off")),
    }
}

/// `--placements`' items.
fn placement(text: &str) -> Result<Placement, String> {
    match text.trim() {
        "dedicated" => Ok(Placement::Dedicated),
        "colocated" => Ok(Placement::Colocated),
        other => Err(format!("{other:?}: give dedicated or colocated")),
    }
}

async fn plan_check(args: PlanCheckArgs) -> anyhow::Result<()> {
    let constants = match &args.constants {
        Some(path) => ps_scheduler::plan::cli::read_constants(path)?,
        None => ps_scheduler::plan::Constants::default(),
    };
    if let Some(path) = &args.table {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut rows: Vec<plan_check::Row> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a plan-check.json", path.display()))?;
        plan_check::predict_again(&mut rows, args.workers, &constants)?;
        print!("{}", plan_check::table(&rows, args.workers));
        if let Some(chart) = &args.chart {
            plan_chart::chart(&rows, chart)?;
        }
        return Ok(());
    }
    netns::preflight()?;
    anyhow::ensure!(
        !args.links.is_empty() && !args.servers.is_empty() && args.workers > 0,
        "the grid needs at least one link rate, one server count and one worker"
    );
    anyhow::ensure!(
        !args.partitions.is_empty()
            && !args.wires.is_empty()
            && !args.pipelining.is_empty()
            && !args.requests.is_empty(),
        "the grid needs at least one partition size, wire dtype, pipelining choice and request count"
    );
    let bin_dir = binaries()?;
    let out = args.out.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ps-plan-check-{}", std::process::id()))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("making {}", out.display()))?;
    let models: Vec<_> = plan_check::default_models()
        .into_iter()
        .filter(|m| args.models.is_empty() || args.models.iter().any(|l| l == m.label))
        .collect();
    anyhow::ensure!(
        !models.is_empty(),
        "--models: the grid's models are comm-bound and compute-bound"
    );
    let grid = plan_check::Grid {
        models,
        links: args.links,
        servers: args.servers,
        placements: args.placements,
        partitions: args.partitions,
        wires: args.wires,
        pipelining: args.pipelining,
        requests: args.requests,
        workers: args.workers,
        bin_dir,
        out: out.clone(),
        prefix: args.prefix,
        constants,
    };
    let rows = tokio::select! {
        rows = plan_check::run(&grid) => rows?,
        () = ps_common::process::shutdown_signal() => {
            anyhow::bail!("interrupted: every process was killed and every namespace removed");
        }
    };
    let table = plan_check::table(&rows, grid.workers);
    std::fs::write(
        out.join("plan-check.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out.join("plan-check.md"), &table)?;
    plan_chart::chart(&rows, &out.join("plan-check.svg"))?;
    print!("{table}");
    println!(
        "\nlogs, plan-check.json, plan-check.md and plan-check.svg: {}",
        out.display()
    );
    Ok(())
}

async fn calibrate(args: CalibrateArgs) -> anyhow::Result<()> {
    netns::preflight()?;
    let swept = netns::sweep(&args.prefix)?;
    if !swept.is_empty() {
        tracing::info!(namespaces = ?swept, "removed what a killed run left");
    }
    let bin_dir = binaries()?;
    anyhow::ensure!(
        bin_dir.join("ps-microbench").is_file(),
        "ps-microbench is not next to ps-testbed in {}; build the workspace (cargo build --release)",
        bin_dir.display()
    );
    let out = args.out.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ps-calibrate-{}", std::process::id()))
    });
    std::fs::create_dir_all(&out).with_context(|| format!("making {}", out.display()))?;
    let spec = calibrate::CalibrationSpec {
        prefix: args.prefix,
        link: args.link,
        bin_dir,
        out,
        plan_args: args.plan_args,
    };
    let printed = tokio::select! {
        printed = calibrate::run(&spec) => printed?,
        () = ps_common::process::shutdown_signal() => {
            anyhow::bail!("interrupted: ps-microbench serve and ps-scheduler were stopped and both hosts removed");
        }
    };
    print!("{printed}");
    Ok(())
}

/// The folder of `ps-testbed`, checked to hold the binaries a job runs.
fn binaries() -> anyhow::Result<PathBuf> {
    let bin_dir = std::env::current_exe()?
        .parent()
        .context("the folder of ps-testbed")?
        .to_path_buf();
    for binary in ["ps-scheduler", "ps-server", "ps-worker"] {
        anyhow::ensure!(
            bin_dir.join(binary).is_file(),
            "{binary} is not next to ps-testbed in {}; build the workspace (cargo build --release)",
            bin_dir.display()
        );
    }
    Ok(bin_dir)
}

async fn run(mut args: RunArgs) -> anyhow::Result<()> {
    netns::preflight()?;
    let mut scheduler_args = args.scheduler_args.clone();
    if let Some(file) = &args.plan {
        let chosen = ps_scheduler::plan::cli::read_plan(file)?;
        let job = planned::job(&chosen, &args.worker_args, &args.scheduler_args)?;
        for difference in &job.differences {
            tracing::warn!("{difference}");
        }
        tracing::info!(servers = job.servers, worker_args = ?job.worker_args, scheduler_args = ?job.scheduler_args, "running the plan's setup");
        args.hosts.servers = job.servers;
        args.colocate = job.colocated;
        args.worker_args.extend(job.worker_args);
        scheduler_args.extend(job.scheduler_args);
    }
    args.hosts.colocated = args.colocate;
    let hosts = plan(args.hosts, args.link, &args.link_for).map_err(anyhow::Error::msg)?;
    let swept = netns::sweep(&args.prefix)?;
    if !swept.is_empty() {
        tracing::info!(namespaces = ?swept, "removed what a killed run left");
    }
    let bin_dir = binaries()?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("ps-testbed-{}", std::process::id())));
    std::fs::create_dir_all(&out).with_context(|| format!("making {}", out.display()))?;
    let spec = JobSpec {
        bin_dir,
        out: out.clone(),
        worker_args: args.worker_args.clone(),
        server_args: args.server_args.clone(),
        scheduler_args,
        timeout: args.timeout,
    };
    let network = Network::build(&args.prefix, &hosts)?;
    tracing::info!(hosts = hosts.len(), link = %args.link, out = %out.display(), "cluster up");
    let ceiling = if args.ceiling > 0.0 {
        let testbed = std::env::current_exe()?;
        Some(ceiling::measure(&network, &testbed, args.ceiling)?)
    } else {
        None
    };
    let outcome = tokio::select! {
        outcome = job::run(&network, &spec) => outcome?,
        () = ps_common::process::shutdown_signal() => {
            drop(network);
            anyhow::bail!("interrupted: every process was killed and every namespace removed");
        }
    };
    drop(network);
    let report = Report::of(&outcome, ceiling);
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(out.join("report.json"), &json)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.text());
        println!("\nlogs and report.json: {}", out.display());
    }
    Ok(())
}
