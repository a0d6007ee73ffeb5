//! A shared-memory session served by the server's own session loop over a
//! real region, driven from the worker's rings by hand: an answer larger
//! than the ring's free space, to a request the worker gave up, holds up
//! neither the requests behind it nor their answers, nor the session's end.

use bytes::Bytes;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use ps_shm::handshake::in_process_ends;
use ps_shm::{AnswerRing, Closed, RequestRing, worker_rings};

use super::*;

/// Elements of `w`: 400 KB, past the 64 KiB rings and lent when pulled.
const ELEMENTS: usize = 100_000;

fn key() -> Vec<v1::KeyRef> {
    vec![v1::KeyRef {
        name: "w".into(),
        part: 0,
    }]
}

fn pull(id: u64) -> v1::SessionRequest {
    let pull = v1::PullRequest {
        keys: key(),
        ..v1::PullRequest::default()
    };
    v1::SessionRequest {
        id,
        deadline_ms: 0,
        op: Some(Op::Pull(pull)),
    }
}

/// Worker 0's step-0 push to `w` of gradients all `value`.
fn push(id: u64, value: f32) -> v1::SessionRequest {
    let grad = v1::Tensor {
        name: "w".into(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![ELEMENTS as u64],
        data: Bytes::from(value.to_le_bytes().repeat(ELEMENTS)),
    };
    let push = v1::PushRequest {
        worker_id: 0,
        step: 0,
        grads: vec![grad],
        map_version: 0,
    };
    v1::SessionRequest {
        id,
        deadline_ms: 0,
        op: Some(Op::Push(push)),
    }
}

/// Waits for `future`, failing the test instead of hanging it.
async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), future)
        .await
        .expect("stuck for 10 s")
}

/// A session over 64 KiB rings, served by [`serve`] on a service of `config`
/// holding `w`; the worker's rings, and the serving task.
async fn served(
    config: ServerConfig,
) -> (
    (RequestRing, AnswerRing, Closed),
    tokio::task::JoinHandle<()>,
) {
    let (service, _store) = crate::fuzzing::w_service(ELEMENTS as u64, config);
    let (server, worker, _) = in_process_ends(1 << 16).await.unwrap();
    let serving = tokio::spawn(serve(
        server,
        service,
        BufferPool::new(),
        CancellationToken::new(),
    ));
    (worker_rings(worker, u64::MAX), serving)
}

/// The worker sends a pull, and gives it up: its 400 KB answer, more than
/// the answer ring holds, is not read. Reading no answers, it then sends a
/// 400 KB push, more than the request ring holds, which is written whole
/// only as the server reads it. The server reads it while the pull's answer
/// waits for room (a session that waited for that room itself, reading
/// nothing, would never be read from again), applies it, and both answers
/// come in order once the worker reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_larger_than_the_ring_waits_beside_the_requests_behind_it() {
    let ((requests, answers, _closed), _serving) = served(ServerConfig::default()).await;
    within(requests.send(pull(1))).await.unwrap();
    within(requests.send(push(2, 1.0))).await.unwrap();

    let (given_up, rest) = within(answers.lock().await.next()).await.unwrap();
    assert_eq!(given_up.message.id, 1);
    assert!(rest.is_none(), "400 KB of values are lent");
    drop(given_up);
    let (pushed, _) = within(answers.lock().await.next()).await.unwrap();
    assert_eq!(pushed.message.id, 2);
    let Some(Outcome::Push(pushed)) = pushed.message.outcome else {
        panic!("the push was not applied: {:?}", pushed.message);
    };
    assert!(pushed.keys[0].accepted, "{pushed:?}");

    // The session goes on: the values pulled next took the push once.
    within(requests.send(pull(3))).await.unwrap();
    let (pulled, _) = within(answers.lock().await.next()).await.unwrap();
    let pulled = within(pulled.into_whole()).await.unwrap();
    assert_eq!(pulled.id, 3);
    let Some(Outcome::Pull(pulled)) = pulled.outcome else {
        panic!("the pull failed: {pulled:?}");
    };
    let data = &pulled.tensors[0].tensor.as_ref().unwrap().data;
    assert_eq!(data.len(), ELEMENTS * 4);
    let stepped = data
        .chunks_exact(4)
        .all(|v| f32::from_le_bytes(v.try_into().unwrap()) == -0.1);
    assert!(stepped, "not one SGD step of lr 0.1 from zero");
}

/// The worker gives up a pull whose answer waits for room it never frees,
/// then sends nothing: the session ends at its idle timeout, and its socket
/// closes then, with the answer still unwritten (a session that waited for
/// the answer to be written first would hold the region, and the socket
/// open, for as long as the worker does not read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_with_an_answer_waiting_for_room_closes_its_socket() {
    let mut config = ServerConfig::default();
    config.transport.idle_connection_timeout = Some(std::time::Duration::from_millis(200));
    let ((requests, _answers, closed), serving) = served(config).await;
    within(requests.send(pull(1))).await.unwrap();
    within(serving).await.unwrap();
    assert_eq!(
        within(closed.wait()).await,
        "the other process closed its socket"
    );
}
