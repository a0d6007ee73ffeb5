//! Exactly-once gradient application under injected faults. Four workers push
//! 1,000 steps each (of a small key, on the session stream or as unary calls) or 150 (of a 128 KiB key,
//! pushed as framed streams of 32 KiB chunks) through [`FaultyProxy`], which delays traffic and cuts
//! connections as answers come back (so the server applied a push whose
//! acknowledgement was lost, and the client retries it); every seventh push is
//! also sent twice on purpose. Under ASP with SGD (lr 1) every push of a gradient
//! of ones lowers each value by exactly 1, so the final values count the pushes
//! applied: any double application or loss would show, exactly, in f32.

use std::time::Duration;

use bytes::Bytes;
use ps_client::ParamBytes;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, PsClient, Recovery, Repair, optim};
use ps_cluster::servers::LocalServers;
use ps_proto::codec::DType;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::v1;
use ps_server::{Consistency, ServerConfig};
use ps_tests::faults::{FaultPlan, FaultyProxy};

const WORKERS: u32 = 4;

/// The key pushed: its length, the pushes each worker makes, and whether
/// pushes that fit one message travel on the session stream.
#[derive(Debug, Clone, Copy)]
struct Key {
    len: usize,
    steps: u64,
    session: bool,
}

/// A key small enough for one message, pushed on the session stream.
const SMALL: Key = Key {
    len: 8,
    steps: 1000,
    session: true,
};
/// The same key, each push a unary call.
const SMALL_UNARY: Key = Key {
    session: false,
    ..SMALL
};
/// A 128 KiB key, pushed as framed streams of four chunks.
const LARGE: Key = Key {
    len: 32 << 10,
    steps: 150,
    session: true,
};

fn ones(key: Key) -> Vec<ParamBytes> {
    let bytes: Vec<u8> = std::iter::repeat_n(1.0f32.to_le_bytes(), key.len)
        .flatten()
        .collect();
    vec![ParamBytes::new("w", Bytes::from(bytes))]
}

async fn client(addr: &str, key: Key) -> PsClient {
    let mut config = ClientConfig::new(vec![addr.to_string()]);
    config.chunk_bytes = 32 << 10;
    config.session = key.session;
    // The faults are the wire's: shared memory would go around the proxy.
    config.data_path = ps_shm::DataPathMode::Grpc;
    let mut client = PsClient::connect(config)
        .await
        .expect("connect through the proxy");
    let info = ParamInfo {
        name: "w".into(),
        shape: vec![key.len],
        dtype: DType::F32,
    };
    client.place(&[info]).await.expect("place");
    client
}

/// Pushes `(worker, step)` until the server acknowledges it, as the trainer does
/// when the client's own retries run out; returns how many keys took it.
async fn push_until_acknowledged(client: &PsClient, key: Key, worker: u32, step: u64) -> usize {
    let grads = ones(key);
    for _ in 0..20 {
        match client.push(Rank(worker), Step(step), &grads).await {
            Ok(accepted) => return accepted,
            Err(error) => assert_eq!(
                error.recovery(Step(step)),
                Recovery::Repair(Repair::ServerLost),
                "a non-transient failure: {error}"
            ),
        }
    }
    panic!("push ({worker}, {step}) was never acknowledged");
}

/// Returns how many pushes the worker sent twice on purpose.
async fn worker(addr: String, key: Key, rank: u32) -> u64 {
    let client = client(&addr, key).await;
    let mut repeated = 0;
    for step in 0..key.steps {
        push_until_acknowledged(&client, key, rank, step).await;
        if step % 7 == 0 {
            let again = push_until_acknowledged(&client, key, rank, step).await;
            assert_eq!(again, 0, "a repeated push ({rank}, {step}) was taken again");
            repeated += 1;
        }
    }
    repeated
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gradient_is_applied_exactly_once_through_cuts_delays_and_duplicates() {
    applied_exactly_once(SMALL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unary_gradient_is_applied_exactly_once_through_cuts_delays_and_duplicates() {
    applied_exactly_once(SMALL_UNARY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_streamed_gradient_is_applied_exactly_once_through_cuts_delays_and_duplicates() {
    applied_exactly_once(LARGE).await;
}

/// Workers push `key` through the faulty proxy; every push must be applied
/// exactly once.
async fn applied_exactly_once(key: Key) {
    let config = ServerConfig {
        consistency: Consistency::Asp,
        workers: 1,
        ..ServerConfig::default()
    };
    let servers = LocalServers::start(1, config).await.expect("a server");
    let server = servers.addrs()[0].parse().expect("an address");
    let plan = FaultPlan {
        cut_response: 0.02,
        delay: 0.1,
        max_delay: Duration::from_millis(2),
        seed: 0x00C0_FFEE,
    };
    let proxy = FaultyProxy::start(server, plan).await.expect("a proxy");
    let direct = client(&servers.addrs()[0], key).await;
    let zeros = vec![ParamBytes::new("w", Bytes::from(vec![0u8; key.len * 4]))];
    direct
        .register(&zeros, &optim::sgd(1.0))
        .await
        .expect("register");

    let tasks: Vec<_> = (0..WORKERS)
        .map(|rank| tokio::spawn(worker(proxy.addr.to_string(), key, rank)))
        .collect();
    let mut repeated = 0;
    for task in tasks {
        repeated += task.await.expect("a worker task panicked");
    }

    let pushes = u64::from(WORKERS) * key.steps;
    let pulled = direct.pull(Version(0)).await.expect("pull directly");
    let w = &pulled["w"];
    assert_eq!(
        w.version,
        Version(pushes),
        "ASP: one version per applied push"
    );
    assert!(
        w.values.iter().all(|&v| v == -(pushes as f32)),
        "each of {pushes} pushes applied exactly once gives -{pushes}, got {:?}",
        w.values
    );
    let mut raw = v1::parameter_server_client::ParameterServerClient::connect(format!(
        "http://{}",
        servers.addrs()[0]
    ))
    .await
    .expect("stats client");
    let stats = raw
        .stats(v1::StatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    let retried_after_applying = stats.duplicate_pushes - repeated;
    eprintln!(
        "{pushes} pushes, {} connections cut, {repeated} sent twice on purpose, {retried_after_applying} retried after the server had applied them",
        proxy.cuts()
    );
    assert!(
        proxy.cuts() > 0,
        "the proxy cut nothing; the test tested nothing"
    );
    assert!(
        retried_after_applying > 0,
        "no acknowledgement was lost after an applied push; the faults missed their target"
    );
    drop(proxy);
    servers.shutdown().await.expect("clean shutdown");
}
