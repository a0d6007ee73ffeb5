//! Embedding rows over real gRPC: exactly once through cut connections and
//! repeats (on session streams and as unary calls), BSP equivalence (two workers with batch b step as one with 2b),
//! and bad requests refused with nothing changed.

use std::collections::HashMap;
use std::time::Duration;

use ps_client::table_spec::{RowOptimizerChoice, table, uniform_rows};
use ps_client::{ClientConfig, PsClient, Recovery, Repair};
use ps_cluster::servers::LocalServers;
use ps_common::rng::SplitMix64;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::rows::{bucket_of, encode_ids, encode_rows};
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_server::{Consistency, ServerConfig};
use ps_tests::faults::{FaultPlan, FaultyProxy};
use tonic::Code;

const WIDTH: u32 = 4;

fn config(consistency: Consistency, workers: u32) -> ServerConfig {
    ServerConfig {
        consistency,
        workers,
        ..ServerConfig::default()
    }
}

async fn client_of(addrs: Vec<String>) -> PsClient {
    client_with(addrs, true).await
}

/// A client whose row requests go on session streams (`session`) or as a
/// unary call each.
async fn client_with(addrs: Vec<String>, session: bool) -> PsClient {
    let config = ClientConfig {
        // The faults are the wire's: shared memory would go around the proxy.
        data_path: ps_shm::DataPathMode::Grpc,
        session,
        ..ClientConfig::new(addrs)
    };
    PsClient::connect(config).await.expect("connect")
}

/// A batch of `count` ids drawn from `0..range`, repeats likely.
fn batch(rng: &mut SplitMix64, count: usize, range: usize) -> Vec<u64> {
    (0..count).map(|_| rng.below(range) as u64).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_gradient_is_applied_exactly_once_through_cuts_and_repeats() {
    let servers = LocalServers::start(1, config(Consistency::Asp, 1))
        .await
        .expect("a server");
    let plan = FaultPlan {
        cut_response: 0.03,
        delay: 0.1,
        max_delay: Duration::from_millis(2),
        seed: 0x0005_EED5,
    };
    let proxy = FaultyProxy::start(servers.addrs()[0].parse().unwrap(), plan)
        .await
        .expect("a proxy");
    // Zeros and SGD with lr 1: every push of a row of ones lowers it by one.
    let spec = {
        let mut spec = table(
            "emb",
            WIDTH,
            v1::RowInit::default(),
            RowOptimizerChoice::Sgd.with_lr(1.0),
        );
        spec.buckets = 4;
        spec
    };
    let mut direct = client_of(servers.addrs()).await;
    direct.declare_table(spec.clone()).await.expect("declare");

    let workers = 3u32;
    let steps = 150u64;
    let tasks: Vec<_> = (0..workers)
        .map(|rank| {
            let (addr, spec) = (proxy.addr.to_string(), spec.clone());
            tokio::spawn(async move {
                // Worker 0 makes a unary call per request, the others use
                // their session streams: both survive the cuts exactly once.
                let mut client = client_with(vec![addr], rank != 0).await;
                client
                    .declare_table(spec)
                    .await
                    .expect("declare through the proxy");
                let mut rng = SplitMix64::new(u64::from(rank));
                let mut pushed: HashMap<u64, f32> = HashMap::new();
                for step in 0..steps {
                    let ids = batch(&mut rng, 8, 50);
                    let grads = vec![1.0f32; ids.len() * WIDTH as usize];
                    let repeats = if step % 5 == 0 { 2 } else { 1 };
                    for _ in 0..repeats {
                        push_until_acknowledged(&client, rank, step, &ids, &grads).await;
                    }
                    for id in ids {
                        *pushed.entry(id).or_default() += 1.0;
                    }
                }
                pushed
            })
        })
        .collect();
    let mut expected: HashMap<u64, f32> = HashMap::new();
    for task in tasks {
        for (id, count) in task.await.expect("a worker panicked") {
            *expected.entry(id).or_default() += count;
        }
    }
    let ids: Vec<u64> = (0..50).collect();
    let rows = direct
        .pull_rows("emb", &ids, Version(0))
        .await
        .expect("pull");
    for (id, row) in ids.iter().zip(rows.chunks_exact(WIDTH as usize)) {
        let want = -expected.get(id).copied().unwrap_or(0.0);
        assert!(
            row.iter().all(|v| *v == want),
            "row {id}: {row:?}, want {want}"
        );
    }
    assert!(
        proxy.cuts() > 0,
        "the proxy cut nothing; the test tested nothing"
    );
    // Every push names all 4 buckets, so a push taken before counts 4 times.
    let mut raw = ParameterServerClient::connect(format!("http://{}", servers.addrs()[0]))
        .await
        .unwrap();
    let stats = raw.stats(v1::StatsRequest {}).await.unwrap().into_inner();
    let on_purpose = u64::from(workers) * steps.div_ceil(5);
    let retried_after_applying = stats.duplicate_pushes / 4 - on_purpose;
    eprintln!(
        "{} cuts, {retried_after_applying} row pushes retried after they were applied",
        proxy.cuts()
    );
    assert!(
        retried_after_applying > 0,
        "no acknowledgement was lost after an applied push; the faults missed their target"
    );
    drop(proxy);
    servers.shutdown().await.expect("clean shutdown");
}

async fn push_until_acknowledged(
    client: &PsClient,
    rank: u32,
    step: u64,
    ids: &[u64],
    grads: &[f32],
) {
    for _ in 0..20 {
        match client
            .push_rows("emb", (Rank(rank), Step(step)), ids, grads)
            .await
        {
            Ok(_) => return,
            Err(error) => assert_eq!(
                error.recovery(Step(step)),
                Recovery::Repair(Repair::ServerLost),
                "a non-transient failure: {error}"
            ),
        }
    }
    panic!("row push ({rank}, {step}) was never acknowledged");
}

/// The ids and per-example gradient rows of one step's global batch.
fn global_batch(step: u64, size: usize) -> (Vec<u64>, Vec<f32>) {
    let mut rng = SplitMix64::new(100 + step);
    let ids = batch(&mut rng, size, 40);
    let grads = (0..size * WIDTH as usize).map(|_| rng.normal()).collect();
    (ids, grads)
}

/// Trains `steps` steps of a global batch of `2 * half` examples split over
/// `workers` workers (each pushing the mean over its share of its examples'
/// gradients), pulling before each step as a trainer does; returns the rows
/// of ids `0..40` at the end.
async fn train(workers: u32, half: usize, steps: u64, optimizer: RowOptimizerChoice) -> Vec<f32> {
    let servers = LocalServers::start(2, config(Consistency::Bsp, workers))
        .await
        .expect("servers");
    let spec = {
        let mut spec = table("emb", WIDTH, uniform_rows(0.5, 9), optimizer.with_lr(0.05));
        spec.buckets = 8;
        spec
    };
    let mut clients = Vec::new();
    for _ in 0..workers {
        let mut client = client_of(servers.addrs()).await;
        client.declare_table(spec.clone()).await.expect("declare");
        clients.push(client);
    }
    let share = 2 * half / workers as usize;
    for step in 0..steps {
        let (ids, grads) = global_batch(step, 2 * half);
        let pushes = clients.iter().enumerate().map(|(rank, client)| {
            let mine = &ids[rank * share..(rank + 1) * share];
            let scale = 1.0 / share as f32;
            let width = WIDTH as usize;
            let my_grads: Vec<f32> = grads[rank * share * width..(rank + 1) * share * width]
                .iter()
                .map(|g| g * scale)
                .collect();
            async move {
                client
                    .pull_rows("emb", mine, Version(step))
                    .await
                    .expect("pull");
                let at = (Rank(rank as u32), Step(step));
                client
                    .push_rows("emb", at, mine, &my_grads)
                    .await
                    .expect("push");
            }
        });
        futures::future::join_all(pushes).await;
    }
    let ids: Vec<u64> = (0..40).collect();
    let rows = clients[0]
        .pull_rows("emb", &ids, Version(steps))
        .await
        .expect("final pull");
    servers.shutdown().await.expect("clean shutdown");
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_batch_b_step_as_one_worker_with_batch_2b() {
    for optimizer in [RowOptimizerChoice::Adagrad, RowOptimizerChoice::LazyAdam] {
        let one = train(1, 16, 6, optimizer).await;
        let two = train(2, 16, 6, optimizer).await;
        let start = train(1, 16, 0, optimizer).await;
        let moved = one.iter().zip(&start).filter(|(a, b)| a != b).count();
        assert!(
            moved > one.len() / 2,
            "{optimizer}: only {moved} elements moved"
        );
        for (i, (a, b)) in one.iter().zip(&two).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5,
                "{optimizer}: element {i}: one worker {a}, two {b}"
            );
        }
    }
}

#[tokio::test]
async fn bad_row_requests_are_refused_precisely_and_change_nothing() {
    let servers = LocalServers::start(1, config(Consistency::Asp, 1))
        .await
        .unwrap();
    let addr = servers.addrs()[0].clone();
    let mut raw = ParameterServerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut spec = table(
        "emb",
        WIDTH,
        uniform_rows(0.5, 1),
        RowOptimizerChoice::Sgd.with_lr(1.0),
    );
    spec.buckets = 2;
    spec.max_rows = 100;
    let declare = |spec: v1::TableSpec| v1::DeclareTableRequest {
        table: Some(spec),
        buckets: vec![0, 1],
        ..Default::default()
    };
    raw.declare_table(declare(spec.clone()))
        .await
        .expect("declare");
    let in_bucket = |bucket: u32, count: usize| -> Vec<u64> {
        (0..100)
            .filter(|id| bucket_of(*id, 2) == bucket)
            .take(count)
            .collect()
    };
    let ids = in_bucket(0, 2);
    let pull = v1::PullRowsRequest {
        table: "emb".into(),
        blocks: vec![v1::RowBlock {
            bucket: 0,
            ids: encode_ids(&ids),
            rows: Default::default(),
        }],
        ..Default::default()
    };
    let before = raw.pull_rows(pull.clone()).await.unwrap().into_inner();
    let push = |ids: &[u64], rows: Vec<f32>| v1::PushRowsRequest {
        table: "emb".into(),
        worker_id: 0,
        step: 0,
        blocks: vec![v1::RowBlock {
            bucket: bucket_of(ids.first().copied().unwrap_or(0), 2),
            ids: encode_ids(ids),
            rows: encode_rows(&rows),
        }],
        map_version: 0,
    };
    let width = WIDTH as usize;
    let mut nan = vec![0.5; 2 * width];
    nan[3] = f32::NAN;
    let twice = [ids[0], ids[0]];
    let cases = [
        (push(&twice, vec![1.0; 2 * width]), "appears twice"),
        (push(&[100], vec![1.0; width]), "out of range"),
        (push(&ids, vec![1.0; 2 * width - 1]), "gradient elements"),
        (push(&ids, nan), "non-finite"),
    ];
    for (request, expected) in cases {
        let status = raw.push_rows(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
        assert!(status.message().contains(expected), "{}", status.message());
    }
    let mut wrong_bucket = push(&ids, vec![1.0; 2 * width]);
    wrong_bucket.blocks[0].bucket = 1;
    let status = raw.push_rows(wrong_bucket).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("belongs to bucket 0"),
        "{}",
        status.message()
    );
    let mut unknown = push(&ids, vec![1.0; 2 * width]);
    unknown.table = "nope".into();
    assert_eq!(
        raw.push_rows(unknown).await.unwrap_err().code(),
        Code::NotFound
    );
    let mut wider = spec.clone();
    wider.width = 8;
    let status = raw.declare_table(declare(wider)).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{}", status.message());
    let mut odd_ids = pull.clone();
    odd_ids.blocks[0].ids = vec![0u8; 9].into();
    assert_eq!(
        raw.pull_rows(odd_ids).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let after = raw.pull_rows(pull).await.unwrap().into_inner();
    assert_eq!(after, before, "a refused request changed the rows");
    let stats = raw.stats(v1::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.pushes, 0);
    servers.shutdown().await.unwrap();
}

/// Rows of width 4 under SGD: 16 bytes of values and 24 of index each.
const ROW_BYTES: u64 = 4 * 4 + 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_larger_than_one_servers_budget_trains_across_servers_each_within_its_own() {
    // Room for 6,000 rows per server and a request in flight (8,000 ids and
    // gradient rows take 192 KiB while applied); the job makes 8,000 rows.
    let budget = 6_000 * ROW_BYTES as usize + (256 << 10);
    let config = ServerConfig {
        memory_budget: budget,
        ..config(Consistency::Asp, 1)
    };
    let spec = {
        let mut spec = table(
            "emb",
            WIDTH,
            v1::RowInit::default(),
            RowOptimizerChoice::Sgd.with_lr(0.1),
        );
        spec.buckets = 16;
        spec
    };
    let ids: Vec<u64> = (0..8_000).collect();
    let grads = vec![1.0f32; ids.len() * WIDTH as usize];

    let one = LocalServers::start(1, config.clone()).await.unwrap();
    let mut client = client_of(one.addrs()).await;
    client.declare_table(spec.clone()).await.unwrap();
    let refused = client
        .push_rows("emb", (Rank(0), Step(0)), &ids, &grads)
        .await;
    let error = refused.expect_err("8,000 rows do not fit one server's budget");
    assert!(error.to_string().contains("ResourceExhausted"), "{error}");
    assert!(error.to_string().contains("--memory-budget"), "{error}");
    one.shutdown().await.unwrap();

    let two = LocalServers::start(2, config).await.unwrap();
    let mut client = client_of(two.addrs()).await;
    client.declare_table(spec).await.unwrap();
    for step in 0..3 {
        client
            .push_rows("emb", (Rank(0), Step(step)), &ids, &grads)
            .await
            .unwrap();
    }
    let rows = client.pull_rows("emb", &ids, Version(0)).await.unwrap();
    assert!(
        rows.iter().all(|v| (*v + 0.3).abs() < 1e-6),
        "three steps of SGD on every row"
    );
    let mut held_rows = 0;
    for addr in two.addrs() {
        let mut raw = ParameterServerClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let stats = raw.stats(v1::StatsRequest {}).await.unwrap().into_inner();
        assert!(
            stats.memory_held_bytes <= stats.memory_budget_bytes,
            "{stats:?}"
        );
        held_rows += stats.memory_held_bytes / ROW_BYTES;
        assert!(
            stats.memory_held_bytes > 1_000 * ROW_BYTES,
            "each server holds a share"
        );
    }
    assert_eq!(
        held_rows, 8_000,
        "every row charged once, nothing else held"
    );
    two.shutdown().await.unwrap();
}
