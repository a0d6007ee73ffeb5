//! The real binaries, each started inside its host's namespace with
//! `ip netns exec` (which execs it, so the child's pid is the binary's), its
//! log written to `OUT/HOST.log`, and its CPU time read from `/proc` while it
//! runs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::oneshot;

/// What went wrong with a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// It could not be started.
    #[error("starting {what}: {source}")]
    Spawn {
        /// The host and binary.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// It exited, or stayed silent, before it said it was listening.
    #[error("{what} did not start listening within {seconds} s; see its log, {log}")]
    NotReady {
        /// The host and binary.
        what: String,
        /// How long it was given.
        seconds: u64,
        /// Its log file.
        log: String,
    },
}

/// One process on one host.
#[derive(Debug)]
pub struct HostProcess {
    /// The host's name.
    pub host: String,
    /// Its pid.
    pub pid: u32,
    /// Its log file.
    pub log: PathBuf,
    child: Child,
    ready: Option<oneshot::Receiver<()>>,
}

/// Seconds a scheduler or server has to say it is listening.
const READY_SECONDS: u64 = 30;

impl HostProcess {
    /// Starts `binary args` in namespace `ns` for `host`; its stderr goes to
    /// `out/HOST.log`, and its stdout is piped to be read (with
    /// [`HostProcess::stdout`]) when `keep_stdout`, and discarded otherwise.
    /// `ready_line`, when given, is the log text that says it is listening.
    ///
    /// # Errors
    /// [`ProcessError::Spawn`].
    pub fn start(
        (host, ns): (&str, &str),
        binary: &Path,
        args: &[String],
        out: &Path,
        ready_line: Option<&str>,
        keep_stdout: bool,
    ) -> Result<Self, ProcessError> {
        let what = format!("{} on {host}", binary.display());
        let log = out.join(format!("{host}.log"));
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(binary)
            .args(args)
            .env("NO_COLOR", "1")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(if keep_stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                what: what.clone(),
                source,
            })?;
        let pid = child.id().ok_or_else(|| ProcessError::Spawn {
            what: what.clone(),
            source: std::io::Error::other("it exited at once"),
        })?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let (said_ready, ready) = oneshot::channel();
        let ready_line = ready_line.map(str::to_string);
        let log_path = log.clone();
        tokio::spawn(async move {
            let Ok(mut file) = tokio::fs::File::create(&log_path).await else {
                return;
            };
            let mut lines = BufReader::new(stderr).lines();
            let mut said_ready = Some(said_ready);
            while let Ok(Some(line)) = lines.next_line().await {
                if ready_line.as_deref().is_some_and(|r| line.contains(r))
                    && let Some(tell) = said_ready.take()
                {
                    let _ = tell.send(());
                }
                let _ = file.write_all(line.as_bytes()).await;
                let _ = file.write_all(b"\n").await;
            }
            let _ = file.flush().await;
        });
        Ok(Self {
            host: host.to_string(),
            pid,
            log,
            child,
            ready: Some(ready),
        })
    }

    /// Waits until it says it is listening.
    ///
    /// # Errors
    /// [`ProcessError::NotReady`] when it exits or stays silent too long.
    pub async fn ready(&mut self) -> Result<(), ProcessError> {
        let not_ready = || ProcessError::NotReady {
            what: self.host.clone(),
            seconds: READY_SECONDS,
            log: self.log.display().to_string(),
        };
        let ready = self.ready.take().ok_or_else(not_ready)?;
        match tokio::time::timeout(Duration::from_secs(READY_SECONDS), ready).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(not_ready()),
        }
    }

    /// Its stdout, to read once.
    pub fn stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Waits for it to exit; whether it exited cleanly.
    pub async fn wait(&mut self) -> bool {
        self.child.wait().await.is_ok_and(|s| s.success())
    }

    /// Sends SIGTERM and waits up to `grace` for it to exit, then kills it.
    pub async fn stop(&mut self, grace: Duration) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await;
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// CPU seconds (user and system) process `pid` has used, from
/// `/proc/PID/stat`; `None` once it has exited.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold
    // spaces: utime and stime are the 12th and 13th of them.
    let after = stat.rsplit_once(')')?.1;
    let mut fields = after.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every Linux ABI the project builds for.
    Some((user + system) / 100.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_used_some_cpu() {
        let mut spent = 0.0;
        // Spend a little CPU so there is something to see.
        while spent == 0.0 {
            let _ = (0..1_000_000u64).map(std::hint::black_box).sum::<u64>();
            spent = super::cpu_seconds(std::process::id()).expect("our own /proc/PID/stat");
        }
        assert!(spent > 0.0 && spent < 3600.0, "{spent}");
    }
}
