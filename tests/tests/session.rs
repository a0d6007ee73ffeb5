//! The `Session` stream as a client written from `ps.proto` sees it: answers
//! matched to requests by id and sent as operations finish, a push and pull as
//! one operation, a duplicate id in flight refused, refusals identical to the
//! unary call's, the values a pull sees the same both ways, a stream left with
//! nothing in flight ended at the idle timeout, and the connection it rides on
//! counted against the connection limit.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_cluster::LocalServers;
use ps_proto::transport::{TransportConfig, http_uri};
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use ps_server::{Consistency, ServerConfig};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

/// A client on one connection.
type Client = ParameterServerClient<tonic::transport::Channel>;

/// A BSP server for one worker holding `w`, four f32 zeros, with SGD at lr 1,
/// closing connections idle for `idle`.
async fn server(idle: Option<Duration>) -> (LocalServers, Client) {
    let transport = TransportConfig {
        idle_connection_timeout: idle,
        ..TransportConfig::default()
    };
    server_over(transport).await
}

/// [`server`] with `transport`, and a client on one connection to it.
async fn server_over(transport: TransportConfig) -> (LocalServers, Client) {
    let config = ServerConfig {
        consistency: Consistency::Bsp,
        workers: 1,
        transport,
        ..ServerConfig::default()
    };
    let servers = LocalServers::start(1, config).await.expect("a server");
    let mut client = ParameterServerClient::connect(http_uri(&servers.addrs()[0]))
        .await
        .expect("connect");
    let spec = v1::ParameterSpec {
        name: "w".into(),
        part: 0,
        dtype: ps_proto::codec::DType::F32.to_proto(),
        shape: vec![4],
        optimizer: Some(ps_client::sgd(1.0)),
        whole_shape: Vec::new(),
    };
    let request = v1::RegisterRequest {
        params: vec![v1::ParameterInit {
            spec: Some(spec),
            initial: f32s(&[0.0; 4]),
        }],
        ..v1::RegisterRequest::default()
    };
    client.register(request).await.expect("register");
    (servers, client)
}

fn f32s(values: &[f32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn push(step: u64, value: f32) -> Op {
    Op::Push(v1::PushRequest {
        worker_id: 0,
        step,
        grads: vec![v1::Tensor {
            name: "w".into(),
            part: 0,
            dtype: ps_proto::codec::DType::F32.to_proto(),
            shape: vec![4],
            data: f32s(&[value; 4]),
        }],
        map_version: 0,
    })
}

fn pull_request(name: &str, min_version: u64) -> v1::PullRequest {
    v1::PullRequest {
        keys: vec![v1::KeyRef {
            name: name.into(),
            part: 0,
        }],
        min_version,
        timeout_ms: 10_000,
        ..v1::PullRequest::default()
    }
}

/// An open session: where requests go in and answers come out.
struct Session {
    requests: mpsc::Sender<v1::SessionRequest>,
    answers: Streaming<v1::SessionAnswer>,
}

impl Session {
    async fn open(client: &mut Client) -> Self {
        let (requests, queued) = mpsc::channel(16);
        let answers = client
            .session(ReceiverStream::new(queued))
            .await
            .expect("open a session")
            .into_inner();
        Self { requests, answers }
    }

    async fn send(&self, id: u64, op: Op) {
        let request = v1::SessionRequest {
            id,
            deadline_ms: 0,
            op: Some(op),
        };
        self.requests
            .send(request)
            .await
            .expect("the session takes it");
    }

    async fn answer(&mut self) -> v1::SessionAnswer {
        self.answers
            .message()
            .await
            .expect("an answer")
            .expect("the stream goes on")
    }
}

fn refusal(answer: &v1::SessionAnswer) -> Option<(Code, &str)> {
    match &answer.outcome {
        Some(Outcome::Refusal(r)) => Some((Code::from_i32(r.code), r.message.as_str())),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_come_as_operations_finish_matched_by_id() {
    let (servers, mut client) = server(None).await;
    let mut session = Session::open(&mut client).await;
    // The pull waits for version 1, which only the push that follows makes.
    session.send(7, Op::Pull(pull_request("w", 1))).await;
    session.send(8, push(0, 0.5)).await;
    let first = session.answer().await;
    assert_eq!(first.id, 8, "the push finishes first: {first:?}");
    let Some(Outcome::Push(pushed)) = &first.outcome else {
        panic!("a push answer: {first:?}");
    };
    assert!(pushed.keys[0].accepted);
    let second = session.answer().await;
    assert_eq!(second.id, 7);
    let Some(Outcome::Pull(pulled)) = &second.outcome else {
        panic!("a pull answer: {second:?}");
    };
    assert_eq!(pulled.tensors[0].version, 1);
    assert_eq!(
        pulled.tensors[0].tensor.as_ref().unwrap().data,
        f32s(&[-0.5; 4])
    );
    assert!(second.pull_waited_us > 0, "the pull waited for the push");

    // The values a unary pull sees are the same.
    let unary = client
        .pull(pull_request("w", 1))
        .await
        .expect("pull")
        .into_inner();
    assert_eq!(unary, *pulled);
    drop(session);
    servers.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_pull_applies_the_push_then_answers_the_pull_after_it() {
    let (servers, mut client) = server(None).await;
    let mut session = Session::open(&mut client).await;
    let Op::Push(push) = push(0, 0.25) else {
        unreachable!("push(..) makes a push")
    };
    let both = |push: v1::PushRequest| {
        Op::PushPull(v1::PushPull {
            push: Some(push),
            pull: Some(pull_request("w", 1)),
        })
    };
    session.send(1, both(push.clone())).await;
    let answer = session.answer().await;
    let Some(Outcome::PushPull(response)) = &answer.outcome else {
        panic!("a push_pull answer: {answer:?}");
    };
    assert!(response.push.as_ref().unwrap().keys[0].accepted);
    let pulled = &response.pull.as_ref().unwrap().tensors[0];
    assert_eq!(pulled.version, 1, "the pull saw the push it followed");
    assert_eq!(pulled.tensor.as_ref().unwrap().data, f32s(&[-0.25; 4]));

    // Repeated whole, the push is not applied again and the pull answers.
    session.send(2, both(push.clone())).await;
    let answer = session.answer().await;
    let Some(Outcome::PushPull(again)) = &answer.outcome else {
        panic!("a push_pull answer: {answer:?}");
    };
    assert!(!again.push.as_ref().unwrap().keys[0].accepted);
    assert_eq!(again.pull.as_ref().unwrap().tensors[0].version, 1);

    // A bad push refuses the whole, and changes nothing.
    let mut bad = push;
    bad.step = 1;
    bad.grads[0].shape = vec![5];
    session.send(3, both(bad)).await;
    let (code, _) = refusal(&session.answer().await).expect("a refusal");
    assert_eq!(code, Code::InvalidArgument);
    let unary = client
        .pull(pull_request("w", 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unary.tensors[0].version, 1, "nothing applied");
    drop(session);
    servers.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_id_in_flight_is_refused_and_the_first_goes_on() {
    let (servers, mut client) = server(None).await;
    let mut session = Session::open(&mut client).await;
    session.send(3, Op::Pull(pull_request("w", 1))).await;
    session.send(3, Op::Pull(pull_request("w", 0))).await;
    let duplicate = session.answer().await;
    let (code, message) = refusal(&duplicate).expect("a refusal");
    assert_eq!((duplicate.id, code), (3, Code::InvalidArgument));
    assert!(message.contains("already in flight"), "{message}");
    session.send(4, push(0, 1.0)).await;
    let mut ids = vec![session.answer().await.id, session.answer().await.id];
    ids.sort_unstable();
    assert_eq!(ids, [3, 4], "the first request 3 and the push are answered");
    // Once answered, the id may be used again.
    session.send(3, Op::Pull(pull_request("w", 1))).await;
    assert!(refusal(&session.answer().await).is_none());
    drop(session);
    servers.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_the_unary_calls_and_a_request_without_an_operation_is_refused() {
    let (servers, mut client) = server(None).await;
    let mut session = Session::open(&mut client).await;
    session.send(1, Op::Pull(pull_request("nothing", 0))).await;
    let answer = session.answer().await;
    let unary = client.pull(pull_request("nothing", 0)).await.unwrap_err();
    assert_eq!(refusal(&answer), Some((unary.code(), unary.message())));
    assert_eq!(unary.code(), Code::NotFound);

    let empty = v1::SessionRequest {
        id: 2,
        deadline_ms: 0,
        op: None,
    };
    session.requests.send(empty).await.unwrap();
    let answer = session.answer().await;
    let (code, message) = refusal(&answer).expect("a refusal");
    assert_eq!((answer.id, code), (2, Code::InvalidArgument));
    assert!(
        message.contains("set push, pull, push_pull, pull_rows or push_rows"),
        "{message}"
    );

    // A deadline shorter than the wait ends the pull with DEADLINE_EXCEEDED.
    let waiting = v1::SessionRequest {
        id: 3,
        deadline_ms: 50,
        op: Some(Op::Pull(pull_request("w", 1))),
    };
    session.requests.send(waiting).await.unwrap();
    let answer = session.answer().await;
    assert_eq!(refusal(&answer).map(|r| r.0), Some(Code::DeadlineExceeded));
    drop(session);
    servers.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_nothing_in_flight_ends_at_the_idle_timeout() {
    let idle = Duration::from_millis(300);
    let (servers, mut client) = server(Some(idle)).await;
    let mut session = Session::open(&mut client).await;
    session.send(1, push(0, 1.0)).await;
    assert!(refusal(&session.answer().await).is_none());
    let quiet = Instant::now();
    let ended = session
        .answers
        .message()
        .await
        .expect_err("the server ends it");
    assert_eq!(ended.code(), Code::Cancelled, "{ended:?}");
    assert!(ended.message().contains("sent nothing"), "{ended:?}");
    assert!(quiet.elapsed() >= idle, "ended after {:?}", quiet.elapsed());
    servers.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_rides_on_a_connection_that_counts_against_the_limit() {
    let transport = TransportConfig {
        max_connections: 1,
        ..TransportConfig::default()
    };
    let (servers, mut client) = server_over(transport).await;
    let mut session = Session::open(&mut client).await;
    let second = ParameterServerClient::connect(http_uri(&servers.addrs()[0])).await;
    if let Ok(mut second) = second {
        let refused = second.stats(v1::StatsRequest {}).await;
        assert!(
            refused.is_err(),
            "a second connection was served: {refused:?}"
        );
    }
    session.send(1, push(0, 1.0)).await;
    assert!(
        refusal(&session.answer().await).is_none(),
        "the session's connection still works"
    );
    drop(session);
    servers.shutdown().await.expect("clean shutdown");
}
