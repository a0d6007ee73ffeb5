//! Every kind of bad input gets a precise status and a message a person can act
//! on, and leaves the stored values, versions and push counts exactly as they were:
//! as a unary call and as a request on a session stream alike.

mod common;

use common::*;
use ps_proto::v1;
use ps_server::ServerConfig;
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

fn assert_status(
    result: Result<impl std::fmt::Debug, Status>,
    code: Code,
    needles: &[&str],
    what: &str,
) {
    let status = result.expect_err(what);
    assert_eq!(status.code(), code, "{what}: {}", status.message());
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{what}: message {:?} lacks {needle:?}",
            status.message()
        );
    }
}

/// A request that must be refused, what it must be refused with, and what the
/// message must say.
struct Refusal<R> {
    what: &'static str,
    request: R,
    code: Code,
    needles: &'static [&'static str],
}

fn refusal<R>(
    what: &'static str,
    request: R,
    code: Code,
    needles: &'static [&'static str],
) -> Refusal<R> {
    Refusal {
        what,
        request,
        code,
        needles,
    }
}

fn with_dtype(dtype: i32, data: Vec<u8>) -> v1::Tensor {
    let mut grad = tensor("w", &[0.0; 3]);
    grad.dtype = dtype;
    grad.data = bytes::Bytes::from(data);
    grad
}

fn with_shape(shape: Vec<u64>) -> v1::Tensor {
    let mut grad = tensor("w", &[]);
    grad.shape = shape;
    grad
}

/// Pushes a server with `w` (3 elements) and `v` (2) in a group of 2 must refuse.
fn bad_pushes() -> Vec<Refusal<v1::PushRequest>> {
    let one_grad = |grad: v1::Tensor| push(0, 0, vec![grad]);
    let mut short = tensor("w", &[1.0; 3]);
    short.data = short.data.slice(0..10);
    let mut cases = vec![
        refusal(
            "unknown key",
            one_grad(tensor("nope", &[1.0])),
            Code::NotFound,
            &["`nope`", "register"],
        ),
        refusal(
            "another dtype",
            one_grad(with_dtype(v1::DType::DtypeF16 as i32, vec![0; 6])),
            Code::InvalidArgument,
            &["is f32", "gradient is f16"],
        ),
        refusal(
            "no dtype",
            one_grad(with_dtype(0, vec![0; 12])),
            Code::InvalidArgument,
            &["dtype"],
        ),
        refusal(
            "an unknown dtype",
            one_grad(with_dtype(17, vec![0; 12])),
            Code::InvalidArgument,
            &["dtype"],
        ),
        refusal(
            "another shape",
            one_grad(tensor("w", &[1.0, 1.0])),
            Code::InvalidArgument,
            &["[3]", "[2]"],
        ),
        refusal(
            "a shape whose element count overflows",
            one_grad(with_shape(vec![u64::MAX, u64::MAX])),
            Code::InvalidArgument,
            &["too many elements"],
        ),
        refusal(
            "data shorter than the shape",
            one_grad(short),
            Code::InvalidArgument,
            &["10 bytes", "needs 12 bytes"],
        ),
        refusal(
            "a step from the future",
            push(0, 3, vec![tensor("w", &[1.0; 3])]),
            Code::FailedPrecondition,
            &["step 3", "from the future", "version 0"],
        ),
        refusal(
            "a worker outside the group",
            push(2, 0, vec![tensor("w", &[1.0; 3])]),
            Code::InvalidArgument,
            &["worker 2", "group of 2"],
        ),
        refusal(
            "a bad key beside a good one",
            push(0, 0, vec![tensor("w", &[1.0; 3]), tensor("v", &[1.0; 5])]),
            Code::InvalidArgument,
            &["`v`"],
        ),
        refusal(
            "a key twice",
            push(0, 0, vec![tensor("w", &[1.0; 3]), tensor("w", &[1.0; 3])]),
            Code::InvalidArgument,
            &["more than once"],
        ),
        refusal(
            "no gradients",
            push(0, 0, vec![]),
            Code::InvalidArgument,
            &["empty request", "no gradients"],
        ),
    ];
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        cases.push(refusal(
            "a non-finite gradient",
            one_grad(tensor("w", &[0.0, bad, 0.0])),
            Code::InvalidArgument,
            &["non-finite", "element 1", "--allow-non-finite"],
        ));
    }
    cases
}

#[tokio::test]
async fn every_bad_push_is_refused_precisely_and_changes_nothing() {
    let config = ServerConfig {
        workers: 2,
        ..ServerConfig::default()
    };
    let server = server_with_keys(config).await;
    for via in BOTH_WAYS {
        for case in bad_pushes() {
            let before = snapshot(&server).await;
            let result = server.push_via(via, case.request).await;
            let what = format!("{} ({via:?})", case.what);
            assert_status(result, case.code, case.needles, &what);
            assert_eq!(snapshot(&server).await, before, "{what} changed the state");
        }
    }
    let refused = BOTH_WAYS.len() * bad_pushes().len();
    assert_eq!(server.stats().await.rejected, refused as u64);
    server.stop().await;
}

fn register(params: Vec<v1::ParameterInit>) -> v1::RegisterRequest {
    v1::RegisterRequest {
        map_version: 0,
        restore_version: 0,
        params,
    }
}

/// Registrations an empty server must refuse.
fn bad_registrations() -> Vec<Refusal<v1::RegisterRequest>> {
    let without_optimizer = v1::ParameterSpec {
        optimizer: None,
        ..spec("w", &[1], sgd(0.1))
    };
    let init = |spec: v1::ParameterSpec| v1::ParameterInit {
        spec: Some(spec),
        initial: bytes::Bytes::new(),
    };
    vec![
        refusal(
            "a non-finite initial value",
            register(vec![param("w", &[f32::NAN], sgd(0.1))]),
            Code::InvalidArgument,
            &["initial value", "non-finite"],
        ),
        refusal(
            "no optimizer",
            register(vec![init(without_optimizer)]),
            Code::InvalidArgument,
            &["no optimizer"],
        ),
        refusal(
            "a negative learning rate",
            register(vec![param("w", &[1.0], sgd(-1.0))]),
            Code::InvalidArgument,
            &["learning rate"],
        ),
        refusal(
            "a NaN learning rate",
            register(vec![param("w", &[1.0], sgd(f64::NAN))]),
            Code::InvalidArgument,
            &["learning rate"],
        ),
        refusal(
            "a tensor over the size limit",
            register(vec![init(spec("huge", &[1 << 40], sgd(0.1)))]),
            Code::ResourceExhausted,
            &["--max-tensor", "partition"],
        ),
        refusal(
            "no parameters",
            register(vec![]),
            Code::InvalidArgument,
            &["no parameters"],
        ),
        refusal(
            "a parameter without a spec",
            register(vec![v1::ParameterInit {
                spec: None,
                initial: bytes::Bytes::new(),
            }]),
            Code::InvalidArgument,
            &["without a spec"],
        ),
    ]
}

#[tokio::test]
async fn every_bad_registration_is_refused_precisely_and_creates_nothing() {
    let server = TestServer::default().await;
    for case in bad_registrations() {
        let result = server.client.clone().register(case.request).await;
        assert_status(result, case.code, case.needles, case.what);
        assert_eq!(server.stats().await.keys, 0, "{} created a key", case.what);
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_pulls_are_refused_precisely() {
    let server = server_with_keys(ServerConfig::default()).await;
    let cases = [
        refusal(
            "an unknown key",
            pull_request(&["nope"], 0, 0),
            Code::NotFound,
            &["`nope`"],
        ),
        refusal(
            "no keys",
            pull_request(&[], 0, 0),
            Code::InvalidArgument,
            &["no keys"],
        ),
        refusal(
            "a key twice",
            pull_request(&["w", "v", "w"], 0, 0),
            Code::InvalidArgument,
            &["`w`", "more than once"],
        ),
        // Under BSP a key completes one step at a time: version 2 of a key at 0
        // needs two steps, the second of which no worker could have pushed.
        // Refused at once (not after the minute's wait) with the key's version.
        refusal(
            "a pull two steps past the key",
            pull_request(&["w"], 2, 60_000),
            Code::FailedPrecondition,
            &["version 2", "at version 0", "offer this worker's copy"],
        ),
    ];
    for via in BOTH_WAYS {
        for case in &cases {
            let result = server.pull_via(via, case.request.clone()).await;
            let what = format!("{} ({via:?})", case.what);
            assert_status(result, case.code, case.needles, &what);
        }
        let ahead = server
            .pull_via(via, pull_request(&["w"], 2, 60_000))
            .await
            .unwrap_err();
        let key_version = ps_proto::metadata::version_in(&ahead, ps_proto::metadata::KEY_VERSION);
        assert_eq!(
            key_version,
            Some(0),
            "{via:?}: the refusal names the key's version"
        );
    }
    let empty_stream = server
        .client
        .clone()
        .push_stream(tokio_stream::iter(Vec::<v1::PushChunk>::new()))
        .await;
    assert_status(
        empty_stream,
        Code::InvalidArgument,
        &["no chunks"],
        "an empty stream",
    );
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
    for via in BOTH_WAYS {
        assert_status(
            server.push_via(via, request.clone()).await,
            Code::OutOfRange,
            &["too large", "limit"],
            &format!("an oversized message ({via:?})"),
        );
    }
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
    assert_status(
        result,
        Code::ResourceExhausted,
        &["PullStream"],
        "a unary pull over the limit",
    );
    server.stop().await;
}

/// Sends `chunk` as the first of a push stream that stays open, and checks that
/// the answer comes without the rest of the stream.
async fn refused_at_first_chunk(
    server: &TestServer,
    chunk: v1::TensorChunk,
    code: Code,
    needles: &[&str],
    what: &str,
) {
    let (chunks, rx) = tokio::sync::mpsc::channel(4);
    let first = v1::PushChunk {
        map_version: 0,
        worker_id: 0,
        step: 0,
        chunk: Some(chunk),
    };
    chunks.send(first).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        server.client.clone().push_stream(stream),
    )
    .await
    .unwrap_or_else(|_| panic!("the server waited for the rest of {what}"));
    assert_status(answer, code, needles, what);
    drop(chunks);
}

#[tokio::test]
async fn a_push_stream_is_refused_at_its_first_bad_chunk() {
    let server = server_with_keys(ServerConfig::default()).await;
    let unknown = v1::TensorChunk {
        name: "nope".into(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![1 << 20],
        offset: 0,
        data: f32_bytes(&[1.0; 1024]),
    };
    let what = "a stream for an unknown key";
    refused_at_first_chunk(&server, unknown, Code::NotFound, &["`nope`"], what).await;
    let not_finite = v1::TensorChunk {
        name: "w".into(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![3],
        offset: 0,
        data: f32_bytes(&[1.0, f32::INFINITY]),
    };
    let needles = ["non-finite", "element 1", "`w`"];
    let what = "a stream whose first chunk holds an infinity";
    refused_at_first_chunk(&server, not_finite, Code::InvalidArgument, &needles, what).await;
    assert_eq!(server.values("w").await, (vec![1.0, 2.0, 3.0], 0));
    server.stop().await;
}
