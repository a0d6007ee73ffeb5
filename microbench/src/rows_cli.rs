//! The command lines of `rows` and its worker processes (`rows-worker`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ps_common::size::parse_size;
use ps_shm::DataPathMode;

use crate::kv::Op;
use crate::report::{print_json, write_csv};
use crate::rows::{self, RowsPlan, WorkerRun};
use crate::stdout;

/// `ps-microbench rows`.
#[derive(Debug, Args)]
pub struct RowsArgs {
    /// ps-server processes (the table's buckets are spread over them).
    #[arg(long, default_value_t = 1)]
    servers: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Ids drawn per batch, before deduplication.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Floats per row.
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// Rows in the table (for example 10M).
    #[arg(long, value_parser = parse_size, default_value = "10000000")]
    rows: usize,
    /// Exponent of the Zipf law the ids follow.
    #[arg(long, default_value_t = 1.05)]
    zipf: f64,
    /// Batches in flight per worker in the throughput phase.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Seconds each phase (latency, throughput) runs per operation.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Print one JSON object per result line instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the results (rows.csv) into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// How workers reach the servers: grpc (as ps-lite's TCP, the default
    /// here), or auto/shm (shared memory on this host, as ps-local's workers do).
    #[arg(long, default_value = "grpc")]
    data_path: DataPathMode,
}

/// `ps-microbench rows-worker`: one worker process of `rows`.
#[derive(Debug, Args)]
pub struct RowsWorkerArgs {
    /// The ps-server addresses, comma-separated.
    #[arg(long, value_delimiter = ',')]
    servers: Vec<String>,
    /// What to do.
    #[arg(long)]
    op: Op,
    /// Ids per batch.
    #[arg(long)]
    batch: usize,
    /// Floats per row.
    #[arg(long)]
    width: usize,
    /// Rows in the table.
    #[arg(long)]
    rows: u64,
    /// Zipf exponent.
    #[arg(long)]
    zipf: f64,
    /// Batches in flight in the throughput phase.
    #[arg(long)]
    window: usize,
    /// Seconds each phase runs.
    #[arg(long)]
    seconds: f64,
    /// This worker's index.
    #[arg(long)]
    index: u32,
    /// How to reach the servers.
    #[arg(long)]
    data_path: DataPathMode,
}

/// Runs `rows` and prints (or writes) its results.
///
/// # Errors
/// Bad arguments, or a server or worker that fails.
pub async fn run_rows(args: RowsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.servers >= 1
            && args.workers >= 1
            && args.window >= 1
            && args.batch >= 1
            && args.width >= 1
            && args.rows >= 1
            && args.seconds > 0.0
            && args.zipf > 0.0,
        "--servers, --workers, --window, --batch, --width and --rows must be at least 1, --seconds and --zipf above 0"
    );
    let plan = RowsPlan {
        servers: args.servers,
        workers: args.workers,
        batch: args.batch,
        width: args.width,
        rows: args.rows as u64,
        zipf: args.zipf,
        window: args.window,
        seconds: args.seconds,
        data_path: args.data_path,
    };
    let results = rows::run(&plan).await?;
    if args.json {
        print_json(&results)?;
    } else {
        stdout::text(rows::table_of(&results))?;
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_csv(&results, &dir.join("rows.csv"))?;
    }
    Ok(())
}

/// Runs one worker process of `rows` and prints its report as one JSON line.
///
/// # Errors
/// When a server cannot be reached or refuses an operation.
pub async fn run_rows_worker(args: RowsWorkerArgs) -> anyhow::Result<()> {
    let run = WorkerRun {
        servers: args.servers,
        op: args.op,
        plan: RowsPlan {
            servers: 0,
            workers: 1,
            batch: args.batch,
            width: args.width,
            rows: args.rows,
            zipf: args.zipf,
            window: args.window,
            seconds: args.seconds,
            data_path: args.data_path,
        },
        index: args.index,
    };
    let report = rows::run_worker(run).await?;
    stdout::line(serde_json::to_string(&report)?)?;
    Ok(())
}
