//! The BSP arithmetic, end to end: two workers with batch b on disjoint halves reach
//! the same parameters as one worker with batch 2b on the same samples, on each
//! way a step's push and pull can travel: one `PushPull` per server on the
//! session stream (SGD), pipelined in groups of keys on the session stream
//! (momentum, a model too large for one message per server), each segment of
//! a segmented backward pass pushed while the next is computed (SGD), and
//! every key pushed, then every key pulled, with unary calls (Adam). A
//! segmented step also ends with the very values of a plain one.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};
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
use ps_worker::segmented::Cuts;
use ps_worker::trainer::vars_by_name;

const BATCH: usize = 16;
const STEPS: usize = 6;

/// How a step's push and pull travel, and on what model.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// One `PushPull` per server on its session stream.
    PushPull,
    /// Pipelined groups of at most a few parts, on the session stream.
    Pipelined,
    /// Every key pushed, then every key pulled, as unary calls.
    SerialUnary,
    /// Pipelined in groups of one part, the backward pass in two segments,
    /// each segment's gradients pushed as soon as it is differentiated.
    Segmented,
}

impl Path {
    /// The hidden layer: wide enough under `Pipelined` that a server's share
    /// (about 75 KiB) is over what one message carries (64 KiB).
    fn hidden(self) -> usize {
        match self {
            Path::Pipelined | Path::Segmented => 512,
            _ => 32,
        }
    }

    fn client(self, addrs: Vec<String>) -> ClientConfig {
        let defaults = ClientConfig::new(addrs);
        match self {
            Path::PushPull => ClientConfig {
                partition_bytes: 1024,
                ..defaults
            },
            Path::Pipelined => ClientConfig {
                partition_bytes: 4096,
                pipeline_group_bytes: Some(8192),
                ..defaults
            },
            // A group for each 4 KiB part.
            Path::Segmented => ClientConfig {
                partition_bytes: 4096,
                pipeline_group_bytes: Some(4096),
                ..defaults
            },
            Path::SerialUnary => ClientConfig {
                partition_bytes: 1024,
                session: false,
                pipeline: false,
                ..defaults
            },
        }
    }
}

/// An MLP whose variables are set from a fixed seed, the same in every process.
fn seeded_model(hidden: usize) -> (VarMap, Mlp) {
    let varmap = VarMap::new();
    let model = Mlp::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        64,
        &[hidden],
        10,
    )
    .unwrap();
    let vars = vars_by_name(&varmap);
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
    (optimizer, path): (v1::Optimizer, Path),
) -> BTreeMap<String, Vec<f32>> {
    let client = PsClient::connect(path.client(addrs)).await.unwrap();
    let (varmap, model) = seeded_model(path.hidden());
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
        let mut cuts = Cuts::default();
        let segments = if let Path::Segmented = path { 2 } else { 1 };
        let logits = model.forward_cut(&x, segments, &mut cuts).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
        if cuts.is_empty() {
            trainer.backward_step(&loss).await.unwrap();
        } else {
            trainer.backward_segments(&loss, cuts).await.unwrap();
        }
    }
    values(&varmap)
}

/// Checks the equivalence with `optimizer`, each step's push and pull on `path`.
async fn check_equivalence(optimizer: v1::Optimizer, path: Path) {
    let how = (optimizer, path);
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

    let (initial, _) = seeded_model(path.hidden());
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
async fn two_workers_with_batch_b_equal_one_worker_with_batch_2b_sgd_push_pull() {
    check_equivalence(ps_client::sgd(0.5), Path::PushPull).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_batch_b_equal_one_worker_with_batch_2b_momentum_pipelined() {
    check_equivalence(ps_client::momentum(0.1), Path::Pipelined).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_batch_b_equal_one_worker_with_batch_2b_adam_serial_unary() {
    check_equivalence(ps_client::adam(0.01), Path::SerialUnary).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_batch_b_equal_one_worker_with_batch_2b_sgd_segmented() {
    check_equivalence(ps_client::sgd(0.5), Path::Segmented).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segmented_step_ends_with_the_values_of_a_plain_one() {
    let data = digits::load().unwrap().train;
    let batches: Vec<Split> = (0..STEPS)
        .map(|k| data.select(&(k * BATCH..(k + 1) * BATCH).collect::<Vec<_>>()))
        .collect();
    let mut trained = Vec::new();
    for path in [Path::Pipelined, Path::Segmented] {
        let cluster = test_cluster(2, 1).await;
        let how = (ps_client::momentum(0.1), path);
        trained.push(train(cluster.addrs(), 0, 1, batches.clone(), how).await);
        cluster.shutdown().await.unwrap();
    }
    let bits = |values: &BTreeMap<String, Vec<f32>>| {
        values
            .iter()
            .map(|(name, v)| (name.clone(), v.iter().map(|x| x.to_bits()).collect()))
            .collect::<BTreeMap<String, Vec<u32>>>()
    };
    assert_eq!(bits(&trained[0]), bits(&trained[1]), "bit for bit");
}
