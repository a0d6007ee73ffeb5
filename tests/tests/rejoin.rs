//! The races between a worker's step and a cluster that changes under it,
//! reproduced step by step on a real ps-server over loopback:
//! - a worker whose BSP step the group completed without it (it was declared
//!   dead while it stalled, and came back) joins the group at the current step;
//! - a worker whose server restarted and restored a key from an older copy than
//!   the worker holds offers its newer copy and repeats the step.
//!
//! Each made the chaos tests fail now and then; here they happen every time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use candle_nn::VarMap;
use ps_client::GroupInfo;
use ps_client::ParamBytes;
use ps_client::optim::OptimizerChoice;
use ps_client::placement::ParamInfo;
use ps_client::{ClientConfig, PsClient};
use ps_proto::ids::{Rank, Step, Version};
use ps_server::ServerConfig;
use ps_server::service::ParameterService;
use ps_server::store::Store;
use ps_tests::sum_model::{self, step, values};
use ps_worker::trainer::PsTrainer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

/// A BSP server for two workers, with its store (to move its live set), in a
/// runtime of its own so that it can die with all its connections.
struct Server {
    addr: String,
    store: Arc<Store>,
    runtime: tokio::runtime::Runtime,
}

impl Server {
    /// Starts one on a free loopback port.
    async fn start() -> Self {
        Self::start_at("127.0.0.1:0").await
    }

    /// Starts one at `listen` (to restart one at the address it had).
    async fn start_at(listen: &str) -> Self {
        let config = ServerConfig {
            workers: 2,
            ..ServerConfig::default()
        };
        let store = Arc::new(Store::new(config.store_rules(), CancellationToken::new()));
        let service = ParameterService::new(Arc::clone(&store), config, None).into_server();
        let listener = std::net::TcpListener::bind(listen).expect("bind loopback");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("bound address").to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the server");
        let (health, health_service) = tonic_health::server::health_reporter();
        let name = ps_common::rendezvous::Peer::ParameterServer.grpc_service();
        runtime.spawn(async move {
            health
                .set_service_status(name, tonic_health::ServingStatus::Serving)
                .await;
            let listener = TcpListener::from_std(listener).expect("a tokio listener");
            tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
        });
        Self {
            addr,
            store,
            runtime,
        }
    }

    /// Ends it at once, with its listener and every connection, as `kill -9` would.
    async fn kill(self) {
        let runtime = self.runtime;
        tokio::task::spawn_blocking(move || runtime.shutdown_timeout(Duration::from_secs(10)))
            .await
            .expect("the server's runtime shuts down");
    }
}

/// A trainer of one 4-element variable `w` as `rank` of 2, and the variable.
async fn trainer(addr: &str, rank: u32) -> (PsTrainer, VarMap) {
    let client = PsClient::connect(ClientConfig::new(vec![addr.to_string()]))
        .await
        .expect("connect");
    let group = GroupInfo {
        rank: Rank(rank),
        workers: 2,
        consistency: "bsp".parse().expect("bsp"),
    };
    sum_model::trainer(client, group).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_step_completed_without_it_joins_at_the_current_step() {
    let server = Server::start().await;
    let (addr, store) = (server.addr.clone(), Arc::clone(&server.store));
    let ((mut zero, zero_vars), (mut one, one_vars)) =
        tokio::join!(trainer(&addr, 0), trainer(&addr, 1));

    // Step 0 together.
    tokio::join!(step(&mut zero, &zero_vars), step(&mut one, &one_vars));
    assert_eq!((zero.step(), one.step()), (Step(1), Step(1)));

    // Worker 1 is declared dead; worker 0 runs steps 1 and 2 alone.
    store.set_live_workers(BTreeSet::from([Rank(0)]));
    step(&mut zero, &zero_vars).await;
    step(&mut zero, &zero_vars).await;
    assert_eq!(zero.step(), Step(3));

    // Worker 1 is back and pushes its step 1, which the group completed without it.
    store.set_live_workers(BTreeSet::from([Rank(0), Rank(1)]));
    step(&mut one, &one_vars).await;
    assert_eq!(one.step(), Step(3), "worker 1 joins at the group's step");
    assert_eq!(
        values(&one_vars),
        values(&zero_vars),
        "and holds its values"
    );

    // From there on the two step together again, and agree.
    tokio::join!(step(&mut zero, &zero_vars), step(&mut one, &one_vars));
    assert_eq!((zero.step(), one.step()), (Step(4), Step(4)));
    assert_eq!(values(&one_vars), values(&zero_vars));
    // Four SGD steps of lr 0.5 on a gradient of 1, from 1: -1; the skipped
    // push of worker 1 was not applied.
    assert_eq!(values(&zero_vars), vec![-1.0; 4]);
    server.kill().await;
}

/// Worker 0 played by the test: a bare client that pushes gradients of 1.
async fn bare_worker(addr: &str) -> PsClient {
    let mut client = PsClient::connect(ClientConfig::new(vec![addr.to_string()]))
        .await
        .expect("connect");
    let w = ParamInfo {
        name: "w".into(),
        shape: vec![4],
        dtype: ps_proto::codec::DType::F32,
    };
    client.place(&[w]).await.expect("place");
    client
}

fn f32_bytes(value: f32) -> Vec<ParamBytes> {
    let bytes: Vec<u8> = [value; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    vec![ParamBytes::new("w", Bytes::from(bytes))]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_ahead_of_a_restored_key_offers_its_newer_copy() {
    let server = Server::start().await;
    let addr = server.addr.clone();
    let zero = bare_worker(&addr).await;
    let (mut one, one_vars) = trainer(&addr, 1).await;

    // Step 0 together: w = 1 - 0.5 = 0.5 at version 1, which worker 1 loads.
    let ones = f32_bytes(1.0);
    let (pushed, ()) = tokio::join!(
        zero.push(Rank(0), Step(0), &ones),
        step(&mut one, &one_vars)
    );
    pushed.expect("worker 0 pushes step 0");
    assert_eq!((one.step(), values(&one_vars)), (Step(1), vec![0.5; 4]));

    // The server restarts empty at its address; worker 0 restores the key from
    // its copy of version 0, older than worker 1's.
    server.kill().await;
    let server = Server::start_at(&addr).await;
    let sgd = OptimizerChoice::Sgd.with_lr(0.5);
    zero.register_copy(&ones, &sgd, Version(0))
        .await
        .expect("worker 0 restores its old copy");

    // Worker 1 pushes step 1 to a key at version 0: it offers its copy of
    // version 1, then the step completes with worker 0's push.
    let worker_zero = async {
        zero.pull(Version(1))
            .await
            .expect("the key reaches worker 1's version");
        zero.push(Rank(0), Step(1), &f32_bytes(1.0))
            .await
            .expect("worker 0 pushes step 1");
    };
    tokio::join!(worker_zero, step(&mut one, &one_vars));
    assert_eq!(one.step(), Step(2));
    assert_eq!(
        values(&one_vars),
        vec![0.0; 4],
        "0.5 - 0.5: from worker 1's copy, not from 1.0"
    );
    server.kill().await;
}
