//! `ps-local`: parameter servers and workers in one process train a real model on a
//! real data set, then report test accuracy.
//!
//! ```text
//! ps-local                                  # 2 servers, 2 workers, MLP on digits
//! ps-local --servers 3 --workers 4 --json
//! ps-local --metrics-listen 127.0.0.1:9100   # scheduler :9100, servers :9101-, workers after
//! ps-local --plan auto                       # the setup ps-scheduler plan picks for this run
//! ```

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use ps_cluster::local::{LocalSpec, LocalSummary, run_local};
use ps_cluster::planned;
use ps_common::certs::ClusterCerts;
use ps_common::flag::env_flag;
use ps_common::size::parse_size;
use ps_proto::consistency::Consistency;
use ps_proto::placement::check_partition_bytes;
use ps_worker::cli::TrainArgs;

/// An in-process candle-ps cluster: a scheduler, parameter servers and candle
/// workers on loopback ports train a real model on a real data set, then report
/// test accuracy.
#[derive(Debug, Parser)]
#[command(name = "ps-local", version)]
struct Cli {
    /// Parameter servers.
    #[arg(long, default_value_t = 2, env = "PS_SERVERS", value_parser = clap::value_parser!(u16).range(1..))]
    servers: u16,
    /// Workers.
    #[arg(long, default_value_t = 2, env = "PS_WORKERS", value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// Consistency model: bsp, asp or ssp:K.
    #[arg(long, default_value = "bsp", env = "PS_CONSISTENCY")]
    consistency: Consistency,
    /// Run without a scheduler (workers place parameters by themselves).
    #[arg(long, env = "PS_NO_SCHEDULER", value_parser = env_flag())]
    no_scheduler: bool,
    /// Checkpoint root: each server writes a folder in it, and a last checkpoint
    /// when training ends (`ps-server export` turns them into one model file).
    #[arg(long, env = "PS_CHECKPOINT_DIR")]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Run every server and channel over TLS, with a CA and certificate made
    /// for this run (and mutual TLS: every client presents one too).
    #[arg(long, env = "PS_TLS", value_parser = env_flag())]
    tls: bool,
    /// Serve each part's Prometheus metrics (GET /metrics) on its own port,
    /// from this address up: the scheduler, the servers, then the workers by
    /// rank (port 0: a free port each). Each is logged with its part.
    #[arg(long, env = "PS_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Print one JSON summary as the last line of stdout.
    #[arg(long, env = "PS_JSON", value_parser = env_flag())]
    json: bool,
    /// How the workers reach the servers: auto (shared memory, as they share
    /// this process's host), shm (the same, failing without it), or grpc.
    #[arg(long, env = "PS_DATA_PATH", default_value = "auto")]
    data_path: ps_shm::DataPathMode,
    /// The largest part a parameter is cut into across the servers (64KiB
    /// to 4MiB).
    #[arg(long, default_value = "1MiB", env = "PS_PARTITION_BYTES",
          value_parser = |t: &str| parse_size(t).and_then(check_partition_bytes))]
    partition_bytes: usize,
    /// Run the setup a plan chooses: auto (planned now for this run, its
    /// compute timed here) or a file from `ps-scheduler plan --out`. It sets
    /// the servers, the consistency, pipelining, backward segments, the wire
    /// dtype and the partition size, over --servers, --consistency and
    /// --partition-bytes.
    #[arg(long, env = "PS_PLAN")]
    plan: Option<ps_cluster::planned::PlanSource>,
    #[command(flatten)]
    train: TrainArgs,
}

fn print_summary(summary: &LocalSummary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
        return Ok(());
    }
    println!(
        "{} servers, {} workers on {}: test accuracy {:.4}, train loss {:.4}, {} steps per worker in {:.1}s ({:.0} examples/s)",
        summary.servers,
        summary.workers,
        summary.dataset,
        summary.test_accuracy,
        summary.train_loss,
        summary.steps,
        summary.wall_seconds,
        summary.examples_per_second
    );
    Ok(())
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
    if let Err(message) = cli.train.validate() {
        Cli::command()
            .error(clap::error::ErrorKind::ValueValidation, message)
            .exit();
    }
    ps_common::process::init_tracing();
    let data = Arc::new(cli.train.dataset().context("loading the data set")?);
    let config = cli
        .train
        .train_config(std::io::stderr().is_terminal())
        .map_err(anyhow::Error::msg)?;
    let mut config = config;
    let mut spec = LocalSpec {
        servers: usize::from(cli.servers),
        workers: cli.workers,
        consistency: cli.consistency,
        scheduler: !cli.no_scheduler,
        checkpoint_dir: cli.checkpoint_dir,
        metrics_listen: cli.metrics_listen,
        data_path: cli.data_path,
        pipeline: true,
        partition_bytes: cli.partition_bytes,
        requests_per_server: ps_client::DEFAULT_REQUESTS_PER_SERVER,
        tls: match cli.tls {
            true => Some(ClusterCerts::generate(&[], 1)?.tls_config(true)),
            false => None,
        },
    };
    if let Some(source) = &cli.plan {
        let hidden = &cli.train.hidden;
        let plan = planned::load(source, &data, hidden, config.batch_size, cli.workers)?;
        let run = planned::apply(&plan, hidden.len() + 1)?;
        let setup = run.setup;
        tracing::info!(setup = %run.summary, consistency = %setup.consistency, "running the plan's setup");
        spec.servers = setup.servers;
        spec.pipeline = setup.pipeline;
        spec.partition_bytes = setup.partition_bytes;
        spec.requests_per_server = usize::from(setup.requests_per_server);
        spec.consistency = setup.consistency.parse().map_err(anyhow::Error::msg)?;
        config.backward_segments = setup.backward_segments;
        config.wire = setup.wire;
    }
    let summary = tokio::select! {
        summary = run_local(&spec, data, &config) => summary?,
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
}
