//! `ps-tests`: helpers for the end-to-end tests in `tests/tests/`: the workspace's
//! binaries as real processes, and reading what they print.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Path of a workspace binary built next to this test (`cargo test --workspace`
/// builds them all).
///
/// # Panics
/// When the binary has not been built.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing; build the workspace first (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// Path of an example built next to this test.
pub fn example(name: &str) -> PathBuf {
    binary(&format!("examples/{name}"))
}

/// A `ps-server` child process on a free loopback port.
pub struct ServerProcess {
    /// The address it listens on.
    pub addr: String,
    child: Child,
}

impl ServerProcess {
    /// Starts `ps-server --listen 127.0.0.1:0 ARGS` and reads its log until it says
    /// where it listens.
    ///
    /// # Panics
    /// When the server exits or stays silent for 30 seconds.
    pub async fn start(args: &[&str]) -> Self {
        let mut child = Command::new(binary("ps-server"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ps-server");
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("read ps-server log") {
                if let Some(rest) = line
                    .split("addr=")
                    .nth(1)
                    .filter(|_| line.contains("ps-server listening"))
                {
                    return rest.split_whitespace().next().map(str::to_string);
                }
            }
            None
        })
        .await
        .expect("ps-server did not report its address within 30s")
        .expect("ps-server exited before listening");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { addr, child }
    }

    /// Sends SIGTERM and waits for a clean exit.
    ///
    /// # Panics
    /// When the server does not exit cleanly within 30 seconds.
    pub async fn stop(mut self) {
        let pid = self.child.id().expect("running").to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .expect("run kill");
        assert!(status.success());
        let exit = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("ps-server hung on SIGTERM");
        assert!(exit.expect("wait").success(), "ps-server exited uncleanly");
    }
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
