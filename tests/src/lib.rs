//! `ps-tests`: helpers for the end-to-end tests in `tests/tests/`: running the
//! workspace's binaries as real processes and reading what they print, and
//! ([`compose`]) running the docker-compose cluster, ([`swarm`]) the swarm stack,
//! and ([`faults`]) a proxy that
//! injects network faults, ([`loopback`]) a ps-server in this process over
//! in-memory streams, and ([`prometheus`]) the compose cluster's Prometheus API.

pub mod compose;
pub mod faults;
pub mod loopback;
pub mod prometheus;
pub mod sum_model;
pub mod swarm;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

pub use ps_common::processes::{ServerProcess, binary, example, peak_rss_bytes};
use tokio::io::AsyncBufReadExt;
use tokio::process::Command;

/// Whether a test that needs something this machine may lack (`missing`, what
/// is absent when `available` is false) can run: true when it is there;
/// otherwise says SKIPPED and why (`skipped`: what went untested), unless the
/// environment variable `require` is set, which makes its absence fail.
///
/// # Panics
/// When it is absent and `require` is set.
pub fn available_or_skip(available: bool, require: &str, missing: &str, skipped: &str) -> bool {
    if available {
        return true;
    }
    assert!(
        std::env::var_os(require).is_none(),
        "{require} is set but {missing}"
    );
    eprintln!("SKIPPED: {missing}; {skipped}");
    false
}

/// Spawns `ps-worker ARGS` with its stdout and stderr piped, killed on drop.
///
/// # Panics
/// When it cannot be spawned.
pub fn spawn_worker(args: &[&str]) -> tokio::process::Child {
    Command::new(binary("ps-worker"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("PS_YIELD_TO_SERVERS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ps-worker")
}

/// What a finished process printed.
pub struct Finished {
    /// Whether it exited 0.
    pub success: bool,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Finished {
    /// The last line of stdout as JSON.
    ///
    /// # Panics
    /// When it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        let last = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| {
            panic!(
                "last stdout line {last:?} is not JSON ({e}); stderr:\n{}",
                self.stderr
            )
        })
    }
}

/// Runs `program ARGS` to completion within `limit`.
///
/// # Panics
/// When it runs longer than `limit` (it is killed).
pub async fn run(program: PathBuf, args: &[&str], limit: Duration) -> Finished {
    let child = Command::new(&program)
        .args(args)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{} ran longer than {limit:?}", program.display()))
        .expect("wait for child");
    Finished {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Reads `worker`'s log until a line holds `marker`, then goes on reading it in
/// the background (so the worker never blocks on a full pipe). Returns that
/// line, and the whole log once the worker ends.
///
/// # Panics
/// When the log ends without `marker`.
pub async fn read_log_until(
    worker: &mut tokio::process::Child,
    marker: &str,
) -> (String, tokio::task::JoinHandle<String>) {
    let (mut lines, rest) = read_log_until_count(worker, marker, 1).await;
    (lines.remove(0), rest)
}

/// [`read_log_until`] `count` lines hold `marker`; returns those lines in order.
///
/// # Panics
/// When the log ends before `count` lines held `marker`.
pub async fn read_log_until_count(
    process: &mut tokio::process::Child,
    marker: &str,
    count: usize,
) -> (Vec<String>, tokio::task::JoinHandle<String>) {
    let stderr = process.stderr.take().expect("piped stderr");
    let mut log = tokio::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let mut found = Vec::new();
    while let Some(line) = log.next_line().await.expect("read the process's log") {
        if line.contains(marker) {
            found.push(line.clone());
        }
        seen.push(line);
        if found.len() == count {
            let rest = tokio::spawn(async move {
                while let Ok(Some(line)) = log.next_line().await {
                    seen.push(line);
                }
                seen.join("\n")
            });
            return (found, rest);
        }
    }
    panic!(
        "the log held {marker:?} {} times, not {count}:\n{}",
        found.len(),
        seen.join("\n")
    );
}

/// The value of the sample named exactly `series` (name and labels) in
/// Prometheus exposition `text`.
pub fn metric_sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

/// `GET path` from `addr`: the status line and the body.
///
/// # Panics
/// When the connection or the response fails.
pub async fn http_get(addr: &str, path: &str) -> (String, String) {
    ps_common::metrics::http_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// A channel to `addr` with `transport`'s settings, attaching the secret its
/// token presents to every call.
///
/// # Panics
/// When `addr` is not an address or nothing answers there.
pub async fn authed_channel(
    addr: &str,
    transport: &ps_proto::transport::TransportConfig,
) -> ps_proto::auth::AuthChannel {
    let channel = transport
        .endpoint(ps_proto::transport::http_uri(addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    transport.authed(channel)
}
