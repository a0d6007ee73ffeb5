//! `ps-worker`: trains a built-in model on a built-in data set with the parameter
//! servers, then evaluates it.
//!
//! ```text
//! ps-worker --server 127.0.0.1:7070            # rank from the server, digits, MLP
//! ps-worker --server a:7070,b:7070 --rank 1 --workers 2 --json
//! ```

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ps_proto::consistency::Consistency;
use ps_worker::cli::TrainArgs;
use ps_worker::client::GroupInfo;
use ps_worker::train::{TrainSummary, train};
use ps_worker::trainer::client_token;
use ps_worker::{ClientConfig, PsClient};

/// A candle worker of candle-ps.
#[derive(Debug, Parser)]
#[command(version, about)]
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
    /// This worker's rank; by default the first server hands one out.
    #[arg(long, env = "PS_RANK", requires = "workers")]
    rank: Option<u32>,
    /// Workers in the group (with --rank).
    #[arg(long, env = "PS_WORKERS")]
    workers: Option<u32>,
    /// Consistency model of the servers (with --rank): bsp, asp or ssp:K.
    #[arg(long, default_value = "bsp", env = "PS_CONSISTENCY")]
    consistency: Consistency,
    /// Seconds a pull may wait for the other workers before failing.
    #[arg(long, default_value_t = 60, env = "PS_PULL_TIMEOUT_SECS")]
    pull_timeout_secs: u64,
    /// Print one JSON summary as the last line of stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    train: TrainArgs,
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
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    ps_proto::process::init_tracing();
    let data = cli.train.dataset().context("loading the data set")?;
    let config = cli
        .train
        .train_config(std::io::stderr().is_terminal())
        .map_err(anyhow::Error::msg)?;
    let mut client_config = ClientConfig::new(cli.server.clone());
    client_config.pull_timeout = Duration::from_secs(cli.pull_timeout_secs);
    client_config.scheduler = cli.scheduler.clone();
    let mut client = PsClient::connect(client_config).await?;
    let group = match (cli.rank, cli.workers) {
        (Some(rank), Some(workers)) => GroupInfo {
            rank,
            workers,
            consistency: cli.consistency,
        },
        _ => client
            .join(&client_token())
            .await
            .context("joining the worker group")?,
    };
    anyhow::ensure!(
        group.rank < group.workers.max(1) || !group.consistency.has_group(),
        "rank {} is outside a group of {} workers",
        group.rank,
        group.workers
    );
    let via = cli
        .scheduler
        .clone()
        .unwrap_or_else(|| cli.server.join(","));
    tracing::info!(via, rank = group.rank, workers = group.workers, consistency = %group.consistency, "ps-worker starting");
    let training = train(client, group, &data, &config);
    let summary = tokio::select! {
        summary = training => summary?,
        () = ps_proto::process::shutdown_signal() => anyhow::bail!("interrupted before training finished"),
    };
    print_summary(&summary, cli.json)
}
