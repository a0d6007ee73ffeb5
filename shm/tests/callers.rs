//! The worker's rings driven by requests themselves ([`ps_shm::caller`]): a
//! read cut off before it moved its ring leaves the session as it was; a
//! read or a write cut off midway breaks it: the ring's next user gets an
//! error, and the session closes, so the server ends its side too.

use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use ps_proto::v1;
use ps_proto::v1::session_request::Op;
use ps_shm::handshake::{Offers, ServerEnd, WorkerEnd, admit, connect};
use ps_shm::message::{MessageError, read_message, write_message};
use ps_shm::pool::BufferPool;
use ps_shm::worker_rings;

/// Both ends of a session over a region whose rings hold 64 KiB.
async fn ends() -> (ServerEnd, WorkerEnd) {
    let (offers, listener) = Offers::bind(1 << 16).unwrap();
    let offer = offers.offer().unwrap();
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        admit(&offers, socket, |_| Ok::<_, String>(())).await
    });
    let worker = connect(&offer).await.unwrap();
    let (server, ()) = server.await.unwrap().unwrap();
    (server, worker)
}

/// A push of one gradient of `bytes` bytes, as request `id`.
fn push(id: u64, bytes: usize) -> v1::SessionRequest {
    v1::SessionRequest {
        id,
        deadline_ms: 0,
        op: Some(Op::Push(v1::PushRequest {
            worker_id: 1,
            step: id,
            map_version: 0,
            grads: vec![v1::Tensor {
                name: "w".into(),
                part: 0,
                dtype: v1::DType::DtypeF32 as i32,
                shape: vec![bytes as u64 / 4],
                data: Bytes::from(vec![7u8; bytes]),
            }],
        })),
    }
}

/// An answer to request `id` with no tensors.
fn answer(id: u64) -> v1::SessionAnswer {
    v1::SessionAnswer {
        id,
        outcome: Some(v1::session_answer::Outcome::Push(
            v1::PushResponse::default(),
        )),
        pull_waited_us: 0,
    }
}

/// Waits for `future`, failing the test instead of hanging it.
async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), future)
        .await
        .expect("no answer within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_cut_off_before_it_moved_the_ring_leaves_the_session_as_it_was() {
    let (mut server, worker) = ends().await;
    let (_requests, answers, _closed) = worker_rings(worker, u64::MAX);
    // Nothing to read yet: the read waits without moving the ring.
    let waiting = answers.lock().await.next().now_or_never();
    assert!(waiting.is_none(), "read an answer nobody wrote");
    write_message(&mut server.answers, 1, answer(1))
        .await
        .unwrap();
    let (read, still) = within(answers.lock().await.next()).await.unwrap();
    assert_eq!(read.message, answer(1));
    assert!(still.is_some(), "a small answer gives the ring back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_cut_off_midway_breaks_the_session_and_closes_it() {
    let (mut server, worker) = ends().await;
    let (requests, answers, closed) = worker_rings(worker, u64::MAX);
    // Half an answer: its sizes, its sequence number, and a header cut short.
    let header_bytes = 64u64;
    server.answers.write_word(header_bytes).await.unwrap();
    server.answers.write_word(1).await.unwrap();
    server.answers.write(&[0u8; 16]).await.unwrap();
    server.answers.flush();
    let cut_off = answers.lock().await.next().now_or_never();
    assert!(cut_off.is_none(), "read an answer only half written");

    let broken = within(answers.lock().await.next()).await.unwrap_err();
    assert!(matches!(broken, MessageError::Broken(_)), "{broken}");
    assert_eq!(within(closed.wait()).await, "a ring broke");
    // The server's side sees the socket close.
    let mut byte = [0u8; 1];
    let read = tokio::io::AsyncReadExt::read(&mut server.socket, &mut byte);
    assert_eq!(
        within(read).await.unwrap(),
        0,
        "the worker closed its socket"
    );
    drop(requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_off_midway_breaks_the_request_ring() {
    let (mut server, worker) = ends().await;
    let (requests, _answers, closed) = worker_rings(worker, u64::MAX);
    within(requests.send(push(1, 4096))).await.unwrap();
    let pool = BufferPool::new();
    let first = read_message::<v1::SessionRequest>(&mut server.requests, 1, u64::MAX, &pool);
    within(first).await.unwrap();
    // 200 KB through a 64 KiB ring nobody reads: it fills the ring, then
    // waits for room.
    let cut_off = requests.send(push(2, 200_000)).now_or_never();
    assert!(cut_off.is_none(), "wrote 200 KB into 64 KiB");
    let broken = within(requests.send(push(3, 4096))).await.unwrap_err();
    assert!(matches!(broken, MessageError::Broken(_)), "{broken}");
    assert_eq!(within(closed.wait()).await, "a ring broke");
}
