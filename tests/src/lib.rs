//! `ps-tests`: helpers for the end-to-end tests in `tests/tests/`: running the
//! workspace's binaries as real processes and reading what they print, and
//! ([`compose`]) running the docker-compose cluster, ([`swarm`]) the swarm stack,
//! and ([`faults`]) a proxy that
//! injects network faults, and ([`loopback`]) a ps-server in this process over
//! in-memory streams.

pub mod compose;
pub mod faults;
pub mod loopback;
pub mod sum_model;
pub mod swarm;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

pub use ps_common::processes::{ServerProcess, binary, example, peak_rss_bytes};
use tokio::process::Command;

/// Spawns `ps-worker ARGS` with its stdout and stderr piped, killed on drop.
///
/// # Panics
/// When it cannot be spawned.
pub fn spawn_worker(args: &[&str]) -> tokio::process::Child {
    Command::new(binary("ps-worker"))
        .args(args)
        .env("NO_COLOR", "1")
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
