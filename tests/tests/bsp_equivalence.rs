//! The BSP arithmetic, end to end: two workers with batch b on disjoint halves reach
//! the same parameters as one worker with batch 2b on the same samples (SGD with
//! pushes and pulls on the session stream, Adam with unary calls).

use std::collections::BTreeMap;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use ps_client::GroupInfo;
use ps_client::{ClientConfig, PsClient};
use ps_cluster::test_cluster;
use ps_proto::consistency::Consistency;
use ps_proto::ids::Rank;
use ps_proto::v1;
use ps_worker::PsTrainer;
use ps_worker::data::Split;
use ps_worker::data::digits;
use ps_worker::data::rng::SplitMix64;
use ps_worker::model::Mlp;

const BATCH: usize = 16;
const STEPS: usize = 6;

/// An MLP whose variables are set from a fixed seed, the same in every process.
fn seeded_model() -> (VarMap, Mlp) {
    let varmap = VarMap::new();
    let model = Mlp::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        64,
        &[32],
        10,
    )
    .unwrap();
    let mut vars: Vec<_> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let mut rng = SplitMix64::new(11);
    for (_, var) in vars {
        let values: Vec<f32> = (0..var.elem_count()).map(|_| rng.normal() * 0.1).collect();
        var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap())
            .unwrap();
    }
    (varmap, model)
}

fn values(varmap: &VarMap) -> BTreeMap<String, Vec<f32>> {
    let data = varmap.data().lock().unwrap();
    data.iter()
        .map(|(n, v)| {
            (
                n.clone(),
                v.as_tensor().flatten_all().unwrap().to_vec1().unwrap(),
            )
        })
        .collect()
}

/// Trains `STEPS` steps as `rank` of `workers`, step k on `batches[k]`.
async fn train(
    addrs: Vec<String>,
    rank: u32,
    workers: u32,
    batches: Vec<Split>,
    (optimizer, session): (v1::Optimizer, bool),
) -> BTreeMap<String, Vec<f32>> {
    let config = ClientConfig {
        partition_bytes: 1024,
        session,
        ..ClientConfig::new(addrs)
    };
    let client = PsClient::connect(config).await.unwrap();
    let (varmap, model) = seeded_model();
    let group = GroupInfo {
        rank: Rank(rank),
        workers,
        consistency: Consistency::Bsp,
    };
    let mut trainer = PsTrainer::new(client, group, &varmap, optimizer)
        .await
        .unwrap();
    for batch in &batches {
        let (x, y) = batch.to_tensors(&Device::Cpu).unwrap();
        let loss = candle_nn::loss::cross_entropy(&model.forward(&x).unwrap(), &y).unwrap();
        trainer.backward_step(&loss).await.unwrap();
    }
    values(&varmap)
}

/// Checks the equivalence with `optimizer`, each push and pull on the session
/// stream (`session`) or a unary call.
async fn check_equivalence(optimizer: v1::Optimizer, session: bool) {
    let how = (optimizer, session);
    let data = digits::load().unwrap().train;
    let half = |k: usize, which: usize| {
        data.select(&((2 * k + which) * BATCH..(2 * k + which + 1) * BATCH).collect::<Vec<_>>())
    };
    let first: Vec<Split> = (0..STEPS).map(|k| half(k, 0)).collect();
    let second: Vec<Split> = (0..STEPS).map(|k| half(k, 1)).collect();
    let both: Vec<Split> = (0..STEPS)
        .map(|k| data.select(&(2 * k * BATCH..(2 * k + 2) * BATCH).collect::<Vec<_>>()))
        .collect();

    let pair = test_cluster(2, 2).await;
    let (a, b) = tokio::join!(
        tokio::spawn(train(pair.addrs(), 0, 2, first, how)),
        tokio::spawn(train(pair.addrs(), 1, 2, second, how)),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    pair.shutdown().await.unwrap();

    let single = test_cluster(1, 1).await;
    let one = train(single.addrs(), 0, 1, both, how).await;
    single.shutdown().await.unwrap();

    let (initial, _) = seeded_model();
    let initial = values(&initial);
    assert_eq!(a, b, "both workers of a BSP group hold the same parameters");
    let mut moved = 0.0f32;
    for (name, single) in &one {
        for (i, (&two, &one)) in a[name].iter().zip(single).enumerate() {
            assert!(
                (two - one).abs() <= 1e-5 * one.abs().max(1.0),
                "{name}[{i}]: two workers {two}, one worker {one}"
            );
        }
        moved = initial[name]
            .iter()
            .zip(single)
            .fold(moved, |m, (x, y)| m.max((x - y).abs()));
    }
    assert!(
        moved > 1e-3,
        "training must change the parameters for the comparison to mean anything"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_batch_b_equal_one_worker_with_batch_2b_sgd_on_the_session() {
    check_equivalence(ps_client::sgd(0.5), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_batch_b_equal_one_worker_with_batch_2b_adam_unary() {
    check_equivalence(ps_client::adam(0.01), false).await;
}
