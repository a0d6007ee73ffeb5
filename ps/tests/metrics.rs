//! Prometheus metrics over real HTTP: a server started with a metrics listener
//! counts what it answered by RPC and status, the bytes it moved and what it
//! holds, in exposition Prometheus reads; other paths get 404.

mod common;

use std::time::Duration;

use common::{TestServer, adam, param, pull_request, push, sgd, tensor};
use ps_proto::v1;
use ps_server::ServerConfig;
use ps_server::checkpointer::CheckpointConfig;

/// `GET path`: the status line and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    ps_common::metrics::http_get(&addr.to_string(), path)
        .await
        .expect("an HTTP answer")
}

/// The value of the sample named exactly `series` (name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
}

#[tokio::test]
async fn answers_bytes_and_holdings_are_exposed() {
    let (server, metrics) = TestServer::with_metrics(ServerConfig::default()).await;
    server.register(vec![param("w", &[1.0; 4], sgd(0.5))]).await;
    let mut client = server.client.clone();
    client
        .push(push(0, 0, vec![tensor("w", &[2.0; 4])]))
        .await
        .expect("a push");
    client
        .pull(pull_request(&["w"], 1, 1000))
        .await
        .expect("a pull");
    let unknown = client.pull(pull_request(&["nope"], 0, 0)).await;
    assert_eq!(unknown.unwrap_err().code(), tonic::Code::NotFound);

    let (status, text) = get(metrics, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    for (series, want) in [
        (
            r#"candle_ps_server_requests_total{rpc="Register",code="OK"}"#,
            1.0,
        ),
        (
            r#"candle_ps_server_requests_total{rpc="Push",code="OK"}"#,
            1.0,
        ),
        (
            r#"candle_ps_server_requests_total{rpc="Pull",code="OK"}"#,
            1.0,
        ),
        (
            r#"candle_ps_server_requests_total{rpc="Pull",code="NOT_FOUND"}"#,
            1.0,
        ),
        (
            r#"candle_ps_server_request_duration_seconds_count{rpc="Push"}"#,
            1.0,
        ),
        ("candle_ps_server_push_bytes_total", 16.0),
        ("candle_ps_server_pull_bytes_total", 16.0),
        ("candle_ps_server_push_apply_duration_seconds_count", 1.0),
        ("candle_ps_server_keys", 1.0),
        ("candle_ps_server_max_key_version", 1.0),
        (r#"candle_ps_server_param_version{param="w"}"#, 1.0),
        (r#"candle_ps_server_key_bytes{kind="values"}"#, 16.0),
        (r#"candle_ps_server_key_bytes{kind="optimizer_state"}"#, 0.0),
        (r#"candle_ps_server_key_bytes{kind="accumulator"}"#, 0.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    assert!(
        sample(&text, r#"candle_ps_server_key_bytes{kind="pull_snapshot"}"#).is_some(),
        "{text}"
    );
    let held = sample(&text, "candle_ps_server_memory_held_bytes").unwrap();
    let budget = sample(&text, "candle_ps_server_memory_budget_bytes").unwrap();
    assert!(
        held >= 16.0 && budget >= held,
        "held {held}, budget {budget}"
    );
    assert!(text.contains("candle_ps_build_info{"), "{text}");
    // Asked for nothing in particular: the classic text format.
    assert!(
        text.contains("# TYPE candle_ps_server_requests_total counter") && !text.contains("# EOF"),
        "{text}"
    );
    // Asked for OpenMetrics, as Prometheus asks: OpenMetrics.
    let (_, openmetrics) = ps_common::metrics::http_get_accepting(
        &metrics.to_string(),
        "/metrics",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    )
    .await
    .unwrap();
    assert!(
        openmetrics.contains("# TYPE candle_ps_server_requests counter")
            && openmetrics.ends_with("# EOF\n"),
        "{openmetrics}"
    );

    let (status, _) = get(metrics, "/other").await;
    assert!(status.contains("404"), "{status}");
    server.stop().await;
}

/// A BSP step of two workers: how long it waited from the first push to the
/// second is observed once per key, and the second worker is the one it
/// waited for.
#[tokio::test]
async fn a_bsp_step_counts_its_wait_and_the_worker_it_waited_for() {
    let config = ServerConfig {
        workers: 2,
        consistency: ps_server::Consistency::Bsp,
        ..ServerConfig::default()
    };
    let (server, metrics) = TestServer::with_metrics(config).await;
    server
        .register(vec![
            param("a", &[1.0; 4], sgd(0.5)),
            param("b", &[1.0; 4], sgd(0.5)),
        ])
        .await;
    let mut client = server.client.clone();
    let grads = || vec![tensor("a", &[2.0; 4]), tensor("b", &[2.0; 4])];
    client.push(push(0, 0, grads())).await.expect("worker 0");
    let (_, before) = get(metrics, "/metrics").await;
    assert_eq!(
        sample(
            &before,
            "candle_ps_server_bsp_step_wait_duration_seconds_count"
        ),
        Some(0.0),
        "{before}"
    );
    client.push(push(1, 0, grads())).await.expect("worker 1");
    let (_, text) = get(metrics, "/metrics").await;
    for (series, want) in [
        ("candle_ps_server_bsp_step_wait_duration_seconds_count", 2.0),
        (
            r#"candle_ps_server_bsp_steps_completed_by_total{worker="1"}"#,
            2.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    assert_eq!(
        sample(
            &text,
            r#"candle_ps_server_bsp_steps_completed_by_total{worker="0"}"#
        ),
        None,
        "{text}"
    );
    server.stop().await;
}

/// Adam's two moments count as optimizer state, each parameter's version is
/// its own, and a server that checkpoints reports how long the checkpoint took
/// and how old the newest one is (-1 before the first).
#[tokio::test]
async fn optimizer_state_param_versions_and_checkpoint_times_are_exposed() {
    let root = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        checkpoint: Some(CheckpointConfig {
            root: root.path().to_path_buf(),
            folder: "server-a".into(),
            every_steps: 0,
            every: Duration::ZERO,
        }),
        ..ServerConfig::default()
    };
    let (server, metrics) = TestServer::with_metrics(config).await;
    server
        .register(vec![
            param("a", &[1.0; 4], adam(0.1)),
            param("b", &[1.0; 2], sgd(0.5)),
        ])
        .await;
    let mut client = server.client.clone();
    for step in 0..3 {
        client
            .push(push(0, step, vec![tensor("a", &[1.0; 4])]))
            .await
            .expect("a push of a");
    }
    client
        .push(push(0, 0, vec![tensor("b", &[1.0; 2])]))
        .await
        .expect("a push of b");
    let (_, before) = get(metrics, "/metrics").await;
    assert_eq!(
        sample(&before, "candle_ps_server_checkpoint_age_seconds"),
        Some(-1.0),
        "{before}"
    );
    client
        .checkpoint(v1::CheckpointRequest {})
        .await
        .expect("a checkpoint");

    let (_, text) = get(metrics, "/metrics").await;
    for (series, want) in [
        (r#"candle_ps_server_param_version{param="a"}"#, 3.0),
        (r#"candle_ps_server_param_version{param="b"}"#, 1.0),
        (r#"candle_ps_server_key_bytes{kind="values"}"#, 24.0),
        // Adam's first and second moments of `a`'s four elements.
        (
            r#"candle_ps_server_key_bytes{kind="optimizer_state"}"#,
            32.0,
        ),
        ("candle_ps_server_checkpoint_duration_seconds_count", 1.0),
        // Every method's answers are counted by the access layer, these too.
        (
            r#"candle_ps_server_requests_total{rpc="Checkpoint",code="OK"}"#,
            1.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series} in\n{text}");
    }
    let age = sample(&text, "candle_ps_server_checkpoint_age_seconds").unwrap();
    assert!((0.0..60.0).contains(&age), "age {age}");
    let written = sample(
        &text,
        "candle_ps_server_checkpoint_last_written_timestamp_seconds",
    )
    .unwrap();
    assert!(written > 1.7e9, "a Unix time, not {written}");
    server.stop().await;
}
