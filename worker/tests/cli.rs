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
fn a_worker_waits_for_its_server_up_to_the_connect_timeout_then_names_it() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    let started = std::time::Instant::now();
    let (ok, stderr) = ps_worker(&["--server", &addr, "--connect-timeout", "700ms"]);
    assert!(!ok);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "bounded"
    );
    for words in [
        addr.as_str(),
        "never came up",
        "waiting for",
        "--connect-timeout",
    ] {
        assert!(stderr.contains(words), "{words:?} in {stderr}");
    }
}

#[test]
fn a_worker_pointed_at_an_http_server_says_so_at_once() {
    use std::io::{Read, Write};
    let http = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = http.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut socket in http.incoming().flatten() {
            let _ = socket.read(&mut [0u8; 1024]);
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let (ok, stderr) = ps_worker(&["--server", &addr, "--connect-timeout", "60s"]);
    assert!(!ok);
    assert!(stderr.contains("an HTTP/1 server"), "{stderr}");
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

#[test]
fn configuration_mistakes_are_refused_before_anything_starts() {
    // No server listens on this port: each mistake must be named before the
    // worker tries to reach one.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = free.local_addr().unwrap().to_string();
    drop(free);
    // (flags, words the error must hold)
    let mistakes: [(&[&str], &str); 12] = [
        (&["--rank", "0", "--workers", "0"], "--workers"),
        (
            &["--rank", "2", "--workers", "2"],
            "--rank 2 is outside a group of --workers 2",
        ),
        (&["--epochs", "0"], "--epochs must be at least 1"),
        (&["--batch-size", "0"], "--batch-size must be at least 1"),
        (
            &["--hidden", "64,0"],
            "--hidden [64, 0] has a layer of width 0",
        ),
        (&["--lr=0"], "--lr must be a positive number"),
        (
            &["--data-dir", "/tmp"],
            "--data-dir is only read by --dataset fashion-mnist",
        ),
        (&["--pull-timeout-secs", "0"], "--pull-timeout-secs"),
        (
            &["--dataset", "synthetic", "--synthetic-classes", "1"],
            "--synthetic-classes must be at least 2",
        ),
        (&["--consistency", "ssp:x"], "--consistency"),
        (
            &["--backward-segments", "0"],
            "--backward-segments must be at least 1",
        ),
        (
            &["--hidden", "64", "--backward-segments", "3"],
            "--backward-segments 3 is more than the model's 2 layers",
        ),
    ];
    for (flags, words) in mistakes {
        let mut args = vec!["--server", addr.as_str()];
        args.extend_from_slice(flags);
        let (ok, stderr) = ps_worker(&args);
        assert!(!ok, "{flags:?} was accepted");
        assert!(stderr.contains(words), "{flags:?}: {stderr}");
        assert!(
            !stderr.contains("connect"),
            "{flags:?} got as far as connecting: {stderr}"
        );
    }
}
