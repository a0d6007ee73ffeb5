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
fn ps_local_trains_over_mutual_tls() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .args(["--tls", "--epochs", "10", "--json"])
        .env("NO_COLOR", "1")
        .output()
        .expect("run ps-local");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "ps-local --tls failed:\n{stderr}");
    for part in ["ps-scheduler listening", "ps-server listening"] {
        let line = stderr.lines().find(|l| l.contains(part)).expect(part);
        assert!(line.contains("tls=true"), "{line}");
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON");
    assert!(
        summary["test_accuracy"].as_f64().unwrap() >= 0.95,
        "{summary}"
    );
}

#[test]
fn zero_workers_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .args(["--workers", "0"])
        .output()
        .expect("run ps-local");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--workers") && stderr.contains("1.."),
        "{stderr}"
    );
}

/// Runs `ps-local ARGS --json` and returns its summary.
fn ps_local_json(args: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .args(args)
        .arg("--json")
        .env("NO_COLOR", "1")
        .output()
        .expect("run ps-local");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "ps-local {args:?} failed:\n{stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().expect("a summary")).expect("JSON")
}

#[test]
fn a_saved_model_loads_into_candle_and_reproduces_the_reported_accuracy() {
    let dir = tempfile::tempdir().expect("a folder");
    let path = dir.path().join("digits.safetensors");
    let file = path.to_str().expect("utf-8 path");
    let summary = ps_local_json(&["--epochs", "3", "--hidden", "32", "--save", file]);
    let reported = summary["test_accuracy"].as_f64().expect("test_accuracy");
    let accuracy = accuracy_of_saved(&path, 32);
    // The same predictions; JSON's float parsing may differ in the last bit.
    assert!(
        (accuracy - reported).abs() < 1e-9,
        "the saved parameters are the evaluated ones: {accuracy} vs {reported}"
    );
    assert!(accuracy > 0.5, "and they were trained: {accuracy}");

    // Starting again from them: training goes on from the saved accuracy.
    let resumed = ps_local_json(&["--epochs", "1", "--hidden", "32", "--load", file]);
    let after = resumed["test_accuracy"].as_f64().expect("test_accuracy");
    assert!(
        after >= reported - 0.05,
        "resumed at {after}, saved at {reported}"
    );
}

/// The test accuracy of the digits MLP with `hidden` units whose parameters are
/// in the safetensors file at `path`, loaded the candle way into a fresh model.
fn accuracy_of_saved(path: &std::path::Path, hidden: usize) -> f64 {
    use candle_core::{DType, Device};
    use candle_nn::{VarBuilder, VarMap};
    use ps_worker::model::Mlp;

    let data = ps_worker::data::digits::load().expect("digits");
    let mut varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = Mlp::new(vb, data.width(), &[hidden], data.classes).expect("model");
    varmap
        .load(path)
        .unwrap_or_else(|e| panic!("VarMap::load reads {}: {e}", path.display()));
    ps_worker::train::accuracy(&model, &data.test, &Device::Cpu).expect("evaluate")
}

#[test]
fn checkpoints_of_partitioned_parameters_export_to_the_trained_model() {
    let dir = tempfile::tempdir().expect("a folder");
    let checkpoints = dir.path().join("checkpoints");
    let saved = dir.path().join("saved.safetensors");
    let exported = dir.path().join("exported.safetensors");
    // 512 hidden units make fc0.weight 128 KiB, which the scheduler cuts into
    // partitions on the two servers.
    let summary = ps_local_json(&[
        "--epochs",
        "1",
        "--hidden",
        "512",
        "--checkpoint-dir",
        checkpoints.to_str().expect("utf-8 path"),
        "--save",
        saved.to_str().expect("utf-8 path"),
    ]);
    let reported = summary["test_accuracy"].as_f64().expect("test_accuracy");
    let export = ps_server::export::export(&checkpoints, &exported, true).expect("export");
    assert_eq!(export.params, 4, "fc0 and fc1, weight and bias: {export:?}");
    assert!(
        export.keys > export.params,
        "some parameter was partitioned: {export:?}"
    );
    assert_eq!(
        export.versions.0, export.versions.1,
        "the servers' last checkpoints are of the same step: {export:?}"
    );
    for (path, what) in [(&saved, "--save"), (&exported, "the export")] {
        let accuracy = accuracy_of_saved(path, 512);
        assert!(
            (accuracy - reported).abs() < 1e-9,
            "{what} reproduces the reported accuracy: {accuracy} vs {reported}"
        );
    }
}

#[test]
fn save_and_load_paths_are_checked_before_anything_starts() {
    let cases = [
        (
            ["--save", "/nonexistent/dir/model.safetensors"],
            "--save: the folder /nonexistent/dir does not exist",
        ),
        (
            ["--load", "/nonexistent/model.safetensors"],
            "--load /nonexistent/model.safetensors: no such file",
        ),
    ];
    for (args, words) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_ps-local"))
            .args(args)
            .output()
            .expect("run ps-local");
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(words), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("local cluster up"),
            "{args:?} started a cluster"
        );
    }
}

#[test]
fn version_and_help_name_the_program() {
    let version = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .arg("-V")
        .output()
        .expect("run ps-local -V");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        concat!("ps-local ", env!("CARGO_PKG_VERSION"))
    );
    let help = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .arg("--help")
        .output()
        .expect("run ps-local --help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.starts_with("An in-process candle-ps cluster"),
        "{help}"
    );
    assert!(help.contains("[env: PS_WORKERS="), "{help}");
}

/// `--plan auto` plans the run on the spot and runs what it chose; a plan
/// file (here one edited by hand, as a user may) sets the servers and the
/// consistency over the flags.
#[test]
fn a_plan_chooses_the_setup_auto_or_from_a_file() {
    let auto = ps_local_json(&["--plan", "auto", "--epochs", "5"]);
    let servers = auto["servers"].as_u64().unwrap();
    assert!((1..=4).contains(&servers), "{auto}");
    assert!(auto["test_accuracy"].as_f64().unwrap() > 0.8, "{auto}");

    let model = ps_scheduler::plan::ModelShapes::from_spec("mlp:64,64,10").unwrap();
    let cluster = ps_scheduler::plan::Cluster {
        workers: 2,
        worker_link: 5e9,
        server_link: 5e9,
        rtt: 50e-6,
        compute: 1e-3,
        cores: 2,
    };
    let choices = ps_scheduler::plan::Choices {
        max_servers: 3,
        server_hosts: 0,
        allow_bf16: false,
        staleness: 1,
        server_memory: 1 << 30,
        optimizer_state: 0,
    };
    let constants = ps_scheduler::plan::Constants::default();
    let mut plan = ps_scheduler::plan::plan(&model, &cluster, &choices, &constants).unwrap();
    plan.chosen.servers = 3;
    plan.chosen.pipeline = false;
    plan.chosen.wire_bytes = 2;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    ps_scheduler::plan::cli::write_plan(&plan, &file).unwrap();
    let planned = ps_local_json(&[
        "--plan",
        file.to_str().unwrap(),
        "--servers",
        "1",
        "--epochs",
        "5",
    ]);
    assert_eq!(planned["servers"].as_u64(), Some(3), "{planned}");
    for worker in planned["per_worker"].as_array().unwrap() {
        assert_eq!(
            worker["wire_dtype"], "bf16",
            "the plan's 2-byte values: {planned}"
        );
    }
    assert!(
        planned["test_accuracy"].as_f64().unwrap() > 0.8,
        "{planned}"
    );

    let missing = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .args(["--plan", "/nonexistent/plan.json"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("reading the plan"));
}

#[test]
fn the_click_model_learns_with_its_table_on_the_servers() {
    let summary = ps_local_json(&[
        "--model",
        "ctr",
        "--dataset",
        "clicks",
        "--click-train",
        "16000",
        "--epochs",
        "4",
        "--batch-size",
        "128",
    ]);
    // Half the examples are clicks: 0.5 is a model that learned nothing. The
    // same run reaches 0.71 (release build, docs/benchmarks.md).
    let accuracy = summary["test_accuracy"].as_f64().unwrap();
    assert!(accuracy >= 0.65, "{summary}");
    assert_eq!(summary["dataset"], "clicks");
}

#[test]
fn the_click_model_and_its_data_set_go_together() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-local"))
        .args(["--model", "ctr"])
        .output()
        .expect("run ps-local");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--dataset clicks"), "{stderr}");
}
