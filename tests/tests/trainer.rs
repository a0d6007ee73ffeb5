//! [`PsTrainer`] without sockets: candle variables trained through a real
//! `ps-server` service in this process. The values it loads follow SGD exactly,
//! and a server restarted empty under it is restored from the trainer's own copy
//! without losing or repeating a step.

use std::time::Duration;

use candle_nn::VarMap;
use ps_client::retry::RetryPolicy;
use ps_client::{ClientConfig, GroupInfo, PsClient};
use ps_proto::codec::DType;
use ps_proto::consistency::Consistency;
use ps_proto::ids::{Rank, Step};
use ps_server::config::ServerConfig;
use ps_tests::loopback::Loopback;
use ps_tests::sum_model::{self, step, values};
use ps_worker::trainer::PsTrainer;

/// One worker under BSP training the sum model.
async fn trainer(server: &Loopback) -> (PsTrainer, VarMap) {
    trainer_on_wire(server, 1.0, DType::F32).await
}

/// [`trainer`], `w` starting at `initial`, its values on the wire as `wire`.
async fn trainer_on_wire(server: &Loopback, initial: f64, wire: DType) -> (PsTrainer, VarMap) {
    let mut config = ClientConfig::new(vec!["loopback:1".into()]);
    config.retry = RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    };
    let client = PsClient::over_channels(config, vec![("loopback:1".into(), server.channel())]);
    let group = GroupInfo {
        rank: Rank(0),
        workers: 1,
        consistency: Consistency::Bsp,
    };
    sum_model::trainer_on_wire(client, group, initial, wire).await
}

fn bsp() -> ServerConfig {
    ServerConfig {
        consistency: Consistency::Bsp,
        workers: 1,
        ..ServerConfig::default()
    }
}

#[tokio::test]
async fn each_step_loads_the_values_sgd_gives() {
    let server = Loopback::start(bsp());
    let (mut trainer, varmap) = trainer(&server).await;
    assert!(
        trainer.created_parameters(),
        "the first worker's values are taken"
    );
    for expected in [0.5, 0.0, -0.5] {
        step(&mut trainer, &varmap).await;
        assert_eq!(values(&varmap), vec![expected; 4]);
    }
    assert_eq!(trainer.step(), Step(3));
    server.stop();
}

#[tokio::test]
async fn values_on_a_bf16_wire_go_and_come_back_as_bf16() {
    let server = Loopback::start(bsp());
    // 1 + 2^-10 is not a bf16 (8 bits of precision): it goes out as 1.0.
    let (mut trainer, varmap) = trainer_on_wire(&server, 1.0 + 1.0 / 1024.0, DType::BF16).await;
    assert_eq!(
        values(&varmap),
        vec![1.0; 4],
        "the values came back as bf16"
    );
    for expected in [0.5, 0.0, -0.5] {
        step(&mut trainer, &varmap).await;
        assert_eq!(values(&varmap), vec![expected; 4]);
    }
    server.stop();

    let server = Loopback::start(bsp());
    let (_, varmap) = trainer_on_wire(&server, 1.0 + 1.0 / 1024.0, DType::F32).await;
    assert_eq!(
        values(&varmap),
        vec![1.0 + 1.0 / 1024.0; 4],
        "f32 keeps them"
    );
    server.stop();
}

#[tokio::test]
async fn a_server_restarted_empty_is_restored_from_the_trainers_copy() {
    let server = Loopback::start(bsp());
    let (mut trainer, varmap) = trainer(&server).await;
    step(&mut trainer, &varmap).await;
    step(&mut trainer, &varmap).await;
    assert_eq!(values(&varmap), vec![0.0; 4]);

    server.restart();
    step(&mut trainer, &varmap).await;
    assert_eq!(
        (trainer.step(), values(&varmap)),
        (Step(3), vec![-0.5; 4]),
        "step 2 applied once, on the values of step 1, not on the initial ones"
    );
    step(&mut trainer, &varmap).await;
    assert_eq!(values(&varmap), vec![-1.0; 4]);
    server.stop();
}
