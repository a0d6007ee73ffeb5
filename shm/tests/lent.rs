//! Large answers through a real session (handshake, region, rings, both
//! links): their payloads are lent to the worker still on the ring and read
//! straight into its own memory; payloads let go unread, partly read, or
//! with a read cut off midway are read past, so the next answer arrives
//! whole, and the session goes on.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_shm::handshake::in_process_ends;
use ps_shm::lent::LEND_AT_BYTES;
use ps_shm::message::Payloads;
use ps_shm::pool::BufferPool;
use ps_shm::serving::Charger;
use ps_shm::{Answer, ServerLink, WorkerLink, serve_link, worker_link};
use tokio_stream::StreamExt;

/// A server's and a worker's link over one region whose rings hold 64 KiB,
/// much less than the answers sent through them.
async fn linked() -> (ServerLink, WorkerLink) {
    let (server, worker, _) = in_process_ends(1 << 16).await.unwrap();
    let charge: Charger = Arc::new(|_| Ok(Arc::new(())));
    let serving = serve_link(
        server,
        (charge, None),
        BufferPool::new(),
        std::future::pending(),
    );
    (serving, worker_link(worker, u64::MAX))
}

/// Payload `index` of `len` bytes: a pattern no other payload repeats.
fn payload(index: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7) ^ index)
        .collect()
}

/// The answer to pull `id`, one tensor per payload.
fn pulled(id: u64, payloads: &[Vec<u8>]) -> v1::SessionAnswer {
    let tensors = payloads
        .iter()
        .enumerate()
        .map(|(i, data)| v1::PulledTensor {
            version: id,
            arena: None,
            tensor: Some(v1::Tensor {
                name: format!("w{i}"),
                part: 0,
                dtype: v1::DType::DtypeF32 as i32,
                shape: vec![data.len() as u64 / 4],
                data: Bytes::from(data.clone()),
            }),
        })
        .collect();
    v1::SessionAnswer {
        id,
        outcome: Some(Outcome::Pull(v1::PullResponse { tensors })),
        pull_waited_us: 0,
    }
}

async fn next(working: &mut WorkerLink) -> Answer {
    working.answers.next().await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_are_read_straight_into_the_callers_memory_and_small_ones_come_whole() {
    let (mut serving, mut working) = linked().await;
    let large = [payload(1, 300_000), payload(2, 1000)];
    let small = [payload(3, 4096)];
    serving.answers.send(Ok(pulled(1, &large))).await.unwrap();
    serving.answers.send(Ok(pulled(2, &small))).await.unwrap();

    let answer = next(&mut working).await;
    let mut lent = answer.lent.expect("300 KB of payloads are lent");
    const { assert!(300_000 >= LEND_AT_BYTES) };
    let mut expected = pulled(1, &large);
    expected.take_payloads();
    assert_eq!(answer.message, expected, "the header, its tensors empty");
    let mut wrong = vec![0u8; 10];
    let refused = lent.read_next(&mut wrong).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Internal, "the wrong length");
    for data in &large {
        let mut mine = vec![0u8; data.len()];
        lent.read_next(&mut mine).await.unwrap();
        assert_eq!(&mine, data);
    }
    assert_eq!(lent.next_len(), None);
    drop(lent);

    let answer = next(&mut working).await;
    assert!(answer.lent.is_none(), "4 KiB is read whole");
    assert_eq!(answer.message, pulled(2, &small));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_let_go_unread_or_partly_read_are_read_past() {
    let (mut serving, mut working) = linked().await;
    // Lengths that end mid-word: each payload is padded to whole words.
    let two = [payload(1, 400_003), payload(2, 200_005)];
    for id in 1..=4 {
        serving.answers.send(Ok(pulled(id, &two))).await.unwrap();
    }
    serving
        .answers
        .send(Ok(pulled(5, &[payload(5, 64)])))
        .await
        .unwrap();

    drop(next(&mut working).await);
    let mut half = next(&mut working).await.lent.unwrap();
    let mut first = vec![0u8; two[0].len()];
    half.read_next(&mut first).await.unwrap();
    assert_eq!(first, two[0]);
    drop(half);
    let whole = next(&mut working).await.into_whole().await.unwrap();
    assert_eq!(whole, pulled(3, &two), "read into buffers and put back");
    let fourth = next(&mut working).await;
    assert_eq!(fourth.message.id, 4);
    let payloads = fourth.lent.unwrap().read_all().await.unwrap();
    assert_eq!(payloads, two.map(Bytes::from).to_vec());
    assert_eq!(
        next(&mut working).await.message,
        pulled(5, &[payload(5, 64)])
    );
}

/// On one thread, so that the server's writer cannot refill the ring while
/// the worker's read is polled.
#[tokio::test(flavor = "current_thread")]
async fn a_read_cut_off_midway_is_read_past_and_the_session_goes_on() {
    let (mut serving, mut working) = linked().await;
    // The server writes the answer's header and then waits for room: its
    // ring holds 64 KiB of the 8 MiB. A read polled once and dropped has
    // taken part of the payload, not all of it.
    let huge = [payload(1, (8 << 20) + 5), payload(3, 100_000)];
    serving.answers.send(Ok(pulled(1, &huge))).await.unwrap();
    serving
        .answers
        .send(Ok(pulled(2, &[payload(2, 64)])))
        .await
        .unwrap();
    let mut lent = next(&mut working).await.lent.unwrap();
    let mut mine = vec![0u8; huge[0].len()];
    {
        let read = lent.read_next(&mut mine);
        tokio::pin!(read);
        assert!(read.as_mut().now_or_never().is_none(), "not all of it yet");
    }
    assert!(mine[..8].iter().any(|&b| b != 0), "some of it was read");
    drop(lent);
    let after = next(&mut working).await;
    assert_eq!(after.message, pulled(2, &[payload(2, 64)]), "in step");
    let another = pulled(3, &huge);
    serving.answers.send(Ok(another.clone())).await.unwrap();
    let whole = next(&mut working).await.into_whole().await.unwrap();
    assert_eq!(whole, another, "the session goes on");
}
