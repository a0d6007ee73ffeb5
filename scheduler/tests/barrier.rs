//! Barriers over real gRPC: released when every live worker arrives (and the
//! waits counted in the metrics), released when the missing one leaves, and a
//! timeout that names who is missing.

use std::time::Duration;

use ps_proto::transport::http_uri;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_scheduler::SchedulerConfig;
use tonic::Code;
use tonic::transport::Channel;

/// A scheduler with workers 0 and 1 registered, and each one's registration secret.
async fn scheduler_with_two_workers() -> (SchedulerClient<Channel>, Vec<String>) {
    let (client, secrets, _) = scheduler_with_metrics().await;
    (client, secrets)
}

/// [`scheduler_with_two_workers`], and the address of its metrics.
async fn scheduler_with_metrics() -> (SchedulerClient<Channel>, Vec<String>, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap().to_string();
    let config = SchedulerConfig {
        workers: 2.into(),
        ..SchedulerConfig::default()
    };
    let serving =
        ps_scheduler::run_with_metrics(listener, Some(metrics), config, std::future::pending());
    tokio::spawn(serving);
    let mut client = SchedulerClient::connect(http_uri(&addr)).await.unwrap();
    let mut secrets = Vec::new();
    for id in ["a", "b"] {
        let registered = client
            .register_worker(v1::RegisterWorkerRequest {
                client_id: id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        secrets.push(registered.secret);
    }
    (client, secrets, metrics_addr)
}

/// The metrics text at `addr` (`GET /metrics` over HTTP/1.1).
async fn metrics_text(addr: &str) -> String {
    let (status, body) = ps_common::metrics::http_get(addr, "/metrics")
        .await
        .expect("an HTTP answer");
    format!("{status}\n{body}")
}

fn barrier(name: &str, rank: u32, timeout_ms: u64) -> v1::BarrierRequest {
    v1::BarrierRequest {
        name: name.into(),
        rank,
        timeout_ms,
    }
}

#[tokio::test]
async fn a_barrier_releases_when_every_live_worker_arrives() {
    let (client, _, metrics) = scheduler_with_metrics().await;
    let mut first = client.clone();
    let waiting = tokio::spawn(async move { first.barrier(barrier("start", 0, 30_000)).await });
    let second = client
        .clone()
        .barrier(barrier("start", 1, 30_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.workers, vec![0, 1]);
    let first = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.into_inner().workers, vec![0, 1]);
    let text = metrics_text(&metrics).await;
    assert!(
        text.contains("candle_ps_scheduler_barrier_wait_duration_seconds_count 2"),
        "both waits counted:\n{text}"
    );
}

#[tokio::test]
async fn a_barrier_times_out_naming_the_missing_worker() {
    let (client, _) = scheduler_with_two_workers().await;
    let status = client
        .clone()
        .barrier(barrier("epoch-1", 0, 100))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(
        status.message().contains("epoch-1") && status.message().contains("[1]"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn a_barrier_stops_waiting_for_a_worker_that_leaves() {
    let (client, secrets) = scheduler_with_two_workers().await;
    let mut first = client.clone();
    let waiting = tokio::spawn(async move { first.barrier(barrier("end", 0, 30_000)).await });
    let node = Some(v1::heartbeat_request::Node::WorkerRank(1));
    client
        .clone()
        .leave(v1::HeartbeatRequest {
            node,
            step: 0,
            secret: secrets[1].clone(),
            ..v1::HeartbeatRequest::default()
        })
        .await
        .unwrap();
    let released = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(released.into_inner().workers, vec![0]);
}

#[tokio::test]
async fn a_shard_map_wait_names_what_is_missing() {
    let (mut client, _) = scheduler_with_two_workers().await;
    let status = client
        .get_shard_map(v1::GetShardMapRequest {
            min_version: 1,
            timeout_ms: 100,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(
        status.message().contains("0 of 1 servers registered"),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("declared the parameters"),
        "{}",
        status.message()
    );
}
