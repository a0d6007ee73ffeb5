//! Tensors of any size move as streams of chunks, each well under the default
//! 4 MiB message limit; malformed streams change nothing.

mod common;

use bytes::Bytes;
use common::*;
use prost::Message;
use ps_proto::chunk::Assembler;
use ps_proto::transport::DEFAULT_MAX_MESSAGE_BYTES;
use ps_proto::v1;
use ps_server::ServerConfig;
use tokio_stream::StreamExt;
use tonic::Code;

/// Pulls one key by PullStream, checking every message against the 4 MiB default.
async fn pull_stream(server: &TestServer, name: &str, min_version: u64) -> (Bytes, u64) {
    let mut stream = server
        .client
        .clone()
        .pull_stream(pull_request(&[name], min_version, 10_000))
        .await
        .unwrap()
        .into_inner();
    let mut assembler = Assembler::new();
    let mut version = None;
    while let Some(message) = stream.next().await {
        let message = message.unwrap();
        assert!(
            message.encoded_len() < DEFAULT_MAX_MESSAGE_BYTES,
            "a {}-byte message",
            message.encoded_len()
        );
        assert!(
            *version.get_or_insert(message.version) == message.version,
            "one version per key"
        );
        assembler
            .add_chunk(message.chunk.as_ref().unwrap())
            .unwrap();
    }
    let (_, tensor) = assembler.finish().unwrap().pop().unwrap();
    (tensor.to_contiguous(), version.unwrap())
}

#[tokio::test]
async fn a_256_mib_tensor_round_trips_bit_exactly() {
    let server = TestServer::default().await;
    let data = pattern(256 * MIB / 4);
    let chunks = register_chunks("huge", &data, sgd(0.1));
    assert!(
        chunks
            .iter()
            .all(|c| c.encoded_len() < DEFAULT_MAX_MESSAGE_BYTES)
    );
    let registered = server
        .client
        .clone()
        .register_stream(tokio_stream::iter(chunks))
        .await
        .unwrap()
        .into_inner();
    assert!(registered.keys[0].created);
    let (pulled, version) = pull_stream(&server, "huge", 0).await;
    assert_eq!(version, 0);
    assert_eq!(pulled.len(), data.len());
    assert!(
        pulled == data,
        "pulled bytes differ from the registered bytes"
    );
    server.stop().await;
}

#[tokio::test]
async fn streamed_push_updates_a_large_tensor() {
    let server = TestServer::default().await;
    let elements = 8 * MIB / 4 + 3;
    let init = f32_bytes(&vec![1.0; elements]);
    server
        .client
        .clone()
        .register_stream(tokio_stream::iter(register_chunks("w", &init, sgd(0.5))))
        .await
        .unwrap();
    let grad: Vec<f32> = (0..elements).map(|i| (i % 7) as f32).collect();
    let chunks = push_chunks(0, 0, "w", &f32_bytes(&grad), 3 * MIB);
    let pushed = server
        .client
        .clone()
        .push_stream(tokio_stream::iter(chunks))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((pushed.keys[0].accepted, pushed.keys[0].version), (true, 1));
    let (pulled, version) = pull_stream(&server, "w", 1).await;
    assert_eq!(version, 1);
    let want: Vec<f32> = grad
        .iter()
        .map(|g| (1.0 - 0.5 * *g as f64) as f32)
        .collect();
    assert!(f32_values(&pulled) == want);
    server.stop().await;
}

#[tokio::test]
async fn pull_stream_honours_the_requested_chunk_size() {
    let server = TestServer::default().await;
    server
        .register(vec![param("w", &vec![2.0; 1000], sgd(0.5))])
        .await;
    let mut request = pull_request(&["w"], 0, 0);
    request.chunk_bytes = 1000;
    let chunks: Vec<_> = server
        .client
        .clone()
        .pull_stream(request)
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(chunks.len(), 4);
    assert!(
        chunks
            .iter()
            .all(|c| c.as_ref().unwrap().chunk.as_ref().unwrap().data.len() <= 1000)
    );
    server.stop().await;
}

async fn refused_stream(
    server: &TestServer,
    chunks: Vec<v1::PushChunk>,
    what: &str,
    needles: &[&str],
) {
    let before = server.values("w").await;
    let status = server
        .client
        .clone()
        .push_stream(tokio_stream::iter(chunks))
        .await
        .expect_err(what);
    let message = status.message();
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {message}");
    for needle in needles {
        assert!(
            message.contains(needle),
            "{what}: {message:?} lacks {needle:?}"
        );
    }
    assert_eq!(
        server.values("w").await,
        before,
        "a stream that {what} changed `w`"
    );
    assert_eq!(server.stats().await.pushes, 0);
}

/// A well-formed stream of `[1.0; 6]` to `w` in three 8-byte chunks, spoilt one way.
type Spoil = fn(&mut Vec<v1::PushChunk>);

fn chunk(chunks: &mut [v1::PushChunk], index: usize) -> &mut v1::TensorChunk {
    chunks[index].chunk.as_mut().expect("a chunk")
}

const MALFORMED: &[(&str, Spoil, &[&str])] = &[
    (
        "ends early",
        |c| c.truncate(2),
        &["ended after 16 of 24 bytes", "nothing was applied"],
    ),
    ("overlaps", |c| chunk(c, 1).offset = 4, &["overlaps"]),
    (
        "leaves a gap",
        |c| {
            c.remove(1);
        },
        &["gap"],
    ),
    (
        "runs past the end",
        |c| {
            c.push(c[2].clone());
            chunk(c, 3).offset = 24;
        },
        &["runs past"],
    ),
    (
        "changes the shape",
        |c| chunk(c, 1).shape = vec![7],
        &["first chunk said"],
    ),
    (
        "changes the step",
        |c| c[2].step = 1,
        &["began as worker 0 step 0"],
    ),
    (
        "splits an element",
        |c| {
            let data = chunk(c, 1).data.slice(0..6);
            chunk(c, 1).data = data;
        },
        &["splits"],
    ),
    (
        "carries a NaN",
        |c| chunk(c, 1).data = f32_bytes(&[1.0, f32::NAN]),
        &["non-finite", "element 3"],
    ),
];

#[tokio::test]
async fn malformed_chunk_streams_change_nothing() {
    let server = TestServer::default().await;
    server.register(vec![param("w", &[1.0; 6], sgd(1.0))]).await;
    let full = push_chunks(0, 0, "w", &f32_bytes(&[1.0; 6]), 8);
    assert_eq!(full.len(), 3);
    for (what, spoil, needles) in MALFORMED {
        let mut chunks = full.clone();
        spoil(&mut chunks);
        refused_stream(&server, chunks, what, needles).await;
    }
    let pushed = server
        .client
        .clone()
        .push_stream(tokio_stream::iter(full))
        .await
        .unwrap()
        .into_inner();
    assert!(
        pushed.keys[0].accepted,
        "the well-formed stream is still taken afterwards"
    );
    server.stop().await;
}

#[tokio::test]
async fn register_stream_refuses_a_changed_spec() {
    let server = TestServer::default().await;
    let mut chunks = register_chunks("w", &f32_bytes(&vec![1.0; 1 << 20]), sgd(0.1));
    chunks[1].spec = Some(spec("w", &[1 << 20], sgd(0.2)));
    let status = server
        .client
        .clone()
        .register_stream(tokio_stream::iter(chunks))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("lr=0.1") && status.message().contains("lr=0.2"),
        "{}",
        status.message()
    );
    assert_eq!(server.stats().await.keys, 0);
    server.stop().await;
}

#[tokio::test]
async fn oversized_chunk_in_a_stream_is_refused() {
    let mut config = ServerConfig::default();
    config.transport.max_message_bytes = 64 << 10;
    config.chunk_bytes = 32 << 10;
    let server = TestServer::start(config).await;
    server.register(vec![zeros("w", 20_000, sgd(1.0))]).await;
    let chunks = push_chunks(0, 0, "w", &f32_bytes(&vec![1.0; 20_000]), 80_000);
    assert_eq!(chunks.len(), 1, "one 80 KB chunk, over the 64 KiB limit");
    let status = server
        .client
        .clone()
        .push_stream(tokio_stream::iter(chunks))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{}", status.message());
    let stats = server.stats().await;
    assert_eq!((stats.key_stats[0].version, stats.pushes), (0, 0));
    server.stop().await;
}

#[tokio::test]
async fn a_stream_that_stalls_is_ended_and_nothing_of_it_is_applied() {
    let idle = std::time::Duration::from_millis(300);
    let server = TestServer::start(ServerConfig {
        stream_idle_timeout: idle,
        ..ServerConfig::default()
    })
    .await;
    let stalled = |result: Result<(), tonic::Status>, what: &str| {
        let status = result.expect_err(what);
        assert_eq!(status.code(), Code::DeadlineExceeded, "{what}: {status:?}");
        assert!(
            status.message().contains("sent nothing for 300ms")
                && status.message().contains("--stream-idle-timeout"),
            "{what}: {}",
            status.message()
        );
    };

    // A registration that stops after the first of its two chunks.
    let values = pattern(MIB);
    let mut chunks = register_chunks("w", &values, sgd(0.1));
    assert_eq!(chunks.len(), 2, "4 MiB goes in two 2 MiB chunks");
    let first = tokio_stream::iter(vec![chunks.remove(0)]).chain(tokio_stream::pending());
    let result = server.client.clone().register_stream(first).await;
    stalled(result.map(drop), "a stalled RegisterStream");
    assert_eq!(server.stats().await.keys, 0, "nothing was registered");

    // A push that stops after its first chunk, to a key registered in full.
    let chunks = register_chunks("w", &values, sgd(0.1));
    server
        .client
        .clone()
        .register_stream(tokio_stream::iter(chunks))
        .await
        .unwrap();
    let grad = pattern(MIB);
    let first = push_chunks(0, 0, "w", &grad, MIB).remove(0);
    let push = tokio_stream::iter(vec![first]).chain(tokio_stream::pending());
    let result = server.client.clone().push_stream(push).await;
    stalled(result.map(drop), "a stalled PushStream");
    let (after, version) = pull_stream(&server, "w", 0).await;
    assert_eq!(version, 0, "nothing of the stalled push was applied");
    assert_eq!(after, values);
    server.stop().await;
}
