//! `ps-local` as a user runs it.

use std::process::Command;

#[test]
fn ps_local_with_defaults_reaches_95_percent_and_prints_json_last() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .args(["--servers", "2", "--workers", "2", "--json"])
        .env("NO_COLOR", "1")
        .output()
        .expect("run ps-local");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "ps-local failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("ps-local printed a summary");
    let summary: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert!(
        summary["test_accuracy"].as_f64().unwrap() >= 0.95,
        "{summary}"
    );
    for field in ["train_loss", "steps", "wall_seconds", "examples_per_second"] {
        assert!(summary[field].is_number(), "{field} missing: {summary}");
    }
    assert_eq!(summary["per_worker"].as_array().map(Vec::len), Some(2));
    assert!(
        stderr.contains("local cluster up"),
        "logs explain what happened:\n{stderr}"
    );
}

#[test]
fn zero_workers_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .args(["--workers", "0"])
        .output()
        .expect("run ps-local");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("at least 1"));
}
