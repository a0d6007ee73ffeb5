//! `scripts/gpu.sh`, as far as a machine with no GPU can take it: it refuses
//! clearly without its SDK or its carried programs, and its run's checks (a–g of
//! docs/gpu.md) pass through the same script with `--dry-run`, the CPU programs
//! standing in for the CUDA worker.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ps_tests::{binary, example};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu.sh")
}

fn gpu_sh(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new("bash");
    command.arg(script()).args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run bash scripts/gpu.sh")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn without_the_sdk_cargo_is_refused_and_the_sdk_command_named() {
    let empty = tempfile::tempdir().unwrap();
    let output = gpu_sh(&["cargo", "build"], &[("PS_CUDA_SDK", empty.path())]);
    assert!(!output.status.success());
    let said = stderr(&output);
    assert!(
        said.contains("no CUDA SDK under") && said.contains("`scripts/gpu.sh sdk`"),
        "{said}"
    );
}

#[test]
fn without_the_carried_programs_the_run_names_the_build() {
    let empty = tempfile::tempdir().unwrap();
    let output = gpu_sh(&["run"], &[("PS_GPU_CARRY", empty.path())]);
    assert!(!output.status.success());
    let said = stderr(&output);
    assert!(said.contains("`scripts/gpu.sh build`"), "{said}");
}

#[test]
fn an_unknown_command_or_flag_is_refused() {
    let output = gpu_sh(&["deploy"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("scripts/gpu.sh build"));
    let output = gpu_sh(&["run", "--fast"], &[]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("unknown flag --fast"));
}

/// The run's checks on the CPU programs: digits on the "device" against the CPU,
/// the large MLP's steps/s and time split, two workers and two servers under BSP
/// ending with equal parameters, the copies' share of the step, the large MLP
/// through each data path and step shape, the compute probe, and the
/// scale-up figures of the host's CPUs.
#[test]
fn the_dry_run_makes_every_check_and_writes_its_figures() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no python3 here to run scripts/gpu_run.py");
        return;
    }
    let worker = binary("ps-worker");
    binary("ps-server");
    // The scale-up check's programs (g), which the dry run links where built.
    binary("ps-local");
    example("single_process");
    example("data_parallel");
    let programs = worker.parent().unwrap();
    let out = tempfile::tempdir().unwrap();
    let output = gpu_sh(
        &["run", "--dry-run", "--quick"],
        &[("PS_GPU_PROGRAMS", programs), ("OUT", out.path())],
    );
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    let text = std::fs::read_to_string(out.path().join("gpu.json")).expect("gpu.json");
    let figures: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(figures["device"], "cpu", "{figures}");
    assert_eq!(figures["failures"], serde_json::json!([]), "{figures}");
    let checks = &figures["checks"];
    let digits = &checks["a_digits"];
    assert!(digits["gap"].as_f64().unwrap() <= 0.02, "{digits}");
    assert!(
        digits["device_accuracy"].as_f64().unwrap() > 0.8,
        "{digits}"
    );
    let mlp = &checks["b_large_mlp"];
    for field in ["device_steps_per_second", "cpu_steps_per_second", "speedup"] {
        assert!(mlp[field].as_f64().unwrap() > 0.0, "{field}: {mlp}");
    }
    assert!(
        mlp["device_time_split"]["gather"]["seconds"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let pair = &checks["c_bsp_pair"];
    assert_eq!(pair["equal"], true, "{pair}");
    assert_eq!(pair["steps"][0], pair["steps"][1], "{pair}");
    let copies = &checks["d_device_copies"];
    let share = copies["copies_share"].as_f64().unwrap();
    assert!(share > 0.0 && share < 1.0, "{copies}");
    let paths = &checks["e_data_paths"];
    for variant in [
        "grpc",
        "shm",
        "shm_bf16",
        "shm_3_segments",
        "shm_push_then_pull",
    ] {
        let row = &paths["variants"][variant];
        assert!(row["steps_per_second"].as_f64().unwrap() > 0.0, "{paths}");
        assert!(
            row["ms_per_step"]["push"].as_f64().unwrap() > 0.0,
            "{paths}"
        );
    }
    assert!(paths["shm_over_grpc"].as_f64().unwrap() > 0.0, "{paths}");
    let probe = &checks["f_compute_probe"];
    assert_eq!(probe["device"], "cpu", "{probe}");
    assert!(
        probe["probe_step_seconds"].as_f64().unwrap() > 0.0,
        "{probe}"
    );
    assert!(
        probe["b_compute_seconds_per_step"].as_f64().unwrap() > 0.0,
        "{probe}"
    );
    let host = &checks["g_scale_up_host"];
    for threads in ["default_threads", "two_threads"] {
        let figures = &host[threads];
        for path in ["shm", "grpc"] {
            let ratio = figures["data_parallel_over_single"][path].as_f64();
            assert!(ratio.unwrap() > 0.0, "{threads} {path}: {host}");
        }
        assert!(
            figures["ps_local_shm_over_grpc"].as_f64().unwrap() > 0.0,
            "{threads}: {host}"
        );
    }
}
