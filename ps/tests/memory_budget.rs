//! The memory budget: what a client can make a server allocate is charged before
//! it is allocated, and a request past the budget gets `RESOURCE_EXHAUSTED`,
//! changes nothing and gives back whatever it had taken.

mod common;

use common::*;
use ps_proto::v1;
use ps_server::{Consistency, ServerConfig};
use tonic::{Code, Status};

/// An ASP server with `budget` bytes: an SGD key of `n` f32 elements is charged
/// `8n` bytes (values and pull snapshot).
async fn budgeted(budget: usize) -> TestServer {
    TestServer::start(ServerConfig {
        consistency: Consistency::Asp,
        memory_budget: budget,
        ..ServerConfig::default()
    })
    .await
}

fn assert_over_budget<T: std::fmt::Debug>(result: Result<T, Status>, what: &str, needle: &str) {
    let status = result.expect_err(what);
    assert_eq!(status.code(), Code::ResourceExhausted, "{what}: {status:?}");
    for needle in [needle, "memory budget", "--memory-budget"] {
        assert!(
            status.message().contains(needle),
            "{what}: {:?} lacks {needle:?}",
            status.message()
        );
    }
}

#[tokio::test]
async fn seven_zeroed_gibibyte_keys_are_refused_before_anything_is_allocated() {
    let server = budgeted(4 << 30).await;
    let keys = (0..7)
        .map(|i| zeros(&format!("k{i}"), 1 << 28, sgd(0.1)))
        .collect();
    let request = v1::RegisterRequest {
        params: keys,
        ..Default::default()
    };
    let result = server.client.clone().register(request).await;
    assert_over_budget(result, "seven 1 GiB keys", "registering 7 new keys");
    let stats = server.stats().await;
    assert_eq!((stats.keys, stats.memory_held_bytes), (0, 0));
    assert_eq!(stats.memory_budget_bytes, 4 << 30);
    server.stop().await;
}

#[tokio::test]
async fn keys_are_charged_when_registered_until_the_budget_is_full() {
    let server = budgeted(100 * MIB).await;
    let key = |name| v1::RegisterRequest {
        params: vec![zeros(name, 4 * MIB as u64, sgd(0.1))],
        ..Default::default()
    };
    for name in ["k0", "k1", "k2"] {
        server.client.clone().register(key(name)).await.unwrap();
    }
    let held = server.stats().await.memory_held_bytes;
    assert_eq!(
        held,
        3 * 32 * MIB as u64,
        "16 MiB of values and 16 of snapshot each"
    );
    let result = server.client.clone().register(key("k3")).await;
    assert_over_budget(result, "a fourth key", "registering `k3`#0");
    server.client.clone().register(key("k0")).await.unwrap();
    let stats = server.stats().await;
    assert_eq!(stats.keys, 3);
    assert_eq!(
        stats.memory_held_bytes, held,
        "registering a key again charges nothing"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_unary_pull_past_the_message_limit_is_refused_before_it_is_read() {
    let server = TestServer::default().await;
    // Half precision, so that a pull encodes a snapshot, which `Stats` counts
    // (an `f32` pull shares the stored values instead).
    let mut big = zeros("big", 4 * MIB as u64, sgd(0.1));
    big.spec.as_mut().expect("a spec").dtype = v1::DType::DtypeF16 as i32;
    let request = v1::RegisterRequest {
        params: vec![big],
        ..Default::default()
    };
    server.client.clone().register(request).await.unwrap();
    let before = server.stats().await;

    let result = server
        .client
        .clone()
        .pull(pull_request(&["big"], 0, 0))
        .await;
    let status = result.expect_err("an 8 MiB unary pull");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("PullStream"), "{status:?}");
    let after = server.stats().await;
    assert_eq!(
        (after.bytes, after.memory_held_bytes),
        (before.bytes, before.memory_held_bytes),
        "the refused pull made no snapshot of the key"
    );

    let mut stream = server
        .client
        .clone()
        .pull_stream(pull_request(&["big"], 0, 0))
        .await
        .unwrap()
        .into_inner();
    while stream.message().await.unwrap().is_some() {}
    let read = server.stats().await;
    assert_eq!(
        read.bytes,
        before.bytes + 8 * MIB as u64,
        "a streamed pull does"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_push_stream_past_the_budget_is_refused_and_gives_back_what_it_buffered() {
    let server = budgeted(10 * MIB).await;
    let values = pattern(MIB);
    let register = register_chunks("w", &values, sgd(0.1));
    let result = server
        .client
        .clone()
        .register_stream(tokio_stream::iter(register.clone()))
        .await;
    assert_over_budget(result, "a register stream", "registering `w`#0");
    assert_eq!(server.stats().await.memory_held_bytes, 0);

    let request = v1::RegisterRequest {
        params: vec![zeros("w", MIB as u64, sgd(0.1))],
        ..Default::default()
    };
    server.client.clone().register(request).await.unwrap();
    let held = server.stats().await.memory_held_bytes;
    assert_eq!(held, 8 * MIB as u64);

    let grads = push_chunks(0, 0, "w", &pattern(MIB), MIB);
    assert_eq!(grads.len(), 4);
    let result = server
        .client
        .clone()
        .push_stream(tokio_stream::iter(grads))
        .await;
    assert_over_budget(
        result,
        "a 4 MiB push stream with 2 MiB to spare",
        "buffering a push stream from worker 0 for step 0",
    );
    let stats = server.stats().await;
    assert_eq!(stats.key_stats[0].version, 0, "nothing of it was applied");
    assert_eq!(stats.memory_held_bytes, held, "its chunks were given back");

    let result = server
        .client
        .clone()
        .pull_stream(pull_request(&["w"], 0, 0))
        .await;
    assert_over_budget(
        result,
        "a pull with no room for its answer",
        "pulling 1 key",
    );
    server.stop().await;
}
