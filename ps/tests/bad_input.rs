//! Every kind of bad input gets a precise status and a message a person can act
//! on, and leaves the stored values, versions and push counts exactly as they were.

mod common;

use common::*;
use ps_proto::v1;
use ps_server::{Consistency, ServerConfig};
use tonic::{Code, Status};

/// What a bad request must not change.
#[derive(Debug, PartialEq)]
struct Snapshot {
    values: Vec<(Vec<f32>, u64)>,
    keys: u64,
    pushes: u64,
}

async fn snapshot(server: &TestServer) -> Snapshot {
    let stats = server.stats().await;
    let mut values = Vec::new();
    for key in &stats.key_stats {
        values.push(server.values(&key.name).await);
    }
    Snapshot {
        values,
        keys: stats.keys,
        pushes: stats.pushes,
    }
}

/// A server with `w` (3 elements) and `v` (2 elements), both SGD.
async fn server_with_keys(config: ServerConfig) -> TestServer {
    let server = TestServer::start(config).await;
    server
        .register(vec![
            param("w", &[1.0, 2.0, 3.0], sgd(0.1)),
            param("v", &[5.0, 6.0], sgd(0.1)),
        ])
        .await;
    server
}

fn assert_status(result: Result<impl std::fmt::Debug, Status>, code: Code, needles: &[&str]) {
    let status = result.expect_err("request must be refused");
    assert_eq!(status.code(), code, "{}", status.message());
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "message {:?} lacks {needle:?}",
            status.message()
        );
    }
}

async fn refused_push(server: &TestServer, request: v1::PushRequest, code: Code, needles: &[&str]) {
    let before = snapshot(server).await;
    assert_status(server.client.clone().push(request).await, code, needles);
    assert_eq!(
        snapshot(server).await,
        before,
        "a refused push changed the state"
    );
}

#[tokio::test]
async fn unknown_key_is_not_found() {
    let server = server_with_keys(ServerConfig::default()).await;
    refused_push(
        &server,
        push(0, 0, vec![tensor("nope", &[1.0])]),
        Code::NotFound,
        &["`nope`", "register"],
    )
    .await;
    assert_status(
        server
            .client
            .clone()
            .pull(pull_request(&["nope"], 0, 0))
            .await,
        Code::NotFound,
        &["`nope`"],
    );
    server.stop().await;
}

#[tokio::test]
async fn wrong_dtype_is_invalid_argument() {
    let server = server_with_keys(ServerConfig::default()).await;
    let mut grad = tensor("w", &[0.0; 3]);
    grad.dtype = v1::DType::DtypeF16 as i32;
    grad.data = bytes::Bytes::from(vec![0u8; 6]);
    refused_push(
        &server,
        push(0, 0, vec![grad]),
        Code::InvalidArgument,
        &["is f32", "gradient is f16"],
    )
    .await;
    for dtype in [0, 17] {
        let mut grad = tensor("w", &[0.0; 3]);
        grad.dtype = dtype;
        refused_push(
            &server,
            push(0, 0, vec![grad]),
            Code::InvalidArgument,
            &["dtype"],
        )
        .await;
    }
    server.stop().await;
}

#[tokio::test]
async fn wrong_shape_is_invalid_argument() {
    let server = server_with_keys(ServerConfig::default()).await;
    refused_push(
        &server,
        push(0, 0, vec![tensor("w", &[1.0, 1.0])]),
        Code::InvalidArgument,
        &["[3]", "[2]"],
    )
    .await;
    let mut overflow = tensor("w", &[]);
    overflow.shape = vec![u64::MAX, u64::MAX];
    refused_push(
        &server,
        push(0, 0, vec![overflow]),
        Code::InvalidArgument,
        &["too many elements"],
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn data_length_not_matching_shape_is_invalid_argument() {
    let server = server_with_keys(ServerConfig::default()).await;
    let mut grad = tensor("w", &[1.0, 1.0, 1.0]);
    grad.data = grad.data.slice(0..10);
    refused_push(
        &server,
        push(0, 0, vec![grad]),
        Code::InvalidArgument,
        &["10 bytes", "needs 12 bytes"],
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn non_finite_gradients_are_refused_by_default() {
    let server = server_with_keys(ServerConfig::default()).await;
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let request = push(0, 0, vec![tensor("w", &[0.0, bad, 0.0])]);
        refused_push(
            &server,
            request,
            Code::InvalidArgument,
            &["non-finite", "element 1", "--allow-non-finite"],
        )
        .await;
    }
    server.stop().await;
}

#[tokio::test]
async fn non_finite_gradients_are_taken_when_allowed() {
    let config = ServerConfig {
        reject_non_finite: false,
        ..ServerConfig::default()
    };
    let server = server_with_keys(config).await;
    server
        .client
        .clone()
        .push(push(0, 0, vec![tensor("w", &[0.0, f32::INFINITY, 0.0])]))
        .await
        .unwrap();
    let (values, version) = server.values("w").await;
    assert_eq!(version, 1);
    assert_eq!(values[1], f32::NEG_INFINITY);
    server.stop().await;
}

#[tokio::test]
async fn non_finite_initial_values_are_refused() {
    let server = TestServer::default().await;
    let result = server
        .client
        .clone()
        .register(v1::RegisterRequest {
            map_version: 0,
            restore_version: 0,
            params: vec![param("w", &[f32::NAN], sgd(0.1))],
        })
        .await;
    assert_status(
        result,
        Code::InvalidArgument,
        &["initial value", "non-finite"],
    );
    assert_eq!(server.stats().await.keys, 0);
    server.stop().await;
}

#[tokio::test]
async fn step_from_the_future_under_bsp_is_failed_precondition() {
    let server = server_with_keys(ServerConfig::default()).await;
    refused_push(
        &server,
        push(0, 3, vec![tensor("w", &[1.0; 3])]),
        Code::FailedPrecondition,
        &["step 3", "from the future", "version 0"],
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn worker_outside_the_group_is_invalid_argument() {
    let config = ServerConfig {
        workers: 2,
        ..ServerConfig::default()
    };
    let server = server_with_keys(config).await;
    refused_push(
        &server,
        push(2, 0, vec![tensor("w", &[1.0; 3])]),
        Code::InvalidArgument,
        &["worker 2", "group of 2"],
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_bad_key_in_a_push_leaves_the_good_keys_unchanged() {
    let server = server_with_keys(ServerConfig::default()).await;
    let request = push(0, 0, vec![tensor("w", &[1.0; 3]), tensor("v", &[1.0; 5])]);
    refused_push(&server, request, Code::InvalidArgument, &["`v`"]).await;
    let request = push(0, 0, vec![tensor("w", &[1.0; 3]), tensor("w", &[1.0; 3])]);
    refused_push(&server, request, Code::InvalidArgument, &["more than once"]).await;
    server.stop().await;
}

#[tokio::test]
async fn message_over_the_size_limit_is_refused_before_it_is_read() {
    let mut config = ServerConfig::default();
    config.transport.max_message_bytes = 64 << 10;
    config.chunk_bytes = 32 << 10;
    let server = TestServer::start(config).await;
    server
        .register(vec![param("a", &vec![0.0; 12_000], sgd(0.1))])
        .await;
    server
        .register(vec![param("b", &vec![0.0; 12_000], sgd(0.1))])
        .await;
    let before = snapshot(&server).await;
    let request = push(
        0,
        0,
        vec![
            tensor("a", &vec![1.0; 12_000]),
            tensor("b", &vec![1.0; 12_000]),
        ],
    );
    assert_status(
        server.client.clone().push(request).await,
        Code::OutOfRange,
        &["too large", "limit"],
    );
    assert_eq!(snapshot(&server).await, before);
    server.stop().await;
}

#[tokio::test]
async fn unary_pull_over_the_limit_points_to_pull_stream() {
    let mut config = ServerConfig::default();
    config.transport.max_message_bytes = 64 << 10;
    config.chunk_bytes = 32 << 10;
    let server = TestServer::start(config).await;
    for name in ["p0", "p1", "p2"] {
        server
            .register(vec![param(name, &vec![0.0; 6000], sgd(0.1))])
            .await;
    }
    let result = server
        .client
        .clone()
        .pull(pull_request(&["p0", "p1", "p2"], 0, 0))
        .await;
    assert_status(result, Code::ResourceExhausted, &["PullStream"]);
    server.stop().await;
}

#[tokio::test]
async fn empty_requests_are_invalid_argument() {
    let server = server_with_keys(ServerConfig::default()).await;
    refused_push(
        &server,
        push(0, 0, vec![]),
        Code::InvalidArgument,
        &["empty request", "no gradients"],
    )
    .await;
    let pull = server.client.clone().pull(pull_request(&[], 0, 0)).await;
    assert_status(pull, Code::InvalidArgument, &["no keys"]);
    let register = server
        .client
        .clone()
        .register(v1::RegisterRequest {
            map_version: 0,
            restore_version: 0,
            params: vec![],
        })
        .await;
    assert_status(register, Code::InvalidArgument, &["no parameters"]);
    let no_spec = v1::RegisterRequest {
        map_version: 0,
        restore_version: 0,
        params: vec![v1::ParameterInit {
            spec: None,
            initial: bytes::Bytes::new(),
        }],
    };
    assert_status(
        server.client.clone().register(no_spec).await,
        Code::InvalidArgument,
        &["without a spec"],
    );
    let empty_stream = server
        .client
        .clone()
        .push_stream(tokio_stream::iter(Vec::<v1::PushChunk>::new()))
        .await;
    assert_status(empty_stream, Code::InvalidArgument, &["no chunks"]);
    server.stop().await;
}

#[tokio::test]
async fn bad_optimizers_are_invalid_argument() {
    let server = TestServer::default().await;
    let mut no_optimizer = spec("w", &[1], sgd(0.1));
    no_optimizer.optimizer = None;
    let cases = [
        (
            v1::ParameterInit {
                spec: Some(no_optimizer),
                initial: bytes::Bytes::new(),
            },
            "no optimizer",
        ),
        (param("w", &[1.0], sgd(-1.0)), "learning rate"),
        (param("w", &[1.0], sgd(f64::NAN)), "learning rate"),
    ];
    for (init, needle) in cases {
        let result = server
            .client
            .clone()
            .register(v1::RegisterRequest {
                map_version: 0,
                restore_version: 0,
                params: vec![init],
            })
            .await;
        assert_status(result, Code::InvalidArgument, &[needle]);
    }
    assert_eq!(server.stats().await.keys, 0);
    server.stop().await;
}

#[tokio::test]
async fn refusals_are_counted() {
    let config = ServerConfig {
        consistency: Consistency::Bsp,
        ..ServerConfig::default()
    };
    let server = server_with_keys(config).await;
    let _ = server
        .client
        .clone()
        .push(push(0, 0, vec![tensor("nope", &[1.0])]))
        .await;
    let _ = server.client.clone().pull(pull_request(&[], 0, 0)).await;
    assert_eq!(server.stats().await.rejected, 2);
    server.stop().await;
}

#[tokio::test]
async fn a_tensor_over_the_size_limit_is_resource_exhausted() {
    let server = TestServer::default().await;
    let huge = v1::ParameterInit {
        spec: Some(spec("huge", &[1 << 40], sgd(0.1))),
        initial: bytes::Bytes::new(),
    };
    let result = server
        .client
        .clone()
        .register(v1::RegisterRequest {
            map_version: 0,
            restore_version: 0,
            params: vec![huge],
        })
        .await;
    assert_status(
        result,
        Code::ResourceExhausted,
        &["--max-tensor", "partition"],
    );
    assert_eq!(server.stats().await.keys, 0);
    server.stop().await;
}

#[tokio::test]
async fn a_push_stream_for_an_unknown_key_is_refused_at_its_first_chunk() {
    let server = server_with_keys(ServerConfig::default()).await;
    let (chunks, rx) = tokio::sync::mpsc::channel(4);
    let first = v1::PushChunk {
        map_version: 0,
        worker_id: 0,
        step: 0,
        chunk: Some(v1::TensorChunk {
            name: "nope".into(),
            part: 0,
            dtype: v1::DType::DtypeF32 as i32,
            shape: vec![1 << 20],
            offset: 0,
            data: f32_bytes(&[1.0; 1024]),
        }),
    };
    chunks.send(first).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    // `chunks` stays open: the answer must come without the rest of the stream.
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        server.client.clone().push_stream(stream),
    )
    .await
    .expect("the server waited for the rest of a stream it should refuse");
    assert_status(answer, Code::NotFound, &["`nope`"]);
    drop(chunks);
    server.stop().await;
}
