//! Heap allocations per small operation, worker and server together: a
//! `ps-server` (ASP, SGD) and a `PsClient` run in this one process on loopback,
//! under dhat's allocator, which counts every allocation, and each phase pushes or
//! pulls one f32 key of `--size` bytes `--ops` times, one operation in flight,
//! on the session stream over gRPC, on the session through shared memory (what
//! a worker on the server's host gets by default), and as unary calls. It prints allocations and
//! allocated bytes per operation, both sides together (from dhat, which also
//! writes where each allocation was made to `--profile`).
//!
//! ```text
//! cargo run --release -p ps-microbench --example allocs_per_op -- --size 4096 --ops 2000
//! ```

use std::collections::BTreeMap;

use anyhow::bail;
use clap::Parser;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, ParamBytes, PsClient, PulledParam, sgd};
use ps_proto::codec::{DType, encode_f32};
use ps_proto::ids::{Rank, Step, Version};
use ps_server::{Consistency, ServerConfig};
use ps_shm::DataPathMode;
use tokio::net::TcpListener;

/// dhat's allocator: it counts every allocation, and records where it came from.
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

#[derive(Parser)]
struct Args {
    /// Key size in bytes.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Operations counted per phase (after as many again to warm up).
    #[arg(long, default_value_t = 2_000)]
    ops: u64,
    /// Where dhat writes where every allocation came from (open it with
    /// dhat's viewer, dh_view.html).
    #[arg(long, default_value = "dhat-heap.json")]
    profile: std::path::PathBuf,
    /// Only the gRPC session stream (for a profile of it alone).
    #[arg(long)]
    session_only: bool,
}

/// One way a worker reaches its server.
#[derive(Clone, Copy)]
struct Path {
    name: &'static str,
    session: bool,
    data_path: DataPathMode,
}

const GRPC_SESSION: Path = Path {
    name: "session",
    session: true,
    data_path: DataPathMode::Grpc,
};
const SHM_SESSION: Path = Path {
    name: "shm",
    session: true,
    data_path: DataPathMode::Shm,
};
const UNARY: Path = Path {
    name: "unary",
    session: false,
    data_path: DataPathMode::Grpc,
};

/// Allocations and bytes counted so far.
fn counted() -> (u64, u64) {
    let stats = dhat::HeapStats::get();
    (stats.total_blocks, stats.total_bytes)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _profiler = dhat::Profiler::builder().file_name(&args.profile).build();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let config = ServerConfig {
        consistency: Consistency::Asp,
        ..ServerConfig::default()
    };
    tokio::spawn(ps_server::run(listener, config, std::future::pending()));

    let name = "allocs".to_string();
    let elements = (args.size / 4).max(1);
    let grad = [ParamBytes::new(
        name.clone(),
        encode_f32(DType::F32, &vec![1e-6; elements]),
    )];
    println!(
        "{} B key, one operation in flight, worker and server together",
        args.size
    );
    println!(
        "{:<8} {:<5} {:>12} {:>14}",
        "path", "op", "allocs/op", "bytes/op"
    );
    let paths: &[Path] = if args.session_only {
        &[GRPC_SESSION]
    } else {
        &[GRPC_SESSION, SHM_SESSION, UNARY]
    };
    for (index, &path) in paths.iter().enumerate() {
        let mut config = ClientConfig::new(vec![addr.clone()]);
        config.session = path.session;
        config.data_path = path.data_path;
        let mut client = PsClient::connect(config).await?;
        let info = ParamInfo {
            name: name.clone(),
            shape: vec![elements],
            dtype: DType::F32,
        };
        client.place(&[info]).await?;
        let initial = [ParamBytes::new(
            name.clone(),
            encode_f32(DType::F32, &vec![0.5; elements]),
        )];
        client.register(&initial, &sgd(0.01)).await?;
        let (path, rank) = (path.name, Rank(index as u32));
        let mut step = Step(0);
        let mut pulled = BTreeMap::<String, PulledParam>::new();
        for op in ["push", "pull"] {
            let mut per_op = (0, 0);
            for counting in [false, true] {
                let before = counted();
                for _ in 0..args.ops {
                    if op == "push" {
                        if client.push(rank, step, &grad).await? == 0 {
                            bail!("{rank} step {step} was taken for a retry");
                        }
                        step = step.next();
                    } else {
                        client.pull_into(Version(0), &mut pulled).await?;
                    }
                }
                let after = counted();
                if counting {
                    per_op = (after.0 - before.0, after.1 - before.1);
                }
            }
            println!(
                "{path:<8} {op:<5} {:>12.1} {:>14.0}",
                per_op.0 as f64 / args.ops as f64,
                per_op.1 as f64 / args.ops as f64
            );
        }
    }
    Ok(())
}
