//! The worker's rings driven by requests themselves ([`ps_shm::caller`]):
//! a request's future dropped at any await leaves the session as it was.
//! A write cut off midway is finished by the writer task or the next write;
//! a read, or a lock for an answer (`AnswerRing::lock_answered`), waits
//! until an answer below `LEND_AT_BYTES` is whole before it reads it. Only
//! a read of an answer larger than the ring can be cut off midway: that
//! breaks the session, whose next reader gets an error, and the session
//! closes, so the server ends its side too.

use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use prost::Message;
use ps_proto::v1;
use ps_proto::v1::session_request::Op;
use ps_shm::handshake::{ServerEnd, WorkerEnd, in_process_ends};
use ps_shm::message::{Arrived, MessageError, read_message, write_message};
use ps_shm::pool::BufferPool;
use ps_shm::ring::RingReader;
use ps_shm::{Sent, worker_rings};

/// Both ends of a session over a region whose rings hold 64 KiB.
async fn ends() -> (ServerEnd, WorkerEnd) {
    let (server, worker, _) = in_process_ends(RING_BYTES).await.unwrap();
    (server, worker)
}

const RING_BYTES: u64 = 64 << 10;

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

/// The answer to pull `id`: one tensor of `bytes` bytes.
fn pulled(id: u64, bytes: usize) -> v1::SessionAnswer {
    let tensor = v1::PulledTensor {
        version: id,
        arena: None,
        tensor: Some(v1::Tensor {
            name: "w".into(),
            part: 0,
            dtype: v1::DType::DtypeF32 as i32,
            shape: vec![bytes as u64 / 4],
            data: Bytes::from(vec![5u8; bytes]),
        }),
    };
    v1::SessionAnswer {
        id,
        outcome: Some(v1::session_answer::Outcome::Pull(v1::PullResponse {
            tensors: vec![tensor],
        })),
        pull_waited_us: 0,
    }
}

/// Reads request `seq` off the server's request ring, whole.
async fn read(ring: &mut RingReader, seq: u64) -> v1::SessionRequest {
    let pool = BufferPool::new();
    let read = read_message::<v1::SessionRequest>(ring, seq, u64::MAX, &pool);
    match within(read).await.unwrap() {
        Arrived::Whole(request) => request,
        Arrived::PastLimit(..) => panic!("request {seq} past the limit"),
    }
}

/// `answer` as message `seq` on a ring, word for word: its sizes, its
/// sequence number, its payloads' lengths, its header and its payloads,
/// each padded to whole words.
fn as_written(seq: u64, answer: &v1::SessionAnswer) -> Vec<u8> {
    let mut header = answer.clone();
    let payloads: Vec<Bytes> = match &mut header.outcome {
        Some(v1::session_answer::Outcome::Pull(pull)) => pull
            .tensors
            .iter_mut()
            .map(|t| std::mem::take(&mut t.tensor.as_mut().unwrap().data))
            .collect(),
        _ => Vec::new(),
    };
    let header = header.encode_to_vec();
    let count = payloads.len() as u64;
    let mut words = Vec::new();
    words.extend_from_slice(&(header.len() as u64 | count << 32).to_le_bytes());
    words.extend_from_slice(&seq.to_le_bytes());
    for payload in &payloads {
        words.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    }
    for part in std::iter::once(&header[..]).chain(payloads.iter().map(|p| &p[..])) {
        words.extend_from_slice(part);
        words.resize(words.len().next_multiple_of(8), 0);
    }
    words
}

/// Writes `bytes` (whole words) onto the server's answer ring and
/// publishes them.
async fn publish(server: &mut ServerEnd, bytes: &[u8]) {
    server.answers.write(bytes).await.unwrap();
    server.answers.flush();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_cut_off_while_its_answer_was_half_written_leaves_the_session_as_it_was() {
    let (mut server, worker) = ends().await;
    let (_requests, answers, _closed) = worker_rings(worker, u64::MAX);
    // Cut after the sizes word, the sequence number, the payload's length,
    // a word of the header, and 9,000 bytes of a 20,000-byte payload: each
    // read waits for the whole answer without reading any of it, and is cut
    // off there.
    let pull = || pulled(2, 20_000);
    let in_payload = as_written(1, &pull()).len() - 20_000 + 9_000;
    let halves = [
        (answer(1), 8),
        (answer(1), 16),
        (pull(), 24),
        (pull(), 32),
        (pull(), in_payload),
    ];
    for (seq, (mut whole, cut)) in (1..).zip(halves) {
        whole.id = seq;
        let bytes = as_written(seq, &whole);
        let (first, rest) = bytes.split_at(cut);
        publish(&mut server, first).await;
        let cut_off = answers.lock().await.next().now_or_never();
        assert!(cut_off.is_none(), "read an answer only half written");
        publish(&mut server, rest).await;
        let (read, still) = within(answers.lock().await.next()).await.unwrap();
        assert_eq!(read.message, whole, "message {seq} read whole");
        assert!(still.is_some(), "a small answer gives the ring back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_for_an_answer_returns_once_one_is_whole_and_cut_off_before_reads_nothing() {
    let (mut server, worker) = ends().await;
    let (_requests, answers, _closed) = worker_rings(worker, u64::MAX);
    let waiting = answers.lock_answered().now_or_never();
    assert!(waiting.is_none(), "nothing is on the ring");
    let whole = pulled(1, 20_000);
    let bytes = as_written(1, &whole);
    let (first, rest) = bytes.split_at(bytes.len() / 16 * 8);
    publish(&mut server, first).await;
    let waiting = answers.lock_answered().now_or_never();
    assert!(waiting.is_none(), "half an answer is on the ring");
    publish(&mut server, rest).await;
    let reader = within(answers.lock_answered()).await;
    // The locks cut off read nothing, and the answer is whole: reading it
    // does not wait.
    let read = reader.next().now_or_never().expect("the read waited");
    let (read, still) = read.unwrap();
    assert_eq!(read.message, whole);
    assert!(still.is_some(), "a small answer gives the ring back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_for_an_answer_cut_off_while_it_reads_past_unread_payloads_leaves_the_ring_whole() {
    let (mut server, worker) = ends().await;
    let (_requests, answers, _closed) = worker_rings(worker, u64::MAX);
    // 300 KB lent through a 64 KiB ring, and dropped unread: each lock for
    // the next answer reads past what has come of it, and is cut off there.
    let lent = as_written(1, &pulled(1, 300_000));
    let mut chunks = lent.chunks(60 << 10);
    publish(&mut server, chunks.next().unwrap()).await;
    let (first, still) = within(answers.lock().await.next()).await.unwrap();
    assert!(still.is_none() && first.lent.is_some(), "300 KB are lent");
    drop(first);
    for chunk in chunks {
        let waiting = answers.lock_answered().now_or_never();
        assert!(
            waiting.is_none(),
            "the rest of the lent answer is no answer"
        );
        publish(&mut server, chunk).await;
    }
    publish(&mut server, &as_written(2, &answer(2))).await;
    let reader = within(answers.lock_answered()).await;
    let (read, _) = reader
        .next()
        .now_or_never()
        .expect("the read waited")
        .unwrap();
    assert_eq!(read.message, answer(2), "the next answer, read whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_an_answer_larger_than_the_ring_cut_off_midway_breaks_the_session_and_closes_it()
{
    let (mut server, worker) = ends().await;
    let (requests, answers, closed) = worker_rings(worker, u64::MAX);
    // 100 KB through a 64 KiB ring is read as it comes: 30 KB of it there.
    let bytes = as_written(1, &pulled(1, 100_000));
    publish(&mut server, &bytes[..30_000]).await;
    let cut_off = answers.lock().await.next().now_or_never();
    assert!(cut_off.is_none(), "read an answer only partly written");

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
async fn a_write_cut_off_midway_is_finished_by_the_writer_task_and_the_ring_stays_whole() {
    let (mut server, worker) = ends().await;
    let (requests, _answers, closed) = worker_rings(worker, u64::MAX);
    let first = within(requests.send(push(1, 4096))).await.unwrap();
    assert!(matches!(first, Sent::Written), "{first:?}");
    // 200 KB through a 64 KiB ring nobody reads yet: it fills the ring and
    // waits for room, and is dropped there, with most of it unwritten.
    let cut_off = requests.send(push(2, 200_000)).now_or_never();
    assert!(cut_off.is_none(), "wrote 200 KB into 64 KiB");
    // The writer task writes the rest as the server reads.
    let ring = &mut server.requests;
    assert_eq!(read(ring, 1).await, push(1, 4096));
    assert_eq!(
        read(ring, 2).await,
        push(2, 200_000),
        "the cut-off request whole"
    );
    within(requests.send(push(3, 4096))).await.unwrap();
    assert_eq!(read(ring, 3).await, push(3, 4096));
    assert!(
        closed.wait().now_or_never().is_none(),
        "the session goes on"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_write_cut_off_midway_is_finished_by_the_next_write_first() {
    let (mut server, worker) = ends().await;
    let (requests, _answers, _closed) = worker_rings(worker, u64::MAX);
    // Cut off as above; on this one thread the writer task has not run
    // when the next request writes itself, so that write finishes the
    // cut-off one first, while the server reads.
    let cut_off = requests.send(push(1, 200_000)).now_or_never();
    assert!(cut_off.is_none(), "wrote 200 KB into 64 KiB");
    let reading = tokio::spawn(async move {
        let ring = &mut server.requests;
        (read(ring, 1).await, read(ring, 2).await)
    });
    let next = within(requests.send(push(2, 4096))).await.unwrap();
    assert!(matches!(next, Sent::Written), "{next:?}");
    let (first, second) = within(reading).await.unwrap();
    assert_eq!(first, push(1, 200_000), "the cut-off request whole, first");
    assert_eq!(second, push(2, 4096));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_the_writer_task_has_not_taken_can_be_withdrawn_and_is_never_written() {
    let (mut server, worker) = ends().await;
    let (requests, _answers, _closed) = worker_rings(worker, u64::MAX);
    // The writer task takes the first and waits for room, holding the ring;
    // the second waits in the queue behind it.
    let first = within(requests.queue(push(1, 200_000))).await.unwrap();
    let second = within(requests.queue(push(2, 4096))).await.unwrap();
    let ring = &mut server.requests;
    let sizes = within(ring.read_word()).await.unwrap();
    assert!(!first.withdraw(), "the writer task is writing the first");
    assert!(second.withdraw(), "the second waited in the queue");
    assert!(second.withdraw(), "withdrawn stays withdrawn");
    let third = within(requests.queue(push(3, 4096))).await.unwrap();
    // The rest of the first: its sequence number, its one payload's
    // length, its header and its payload, each padded to whole words.
    assert_eq!(within(ring.read_word()).await.unwrap(), 1);
    let payload = within(ring.read_word()).await.unwrap();
    let header = sizes & 0xffff_ffff;
    let padded = |bytes: u64| bytes.next_multiple_of(8) as usize;
    let mut rest = vec![0u8; padded(header) + padded(payload)];
    within(ring.read(&mut rest)).await.unwrap();
    // Next comes the third, as the session's second message.
    let request = read(ring, 2).await;
    assert_eq!(request, push(3, 4096), "the withdrawn request was written");
    assert!(!third.withdraw(), "the third was written");
}
