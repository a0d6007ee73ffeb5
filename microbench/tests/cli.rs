//! `ps-microbench` as a user runs it: JSON lines with every documented field, CSV and
//! SVG output, and a remote `--target` started with `serve`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn microbench(args: &[&str]) -> Vec<serde_json::Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(args)
        .output()
        .expect("run ps-microbench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "ps-microbench {args:?} failed:\n{stderr}"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"))
        })
        .collect()
}

const FIELDS: [&str; 9] = [
    "bench",
    "encoding",
    "size_bytes",
    "throughput_bytes_per_sec",
    "tcp_throughput_bytes_per_sec",
    "ratio_vs_tcp",
    "p50_us",
    "p99_us",
    "tcp_p50_us",
];

#[test]
fn bandwidth_json_has_grpc_and_tcp_for_every_size_and_mode() {
    let rows = microbench(&[
        "bandwidth",
        "--sizes",
        "4KiB,1MiB",
        "--json",
        "--seconds",
        "0.2",
        "--warmup-seconds",
        "0.05",
        "--reps",
        "1",
    ]);
    assert_eq!(rows.len(), 4, "2 sizes x unary and stream");
    for row in &rows {
        for field in FIELDS {
            assert!(row.get(field).is_some(), "{field} missing from {row}");
        }
        assert_eq!(row["bench"], "bandwidth");
        assert!(
            row["throughput_bytes_per_sec"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        assert!(
            row["tcp_throughput_bytes_per_sec"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        assert!(row["ratio_vs_tcp"].as_f64().unwrap() > 0.0, "{row}");
        assert!(
            row["p50_us"].is_null(),
            "latency fields do not apply: {row}"
        );
    }
    let sizes: Vec<u64> = rows
        .iter()
        .map(|r| r["size_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![4096, 1 << 20, 4096, 1 << 20]);
}

#[test]
fn latency_json_has_percentiles_next_to_tcp() {
    let rows = microbench(&[
        "latency", "--sizes", "64B", "--json", "--count", "300", "--warmup", "30", "--reps", "1",
    ]);
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    for field in FIELDS {
        assert!(row.get(field).is_some(), "{field} missing from {row}");
    }
    let (p50, p99, max) = (
        row["p50_us"].as_f64().unwrap(),
        row["p99_us"].as_f64().unwrap(),
        row["max_us"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{row}");
    assert!(row["tcp_p50_us"].as_f64().unwrap() > 0.0);
    assert_eq!(row["messages"].as_u64(), Some(300));
}

#[test]
fn latency_and_bandwidth_run_over_tls() {
    // The client trusts only the run's CA and dials https: a server that did not
    // serve TLS with that certificate would fail every connection.
    let rows = microbench(&[
        "latency", "--tls", "--sizes", "64B", "--json", "--count", "50", "--warmup", "5", "--reps",
        "1",
    ]);
    assert_eq!(rows.len(), 1);
    assert!(rows[0]["p50_us"].as_f64().unwrap() > 0.0, "{}", rows[0]);
    let rows = microbench(&[
        "bandwidth",
        "--tls",
        "--sizes",
        "64KiB",
        "--mode",
        "stream",
        "--json",
        "--seconds",
        "0.1",
        "--warmup-seconds",
        "0.02",
        "--reps",
        "1",
    ]);
    assert_eq!(rows.len(), 1);
    assert!(rows[0]["throughput_bytes_per_sec"].as_f64().unwrap() > 0.0);

    let output = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(["latency", "--tls", "--target", "127.0.0.1:1"])
        .output()
        .expect("run ps-microbench");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("leave out --target"), "{stderr}");
}

#[test]
fn schemes_and_encodings_write_csv_and_charts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let args = [
        "bandwidth",
        "--scheme",
        "skew",
        "--encoding",
        "bytes,floats",
        "--mode",
        "unary",
        "--seconds",
        "0.1",
        "--warmup-seconds",
        "0.02",
        "--reps",
        "1",
        "--out",
        out,
    ];
    let output = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("skew x10") && table.contains("floats") && table.contains("vs tcp"),
        "{table}"
    );
    let csv = std::fs::read_to_string(dir.path().join("bandwidth.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "header and two rows:\n{csv}");
    let svg = std::fs::read_to_string(dir.path().join("bandwidth.svg")).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("TCP"),
        "the chart names its series"
    );
    let labels = svg.replace('\n', "");
    assert!(
        labels.contains("payload size")
            && labels.contains("GB/s (log scale)")
            && [" B<", " kB<", " MB<"]
                .iter()
                .any(|unit| labels.contains(unit)),
        "sizes are labelled in units on a log axis"
    );

    let args = [
        "latency", "--sizes", "64B,1KiB", "--count", "50", "--warmup", "5", "--reps", "1", "--out",
        out,
    ];
    let output = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        std::fs::read_to_string(dir.path().join("latency_cdf.svg"))
            .unwrap()
            .contains("<svg")
    );
}

#[test]
fn a_remote_target_started_with_serve_is_measured() {
    let mut server = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tcp-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .expect("serve names its address")
        .to_string();
    let rows = microbench(&[
        "latency", "--target", &addr, "--sizes", "64B", "--json", "--count", "50", "--warmup", "5",
        "--reps", "1",
    ]);
    assert_eq!(rows.len(), 1);
    server.kill().unwrap();
    server.wait().unwrap();
}

#[test]
fn bad_sizes_and_schemes_are_explained() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(["bandwidth", "--sizes", "12XB"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown unit"));
    let output = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(["latency", "--scheme", "zipf"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("uniform"));
}

#[test]
fn a_bandwidth_run_says_what_it_measures_as_it_goes() {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(["bandwidth", "--sizes", "4KiB", "--seconds", "0.05"])
        .args(["--warmup-seconds", "0.01", "--reps", "1", "--json"])
        .output()
        .expect("run ps-microbench");
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for line in [
        "measuring=unary bytes 4KiB done=0 of=2",
        "measuring=stream bytes 4KiB done=1 of=2",
    ] {
        assert!(stderr.contains(line), "{line:?} in {stderr}");
    }
}

#[test]
fn kv_measures_push_and_pull_by_worker_processes_against_real_servers() {
    let rows = microbench(&[
        "kv",
        "--servers",
        "2",
        "--workers",
        "2",
        "--sizes",
        "4KiB,256KiB",
        "--window",
        "2",
        "--seconds",
        "0.3",
        "--json",
    ]);
    let ops: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["size_bytes"].as_u64().unwrap(),
                r["mode"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            (4096, "push"),
            (4096, "pull"),
            (262_144, "push"),
            (262_144, "pull")
        ]
    );
    for row in &rows {
        let payload = row["payload"].as_str().unwrap();
        let parts: usize = payload
            .rsplit_once('(')
            .and_then(|(_, p)| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{payload} names its parts"));
        assert!(parts >= 2, "{payload}: the key is split over both servers");
        for field in FIELDS.iter().chain(&["rpcs_per_sec"]) {
            if *field != "p90_us" {
                assert!(
                    row[field].is_number() || row[field].is_string(),
                    "{field} in {row}"
                );
            }
        }
        assert!(
            row["throughput_bytes_per_sec"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        assert!(row["p50_us"].as_f64().unwrap() > 0.0, "{row}");
        let servers = row["servers"]["servers"].as_array().unwrap();
        assert_eq!(servers.len(), 2, "{row}");
        let tcp_runs: Vec<f64> = row["servers"]["tcp_runs_bytes_per_sec"]
            .as_array()
            .unwrap_or_else(|| panic!("raw TCP's runs in {row}"))
            .iter()
            .map(|run| run.as_f64().unwrap())
            .collect();
        assert_eq!(tcp_runs.len(), 2, "raw TCP before and after: {row}");
        assert!(tcp_runs.iter().all(|run| *run > 0.0), "{row}");
        let mean = (tcp_runs[0] + tcp_runs[1]) / 2.0;
        let tcp = row["tcp_throughput_bytes_per_sec"].as_f64().unwrap();
        assert!(
            (tcp - mean).abs() <= 1e-9 * mean,
            "the ratio's TCP is the mean: {row}"
        );
        assert!(
            servers
                .iter()
                .all(|s| s["peak_rss_bytes"].as_u64().unwrap() > 0),
            "{row}"
        );
        assert_eq!(row["servers"]["workers"].as_array().unwrap().len(), 2);
        assert!(row["servers"]["tcp_cores"].as_f64().unwrap() > 0.0, "{row}");
        // Each side's CPU per GB moved in the throughput phase, and raw TCP's.
        for per_gb in [
            &row["client_cpu_sec_per_gb"],
            &row["server_cpu_sec_per_gb"],
            &row["servers"]["tcp_cpu_sec_per_gb"],
        ] {
            assert!(per_gb.as_f64().unwrap() > 0.0, "{row}");
        }
        assert!(
            row["servers"].get("tls_tcp_bytes_per_sec").is_none(),
            "no TLS baseline without --tls: {row}"
        );
    }
}

/// `kv` with `flag` over one 256 KiB key, two operations in flight, briefly.
fn kv_of_one_small_key(flag: &str) -> Vec<serde_json::Value> {
    microbench(&[
        "kv",
        flag,
        "--sizes",
        "256KiB",
        "--window",
        "2",
        "--seconds",
        "0.3",
        "--json",
    ])
}

#[test]
fn kv_over_tls_reads_each_row_against_raw_tls_as_well_as_raw_tcp() {
    let rows = kv_of_one_small_key("--tls");
    assert_eq!(rows.len(), 2, "a push row and a pull row: {rows:?}");
    for row in &rows {
        assert_eq!(row["encoding"], "f32 tls grpc", "{row}");
        let figures = &row["servers"];
        let tls_runs = figures["tls_tcp_runs_bytes_per_sec"]
            .as_array()
            .unwrap_or_else(|| panic!("raw TLS's runs in {row}"));
        assert_eq!(tls_runs.len(), 2, "raw TLS before and after: {row}");
        let tls_tcp = figures["tls_tcp_bytes_per_sec"].as_f64().unwrap();
        assert!(tls_tcp > 0.0, "{row}");
        assert!(figures["tls_tcp_cores"].as_f64().unwrap() > 0.0, "{row}");
        let throughput = row["throughput_bytes_per_sec"].as_f64().unwrap();
        let ratio = figures["ratio_vs_tls_tcp"].as_f64().unwrap();
        assert!(
            (ratio - throughput / tls_tcp).abs() <= 1e-9 * ratio,
            "the ratio is to the raw TLS mean: {row}"
        );
    }
}

#[test]
fn kv_with_the_sgd_floor_reads_each_push_against_raw_tcp_that_applies_sgd() {
    let rows = kv_of_one_small_key("--sgd-floor");
    let ops: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(ops, ["push", "pull"], "{rows:?}");
    let (push, pull) = (&rows[0]["servers"], &rows[1]["servers"]);
    let runs = push["tcp_sgd_runs_bytes_per_sec"]
        .as_array()
        .unwrap_or_else(|| panic!("the floor's runs in {push}"));
    assert_eq!(runs.len(), 2, "the floor before and after: {push}");
    let floor = push["tcp_sgd_bytes_per_sec"].as_f64().unwrap();
    let mean = runs.iter().map(|r| r.as_f64().unwrap()).sum::<f64>() / 2.0;
    assert!(
        floor > 0.0 && (floor - mean).abs() <= 1e-9 * floor,
        "{push}"
    );
    assert!(push["tcp_sgd_cores"].as_f64().unwrap() > 0.0, "{push}");
    assert!(push["tcp_sgd_p50_us"].as_f64().unwrap() > 0.0, "{push}");
    let throughput = rows[0]["throughput_bytes_per_sec"].as_f64().unwrap();
    let ratio = push["ratio_vs_tcp_sgd"].as_f64().unwrap();
    assert!(
        (ratio - throughput / floor).abs() <= 1e-9 * ratio,
        "the ratio is to the floor's mean: {push}"
    );
    assert!(
        pull.get("tcp_sgd_bytes_per_sec").is_none(),
        "a pull applies nothing, so it is not read against the floor: {pull}"
    );
}

#[test]
fn kv_measures_both_data_paths_in_one_run_against_one_cores_floors_and_the_rings() {
    let rows = kv_of_one_small_key("--data-path=grpc,shm");
    let paths: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["mode"].as_str().unwrap(), r["encoding"].as_str().unwrap()))
        .collect();
    assert_eq!(
        paths,
        [
            ("push", "f32 grpc"),
            ("pull", "f32 grpc"),
            ("push", "f32 shm"),
            ("pull", "f32 shm")
        ]
    );
    for row in &rows {
        let figures = &row["servers"];
        let (memcpy, copy_sgd) = (
            figures["memcpy_bytes_per_sec"].as_f64().unwrap(),
            figures["copy_sgd_bytes_per_sec"].as_f64().unwrap(),
        );
        assert!(
            memcpy > copy_sgd && copy_sgd > 0.0,
            "a copy alone is faster: {row}"
        );
        // A pull's floor is the copy; a push's, the copy and the SGD.
        let floor = match row["mode"].as_str().unwrap() {
            "pull" => memcpy,
            _ => copy_sgd,
        };
        assert_eq!(
            figures["floor_bytes_per_sec"].as_f64().unwrap(),
            floor,
            "{row}"
        );
        let throughput = row["throughput_bytes_per_sec"].as_f64().unwrap();
        let ratio = figures["ratio_vs_floor"].as_f64().unwrap();
        assert!(
            throughput > 0.0 && (ratio - throughput / floor).abs() <= 1e-9 * ratio,
            "{row}"
        );
        // A pull is read against the same copy into as many buffers as
        // its worker pulls into, too; a push is not.
        let window_floor = figures["memcpy_window_bytes_per_sec"].as_f64().unwrap();
        assert!(window_floor > 0.0, "{row}");
        match row["mode"].as_str().unwrap() {
            "pull" => {
                let ratio = figures["ratio_vs_memcpy_window"].as_f64().unwrap();
                assert!(
                    (ratio - throughput / window_floor).abs() <= 1e-9 * ratio,
                    "{row}"
                );
            }
            _ => assert!(figures.get("ratio_vs_memcpy_window").is_none(), "{row}"),
        }
        // Every row is read against the ring between two threads, too.
        let ring = figures["ring_bytes_per_sec"].as_f64().unwrap();
        let ratio = figures["ratio_vs_ring"].as_f64().unwrap();
        assert!(
            ring > 0.0 && (ratio - throughput / ring).abs() <= 1e-9 * ratio,
            "{row}"
        );
        // And a push's p50 against the rings' round trip carrying the key.
        let round_trip = figures["round_trip_p50_us"].as_f64().unwrap();
        assert!(round_trip > 0.0, "{row}");
        let p50 = row["p50_us"].as_f64().unwrap();
        match row["mode"].as_str().unwrap() {
            "push" => {
                let ratio = figures["p50_vs_round_trip"].as_f64().unwrap();
                assert!((ratio - p50 / round_trip).abs() <= 1e-9 * ratio, "{row}");
            }
            _ => assert!(figures.get("p50_vs_round_trip").is_none(), "{row}"),
        }
        // And its operations per second against those round trips' rate
        // with the run's window in flight.
        let round_trips = figures["round_trips_per_sec"].as_f64().unwrap();
        let operations = row["rpcs_per_sec"].as_f64().unwrap();
        let ratio = figures["ops_vs_round_trips"].as_f64().unwrap();
        assert!(
            round_trips > 0.0 && (ratio - operations / round_trips).abs() <= 1e-6 * ratio,
            "{row}"
        );
    }
}

#[test]
fn apply_measures_every_optimizer_against_a_memcpy_of_the_same_key() {
    let rows = microbench(&["apply", "--size", "1MiB", "--reps", "3", "--json"]);
    let passes: Vec<&str> = rows.iter().map(|r| r["pass"].as_str().unwrap()).collect();
    assert_eq!(passes, ["memcpy", "sgd", "momentum", "adam", "adam-tiny"]);
    for row in &rows {
        assert_eq!(row["size_bytes"], 1 << 20, "{row}");
        let seconds = row["seconds"].as_f64().unwrap();
        let key_rate = row["key_bytes_per_sec"].as_f64().unwrap();
        assert!(seconds > 0.0 && key_rate > 0.0, "{row}");
        assert!(
            (key_rate * seconds / f64::from(1 << 20) - 1.0).abs() < 1e-6,
            "{row}"
        );
        assert!(
            row["memory_bytes_per_sec"].as_f64().unwrap() > key_rate,
            "{row}"
        );
    }
    assert_eq!(rows[0]["ratio_to_memcpy"], 1.0);
    let memcpy = rows[0]["memory_bytes_per_sec"].as_f64().unwrap();
    let adam = &rows[3];
    let ratio = adam["ratio_to_memcpy"].as_f64().unwrap();
    let expected = adam["memory_bytes_per_sec"].as_f64().unwrap() / memcpy;
    assert!((ratio - expected).abs() < 1e-9, "{adam}");
}

/// `rows` pushes then pulls Zipf batches of rows from a worker process to two
/// real servers (through shared memory: the row operations' session), and
/// reads each operation against its raw-TCP floor, with the servers' CPU per
/// row and RSS.
#[test]
fn rows_measures_push_and_pull_of_embedding_rows_against_real_servers() {
    let rows = microbench(&[
        "rows",
        "--servers",
        "2",
        "--batch",
        "512",
        "--width",
        "16",
        "--rows",
        "100000",
        "--seconds",
        "0.3",
        "--data-path",
        "shm",
        "--json",
    ]);
    let modes: Vec<&str> = rows.iter().filter_map(|r| r["mode"].as_str()).collect();
    assert_eq!(modes, ["push", "pull"], "{rows:?}");
    // Through the shared-memory session (a worker that cannot have it fails).
    assert!(
        rows[0]["payload"].as_str().unwrap().ends_with("shm"),
        "{rows:?}"
    );
    for row in &rows {
        assert_eq!(row["bench"], "rows", "{row}");
        let servers = &row["servers"];
        for field in [
            "rows_per_sec",
            "rows_per_batch",
            "server_cpu_us_per_row",
            "floor_rows_per_sec",
        ] {
            let value = servers[field].as_f64().unwrap_or(0.0);
            assert!(value > 0.0, "{field} = {value}: {row}");
        }
        // 512 Zipf draws over 100,000 ids repeat many: fewer distinct rows.
        assert!(servers["rows_per_batch"].as_f64().unwrap() < 512.0, "{row}");
        let rss = servers["server_peak_rss_bytes"].as_array().expect("RSS");
        assert_eq!(rss.len(), 2, "one per server: {row}");
    }
}

#[test]
fn results_whose_reader_closed_early_end_the_run_quietly() {
    // As `ps-microbench apply ... | head -c 0` would: the reader is gone
    // before the first row is written.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ps-microbench"))
        .args(["apply", "--size", "4KiB", "--reps", "1", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run ps-microbench");
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
