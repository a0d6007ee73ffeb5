//! Answers whose payloads lie in the server's values arena, through a real
//! session (handshake, region, rings, both links): the worker reads them
//! from the arena it was handed, lent or whole, and the server holds the
//! values unchanged until the worker has read them, letting them go before
//! it hands on the worker's next request.

use std::sync::Arc;

use bytes::Bytes;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use ps_shm::arena::{Arena, Block, LEND_FROM_BYTES};
use ps_shm::handshake::in_process_ends_with;
use ps_shm::lent::LEND_AT_BYTES;
use ps_shm::pool::BufferPool;
use ps_shm::serving::Charger;
use ps_shm::{ServerLink, WorkerLink, serve_link, worker_link};
use tokio_stream::StreamExt;

/// A server's and a worker's link over one region whose rings hold 64 KiB,
/// the server handing the worker `arena`.
async fn linked(arena: &Arc<Arena>) -> (ServerLink, WorkerLink) {
    let (server, worker, _) = in_process_ends_with(1 << 16, Some(Arc::clone(arena)))
        .await
        .unwrap();
    assert!(worker.arena.is_some(), "the worker was handed the arena");
    let charge: Charger = Arc::new(|_| Ok(Arc::new(())));
    let serving = serve_link(
        server,
        (charge, None),
        BufferPool::new(),
        std::future::pending(),
    );
    (serving, worker_link(worker, u64::MAX))
}

/// A block of `len` values in `arena`, each a pattern of `seed`.
fn block(arena: &Arc<Arena>, len: usize, seed: f32) -> Arc<Block> {
    let values: Vec<f32> = (0..len).map(|i| seed + i as f32).collect();
    Arc::new(arena.block(&values).unwrap())
}

/// The answer to pull `id`, its one tensor `block`'s values.
fn pulled(id: u64, block: &Arc<Block>) -> v1::SessionAnswer {
    let data = ps_shm::arena::shared_bytes(Arc::clone(block));
    let tensor = v1::Tensor {
        name: "w".to_string(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![data.len() as u64 / 4],
        data,
    };
    v1::SessionAnswer {
        id,
        outcome: Some(Outcome::Pull(v1::PullResponse {
            tensors: vec![v1::PulledTensor {
                version: 1,
                arena: None,
                tensor: Some(tensor),
            }],
        })),
        pull_waited_us: 0,
    }
}

fn data_of(answer: &v1::SessionAnswer) -> &Bytes {
    match &answer.outcome {
        Some(Outcome::Pull(pull)) => &pull.tensors[0].tensor.as_ref().unwrap().data,
        other => panic!("not a pull: {other:?}"),
    }
}

/// Sends request `id` and waits until the server's session has it: the
/// reader lets released payloads go before it hands a request on.
async fn request(serving: &mut ServerLink, working: &WorkerLink, id: u64) {
    let pull = v1::SessionRequest {
        id,
        deadline_ms: 0,
        op: Some(Op::Pull(v1::PullRequest::default())),
    };
    working.requests.send(pull).await.unwrap();
    let arrived = serving
        .requests
        .next()
        .await
        .unwrap()
        .unwrap()
        .expect("handed on");
    assert_eq!(arrived.id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_in_the_arena_are_read_from_it_and_held_until_the_worker_is_done() {
    let arena = Arena::create(16 << 20).unwrap();
    let (mut serving, mut working) = linked(&arena).await;
    let large = block(&arena, 1 << 20, 0.5);
    serving.answers.send(Ok(pulled(1, &large))).await.unwrap();
    let answer = working.answers.next().await.unwrap().unwrap();
    let mut lent = answer.lent.expect("4 MiB is lent");
    assert!(lent.next_in_arena(), "sent by its offset");
    let mut mine = vec![0u8; 4 << 20];
    lent.read_next(&mut mine).await.unwrap();
    assert_eq!(mine, bytemuck::cast_slice::<f32, u8>(large.as_slice()));
    assert!(
        Arc::strong_count(&large) > 1,
        "held while the worker holds it"
    );
    drop(lent);
    request(&mut serving, &working, 10).await;
    assert_eq!(Arc::strong_count(&large), 1, "let go once released");

    // Lent by its offset, but below what a worker reads while lent: read
    // whole, and released as soon as it is.
    let middle = block(&arena, LEND_FROM_BYTES / 4, 7.0);
    const { assert!((LEND_FROM_BYTES as u64) < LEND_AT_BYTES) };
    serving.answers.send(Ok(pulled(2, &middle))).await.unwrap();
    let answer = working.answers.next().await.unwrap().unwrap();
    assert!(answer.lent.is_none());
    let expected = bytemuck::cast_slice::<f32, u8>(middle.as_slice());
    assert_eq!(data_of(&answer.message), expected);
    request(&mut serving, &working, 11).await;
    assert_eq!(Arc::strong_count(&middle), 1, "let go once read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_still_reading_keeps_the_values_past_its_next_request() {
    let arena = Arena::create(16 << 20).unwrap();
    let (mut serving, mut working) = linked(&arena).await;
    let large = block(&arena, 1 << 19, 1.0);
    serving.answers.send(Ok(pulled(1, &large))).await.unwrap();
    let answer = working.answers.next().await.unwrap().unwrap();
    let lent = answer.lent.expect("2 MiB is lent");
    assert!(lent.next_in_arena());
    // A request sent while the answer's payloads are still lent (a worker
    // that pushes while it reads a pull) does not let them go.
    request(&mut serving, &working, 10).await;
    assert!(Arc::strong_count(&large) > 1, "still held");
    let payloads = lent.read_all().await.unwrap();
    assert_eq!(
        &payloads[0][..],
        bytemuck::cast_slice::<f32, u8>(large.as_slice())
    );
    request(&mut serving, &working, 11).await;
    assert_eq!(Arc::strong_count(&large), 1);
}
