//! The `ps-worker` binary's own checks: bad flags and missing peers fail fast with
//! messages that say what to do.

use std::process::Command;

fn ps_worker(args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-worker"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run ps-worker");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_worker_with_no_server_fails_fast_naming_the_address() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let (ok, stderr) = ps_worker(&["--server", &addr]);
    assert!(!ok);
    assert!(
        stderr.contains(&addr) && stderr.contains("cannot connect"),
        "{stderr}"
    );
}

#[test]
fn a_missing_data_directory_is_named() {
    let (ok, stderr) = ps_worker(&[
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        "/nonexistent/fmnist",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("/nonexistent/fmnist/train-images-idx3-ubyte"),
        "{stderr}"
    );
}

#[test]
fn unknown_flag_values_are_explained() {
    let (ok, stderr) = ps_worker(&["--optimizer", "lbfgs"]);
    assert!(!ok);
    assert!(stderr.contains("use sgd, momentum or adam"), "{stderr}");
    let (ok, stderr) = ps_worker(&["--device", "tpu:0"]);
    assert!(!ok);
    assert!(stderr.contains("cpu or cuda:N"), "{stderr}");
}
