//! Checkpoints through a real server: written on request, resumed by a restarted
//! server with values, Adam state, version and per-worker steps intact, a
//! truncated newest file skipped for the previous one, and a clear refusal when no
//! checkpoint folder is set.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use ps_proto::v1;
use ps_server::ServerConfig;
use ps_server::checkpointer::CheckpointConfig;
use tonic::Code;

/// A one-worker BSP server that checkpoints only when asked.
fn checkpointing(root: &Path) -> ServerConfig {
    ServerConfig {
        checkpoint: Some(CheckpointConfig {
            root: root.to_path_buf(),
            folder: "server-a".into(),
            every_steps: 0,
            every: Duration::ZERO,
        }),
        ..ServerConfig::default()
    }
}

fn gradient(step: u64) -> Vec<f32> {
    vec![0.5 + step as f32, -1.0, 0.25 * step as f32]
}

/// Pushes `step`'s gradient as worker 0; returns whether it was taken.
async fn push_step(server: &TestServer, step: u64) -> bool {
    let request = push(0, step, vec![tensor("w", &gradient(step))]);
    let response = server.client.clone().push(request).await.unwrap();
    response.into_inner().keys[0].accepted
}

async fn checkpoint_now(server: &TestServer) -> v1::CheckpointResponse {
    server
        .client
        .clone()
        .checkpoint(v1::CheckpointRequest {})
        .await
        .expect("checkpoint")
        .into_inner()
}

fn truncate_to_half(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
}

#[tokio::test]
async fn a_restarted_server_resumes_from_the_newest_valid_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let first = TestServer::start(checkpointing(root.path())).await;
    first
        .register(vec![param("w", &[1.0, 2.0, 3.0], adam(0.1))])
        .await;
    for step in 0..4 {
        assert!(push_step(&first, step).await);
    }
    let older = checkpoint_now(&first).await;
    assert_eq!((older.keys, older.version), (1, 4));
    let at_four = first.values("w").await;
    assert!(push_step(&first, 4).await);
    let at_five = first.values("w").await;
    assert!(push_step(&first, 5).await);
    let newest = checkpoint_now(&first).await;
    assert_eq!(newest.version, 6);
    assert_ne!(newest.path, older.path);
    first.stop().await;

    truncate_to_half(&PathBuf::from(&newest.path));
    let second = TestServer::start(checkpointing(root.path())).await;
    // A worker registering initial values (restore_version 0) gets the checkpoint.
    second
        .register(vec![param("w", &[0.0, 0.0, 0.0], adam(0.1))])
        .await;
    assert_eq!(
        second.values("w").await,
        at_four,
        "not the older checkpoint"
    );
    assert!(
        !push_step(&second, 3).await,
        "a step the checkpoint had applied was taken again"
    );
    assert!(push_step(&second, 4).await);
    // Bit-identical to the undisturbed server only if Adam's moments and update
    // count came back too.
    assert_eq!(second.values("w").await, at_five);
    second.stop().await;
}

#[tokio::test]
async fn a_server_with_only_corrupt_checkpoints_starts_from_the_workers_values() {
    let root = tempfile::tempdir().unwrap();
    let first = TestServer::start(checkpointing(root.path())).await;
    first
        .register(vec![param("w", &[1.0, 2.0, 3.0], sgd(1.0))])
        .await;
    assert!(push_step(&first, 0).await);
    let only = checkpoint_now(&first).await;
    first.stop().await;

    truncate_to_half(&PathBuf::from(&only.path));
    let second = TestServer::start(checkpointing(root.path())).await;
    second
        .register(vec![param("w", &[7.0, 8.0, 9.0], sgd(1.0))])
        .await;
    assert_eq!(second.values("w").await, (vec![7.0, 8.0, 9.0], 0));
    second.stop().await;
}

#[tokio::test]
async fn checkpoint_without_a_folder_is_refused_with_failed_precondition() {
    let server = TestServer::default().await;
    server.register(vec![param("w", &[1.0], sgd(1.0))]).await;
    let refused = server
        .client
        .clone()
        .checkpoint(v1::CheckpointRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused.message().contains("--checkpoint-dir"),
        "{}",
        refused.message()
    );
    server.stop().await;
}
