//! Real `ps-server` and `ps-scheduler` processes on free loopback ports, for end-to-end tests and
//! benchmarks that must measure separate processes.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The profile directory (`target/debug`, `target/release`, ...) of the running
/// executable, whether it is a binary there or a test or example below it.
///
/// # Panics
/// When the executable's path cannot be found.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable directory");
    let dir = if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.parent().expect("target directory")
    } else {
        dir
    };
    dir.to_path_buf()
}

/// Path of a workspace binary built next to the running executable (a test in
/// `target/*/deps/`, or a binary in `target/*/`). Under cargo (a test run, which
/// builds only its own package's binaries) a missing one is built first.
///
/// # Panics
/// When it is missing and cannot be built.
pub fn binary(name: &str) -> PathBuf {
    built(name, &["--bin", name])
}

/// Path of a workspace example, built first under cargo when missing.
///
/// # Panics
/// When it is missing and cannot be built.
pub fn example(name: &str) -> PathBuf {
    built(&format!("examples/{name}"), &["--example", name])
}

fn built(relative: &str, selector: &[&str]) -> PathBuf {
    let profile_dir = target_dir();
    let path = profile_dir.join(relative);
    if !path.is_file()
        && let Some(cargo) = std::env::var_os("CARGO")
    {
        let mut build = std::process::Command::new(cargo);
        build
            .args(["build", "--quiet", "--workspace"])
            .args(selector);
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(is_set_by_cargo_for_a_crate) {
                build.env_remove(name);
            }
        }
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "cargo build {selector:?} failed");
    }
    assert!(
        path.is_file(),
        "{} is missing; build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// True for the variables cargo sets for the one crate it runs (a test's
/// `CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, ...), as opposed to its own
/// settings (`CARGO_HOME`, `CARGO_TARGET_DIR`, `CARGO_PROFILE_*`). A build
/// started from a test leaves them out: build scripts that watch them (ring's
/// reads `CARGO_PKG_NAME` and `CARGO_MANIFEST_DIR`) would otherwise run again,
/// and the next `cargo test` would rebuild them and everything above them.
fn is_set_by_cargo_for_a_crate(name: &str) -> bool {
    const CRATE_VARIABLES: [&str; 9] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    CRATE_VARIABLES.contains(&name)
        || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
}

/// Peak resident set of process `pid` in bytes (`VmHWM` in `/proc/PID/status`),
/// or 0 where that cannot be read.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
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
        Self::start_named("ps-server", args).await
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Starts `ps-server --listen LISTEN ARGS` (to restart one at the address an
    /// earlier one was given).
    ///
    /// # Panics
    /// When the server exits or stays silent for 30 seconds.
    pub async fn start_at(listen: &str, args: &[&str]) -> Self {
        Self::start_named_at("ps-server", listen, args).await
    }

    /// Starts `ps-scheduler --listen 127.0.0.1:0 ARGS` the same way.
    ///
    /// # Panics
    /// When the scheduler exits or stays silent for 30 seconds.
    pub async fn start_scheduler(args: &[&str]) -> Self {
        Self::start_named("ps-scheduler", args).await
    }

    /// Starts `ps-scheduler --listen LISTEN ARGS` (to restart one at the address
    /// an earlier one was given).
    ///
    /// # Panics
    /// When the scheduler exits or stays silent for 30 seconds.
    pub async fn start_scheduler_at(listen: &str, args: &[&str]) -> Self {
        Self::start_named_at("ps-scheduler", listen, args).await
    }

    /// Starts the workspace binary `name` (`ps-server` or `ps-scheduler`) on a free
    /// loopback port and reads its log until it says `<name> listening addr=...`.
    async fn start_named(name: &str, args: &[&str]) -> Self {
        Self::start_named_at(name, "127.0.0.1:0", args).await
    }

    async fn start_named_at(name: &str, listen: &str, args: &[&str]) -> Self {
        let mut child = Command::new(binary(name))
            .args(["--listen", listen])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let mut lines = BufReader::new(child.stderr.take().expect("piped stderr")).lines();
        let ready = format!("{name} listening");
        let mut said = Vec::new();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("read the log") {
                if let Some(rest) = line.split("addr=").nth(1).filter(|_| line.contains(&ready)) {
                    return rest.split_whitespace().next().map(str::to_string);
                }
                said.push(line);
            }
            None
        })
        .await
        .unwrap_or_else(|_| panic!("{name} did not report its address within 30s"))
        .unwrap_or_else(|| {
            panic!(
                "{name} exited before listening; it said:\n{}",
                said.join("\n")
            )
        });
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { addr, child }
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
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

#[cfg(test)]
mod tests {
    use super::is_set_by_cargo_for_a_crate;

    #[test]
    fn a_crates_own_variables_are_told_from_cargos_settings() {
        for crate_variable in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_BIN_EXE_ps-server",
            "OUT_DIR",
        ] {
            assert!(
                is_set_by_cargo_for_a_crate(crate_variable),
                "{crate_variable}"
            );
        }
        for setting in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_PROFILE_DEV_DEBUG",
            "CARGO_BUILD_JOBS",
            "PATH",
        ] {
            assert!(!is_set_by_cargo_for_a_crate(setting), "{setting}");
        }
        // What cargo set for this very test is among them.
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    }
}
