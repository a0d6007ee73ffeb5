//! Shard maps end to end: a worker leaving shrinks the BSP group on the servers, and
//! a request routed with an outdated map is refused, refreshed and retried.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_client::ParamBytes;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, PsClient};
use ps_cluster::LocalServers;
use ps_proto::codec::DType;
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::transport::http_uri;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_scheduler::SchedulerConfig;
use ps_server::ServerConfig;

async fn scheduler(workers: u32) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = SchedulerConfig {
        workers: workers.into(),
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_secs(2),
        ..SchedulerConfig::default()
    };
    tokio::spawn(ps_scheduler::run(listener, config, std::future::pending()));
    addr
}

fn f32s(values: &[f32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_map_is_refused_then_refreshed_and_the_group_shrinks() {
    stale_map_refused_then_refreshed(2).await;
}

/// The same with a 128 KiB key, pushed and pulled as framed streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_map_is_refused_on_a_framed_stream_then_refreshed() {
    stale_map_refused_then_refreshed(32 << 10).await;
}

/// A worker of a key of `len` elements pushes with a map that a second
/// worker's leaving made stale: refused with the new version, refreshed, and
/// the gradient taken exactly once.
async fn stale_map_refused_then_refreshed(len: usize) {
    let addr = scheduler(2).await;
    let servers = LocalServers::start_following(
        1,
        ServerConfig {
            workers: 2,
            ..ServerConfig::default()
        },
        Some(&addr),
    )
    .await
    .unwrap();
    let mut client = PsClient::connect(ClientConfig {
        scheduler: Some(addr.clone()),
        ..ClientConfig::new(Vec::new())
    })
    .await
    .unwrap();
    assert_eq!(client.join("worker-a").await.unwrap().rank, Rank(0));
    client
        .place(&[ParamInfo {
            name: "w".into(),
            shape: vec![len],
            dtype: DType::F32,
        }])
        .await
        .unwrap();
    client
        .register(
            &[ParamBytes::new("w", f32s(&vec![1.0; len]))],
            &ps_client::sgd(1.0),
        )
        .await
        .unwrap();

    // A second worker joins and leaves: the map drops it and gets a new version.
    let mut raw = SchedulerClient::connect(http_uri(&addr)).await.unwrap();
    let b = raw
        .register_worker(v1::RegisterWorkerRequest {
            client_id: "worker-b".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let node = Some(v1::heartbeat_request::Node::WorkerRank(b.rank));
    raw.leave(v1::HeartbeatRequest {
        node,
        step: 0,
        secret: b.secret,
        ..v1::HeartbeatRequest::default()
    })
    .await
    .unwrap();
    let current = raw
        .get_shard_map(v1::GetShardMapRequest {
            min_version: 2,
            timeout_ms: 5_000,
        })
        .await
        .unwrap()
        .into_inner()
        .version;
    let current = MapVersion(current);

    // The worker hears of the new version through its heartbeats.
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.newer_map() != Some(current) {
        assert!(
            Instant::now() < deadline,
            "the worker never heard of map version {current}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Until the server applies the new map, pushes with the old one go through; after,
    // they are refused with the version to fetch.
    let grads = [ParamBytes::new("w", f32s(&vec![0.5; len]))];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut taken_before = 0;
    let stale = loop {
        match client.push(Rank(0), Step(0), &grads).await {
            Err(error) => break error,
            Ok(taken) => {
                taken_before += taken;
                assert!(
                    Instant::now() < deadline,
                    "the server never learned of map version {current}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(stale.stale_map(), Some(current), "{stale}");
    assert!(stale.to_string().contains("stale shard map"), "{stale}");

    client.refresh(current).await.unwrap();
    let taken_after = client.push(Rank(0), Step(0), &grads).await.unwrap();
    assert_eq!(
        taken_before + taken_after,
        1,
        "the gradient is taken exactly once, before or after the refresh"
    );
    let pulled = client.pull(Version(1)).await.unwrap();
    assert_eq!(
        pulled["w"].values,
        vec![0.5; len],
        "step 0 completed with the one live worker, applied once"
    );
    servers.shutdown().await.unwrap();
}
