//! Health, shutdown, and the `ps-server` binary as a real process.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use ps_proto::transport::{TransportConfig, http_uri};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[tokio::test]
async fn health_service_reports_serving() {
    let server = TestServer::default().await;
    let channel = TransportConfig::default()
        .endpoint(http_uri(&server.addr.to_string()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "ps.v1.ParameterServer"] {
        let request = HealthCheckRequest {
            service: service.into(),
        };
        let status = health.check(request).await.unwrap().into_inner().status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    server.stop().await;
}

#[tokio::test]
async fn shutdown_ends_waiting_pulls_with_unavailable() {
    let mut server = TestServer::default().await;
    server.register(vec![param("w", &[0.0], sgd(1.0))]).await;
    let mut client = server.client.clone();
    let waiting = tokio::spawn(async move { client.pull(pull_request(&["w"], 5, 600_000)).await });
    server.begin_stop();
    // Whether the pull was already waiting or arrived during shutdown, it must end
    // promptly with UNAVAILABLE instead of holding shutdown for its 10-minute timeout.
    let outcome = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("pull still waiting");
    assert_eq!(outcome.unwrap().unwrap_err().code(), Code::Unavailable);
    tokio::time::timeout(Duration::from_secs(30), server.join())
        .await
        .expect("server did not stop")
        .unwrap();
}

/// Reads the server's log until it names the address it listens on.
fn listening_addr(stderr: &mut impl BufRead) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "ps-server exited before listening"
        );
        if line.contains("ps-server listening") {
            let addr = line.split("addr=").nth(1).expect("log names addr");
            return addr.split_whitespace().next().unwrap().to_string();
        }
    }
}

/// Multi-threaded, so the client's connection keeps running while this test blocks
/// reading the child's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_and_exits_cleanly_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["--listen", "127.0.0.1:0", "--workers", "2"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let addr = listening_addr(&mut stderr);
    let channel = TransportConfig::default()
        .endpoint(http_uri(&addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ps_proto::v1::parameter_server_client::ParameterServerClient::new(channel);
    let stats = client
        .stats(ps_proto::v1::StatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.workers, stats.consistency.as_str()), (2, "bsp"));
    let health = health_subcommand(&addr);
    assert!(health.status.success(), "{health:?}");
    assert!(String::from_utf8_lossy(&health.stdout).contains("healthy"));

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest: Vec<String> = stderr.lines().map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit {status:?}; log: {rest:#?}");
    assert!(rest.iter().any(|l| l.contains("SIGTERM")), "{rest:#?}");
    assert!(
        rest.iter().any(|l| l.contains("ps-server stopped")),
        "{rest:#?}"
    );
    let health = health_subcommand(&addr);
    assert!(!health.status.success(), "a stopped server is not healthy");
    let message = String::from_utf8_lossy(&health.stderr);
    assert!(
        message.contains("unhealthy") && message.contains(&addr),
        "{message}"
    );
}

/// `ps-server health --server ADDR`, the container health check.
fn health_subcommand(addr: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["health", "--server", addr])
        .output()
        .unwrap()
}

#[test]
fn binary_refuses_bad_flags_with_a_clear_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["--listen", "127.0.0.1:0", "--consistency", "sync"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("use bsp, asp or ssp:K"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["--listen", "127.0.0.1:0", "--workers", "0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--workers must be at least 1"));
}

#[tokio::test]
async fn join_group_hands_out_stable_ranks_until_the_group_is_full() {
    let config = ps_server::ServerConfig {
        workers: 2,
        ..Default::default()
    };
    let server = TestServer::start(config).await;
    let join = |id: &str| {
        let mut client = server.client.clone();
        let request = ps_proto::v1::JoinGroupRequest {
            client_id: id.into(),
            ..Default::default()
        };
        async move { client.join_group(request).await }
    };
    assert_eq!(join("first").await.unwrap().into_inner().rank, 0);
    let second = join("second").await.unwrap().into_inner();
    assert_eq!(
        (second.rank, second.workers, second.consistency.as_str()),
        (1, 2, "bsp")
    );
    assert_eq!(
        join("first").await.unwrap().into_inner().rank,
        0,
        "a retry keeps its rank"
    );
    let full = join("third").await.unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted);
    assert!(full.message().contains("--workers"), "{}", full.message());
    server.stop().await;
}

#[tokio::test]
async fn a_worker_started_for_another_group_is_refused_when_it_joins() {
    let config = ps_server::ServerConfig {
        workers: 2,
        ..Default::default()
    };
    let server = TestServer::start(config).await;
    use ps_proto::v1::JoinGroupRequest;
    let asking = |expected_workers, expected_consistency: &str, rank| JoinGroupRequest {
        client_id: "worker".into(),
        expected_workers,
        expected_consistency: expected_consistency.into(),
        rank,
    };
    // (request, code, words the message must hold)
    let cases = [
        (
            asking(3, "", None),
            Code::FailedPrecondition,
            "workers 2, but the worker was started with workers 3",
        ),
        (
            asking(0, "asp", None),
            Code::FailedPrecondition,
            "--consistency",
        ),
        (
            asking(2, "", Some(2)),
            Code::InvalidArgument,
            "outside this server's group of 2",
        ),
        (
            asking(0, "nonsense", None),
            Code::InvalidArgument,
            "expected_consistency",
        ),
    ];
    for (request, code, words) in cases {
        let refused = server
            .client
            .clone()
            .join_group(request.clone())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), code, "{request:?}: {}", refused.message());
        assert!(
            refused.message().contains(words),
            "{request:?}: {}",
            refused.message()
        );
    }
    let joined = server
        .client
        .clone()
        .join_group(asking(2, "bsp", Some(1)))
        .await
        .expect("a matching worker joins with the rank it chose")
        .into_inner();
    assert_eq!((joined.rank, joined.workers), (1, 2));
    server.stop().await;
}

#[tokio::test]
async fn binary_refuses_a_scheduler_address_that_is_not_a_scheduler() {
    // Another parameter server where the scheduler should be.
    let other = TestServer::start(ps_server::ServerConfig::default()).await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["--listen", "127.0.0.1:0", "--scheduler"])
        .arg(other.addr.to_string())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success(), "it must not serve forever");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("is a candle-ps parameter server (ps-server), not a candle-ps scheduler"),
        "{stderr}"
    );
    other.stop().await;
}

#[test]
fn binary_waits_for_its_scheduler_up_to_the_connect_timeout() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let output = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--connect-timeout",
            "500ms",
            "--scheduler",
            &addr,
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("never came up") && stderr.contains(&addr),
        "{stderr}"
    );
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_and_the_open_ones_keep_working() {
    let mut config = ps_server::ServerConfig::default();
    config.transport.max_connections = 1;
    let server = TestServer::start(config).await;
    server.register(vec![param("w", &[1.0], sgd(1.0))]).await;
    let second = TransportConfig::default()
        .endpoint(http_uri(&server.addr.to_string()))
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = second {
        let mut client = ps_proto::v1::parameter_server_client::ParameterServerClient::new(channel);
        let refused = client.stats(ps_proto::v1::StatsRequest {}).await;
        assert!(
            refused.is_err(),
            "a second connection was served: {refused:?}"
        );
    }
    assert_eq!(
        server.stats().await.keys,
        1,
        "the first connection still works"
    );
    server.stop().await;
}

/// A server with an idle limit of `idle` and a BSP group of two workers.
async fn server_closing_idle_connections(idle: Duration) -> TestServer {
    let mut config = ps_server::ServerConfig {
        workers: 2,
        ..ps_server::ServerConfig::default()
    };
    config.transport.idle_connection_timeout = Some(idle);
    TestServer::start(config).await
}

/// A connection that opens HTTP/2 and then asks nothing is closed by the
/// server once the idle limit has passed, not before. A client whose own
/// connection was closed the same way finds out on its next call (tonic
/// reports the closed connection once, as `CANCELLED`); candle-ps's clients
/// take that as transient and retry, and the retry reconnects and is served.
#[tokio::test]
async fn a_connection_that_asks_nothing_is_closed_after_the_idle_limit() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let idle = Duration::from_millis(300);
    let server = server_closing_idle_connections(idle).await;
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    // The client preface and an empty SETTINGS frame, then nothing.
    silent
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let opened = std::time::Instant::now();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(30), silent.read_to_end(&mut sink)).await;
    assert!(
        closed.is_ok(),
        "the silent connection was still open after 30 s"
    );
    let lasted = opened.elapsed();
    assert!(
        lasted >= idle,
        "closed after {lasted:?}, before the idle limit"
    );
    // The test's own client was idle as long: retried as PsClient retries, it
    // reconnects and is served.
    let stats = ps_client::retry::RetryPolicy::default()
        .run("Stats", || {
            let mut client = server.client.clone();
            async move { client.stats(ps_proto::v1::StatsRequest {}).await }
        })
        .await;
    assert_eq!(
        stats.expect("served after reconnecting").into_inner().keys,
        0
    );
    server.stop().await;
}

/// A pull the server holds for a BSP step longer than the idle limit keeps
/// its connection: a request in flight is not idleness.
#[tokio::test]
async fn a_pull_held_past_the_idle_limit_keeps_its_connection() {
    let server = server_closing_idle_connections(Duration::from_millis(200)).await;
    // Worker 1 pushes on a connection of its own, so that the held pull is
    // all the first connection carries.
    let other = TransportConfig::default()
        .endpoint(http_uri(&server.addr.to_string()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let other = ps_proto::v1::parameter_server_client::ParameterServerClient::new(other);
    a_held_pull_outlasts_the_idle_limit(&server, other).await;
    server.stop().await;
}
