//! Register, push and pull over real gRPC: optimizer arithmetic, BSP averaging,
//! exactly-once pushes, half precision.

mod common;

use common::*;
use ps_proto::v1;
use ps_server::{Consistency, ServerConfig};
use tonic::Code;

fn bsp(workers: u32) -> ServerConfig {
    ServerConfig {
        workers,
        consistency: Consistency::Bsp,
        ..ServerConfig::default()
    }
}

#[tokio::test]
async fn sgd_push_then_pull_gives_exact_update() {
    let server = TestServer::default().await;
    let created = server
        .register(vec![param("w", &[1.0, 2.0, -3.0], sgd(0.1))])
        .await;
    assert!(created.keys[0].created);
    let response = server
        .client
        .clone()
        .push(push(0, 0, vec![tensor("w", &[1.0, -2.0, 0.5])]))
        .await
        .unwrap();
    assert_eq!(response.get_ref().keys[0].version, 1);
    let pulled = server
        .client
        .clone()
        .pull(pull_request(&["w"], 1, 1000))
        .await
        .unwrap()
        .into_inner();
    let want: Vec<f32> = [(1.0, 1.0), (2.0, -2.0), (-3.0, 0.5)]
        .iter()
        .map(|&(w, g): &(f64, f64)| (w - 0.1 * g) as f32)
        .collect();
    assert_eq!(
        f32_values(&pulled.tensors[0].tensor.as_ref().unwrap().data),
        want
    );
    assert_eq!(pulled.tensors[0].version, 1);
    server.stop().await;
}

#[tokio::test]
async fn adam_over_grpc_matches_float64_reference() {
    let server = TestServer::default().await;
    let init = [0.5f32, -1.0, 2.0, 1.5];
    server.register(vec![param("w", &init, adam(0.01))]).await;
    let mut reference: Vec<f64> = init.iter().map(|&x| x as f64).collect();
    let (mut m, mut v) = (vec![0.0f64; 4], vec![0.0f64; 4]);
    for step in 0..5u64 {
        let grad = [0.3f32 * (step as f32 + 1.0), -0.7, 0.1, 1.3];
        server
            .client
            .clone()
            .push(push(0, step, vec![tensor("w", &grad)]))
            .await
            .unwrap();
        let t = step as i32 + 1;
        for i in 0..4 {
            let g = grad[i] as f64;
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.999 * v[i] + 0.001 * g * g;
            let m_hat = m[i] / (1.0 - 0.9f64.powi(t));
            let v_hat = v[i] / (1.0 - 0.999f64.powi(t));
            reference[i] -= 0.01 * m_hat / (v_hat.sqrt() + 1e-8);
        }
    }
    let (values, version) = server.values("w").await;
    assert_eq!(version, 5);
    for (got, want) in values.iter().zip(&reference) {
        let rel = ((*got as f64) - want).abs() / want.abs();
        assert!(
            rel < 1e-6,
            "got {got}, reference {want}, relative error {rel:e}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn register_is_idempotent_and_conflicts_name_both_specs() {
    let server = TestServer::default().await;
    server
        .register(vec![param("w", &[1.0, 2.0], sgd(0.1))])
        .await;
    let again = server
        .register(vec![param("w", &[9.0, 9.0], sgd(0.1))])
        .await;
    assert!(
        !again.keys[0].created,
        "identical spec keeps the first values"
    );
    assert_eq!(server.values("w").await.0, vec![1.0, 2.0]);

    let conflict = server
        .client
        .clone()
        .register(v1::RegisterRequest {
            map_version: 0,
            restore_version: 0,
            params: vec![param("w", &[1.0, 2.0], sgd(0.5))],
        })
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists);
    assert!(
        conflict.message().contains("lr=0.1") && conflict.message().contains("lr=0.5"),
        "{}",
        conflict.message()
    );

    let wrong_shape = server
        .client
        .clone()
        .register(v1::RegisterRequest {
            map_version: 0,
            restore_version: 0,
            params: vec![param("w", &[1.0, 2.0, 3.0], sgd(0.1))],
        })
        .await
        .unwrap_err();
    assert_eq!(wrong_shape.code(), Code::AlreadyExists);
    assert!(wrong_shape.message().contains("[2]") && wrong_shape.message().contains("[3]"));
    assert_eq!(server.values("w").await, (vec![1.0, 2.0], 0));
    server.stop().await;
}

#[tokio::test]
async fn register_is_all_or_nothing() {
    let server = TestServer::default().await;
    server.register(vec![param("a", &[1.0], sgd(0.1))]).await;
    let err = server
        .client
        .clone()
        .register(v1::RegisterRequest {
            map_version: 0,
            restore_version: 0,
            params: vec![param("b", &[1.0], sgd(0.1)), param("a", &[1.0], adam(0.1))],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(
        server.stats().await.keys,
        1,
        "`b` must not be created when `a` conflicts"
    );
    server.stop().await;
}

#[tokio::test]
async fn bsp_averages_the_group_and_releases_waiting_pulls() {
    let server = TestServer::start(bsp(2)).await;
    server
        .register(vec![param("w", &[0.0, 0.0], sgd(1.0))])
        .await;
    let mut waiting = server.client.clone();
    let asked = std::time::Instant::now();
    let pull = tokio::spawn(async move { waiting.pull(pull_request(&["w"], 1, 30_000)).await });

    server
        .client
        .clone()
        .push(push(0, 0, vec![tensor("w", &[2.0, 4.0])]))
        .await
        .unwrap();
    assert_eq!(
        server.values("w").await,
        (vec![0.0, 0.0], 0),
        "one of two workers pushed: nothing applied"
    );
    server
        .client
        .clone()
        .push(push(1, 0, vec![tensor("w", &[4.0, 0.0])]))
        .await
        .unwrap();

    let answer = pull.await.unwrap().unwrap();
    // The server says how long it held the pull for the step: some of the time
    // since it was asked, never more.
    let waited = ps_proto::metadata::pull_waited(answer.metadata());
    assert!(
        waited > std::time::Duration::ZERO && waited <= asked.elapsed(),
        "{waited:?}"
    );
    let pulled = answer.into_inner();
    assert_eq!(pulled.tensors[0].version, 1);
    assert_eq!(
        f32_values(&pulled.tensors[0].tensor.as_ref().unwrap().data),
        vec![-3.0, -2.0]
    );
    server.stop().await;
}

#[tokio::test]
async fn bsp_pull_timeout_names_the_missing_worker() {
    let server = TestServer::start(bsp(3)).await;
    server.register(vec![param("w", &[0.0], sgd(1.0))]).await;
    server
        .client
        .clone()
        .push(push(0, 0, vec![tensor("w", &[1.0])]))
        .await
        .unwrap();
    server
        .client
        .clone()
        .push(push(2, 0, vec![tensor("w", &[1.0])]))
        .await
        .unwrap();
    let err = server
        .client
        .clone()
        .pull(pull_request(&["w"], 1, 50))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert!(err.message().contains("workers [1]"), "{}", err.message());
    assert!(err.message().contains("version 1"), "{}", err.message());
    server.stop().await;
}

/// One push of a scenario: `(worker, step, gradient, refused with)`.
type Push = (u32, u64, f32, Option<Code>);

/// Pushes to `w` (one element, 0.0, SGD with lr 1) under one consistency model,
/// and the values, version and counts they must leave.
struct Scenario {
    what: &'static str,
    consistency: Consistency,
    workers: u32,
    pushes: &'static [Push],
    values: f32,
    version: u64,
    /// `(pushes answered OK, gradients acknowledged as retries)`.
    counts: (u64, u64),
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        what: "a repeated push is acknowledged and applied once",
        consistency: Consistency::Bsp,
        workers: 1,
        pushes: &[(0, 0, 0.5, None), (0, 0, 0.5, None)],
        values: -0.5,
        version: 1,
        counts: (2, 1),
    },
    Scenario {
        what: "BSP: retries within a step count once in the average",
        consistency: Consistency::Bsp,
        workers: 2,
        pushes: &[
            (0, 0, 2.0, None),
            (0, 0, 2.0, None),
            (0, 0, 2.0, None),
            (1, 0, 0.0, None),
        ],
        values: -1.0,
        version: 1,
        counts: (4, 2),
    },
    Scenario {
        what: "BSP: one of two workers pushed, nothing applied",
        consistency: Consistency::Bsp,
        workers: 2,
        pushes: &[(0, 0, 2.0, None)],
        values: 0.0,
        version: 0,
        counts: (1, 0),
    },
    Scenario {
        what: "ASP: every push is applied at once, from any worker",
        consistency: Consistency::Asp,
        workers: 1,
        pushes: &[(5, 0, 1.0, None), (9, 0, 2.0, None)],
        values: -3.0,
        version: 2,
        counts: (2, 0),
    },
    Scenario {
        what: "SSP(1): a worker runs one step ahead, no further; pushes scaled by 1/2",
        consistency: Consistency::Ssp { staleness: 1 },
        workers: 2,
        pushes: &[
            (0, 0, 2.0, None),
            (0, 1, 2.0, None),
            (0, 2, 2.0, Some(Code::FailedPrecondition)),
        ],
        values: -2.0,
        version: 0,
        counts: (2, 0),
    },
];

#[tokio::test]
async fn each_consistency_model_applies_pushes_as_it_promises() {
    for scenario in SCENARIOS {
        let config = ServerConfig {
            consistency: scenario.consistency,
            workers: scenario.workers,
            ..ServerConfig::default()
        };
        let server = TestServer::start(config).await;
        server.register(vec![param("w", &[0.0], sgd(1.0))]).await;
        for &(worker, step, grad, refused) in scenario.pushes {
            let request = push(worker, step, vec![tensor("w", &[grad])]);
            let answer = server.client.clone().push(request).await;
            assert_eq!(
                answer.err().map(|status| status.code()),
                refused,
                "{}: worker {worker} step {step}",
                scenario.what
            );
        }
        assert_eq!(
            server.values("w").await,
            (vec![scenario.values], scenario.version),
            "{}",
            scenario.what
        );
        let stats = server.stats().await;
        assert_eq!(
            (stats.pushes, stats.duplicate_pushes),
            scenario.counts,
            "{}",
            scenario.what
        );
        server.stop().await;
    }
}

#[tokio::test]
async fn half_precision_parameters_round_trip() {
    use half::f16;
    let server = TestServer::default().await;
    let to_bytes = |values: &[f32]| -> bytes::Bytes {
        values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect()
    };
    let mut spec = spec("h", &[3], sgd(0.5));
    spec.dtype = v1::DType::DtypeF16 as i32;
    let init = v1::ParameterInit {
        spec: Some(spec),
        initial: to_bytes(&[1.0, 2.0, 3.0]),
    };
    server.register(vec![init]).await;
    let grad = v1::Tensor {
        name: "h".into(),
        part: 0,
        dtype: v1::DType::DtypeF16 as i32,
        shape: vec![3],
        data: to_bytes(&[2.0, 2.0, -2.0]),
    };
    server
        .client
        .clone()
        .push(push(0, 0, vec![grad]))
        .await
        .unwrap();
    let pulled = server
        .client
        .clone()
        .pull(pull_request(&["h"], 1, 1000))
        .await
        .unwrap()
        .into_inner();
    let tensor = pulled.tensors[0].tensor.as_ref().unwrap();
    assert_eq!(tensor.dtype, v1::DType::DtypeF16 as i32);
    assert_eq!(tensor.data, to_bytes(&[0.0, 1.0, 4.0]));
    server.stop().await;
}

#[tokio::test]
async fn stats_report_keys_bytes_versions_and_traffic() {
    let server = TestServer::default().await;
    server
        .register(vec![
            param("a", &[0.0; 10], adam(0.1)),
            param("b", &[0.0; 4], sgd(0.1)),
        ])
        .await;
    server
        .client
        .clone()
        .push(push(0, 0, vec![tensor("b", &[1.0; 4])]))
        .await
        .unwrap();
    server.values("a").await;
    let stats = server.stats().await;
    assert_eq!(stats.keys, 2);
    assert_eq!(
        stats.bytes,
        10 * 4 * 3 + 4 * 4,
        "adam keeps values, m and v; sgd only values; an f32 pull shares the values"
    );
    assert_eq!(
        stats.memory_held_bytes,
        10 * (4 * 4 + 4) + 4 * (2 * 4 + 4),
        "charged at registration: values, optimizer state, BSP accumulator and snapshot"
    );
    assert_eq!((stats.pushes, stats.pulls), (1, 1));
    assert_eq!(stats.consistency, "bsp");
    let versions: Vec<(String, u64)> = stats
        .key_stats
        .iter()
        .map(|k| (k.name.clone(), k.version))
        .collect();
    assert_eq!(versions, vec![("a".into(), 0), ("b".into(), 1)]);
    server.stop().await;
}

/// Two workers push and pull concurrently for many steps; every pull must see its
/// version promptly (a lost version notification would make one wait out its timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_bsp_workers_never_miss_a_version() {
    let server = TestServer::start(bsp(2)).await;
    server
        .register(vec![
            param("a", &[0.0; 8], sgd(0.01)),
            param("b", &[0.0; 8], sgd(0.01)),
        ])
        .await;
    let steps = 300u64;
    let workers = (0..2u32).map(|worker| {
        let mut client = server.client.clone();
        tokio::spawn(async move {
            for step in 0..steps {
                let grads = vec![tensor("a", &[1.0; 8]), tensor("b", &[1.0; 8])];
                client.push(push(worker, step, grads)).await.unwrap();
                let pulled = client
                    .pull(pull_request(&["a", "b"], step + 1, 5_000))
                    .await;
                let pulled = pulled
                    .unwrap_or_else(|e| panic!("worker {worker} step {step}: {}", e.message()));
                assert!(pulled.into_inner().tensors.iter().all(|t| t.version > step));
            }
        })
    });
    for worker in workers.collect::<Vec<_>>() {
        worker.await.unwrap();
    }
    assert_eq!(server.values("a").await.1, steps);
    server.stop().await;
}
