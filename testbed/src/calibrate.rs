//! `ps-testbed calibrate`: `ps-scheduler plan --measure-link` run where it is
//! meant to run, across a shaped link. Two hosts (a server and a worker) are
//! built with links of the given rate; `ps-microbench serve` runs on the
//! server host, and `ps-scheduler plan --measure-link SERVER` on the worker
//! host, so the round trip, the link's rate and the share of it gRPC gets are
//! the emulated cluster's, not loopback's. The plan (with its measured
//! constants) is what `ps-scheduler plan` printed; with `--out FILE` in the
//! plan's arguments it is also a plan file that `ps-testbed plan-check
//! --constants FILE` predicts with.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::hosts::{self, Host, HostCounts, Role};
use crate::netns::Network;
use crate::process::HostProcess;
use crate::rate::LinkRate;

/// The port `ps-microbench serve` takes on the server host (its own
/// namespace: nothing else listens there).
const SERVE_PORT: u16 = 7080;
/// Its raw TCP baseline's port.
const TCP_PORT: u16 = 7081;
/// Seconds `ps-microbench serve` has to say it is serving.
const READY_SECONDS: u64 = 30;

/// What a calibration runs.
#[derive(Debug, Clone)]
pub struct CalibrationSpec {
    /// Namespace prefix.
    pub prefix: String,
    /// Both hosts' link rate, each way.
    pub link: LinkRate,
    /// Where `ps-microbench` and `ps-scheduler` are.
    pub bin_dir: PathBuf,
    /// Where the serving side's log goes.
    pub out: PathBuf,
    /// `ps-scheduler plan`'s other arguments (the model, workers, `--out`).
    pub plan_args: Vec<String>,
}

/// Builds the two hosts, measures, and removes them; what `ps-scheduler
/// plan` printed.
///
/// # Errors
/// The hosts cannot be built, `ps-microbench serve` does not start, or the
/// plan fails (its error is in the message).
pub async fn run(spec: &CalibrationSpec) -> anyhow::Result<String> {
    let counts = HostCounts {
        servers: 1,
        workers: 1,
        colocated: false,
    };
    let hosts = hosts::plan(counts, spec.link, &[]).map_err(anyhow::Error::msg)?;
    let network = Network::build(&spec.prefix, &hosts)?;
    let host = |role| {
        network
            .hosts()
            .iter()
            .find(|h: &&Host| h.role == role)
            .cloned()
            .expect("the plan has a server and a worker")
    };
    let (server, worker) = (host(Role::Server), host(Role::Worker));
    let mut serve = serve_on(&network, &server, spec).await?;
    let measured = plan_on(&network, &worker, &server, spec).await;
    serve.stop(Duration::from_secs(5)).await;
    drop(network);
    measured
}

/// `ps-microbench serve` on `server`, once it says it is serving.
async fn serve_on(
    network: &Network,
    server: &Host,
    spec: &CalibrationSpec,
) -> anyhow::Result<HostProcess> {
    let args = [
        "serve".to_string(),
        "--listen".into(),
        format!("{}:{SERVE_PORT}", server.addr),
        "--tcp-listen".into(),
        format!("{}:{TCP_PORT}", server.addr),
    ];
    let ns = network.namespace(server);
    let binary = spec.bin_dir.join("ps-microbench");
    let mut serve = HostProcess::start((&server.name, &ns), &binary, &args, &spec.out, None, true)?;
    let stdout = serve.stdout().context("ps-microbench serve's output")?;
    let mut said = String::new();
    let mut stdout = BufReader::new(stdout);
    let read = stdout.read_line(&mut said);
    let started = tokio::time::timeout(Duration::from_secs(READY_SECONDS), read).await;
    anyhow::ensure!(
        matches!(started, Ok(Ok(_))) && said.contains("grpc="),
        "ps-microbench serve on {} did not start in {READY_SECONDS} s (log: {})",
        server.name,
        serve.log.display()
    );
    Ok(serve)
}

/// `ps-scheduler plan --measure-link` on `worker` against `server`.
async fn plan_on(
    network: &Network,
    worker: &Host,
    server: &Host,
    spec: &CalibrationSpec,
) -> anyhow::Result<String> {
    let output = Command::new("ip")
        .args(["netns", "exec", &network.namespace(worker)])
        .arg(spec.bin_dir.join("ps-scheduler"))
        .args([
            "plan",
            "--measure-link",
            &format!("{}:{SERVE_PORT}", server.addr),
        ])
        .args(&spec.plan_args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running ps-scheduler plan on the worker host")?;
    anyhow::ensure!(
        output.status.success(),
        "ps-scheduler plan --measure-link failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
