//! A worker whose BSP step the group completed without it (it was declared dead
//! while it stalled, and came back) joins the group at the current step instead
//! of failing: the race that made the chaos tests fail about half the time,
//! reproduced here step by step on a real ps-server over loopback, with the
//! server's live set moved the way the scheduler's shard maps move it.

use std::collections::BTreeSet;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarMap};
use ps_server::ServerConfig;
use ps_server::service::ParameterService;
use ps_server::store::Store;
use ps_worker::client::GroupInfo;
use ps_worker::optim::OptimizerChoice;
use ps_worker::trainer::PsTrainer;
use ps_worker::{ClientConfig, PsClient};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

/// A BSP server for two workers whose store the test keeps, to move its live set.
async fn server() -> (String, Arc<Store>, CancellationToken) {
    let config = ServerConfig {
        workers: 2,
        ..ServerConfig::default()
    };
    let stop = CancellationToken::new();
    let store = Arc::new(Store::new(config.store_rules(), stop.clone()));
    let service = ParameterService::new(Arc::clone(&store), config, None).into_server();
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound address").to_string();
    let shutdown = stop.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(listener),
                shutdown.cancelled_owned(),
            ),
    );
    (addr, store, stop)
}

/// A trainer of one 4-element variable `w` as `rank` of 2, and the variable.
async fn trainer(addr: &str, rank: u32) -> (PsTrainer, VarMap) {
    let varmap = VarMap::new();
    varmap
        .get(4, "w", Init::Const(1.0), DType::F32, &Device::Cpu)
        .expect("a variable");
    let client = PsClient::connect(ClientConfig::new(vec![addr.to_string()]))
        .await
        .expect("connect");
    let group = GroupInfo {
        rank,
        workers: 2,
        consistency: "bsp".parse().expect("bsp"),
    };
    let sgd = OptimizerChoice::Sgd.with_lr(0.5);
    let trainer = PsTrainer::new(client, group, &varmap, sgd)
        .await
        .expect("trainer");
    (trainer, varmap)
}

/// One step with the loss `sum(w)`, whose gradient is 1 everywhere.
async fn step(trainer: &mut PsTrainer, varmap: &VarMap) {
    let w = varmap.all_vars().remove(0);
    let loss = w.as_tensor().sum_all().expect("sum");
    trainer.backward_step(&loss).await.expect("a step");
}

fn values(varmap: &VarMap) -> Vec<f32> {
    let w: Tensor = varmap.all_vars().remove(0).as_tensor().clone();
    w.to_vec1().expect("values")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_step_completed_without_it_joins_at_the_current_step() {
    let (addr, store, stop) = server().await;
    let ((mut zero, zero_vars), (mut one, one_vars)) =
        tokio::join!(trainer(&addr, 0), trainer(&addr, 1));

    // Step 0 together.
    tokio::join!(step(&mut zero, &zero_vars), step(&mut one, &one_vars));
    assert_eq!((zero.step(), one.step()), (1, 1));

    // Worker 1 is declared dead; worker 0 runs steps 1 and 2 alone.
    store.set_live_workers(BTreeSet::from([0]));
    step(&mut zero, &zero_vars).await;
    step(&mut zero, &zero_vars).await;
    assert_eq!(zero.step(), 3);

    // Worker 1 is back and pushes its step 1, which the group completed without it.
    store.set_live_workers(BTreeSet::from([0, 1]));
    step(&mut one, &one_vars).await;
    assert_eq!(one.step(), 3, "worker 1 joins at the group's step");
    assert_eq!(
        values(&one_vars),
        values(&zero_vars),
        "and holds its values"
    );

    // From there on the two step together again, and agree.
    tokio::join!(step(&mut zero, &zero_vars), step(&mut one, &one_vars));
    assert_eq!((zero.step(), one.step()), (4, 4));
    assert_eq!(values(&one_vars), values(&zero_vars));
    // Four SGD steps of lr 0.5 on a gradient of 1, from 1: -1; the skipped
    // push of worker 1 was not applied.
    assert_eq!(values(&zero_vars), vec![-1.0; 4]);
    stop.cancel();
}
