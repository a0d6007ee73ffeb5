//! Chaos with real processes: `kill -9` of a parameter server in the middle of a
//! 2-server, 2-worker digits run. The scheduler declares it dead, places its keys
//! on the live server, the workers re-register them from their copies (or the
//! dead server's checkpoint, on the shared folder), repeat the step they were in,
//! and the run completes with the accuracy of an undisturbed one.

use std::process::Stdio;
use std::time::{Duration, Instant};

use ps_proto::transport::http_uri;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_tests::{ServerProcess, binary};
use tokio::process::{Child, Command};

const HEARTBEAT_TIMEOUT_MS: u64 = 1500;
const EPOCHS: &str = "40";

fn worker(scheduler: &str) -> Child {
    Command::new(binary("ps-worker"))
        .args(["--scheduler", scheduler, "--json", "--epochs", EPOCHS])
        .args(["--pull-timeout-secs", "30"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ps-worker")
}

async fn lowest_step(scheduler: &str) -> Option<u64> {
    let mut client = SchedulerClient::connect(http_uri(scheduler)).await.ok()?;
    let status = client.status(v1::StatusRequest {}).await.ok()?.into_inner();
    (status.workers.len() == 2).then(|| status.workers.iter().map(|w| w.last_step).min())?
}

/// Accuracy of each worker, in rank order, after a run; `victim_at` kills one of the
/// two servers with SIGKILL once both workers reported that step.
async fn run(victim_at: Option<u64>) -> (Vec<f64>, Duration, Vec<String>) {
    let checkpoints = tempfile::tempdir().expect("a checkpoint folder");
    let root = checkpoints.path().to_str().expect("utf-8 path").to_string();
    let timeout = HEARTBEAT_TIMEOUT_MS.to_string();
    let scheduler = ServerProcess::start_scheduler(&[
        "--workers",
        "2",
        "--servers",
        "2",
        "--heartbeat-ms",
        "250",
        "--heartbeat-timeout-ms",
        &timeout,
    ])
    .await;
    let server_args = [
        "--scheduler",
        &scheduler.addr,
        "--checkpoint-dir",
        &root,
        "--checkpoint-every-steps",
        "25",
    ];
    let mut servers = vec![
        ServerProcess::start(&server_args).await,
        ServerProcess::start(&server_args).await,
    ];
    let started = Instant::now();
    let workers = [worker(&scheduler.addr), worker(&scheduler.addr)];
    if let Some(step) = victim_at {
        let deadline = Instant::now() + Duration::from_secs(120);
        while lowest_step(&scheduler.addr).await.is_none_or(|s| s < step) {
            assert!(
                Instant::now() < deadline,
                "workers never reached step {step}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        servers.pop().expect("two servers").kill().await;
        eprintln!("killed a server at step {step}");
    }
    let mut accuracies = Vec::new();
    let mut recoveries = Vec::new();
    for child in workers {
        let output = tokio::time::timeout(Duration::from_secs(240), child.wait_with_output())
            .await
            .expect("a worker hung")
            .expect("wait for a worker");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "a worker failed:\n{stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        let summary: serde_json::Value = serde_json::from_str(last)
            .unwrap_or_else(|_| panic!("no JSON summary: {last:?}\n{stderr}"));
        accuracies.push(summary["test_accuracy"].as_f64().expect("test_accuracy"));
        recoveries.extend(
            stderr
                .lines()
                .filter(|l| l.contains("looks lost"))
                .map(str::to_string),
        );
    }
    let took = started.elapsed();
    for server in servers {
        server.stop().await;
    }
    scheduler.stop().await;
    (accuracies, took, recoveries)
}

/// A step between 60 and 400, different from run to run.
fn random_step() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    60 + u64::from(nanos) % 340
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_two_servers_mid_run_still_reaches_the_undisturbed_accuracy() {
    let (undisturbed, normal_time, calm) = run(None).await;
    assert!(
        calm.is_empty(),
        "nothing was lost in the calm run: {calm:#?}"
    );
    let step = random_step();
    let (disturbed, took, recoveries) = run(Some(step)).await;
    assert!(
        !recoveries.is_empty(),
        "the kill at step {step} happened mid-run, so the workers must have recovered"
    );
    eprintln!("{}", recoveries.join("\n"));
    eprintln!(
        "undisturbed {undisturbed:?} in {normal_time:?}; server killed at step {step}: {disturbed:?} in {took:?}"
    );
    for (&base, &after) in undisturbed.iter().zip(&disturbed) {
        assert!(
            after >= 0.93,
            "accuracy {after} after the kill (step {step})"
        );
        assert!(
            (after - base).abs() <= 0.02,
            "accuracy {after} after the kill vs {base} undisturbed (step {step})"
        );
    }
    let allowed =
        normal_time + Duration::from_millis(HEARTBEAT_TIMEOUT_MS) + Duration::from_secs(20);
    assert!(took <= allowed, "took {took:?}, allowed {allowed:?}");
}
