//! The scheduler with real processes: a worker killed mid-run, a worker started
//! before any server, and `ps-scheduler status`.

use std::time::{Duration, Instant};

use ps_proto::transport::http_uri;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_tests::{ServerProcess, binary, run, spawn_worker};
use tokio::process::Child;

fn worker(scheduler: &str, extra: &[&str]) -> Child {
    let mut args = vec!["--server", scheduler, "--json"];
    args.extend_from_slice(extra);
    spawn_worker(&args)
}

async fn status(scheduler: &str) -> v1::StatusResponse {
    let mut client = SchedulerClient::connect(http_uri(scheduler))
        .await
        .expect("reach the scheduler");
    client
        .status(v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner()
}

/// Waits until every registered worker reports at least `step`.
async fn wait_for_step(scheduler: &str, workers: usize, step: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = status(scheduler).await;
        if s.workers.len() == workers && s.workers.iter().all(|w| w.last_step >= step) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "workers did not reach step {step}: {:?}",
            s.workers
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_worker_mid_run_lets_the_other_two_finish() {
    let scheduler = ServerProcess::start_scheduler(&[
        "--workers",
        "3",
        "--servers",
        "2",
        "--heartbeat-timeout-ms",
        "2000",
    ])
    .await;
    let servers = [
        ServerProcess::start(&["--scheduler", &scheduler.addr, "--workers", "3"]).await,
        ServerProcess::start(&["--scheduler", &scheduler.addr, "--workers", "3"]).await,
    ];
    let epochs = ["--epochs", "60"];
    let mut workers: Vec<Child> = (0..3).map(|_| worker(&scheduler.addr, &epochs)).collect();
    wait_for_step(&scheduler.addr, 3, 40).await;

    let mut victim = workers.pop().unwrap();
    victim.kill().await.expect("kill -9 a worker");
    let killed_at = Instant::now();
    for survivor in workers {
        let output = tokio::time::timeout(Duration::from_secs(180), survivor.wait_with_output())
            .await
            .expect("a survivor hung")
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "a survivor failed:\n{stderr}");
        let last = String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        let summary: serde_json::Value = serde_json::from_str(&last)
            .unwrap_or_else(|_| panic!("no JSON summary: {last:?}\n{stderr}"));
        assert!(
            summary["test_accuracy"].as_f64().unwrap() >= 0.95,
            "{summary}"
        );
    }
    eprintln!(
        "survivors finished {:?} after the kill",
        killed_at.elapsed()
    );
    let s = status(&scheduler.addr).await;
    let dead = s.workers.iter().filter(|w| !w.alive && !w.left).count();
    let left = s.workers.iter().filter(|w| w.left).count();
    assert_eq!(
        (dead, left),
        (1, 2),
        "the killed worker is declared dead, the finished ones left: {:?}",
        s.workers
    );
    for server in servers {
        server.stop().await;
    }
    scheduler.stop().await;
}

#[tokio::test]
async fn a_worker_with_no_servers_fails_within_its_deadline_naming_what_is_missing() {
    let scheduler = ServerProcess::start_scheduler(&["--workers", "1", "--servers", "2"]).await;
    let started = Instant::now();
    let lonely = run(
        binary("ps-worker"),
        &["--server", &scheduler.addr, "--pull-timeout-secs", "2"],
        Duration::from_secs(60),
    )
    .await;
    assert!(!lonely.success);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        lonely.stderr.contains("0 of 2 servers registered"),
        "{}",
        lonely.stderr
    );
    scheduler.stop().await;
}

#[tokio::test]
async fn status_prints_servers_with_their_load_and_workers() {
    let scheduler = ServerProcess::start_scheduler(&["--workers", "1", "--servers", "1"]).await;
    let server = ServerProcess::start(&["--scheduler", &scheduler.addr]).await;
    let trained = run(
        binary("ps-worker"),
        &["--server", &scheduler.addr, "--epochs", "1", "--json"],
        Duration::from_secs(120),
    )
    .await;
    assert!(trained.success, "{}", trained.stderr);
    let printed = run(
        binary("ps-scheduler"),
        &["status", "--scheduler", &scheduler.addr],
        Duration::from_secs(30),
    )
    .await;
    assert!(printed.success, "{}", printed.stderr);
    assert!(
        printed.stdout.contains("shard map version"),
        "{}",
        printed.stdout
    );
    assert!(
        printed.stdout.contains(&server.addr),
        "the server is listed: {}",
        printed.stdout
    );
    assert!(
        printed.stdout.contains("1.00x"),
        "one server carries all the load: {}",
        printed.stdout
    );
    assert!(printed.stdout.contains("last step"), "{}", printed.stdout);
    server.stop().await;
    scheduler.stop().await;
}
