//! The push buffer: push streams that declare their bytes wait for room before
//! the server reads them, so many large pushes in flight on one connection
//! neither stall each other nor raise the server's memory past the buffer, and
//! every one of them is applied exactly once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use ps_proto::metadata::PUSH_BYTES;
use ps_proto::v1;
use ps_server::ServerConfig;
use ps_server::consistency::Consistency;
use tonic::{Code, Request};

const ELEMENTS: usize = MIB / 2; // a 2 MiB key
const PUSHES: u32 = 12;
const BUFFER: usize = 2 * MIB;

fn asp_with_a_small_buffer() -> ServerConfig {
    ServerConfig {
        consistency: Consistency::Asp,
        workers: PUSHES,
        push_buffer_bytes: BUFFER,
        ..ServerConfig::default()
    }
}

/// A push stream of `grad` to `w` declaring `declared` bytes.
fn declared_push(
    worker: u32,
    grad: &Bytes,
    declared: &str,
) -> Request<tokio_stream::Iter<std::vec::IntoIter<v1::PushChunk>>> {
    let chunks = push_chunks(worker, 0, "w", grad, MIB / 2);
    let mut request = Request::new(tokio_stream::iter(chunks));
    request
        .metadata_mut()
        .insert(PUSH_BYTES, declared.parse().expect("ascii"));
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_large_pushes_on_one_connection_wait_their_turn_and_each_applies_once() {
    let server = TestServer::start(asp_with_a_small_buffer()).await;
    server
        .register(vec![param("w", &vec![0.0; ELEMENTS], sgd(1.0))])
        .await;
    let registered = server.stats().await.memory_held_bytes;

    // While the pushes run, the bytes the server holds are sampled: buffered
    // pushes are charged to the memory budget as they are read.
    let done = Arc::new(AtomicBool::new(false));
    let most_held = Arc::new(AtomicU64::new(0));
    let sampler = tokio::spawn({
        let (client, done, most_held) = (server.client.clone(), done.clone(), most_held.clone());
        async move {
            while !done.load(Ordering::Relaxed) {
                let stats = client.clone().stats(v1::StatsRequest {}).await.unwrap();
                most_held.fetch_max(stats.into_inner().memory_held_bytes, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });

    // Twelve 2 MiB pushes at once, on the server's one connection, with room
    // for one at a time. Worker k pushes 12 (k + 1) everywhere, so that each
    // applied step, scaled by 1 / 12, is a whole number: the sum is exact in
    // f32 whatever order the pushes are applied in.
    let pushes = (0..PUSHES).map(|worker| {
        let mut client = server.client.clone();
        let grad = f32_bytes(&vec![((worker + 1) * PUSHES) as f32; ELEMENTS]);
        let declared = grad.len().to_string();
        async move {
            client
                .push_stream(declared_push(worker, &grad, &declared))
                .await
        }
    });
    let answers = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(pushes))
        .await
        .expect("every push got room in turn; none stalled another");
    done.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    for answer in answers {
        let keys = answer.expect("the push was applied").into_inner().keys;
        assert!(keys[0].accepted);
    }

    // SGD with lr 1 from zeros, each gradient scaled by 1 / workers:
    // -(1 + 2 + ... + 12) in every element.
    let (values, version) = server.values("w").await;
    let total: u32 = (1..=PUSHES).sum();
    assert_eq!(version, u64::from(PUSHES));
    let want = -(total as f32);
    let wrong = values.iter().filter(|v| **v != want).count();
    assert_eq!(
        wrong, 0,
        "{wrong} elements are not {want}, e.g. {}",
        values[0]
    );

    // One push buffered at a time: a stream's chunks are charged only while
    // it holds its room.
    let extra = most_held.load(Ordering::Relaxed).saturating_sub(registered);
    assert!(
        extra <= BUFFER as u64,
        "the server held {extra} bytes of pushes at once with a {BUFFER}-byte buffer"
    );
    server.stop().await;
}

/// Pushes `grad` declaring `declared` bytes, which the server must refuse as
/// `INVALID_ARGUMENT`; the refusal.
async fn refused(server: &TestServer, grad: &Bytes, declared: &str, what: &str) -> tonic::Status {
    let status = server
        .client
        .clone()
        .push_stream(declared_push(0, grad, declared))
        .await
        .expect_err(what);
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    status
}

#[tokio::test]
async fn a_stream_carrying_more_than_it_declared_is_refused_and_changes_nothing() {
    let server = TestServer::start(asp_with_a_small_buffer()).await;
    server
        .register(vec![param("w", &vec![0.0; ELEMENTS], sgd(1.0))])
        .await;
    let grad = f32_bytes(&vec![1.0; ELEMENTS]);

    let understated = (grad.len() - 4).to_string();
    let status = refused(&server, &grad, &understated, "more than declared").await;
    assert!(
        status.message().contains(&understated) && status.message().contains("ps-push-bytes"),
        "{}",
        status.message()
    );

    let status = refused(&server, &grad, "lots", "a header that is no number").await;
    assert!(
        status.message().contains("\"lots\""),
        "{}",
        status.message()
    );

    assert_eq!(server.values("w").await, (vec![0.0; ELEMENTS], 0));
    assert_eq!(server.stats().await.pushes, 0);

    // The room the refused streams reserved was given back: a push declaring
    // the whole buffer still goes through.
    let exact = grad.len().to_string();
    let pushed = server
        .client
        .clone()
        .push_stream(declared_push(0, &grad, &exact))
        .await
        .expect("an honest push");
    assert!(pushed.into_inner().keys[0].accepted);
    server.stop().await;
}
