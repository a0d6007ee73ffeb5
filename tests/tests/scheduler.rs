//! The scheduler with real processes: a worker killed mid-run (through shared
//! memory), a worker started before any server, a server of the first map not
//! reachable yet, and `ps-scheduler status`.

use std::time::{Duration, Instant};

use prost::Message;
use ps_proto::transport::http_uri;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_tests::faults::{FaultPlan, FaultyProxy};
use ps_tests::{ServerProcess, binary, peak_rss_bytes, read_log_until, run, spawn_worker};
use tokio::io::{AsyncBufReadExt, BufReader};
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

/// Workers and servers share this host, so their pushes and pulls go through
/// shared memory (`--data-path shm` on both, which fails rather than falling
/// back to gRPC): a worker killed with `kill -9` mid-run, its session's ring
/// possibly half written, is declared dead by its missed heartbeats and the
/// BSP steps complete without it.
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
    let server_args = [
        "--scheduler",
        &scheduler.addr,
        "--workers",
        "3",
        "--data-path",
        "shm",
    ];
    let servers = [
        ServerProcess::start(&server_args).await,
        ServerProcess::start(&server_args).await,
    ];
    let epochs = ["--epochs", "60", "--data-path", "shm"];
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

/// A socket bound on loopback but not listening: connections to its address
/// are refused until [`forward`] listens on it.
fn bound_not_listening() -> (tokio::net::TcpSocket, String) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let addr = socket.local_addr().expect("its address").to_string();
    (socket, addr)
}

/// Listens on `socket` and forwards every connection to `target`.
fn forward(socket: tokio::net::TcpSocket, target: &str) -> FaultyProxy {
    let open = FaultPlan {
        cut_response: 0.0,
        delay: 0.0,
        max_delay: Duration::ZERO,
        seed: 0,
    };
    let listener = socket.listen(64).expect("listen");
    FaultyProxy::start_on(listener, target.parse().expect("a socket address"), open)
        .expect("a proxy")
}

/// An orchestrator (a swarm, Kubernetes) publishes a container's name only once
/// it is healthy, so the first shard map can name a server that cannot be
/// reached yet. The worker waits for it, as it waits for the scheduler, instead
/// of exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waits_for_a_server_of_the_first_map_that_is_not_reachable_yet() {
    let scheduler = ServerProcess::start_scheduler(&["--workers", "1", "--servers", "1"]).await;
    // The address the server is published at refuses connections for now.
    let (published, published_addr) = bound_not_listening();
    let server = ServerProcess::start(&[
        "--scheduler",
        &scheduler.addr,
        "--advertise",
        &published_addr,
    ])
    .await;
    let mut worker = worker(&scheduler.addr, &["--epochs", "2"]);
    let waiting = format!(
        "waiting for a candle-ps parameter server (ps-server) to come up addr=\"{published_addr}\""
    );
    let (_, log) = read_log_until(&mut worker, &waiting).await;
    let _now_up = forward(published, &server.addr);
    let output = tokio::time::timeout(Duration::from_secs(120), worker.wait_with_output())
        .await
        .expect("the worker finishes")
        .expect("wait for the worker");
    let log = log.await.expect("the log");
    assert!(output.status.success(), "{log}");
    assert!(log.contains("ps-server) is up"), "{log}");
    let summary: serde_json::Value =
        serde_json::from_slice(output.stdout.trim_ascii()).expect("a JSON summary");
    assert!(
        summary["test_accuracy"].as_f64().unwrap() > 0.8,
        "{summary}"
    );
    server.stop().await;
    scheduler.stop().await;
}

/// A server that joins a running job is in the next shard map before its
/// address can be reached (an orchestrator publishes the name once the
/// container is healthy; a replacement for a killed task is such a server).
/// Workers wait for it, or for a newer map, instead of spending their repairs
/// at once and exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_wait_for_a_server_that_joins_mid_run_before_its_address_answers() {
    let scheduler = ServerProcess::start_scheduler(&["--workers", "1", "--servers", "1"]).await;
    let first = ServerProcess::start(&["--scheduler", &scheduler.addr]).await;
    let mut worker = worker(&scheduler.addr, &["--epochs", "40"]);
    wait_for_step(&scheduler.addr, 1, 50).await;
    let (published, published_addr) = bound_not_listening();
    let joining = ServerProcess::start(&[
        "--scheduler",
        &scheduler.addr,
        "--advertise",
        &published_addr,
    ])
    .await;
    let (_, log) = read_log_until(&mut worker, "cannot be reached yet").await;
    let _now_up = forward(published, &joining.addr);
    let output = tokio::time::timeout(Duration::from_secs(120), worker.wait_with_output())
        .await
        .expect("the worker finishes")
        .expect("wait for the worker");
    let log = log.await.expect("the log");
    assert!(output.status.success(), "{log}");
    let summary: serde_json::Value =
        serde_json::from_slice(output.stdout.trim_ascii()).expect("a JSON summary");
    assert!(
        summary["test_accuracy"].as_f64().unwrap() > 0.9,
        "{summary}"
    );
    joining.stop().await;
    first.stop().await;
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

/// `ps-scheduler status --watch` refreshes the table every second with the
/// rates in between: a training job shows pushes/s and MB/s on its server and
/// steps/s on its worker, and Ctrl-C (SIGINT) ends it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_shows_push_and_step_rates_while_a_job_runs() {
    let scheduler = ServerProcess::start_scheduler(&["--workers", "1", "--servers", "1"]).await;
    let server = ServerProcess::start(&["--scheduler", &scheduler.addr]).await;
    let mut worker = worker(&scheduler.addr, &["--epochs", "200"]);
    wait_for_step(&scheduler.addr, 1, 20).await;
    let mut watch = tokio::process::Command::new(binary("ps-scheduler"))
        .args(["status", "--watch", "--scheduler", &scheduler.addr])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ps-scheduler status --watch");
    let mut lines = BufReader::new(watch.stdout.take().expect("piped stdout")).lines();
    let (mut pushing, mut stepping, mut seen) = (false, false, Vec::new());
    let rate = |field: Option<&str>| field.and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(pushing && stepping) {
        assert!(
            Instant::now() < deadline,
            "no push or step rates within 60 s:\n{}",
            seen.join("\n")
        );
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a new table within 30 s")
            .expect("read the table")
            .unwrap_or_else(|| panic!("status --watch ended:\n{}", seen.join("\n")));
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A server row: id, address, alive, parts, bytes, load, pushes/s, MB/s, silent.
        if fields.len() == 9 && fields[1] == server.addr {
            pushing |= rate(fields.get(6).copied()) > 0.0 && rate(fields.get(7).copied()) > 0.0;
        }
        // A worker row: rank, alive, last step, steps/s, silent.
        if fields.len() == 5 && fields[1] == "yes" {
            stepping |= rate(fields.get(3).copied()) > 0.0;
        }
        seen.push(line);
    }
    let pid = watch.id().expect("running").to_string();
    let interrupted = tokio::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await
        .expect("run kill");
    assert!(interrupted.success());
    let exit = tokio::time::timeout(Duration::from_secs(10), watch.wait())
        .await
        .expect("status --watch ends on Ctrl-C")
        .expect("wait");
    assert!(exit.success(), "{exit}");
    worker.kill().await.expect("stop the worker");
    server.stop().await;
    scheduler.stop().await;
}

fn declare(names: &[String], elements: u64) -> v1::DeclareParamsRequest {
    v1::DeclareParamsRequest {
        params: names
            .iter()
            .map(|name| v1::DeclaredParam {
                name: name.clone(),
                elements,
                dtype: v1::DType::DtypeF32 as i32,
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_stays_small_under_declare_params_attacks() {
    let scheduler = ServerProcess::start_scheduler(&["--servers", "2", "--workers", "1"]).await;
    let pid = scheduler.pid().expect("running");
    let mut client = SchedulerClient::connect(http_uri(&scheduler.addr))
        .await
        .expect("reach the scheduler");
    for port in [1, 2] {
        let addr = format!("127.0.0.1:{port}");
        client
            .register_server(v1::RegisterServerRequest { addr })
            .await
            .expect("register a server");
    }

    // 1 TiB under one long name: its 262,144 parts would each repeat the name.
    let long = declare(&["n".repeat(256)], 1 << 38);
    let status = client.declare_params(long).await.expect_err("a 70 MB map");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("shard map"), "{status:?}");
    // The elements past every bound: refused before anything is planned.
    let overflow = declare(&["w".into()], u64::MAX);
    let status = client
        .declare_params(overflow)
        .await
        .expect_err("2^64 floats");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // The largest model it takes at once, 256 GiB, gives a map a client reads.
    let names: Vec<String> = (0..4).map(|i| format!("w{i}")).collect();
    client
        .declare_params(declare(&names, 1 << 34))
        .await
        .expect("256 GiB in four parameters");
    let map = client
        .get_shard_map(v1::GetShardMapRequest {
            min_version: 1,
            timeout_ms: 10_000,
        })
        .await
        .expect("the map fits in a message a client reads")
        .into_inner();
    assert_eq!(map.parts.len(), 65_536, "4 MiB parts");
    assert!(map.encoded_len() < 4 << 20);
    let peak = peak_rss_bytes(pid);
    assert!(
        peak < 100 << 20,
        "the scheduler peaked at {} MiB",
        peak >> 20
    );
    scheduler.stop().await;
}
