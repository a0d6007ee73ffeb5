//! `ps-worker`: trains a built-in model on a built-in data set with the parameter
//! servers, then evaluates it.
//!
//! ```text
//! ps-worker --server 127.0.0.1:7070            # rank from the server, digits, MLP
//! ps-worker --server a:7070,b:7070 --rank 1 --workers 2 --json
//! ```

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use ps_client::Expected;
use ps_client::{ClientConfig, PsClient};
use ps_common::flag::env_flag;
use ps_common::security_args::SecurityArgs;
use ps_common::size::parse_size;
use ps_proto::auth::Role;
use ps_proto::consistency::Consistency;
use ps_proto::ids::Rank;
use ps_proto::placement::check_partition_bytes;
use ps_worker::cli::{ModelChoice, TrainArgs};
use ps_worker::metrics::WorkerMetrics;
use ps_worker::train::{TrainSummary, train};
use ps_worker::trainer::client_token;

/// A candle worker of candle-ps: trains a model on its share of the data, with
/// the parameters held by parameter servers.
#[derive(Debug, Parser)]
#[command(name = "ps-worker", version)]
struct Cli {
    /// Parameter servers, comma-separated; parameters are spread over all of them.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "127.0.0.1:7070",
        env = "PS_SERVER"
    )]
    server: Vec<String>,
    /// A scheduler to take rank, placement and servers from (a lone --server that is a
    /// scheduler is recognised too).
    #[arg(long, env = "PS_SCHEDULER", conflicts_with = "rank")]
    scheduler: Option<String>,
    /// This worker's rank; by default the first server hands one out. The server
    /// refuses a rank outside its group.
    #[arg(long, env = "PS_RANK", requires = "workers")]
    rank: Option<u32>,
    /// Workers in the group. Checked against the server's (or scheduler's) group
    /// when this worker joins; by default, whatever the group has.
    #[arg(long, env = "PS_WORKERS", value_parser = clap::value_parser!(u32).range(1..))]
    workers: Option<u32>,
    /// Consistency model the job uses: bsp, asp or ssp:K. Checked against the
    /// servers' when this worker joins; by default, whatever they use.
    #[arg(long, env = "PS_CONSISTENCY")]
    consistency: Option<Consistency>,
    /// Write the run's per-epoch loss and test accuracy (epochs.csv), per-step
    /// timings (steps.csv) and their charts (training.svg, time_split.svg) into
    /// this folder; the test split is evaluated after every epoch.
    #[arg(long, env = "PS_OUT")]
    out: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics (GET /metrics) on this address while training:
    /// steps, examples, loss, each step's time split and repairs; off unless set.
    #[arg(long, env = "PS_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Seconds a pull may wait for the other workers before failing.
    #[arg(long, default_value_t = 60, env = "PS_PULL_TIMEOUT_SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pull_timeout_secs: u64,
    /// How long to wait for the servers (or the scheduler) to come up, for
    /// example 60s or 2m.
    #[arg(long, default_value = "60s", env = "PS_CONNECT_TIMEOUT", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// Print one JSON summary as the last line of stdout.
    #[arg(long, env = "PS_JSON", value_parser = env_flag())]
    json: bool,
    /// Make every push and pull its own unary call instead of a message on one
    /// long-lived session stream per server (for servers or proxies that only
    /// pass unary calls, and for comparing the two).
    #[arg(long, env = "PS_UNARY", value_parser = env_flag())]
    unary: bool,
    /// Push every key, then pull every key, instead of pulling each group of
    /// keys as soon as its push is answered while later groups are still
    /// being pushed (for comparing the two).
    #[arg(long, env = "PS_NO_PIPELINE", value_parser = env_flag())]
    no_pipeline: bool,
    /// Least bytes of one pipelined group of keys (default 1MiB). Smaller
    /// groups keep both directions of a slow link busy for more of the step,
    /// at one request each; a part is never split, so cut the shard map as
    /// finely (the scheduler's --partition-bytes).
    #[arg(long, env = "PS_PIPELINE_GROUP_BYTES", conflicts_with = "no_pipeline",
          value_parser = parse_group_bytes)]
    pipeline_group_bytes: Option<usize>,
    /// How pushes and pulls reach a server: auto (through shared memory when
    /// the server is on this host, gRPC otherwise), shm (shared memory, or
    /// fail naming why not), or grpc.
    #[arg(long, env = "PS_DATA_PATH", default_value = "auto")]
    data_path: ps_shm::DataPathMode,
    /// How many nice levels this worker lowers its priority by when it
    /// reaches a server through shared memory, which shares this host's
    /// cores: the servers' work, which every step waits for, then runs ahead
    /// of this worker's compute (docs/benchmarks.md). It weighs only against
    /// processes of the same scheduling group (session, systemd unit or
    /// container). 0 keeps the priority.
    #[arg(long, default_value_t = 5, env = "PS_YIELD_TO_SERVERS", value_parser = clap::value_parser!(u8).range(0..=19))]
    yield_to_servers: u8,
    /// The largest part a parameter is cut into across --server's servers
    /// (64KiB to 4MiB). With --scheduler, its --partition-bytes decides.
    #[arg(long, default_value = "1MiB", conflicts_with = "scheduler",
          value_parser = |t: &str| parse_size(t).and_then(check_partition_bytes))]
    partition_bytes: usize,
    /// Requests a push or pull keeps in flight to one server at once (its
    /// keys cut into this many groups of similar bytes), so the server
    /// applies one while the next arrives.
    #[arg(long, default_value_t = ps_client::DEFAULT_REQUESTS_PER_SERVER as u16, env = "PS_REQUESTS_PER_SERVER",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    requests_per_server: u16,
    /// Time one step's compute (forward, loss and backward of the MLP on a
    /// --batch-size batch of --dataset) on this host's --device, print it as one JSON
    /// line and exit, reaching no server: what `ps-scheduler plan
    /// --measure-compute` runs (on the CPU, or the device PS_DEVICE names).
    #[arg(long)]
    probe_compute: bool,
    #[command(flatten)]
    train: TrainArgs,
    #[command(flatten)]
    security: SecurityArgs,
}

impl Cli {
    /// Every check that needs no peer, made before anything starts.
    fn validate(&self) -> Result<(), String> {
        if let (Some(rank), Some(workers)) = (self.rank, self.workers)
            && rank >= workers
        {
            return Err(format!(
                "--rank {rank} is outside a group of --workers {workers} (ranks 0..{workers})"
            ));
        }
        if self.server.iter().any(|s| s.trim().is_empty()) {
            return Err("--server has an empty address".into());
        }
        self.train.validate()
    }
}

fn print_summary(summary: &TrainSummary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
    } else {
        println!(
            "worker {}/{}: test accuracy {:.4}, train loss {:.4}, {} steps in {:.1}s ({:.0} examples/s) on {}",
            summary.rank,
            summary.workers,
            summary.test_accuracy,
            summary.train_loss,
            summary.steps,
            summary.wall_seconds,
            summary.examples_per_second,
            summary.dataset
        );
        let parts: Vec<String> = summary
            .time_split
            .parts()
            .iter()
            .map(|(name, part)| format!("{name} {:.0}%", part.share * 100.0))
            .collect();
        println!("  time: {}", parts.join(", "));
    }
    Ok(())
}

/// `--probe-compute`: one step's compute, timed, as JSON on stdout.
fn probe_compute(train: &TrainArgs, data: &ps_worker::data::Dataset) -> anyhow::Result<()> {
    if train.model != ModelChoice::Mlp {
        anyhow::bail!("--probe-compute times the MLP (--model mlp); it cannot time --model ctr");
    }
    let device = ps_worker::device::parse_device(&train.device).map_err(anyhow::Error::msg)?;
    let seconds =
        ps_worker::compute_probe::step_seconds(data, &train.hidden, train.batch_size, &device)
            .context("timing a step")?;
    let probe = serde_json::json!({
        "step_seconds": seconds,
        "device": train.device,
        "features": data.width(),
        "hidden": train.hidden,
        "classes": data.classes,
        "batch_size": train.batch_size,
        // As pinned at start (`compute_threads`): null if it could not be.
        "rayon_num_threads": std::env::var(ps_worker::compute_threads::VARIABLE).ok(),
    });
    println!("{probe}");
    Ok(())
}

/// `--pipeline-group-bytes`: a size of at least one byte.
fn parse_group_bytes(text: &str) -> Result<usize, String> {
    match parse_size(text)? {
        0 => Err("a pipelined group needs at least one byte".into()),
        bytes => Ok(bytes),
    }
}

/// jemalloc keeps freed buffers for reuse: with the system allocator each
/// message-sized buffer went back to the kernel and came again page by page,
/// which cost 1 MiB pushes a third of their throughput (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    ps_worker::compute_threads::pin_compute_threads();
    run()
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Err(message) = cli.validate() {
        Cli::command()
            .error(clap::error::ErrorKind::ValueValidation, message)
            .exit();
    }
    ps_common::process::init_tracing();
    let data = cli.train.dataset().context("loading the data set")?;
    if cli.probe_compute {
        return probe_compute(&cli.train, &data);
    }
    let mut config = cli
        .train
        .train_config(std::io::stderr().is_terminal())
        .map_err(anyhow::Error::msg)?;
    config.out = cli.out.clone();
    config.yield_to_servers = cli.yield_to_servers;
    let mut client_config = ClientConfig::new(cli.server.clone());
    if let Some(listener) = ps_common::metrics::bind(cli.metrics_listen.as_deref()).await? {
        let (metrics, exposition) = WorkerMetrics::new(client_config.retry.tally.clone());
        config.metrics = Some(metrics);
        // Served until the process exits.
        let forever = std::future::pending::<()>();
        tokio::spawn(ps_common::metrics::serve(
            listener,
            Arc::new(exposition),
            forever,
        ));
    }
    client_config.pull_timeout = Duration::from_secs(cli.pull_timeout_secs);
    client_config.connect_timeout = cli.connect_timeout;
    client_config.scheduler = cli.scheduler.clone();
    client_config.session = !cli.unary;
    client_config.pipeline = !cli.no_pipeline;
    client_config.pipeline_group_bytes = cli.pipeline_group_bytes;
    client_config.data_path = cli.data_path;
    client_config.partition_bytes = cli.partition_bytes;
    client_config.requests_per_server = usize::from(cli.requests_per_server);
    cli.security
        .apply(Role::Worker, &mut client_config.transport)?;
    let mut client = PsClient::connect(client_config).await?;
    let expected = Expected {
        rank: cli.rank.map(Rank),
        workers: cli.workers,
        consistency: cli.consistency,
    };
    let group = client
        .join_expecting(&client_token(), expected)
        .await
        .context("joining the worker group")?;
    let via = cli
        .scheduler
        .clone()
        .unwrap_or_else(|| cli.server.join(","));
    tracing::info!(via, rank = %group.rank, workers = group.workers, consistency = %group.consistency, "ps-worker starting");
    let training = train(client, group, &data, &config);
    let summary = tokio::select! {
        summary = training => summary?,
        () = ps_common::process::shutdown_signal() => anyhow::bail!("interrupted before training finished"),
    };
    print_summary(&summary, cli.json)
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

    #[test]
    fn a_pipelined_group_size_is_taken_and_zero_refused() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["ps-worker"], args].concat());
        let cli = parse(&["--pipeline-group-bytes", "128KiB"]).unwrap();
        assert_eq!(cli.pipeline_group_bytes, Some(128 << 10));
        assert_eq!(parse(&[]).unwrap().pipeline_group_bytes, None);
        let zero = parse(&["--pipeline-group-bytes", "0"]).unwrap_err();
        assert!(zero.to_string().contains("at least one byte"), "{zero}");
        let both = parse(&["--pipeline-group-bytes", "1MiB", "--no-pipeline"]).unwrap_err();
        assert_eq!(both.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
}
