//! gRPC on a Unix-domain socket (`ps-server --listen-unix PATH`, workers at
//! `unix:PATH`): the same service as on TCP, with the same values, over TLS
//! too; the socket is its user's alone, needs the cluster token, refuses a
//! second server, and goes when the server stops, within its grace period
//! even with a worker still connected; `ps-server health` and `ps-worker`
//! take the address as a user gives it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, ClientError, ParamBytes, PsClient, optim};
use ps_common::certs::ClusterCerts;
use ps_proto::auth::{ClusterToken, Role};
use ps_proto::codec::DType;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::transport::TransportConfig;
use ps_server::ServerConfig;
use ps_shm::DataPathMode;
use ps_tests::{ServerProcess, binary, run};
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(240);

fn values(len: usize, f: impl Fn(usize) -> f32) -> Bytes {
    (0..len).flat_map(|i| f(i).to_le_bytes()).collect()
}

fn transport(token: Option<&str>, role: Role) -> TransportConfig {
    TransportConfig {
        token: token.map(|t| ClusterToken::new(t).unwrap().presenting(role).unwrap()),
        ..TransportConfig::default()
    }
}

/// An in-process server for one worker, on loopback and on `socket`, with
/// `transport` (its token, its TLS); it stops when `stop` is cancelled, and
/// gives connections left open 1 s.
async fn server(
    socket: &Path,
    transport: TransportConfig,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = ServerConfig {
        workers: 1,
        transport,
        unix_socket: Some(socket.to_path_buf()),
        shutdown_grace: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        ps_server::run(listener, config, stopped)
            .await
            .expect("the server runs");
    });
    // The socket is bound before the server takes requests; wait for the file.
    for _ in 0..500 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(socket.exists(), "the server made no socket within 5 s");
    task
}

async fn client(addr: &str, transport: TransportConfig) -> Result<PsClient, ClientError> {
    let config = ClientConfig {
        transport,
        data_path: DataPathMode::Grpc,
        ..ClientConfig::new(vec![addr.to_string()])
    };
    let mut client = PsClient::connect(config).await?;
    let info = ParamInfo {
        name: "w".into(),
        shape: vec![1000],
        dtype: DType::F32,
    };
    client.place(&[info]).await?;
    Ok(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_at_unix_path_trains_as_over_tcp_and_the_socket_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ps.sock");
    let stop = CancellationToken::new();
    let serving = server(&socket, transport(Some("the-token"), Role::Server), &stop).await;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only the server's user may open it");
    let addr = format!("unix:{}", socket.display());

    let worker = client(&addr, transport(Some("the-token"), Role::Worker))
        .await
        .expect("connect");
    worker
        .register(
            &[ParamBytes::new("w", values(1000, |i| i as f32))],
            &optim::sgd(0.5),
        )
        .await
        .expect("register");
    let grads = [ParamBytes::new("w", values(1000, |i| (i % 3) as f32))];
    assert_eq!(worker.push(Rank(0), Step(0), &grads).await.unwrap(), 1);
    let pulled = worker.pull(Version(1)).await.expect("pull");
    let expected: Vec<f32> = (0..1000).map(|i| i as f32 - 0.5 * (i % 3) as f32).collect();
    assert_eq!(pulled["w"].values, expected);

    // Without the token the socket serves nothing.
    let refused = client(&addr, transport(None, Role::Worker)).await;
    let register = match refused {
        Ok(c) => c
            .register(
                &[ParamBytes::new("w", values(1000, |_| 9.0))],
                &optim::sgd(0.5),
            )
            .await
            .err(),
        Err(error) => Some(error),
    };
    let error = register.expect("refused without the token").to_string();
    assert!(
        error.contains("token") || error.contains("nauthenticated"),
        "{error}"
    );
    let again = worker.pull(Version(1)).await.expect("pull");
    assert_eq!(again["w"].values, expected, "nothing changed");

    drop(worker);
    stop.cancel();
    serving.await.unwrap();
    assert!(
        !socket.exists(),
        "the socket file goes when the server stops"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_runs_over_the_socket_and_a_connection_left_open_ends_within_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ps.sock");
    let tls = ClusterCerts::generate(&[], 1).unwrap().tls_config(true);
    let with_tls = TransportConfig {
        tls: Some(tls),
        ..TransportConfig::default()
    };
    let stop = CancellationToken::new();
    let serving = server(&socket, with_tls.clone(), &stop).await;
    let addr = format!("unix:{}", socket.display());
    let worker = client(&addr, with_tls).await.expect("connect over TLS");
    worker
        .register(
            &[ParamBytes::new("w", values(1000, |_| 1.0))],
            &optim::sgd(1.0),
        )
        .await
        .expect("register");
    let grads = [ParamBytes::new("w", values(1000, |_| 0.25))];
    assert_eq!(worker.push(Rank(0), Step(0), &grads).await.unwrap(), 1);
    let pulled = worker.pull(Version(1)).await.unwrap();
    assert_eq!(pulled["w"].values, vec![0.75; 1000]);
    // A plain client gets nothing from a TLS socket.
    let plain = ClientConfig {
        data_path: DataPathMode::Grpc,
        connect_timeout: Duration::from_secs(1),
        ..ClientConfig::new(vec![addr.clone()])
    };
    assert!(PsClient::connect(plain).await.is_err());

    // The worker stays connected: the server still stops within its grace
    // period (1 s here), and takes its socket file with it.
    let stopping = std::time::Instant::now();
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), serving)
        .await
        .expect("the server stopped")
        .unwrap();
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        !socket.exists(),
        "the socket file goes when the server stops"
    );
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_server_and_ps_worker_take_a_socket_as_users_give_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ps.sock");
    let listen_unix = format!("--listen-unix={}", socket.display());
    let server =
        ServerProcess::start(&["--workers", "1", "--data-path", "grpc", &listen_unix]).await;
    let addr = format!("unix:{}", socket.display());

    let second = run(
        binary("ps-server"),
        &["--listen", "127.0.0.1:0", &listen_unix],
        LIMIT,
    )
    .await;
    assert!(
        !second.success,
        "a second server on the same socket is refused"
    );
    assert!(
        second.stderr.contains("already listens"),
        "{}",
        second.stderr
    );

    let health = run(binary("ps-server"), &["health", "--server", &addr], LIMIT).await;
    assert!(health.success, "health over the socket:\n{}", health.stderr);

    let worker = run(
        binary("ps-worker"),
        &[
            "--server",
            &addr,
            "--epochs",
            "1",
            "--data-path",
            "grpc",
            "--json",
        ],
        LIMIT,
    )
    .await;
    assert!(
        worker.success,
        "ps-worker over the socket:\n{}",
        worker.stderr
    );
    let accuracy = worker.json()["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.8, "one epoch of digits: {accuracy}");

    server.stop().await;
    assert!(
        !socket.exists(),
        "the socket file goes when the server stops"
    );
}
