//! Rendezvous against real sockets on loopback: a peer that comes up late is
//! waited for, and one that answers as something else is named at once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ps_common::rendezvous::{Peer, RendezvousError, rendezvous};
use ps_proto::transport::TransportConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// A gRPC server on `listener` whose health service reports `service` serving.
async fn serve_health(listener: TcpListener, service: &'static str) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(service, tonic_health::ServingStatus::Serving)
        .await;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
}

/// An address nothing listens on (bound, then released).
fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.local_addr().expect("address")
}

async fn wait(addr: &str, wanted: &[Peer], timeout: Duration) -> Result<Peer, RendezvousError> {
    let transport = TransportConfig::default();
    rendezvous(addr, wanted, &transport, timeout)
        .await
        .map(|(peer, _)| peer)
}

#[tokio::test]
async fn nothing_listening_times_out_naming_the_address_and_the_flag() {
    let addr = free_addr().to_string();
    let started = Instant::now();
    let error = wait(&addr, &[Peer::ParameterServer], Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the timeout"
    );
    let message = error.to_string();
    assert!(
        matches!(error, RendezvousError::TimedOut { .. }),
        "{message}"
    );
    for words in [
        addr.as_str(),
        "parameter server",
        "--connect-timeout",
        "never came up",
    ] {
        assert!(message.contains(words), "{message}");
    }
}

#[tokio::test]
async fn a_peer_that_comes_up_late_is_waited_for() {
    let addr = free_addr();
    let waiting = tokio::spawn(async move {
        wait(
            &addr.to_string(),
            &[Peer::Scheduler],
            Duration::from_secs(30),
        )
        .await
    });
    let listener = TcpListener::bind(addr)
        .await
        .expect("bind the same address");
    serve_health(listener, Peer::Scheduler.grpc_service()).await;
    let peer = waiting.await.expect("task").expect("the scheduler came up");
    assert_eq!(peer, Peer::Scheduler);
}

#[tokio::test]
async fn a_lone_address_may_be_either_of_two_kinds() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    serve_health(listener, Peer::Scheduler.grpc_service()).await;
    let either = [Peer::ParameterServer, Peer::Scheduler];
    let peer = wait(&addr, &either, Duration::from_secs(10))
        .await
        .expect("up");
    assert_eq!(peer, Peer::Scheduler);
}

#[tokio::test]
async fn peers_that_are_something_else_are_named_at_once() {
    // (what answers, what it must be called)
    let scheduler = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let scheduler_addr = scheduler.local_addr().expect("address").to_string();
    serve_health(scheduler, Peer::Scheduler.grpc_service()).await;
    let foreign = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let foreign_addr = foreign.local_addr().expect("address").to_string();
    serve_health(foreign, "other.v1.Service").await;
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http_addr = http.local_addr().expect("address").to_string();
    tokio::spawn(http_1_server(http));
    let cases = [
        (scheduler_addr, "a candle-ps scheduler (ps-scheduler)"),
        (foreign_addr, "serves none of candle-ps's services"),
        (http_addr, "an HTTP/1 server, which cannot carry gRPC"),
    ];
    for (addr, named) in cases {
        let started = Instant::now();
        let error = wait(&addr, &[Peer::ParameterServer], Duration::from_secs(30))
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, RendezvousError::WrongPeer { .. }),
            "{message}"
        );
        assert!(
            message.contains(named) && message.contains(&addr),
            "{message}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "named at once, not after the timeout"
        );
    }
}

/// Answers every connection as an HTTP/1.1 server would, then closes it.
async fn http_1_server(listener: TcpListener) {
    while let Ok((mut socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buffer = [0u8; 1024];
            let _ = socket.read(&mut buffer).await;
            let answer =
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(answer).await;
        });
    }
}
