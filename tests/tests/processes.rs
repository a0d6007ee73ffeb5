//! The binaries as a user runs them: separate processes over loopback.

use std::time::Duration;

use ps_tests::{
    Finished, ServerProcess, binary, example, http_get, metric_sample, read_log_until, run,
    spawn_worker,
};

const LIMIT: Duration = Duration::from_secs(240);

fn accuracy(json: &serde_json::Value) -> f64 {
    json["test_accuracy"]
        .as_f64()
        .expect("test_accuracy in the summary")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_and_two_workers_with_no_other_flags_reach_95_percent() {
    let server = ServerProcess::start(&["--workers", "2"]).await;
    let args = ["--server", server.addr.as_str(), "--json"];
    let (a, b) = tokio::join!(
        run(binary("ps-worker"), &args, LIMIT),
        run(binary("ps-worker"), &args, LIMIT)
    );
    for worker in [&a, &b] {
        assert!(worker.success, "ps-worker failed:\n{}", worker.stderr);
    }
    let (a, b) = (a.json(), b.json());
    let mut ranks = [a["rank"].as_u64().unwrap(), b["rank"].as_u64().unwrap()];
    ranks.sort_unstable();
    assert_eq!(
        ranks,
        [0, 1],
        "the server hands out distinct ranks, so the two split the data"
    );
    for summary in [&a, &b] {
        assert!(accuracy(summary) >= 0.95, "{summary}");
        for field in ["train_loss", "steps", "wall_seconds", "examples_per_second"] {
            assert!(summary[field].is_number(), "{field} missing from {summary}");
        }
        time_split_adds_up(&summary["time_split"]);
    }
    server.stop().await;
}

/// `ps-worker --requests-per-server` cuts each push to a server into that
/// many requests (when not pipelined): a 4 MiB layer and the rest go as one
/// request with 1, and as more with the default 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_server_sets_how_many_requests_a_push_makes() {
    let requests = |given: &'static [&'static str]| async move {
        let mut args = vec!["--no-pipeline", "--hidden", "1024,1024"];
        args.extend(["--epochs", "1", "--data-path", "grpc"]);
        args.extend(given);
        let worker = worker_with_a_server_of_its_own(&args).await;
        let ready = worker
            .stderr
            .lines()
            .find(|l| l.contains("trainer ready"))
            .unwrap_or_else(|| panic!("no trainer ready line:\n{}", worker.stderr))
            .to_string();
        let field = ready
            .split_whitespace()
            .find_map(|f| f.strip_prefix("requests_per_push="))
            .unwrap_or_else(|| panic!("no requests_per_push in {ready}"));
        field.parse::<usize>().expect("a count")
    };
    assert_eq!(requests(&["--requests-per-server", "1"]).await, 1);
    assert!(requests(&[]).await > 1, "the default 4 cuts the push");
}

/// A worker that reaches its server through shared memory (the default on
/// the server's host) trains at a priority lowered by `--yield-to-servers`
/// (5 by default), so that the server it shares the cores with runs first;
/// over gRPC, or with 0, it keeps the priority it was started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sharing_its_servers_host_lowers_its_priority_and_others_keep_theirs() {
    let started_at = ps_worker::share_cores::current_nice().expect("this process's nice value");
    assert!(
        started_at + 7 <= 19,
        "at nice {started_at} a worker cannot be seen to lower itself by 7; run the tests at nice 12 or lower"
    );
    let nice = |given: &'static [&'static str]| async move {
        let mut args = vec!["--epochs", "1"];
        args.extend(given);
        let worker = worker_with_a_server_of_its_own(&args).await;
        let summary = worker.json();
        (
            summary["nice"].as_i64().expect("nice in the summary"),
            worker.stderr,
        )
    };
    let (shared, log) = nice(&[]).await;
    assert_eq!(shared, i64::from((started_at + 5).min(19)), "{log}");
    assert!(
        log.contains("sharing this host's cores with its servers"),
        "{log}"
    );
    let (lowered_more, _) = nice(&["--yield-to-servers", "7"]).await;
    assert_eq!(lowered_more, i64::from((started_at + 7).min(19)));
    for kept in [&["--data-path", "grpc"][..], &["--yield-to-servers", "0"]] {
        let (kept_at, log) = nice(kept).await;
        assert_eq!(kept_at, i64::from(started_at), "{kept:?}: {log}");
    }
}

/// `ps-worker --json` with `args` against a server of its own (a group of one
/// rank), once it has exited successfully.
async fn worker_with_a_server_of_its_own(args: &[&str]) -> Finished {
    let server = ServerProcess::start(&["--workers", "1"]).await;
    let mut all = vec!["--server", server.addr.as_str(), "--json"];
    all.extend(args);
    let worker = run(binary("ps-worker"), &all, LIMIT).await;
    assert!(worker.success, "ps-worker failed:\n{}", worker.stderr);
    server.stop().await;
    worker
}

/// A worker's time split: every part measured, the shares add up to the
/// training loop's time, and what no part accounts for stays under 5% of it.
fn time_split_adds_up(split: &serde_json::Value) {
    let share = |part: &str| split[part]["share"].as_f64().unwrap_or(-1.0);
    let seconds = |part: &str| split[part]["seconds"].as_f64().unwrap_or(-1.0);
    let parts = [
        "compute", "gather", "push", "wait", "pull", "apply", "other",
    ];
    let total: f64 = parts.iter().map(|p| share(p)).sum();
    assert!(
        (total - 1.0).abs() < 1e-6,
        "shares add up to {total}: {split}"
    );
    for part in ["compute", "gather", "push", "pull", "apply"] {
        assert!(seconds(part) > 0.0, "no time in {part}: {split}");
    }
    assert!(seconds("wait") >= 0.0, "{split}");
    assert!(
        share("other") < 0.05,
        "the parts miss more than 5%: {split}"
    );
}

/// Runs the example `name` against a server of its own; its test accuracy.
async fn example_accuracy(name: &str) -> f64 {
    let server = ServerProcess::start(&["--workers", "1"]).await;
    let trained = run(example(name), &[server.addr.as_str()], LIMIT).await;
    assert!(trained.success, "{name} failed:\n{}", trained.stderr);
    let line = trained.stdout.lines().last().unwrap_or_default();
    let value: f64 = line
        .trim_start_matches("test accuracy ")
        .parse()
        .unwrap_or_else(|_| panic!("{name}: unexpected output {line:?}"));
    server.stop().await;
    value
}

/// The plain candle loop draws its model from seed 0 (`Mlp::draw_parameters`),
/// so two runs train alike; with candle's unseeded draw they differ.
#[tokio::test]
async fn two_runs_of_the_single_process_example_reach_the_same_accuracy() {
    let (a, b) = tokio::join!(
        run(example("single_process"), &[], LIMIT),
        run(example("single_process"), &[], LIMIT)
    );
    for trained in [&a, &b] {
        assert!(
            trained.success,
            "single_process failed:\n{}",
            trained.stderr
        );
        assert!(
            trained.stdout.contains("test accuracy "),
            "{}",
            trained.stdout
        );
    }
    assert_eq!(a.stdout, b.stdout, "two runs of one seeded loop");
}

#[tokio::test]
async fn the_readme_example_trains_against_a_server() {
    let accuracy = example_accuracy("data_parallel").await;
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

#[tokio::test]
async fn the_segmented_backward_example_trains_against_a_server() {
    let accuracy = example_accuracy("segmented").await;
    assert!(accuracy >= 0.95, "test accuracy {accuracy}");
}

#[tokio::test]
#[ignore = "needs Debian's dataset-fashion-mnist; .ci/run installs it and runs the ignored fashion_mnist tests"]
async fn ps_local_trains_on_the_real_fashion_mnist_files() {
    let dir = ps_worker::data::idx::DEBIAN_FASHION_MNIST_DIR;
    assert!(
        std::path::Path::new(dir).is_dir(),
        "{dir} is absent: apt-get install dataset-fashion-mnist"
    );
    let args = [
        "--dataset",
        "fashion-mnist",
        "--epochs",
        "1",
        "--batch-size",
        "100",
        "--hidden",
        "128",
        "--json",
    ];
    let local = run(binary("ps-local"), &args, LIMIT).await;
    assert!(local.success, "ps-local failed:\n{}", local.stderr);
    let summary = local.json();
    assert_eq!(summary["dataset"], "fashion-mnist");
    assert_eq!(
        summary["steps"].as_u64(),
        Some(300),
        "60,000 examples over 2 workers in batches of 100"
    );
    assert!(
        accuracy(&summary) >= 0.75,
        "one epoch of an MLP reaches about 0.8: {summary}"
    );
}

#[tokio::test]
async fn ps_throughput_runs_against_real_servers_and_reports_their_load() {
    binary("ps-server");
    let args = [
        "ps-throughput",
        "--servers",
        "2",
        "--workers",
        "2",
        "--model",
        "sizes:3MiB,1MiB,256KiB,8KiB",
        "--steps",
        "3",
        "--json",
    ];
    let bench = run(binary("ps-microbench"), &args, LIMIT).await;
    assert!(bench.success, "ps-microbench failed:\n{}", bench.stderr);
    let row = bench.json();
    assert_eq!(row["bench"], "ps-throughput");
    assert!(
        row["throughput_bytes_per_sec"].as_f64().unwrap() > 0.0
            && row["rpcs_per_sec"].as_f64().unwrap() > 0.0,
        "{row}"
    );
    assert!(row["ratio_vs_tcp"].as_f64().unwrap() > 0.0, "{row}");
    let servers = row["servers"].as_array().expect("per-server load");
    assert_eq!(servers.len(), 2);
    for server in servers {
        assert!(
            server["keys"].as_u64().unwrap() > 0 && server["pushes"].as_u64().unwrap() > 0,
            "every server carries load: {server}"
        );
    }
    // The simulated workers' time split: push and pull measured, the wait as
    // the servers report it, all within each worker's time.
    let share = |name: &str| row[name].as_f64().unwrap_or(-1.0);
    for name in ["push_share", "pull_share"] {
        assert!(share(name) > 0.0, "{name}: {row}");
    }
    assert!(share("wait_share") >= 0.0, "{row}");
    let total = share("push_share") + share("wait_share") + share("pull_share");
    assert!(total <= 1.0 + 1e-6, "the parts add up to {total}: {row}");
}

/// `ps-worker --metrics-listen` serves its steps, examples, loss and each
/// step's phases while it trains, in exposition Prometheus reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_its_steps_and_time_split_as_prometheus_metrics() {
    let server = ServerProcess::start(&["--workers", "1"]).await;
    let mut worker = spawn_worker(&[
        "--server",
        &server.addr,
        "--epochs",
        "200",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    // Logged as `addr=Some(127.0.0.1:PORT)`.
    let (line, log) = read_log_until(&mut worker, "metrics listening").await;
    let addr = line
        .split("addr=Some(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let text = loop {
        let (status, text) = http_get(&addr, "/metrics").await;
        assert!(status.contains("200"), "{status}");
        if metric_sample(&text, "candle_ps_worker_steps_total").is_some_and(|steps| steps >= 20.0) {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no steps in 60 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let steps = metric_sample(&text, "candle_ps_worker_steps_total").unwrap();
    let examples = metric_sample(&text, "candle_ps_worker_examples_total").unwrap();
    // Counted before the step (a scrape may fall in between).
    assert!(examples >= steps * 32.0, "32 examples a step:\n{text}");
    assert!(
        metric_sample(&text, "candle_ps_worker_loss").is_some_and(f64::is_finite),
        "{text}"
    );
    for phase in ["compute", "gather", "push", "wait", "pull", "apply"] {
        let count =
            format!("candle_ps_worker_step_phase_duration_seconds_count{{phase=\"{phase}\"}}");
        assert!(
            metric_sample(&text, &count).is_some_and(|n| n >= steps),
            "{count}:\n{text}"
        );
    }
    assert!(text.contains("candle_ps_build_info{"), "{text}");
    worker.kill().await.expect("stop the worker");
    drop(log);
    server.stop().await;
}

/// `ps-worker --out DIR` leaves the run's loss and accuracy per epoch, its
/// timings per step and their two charts.
#[tokio::test]
async fn a_worker_writes_its_epochs_steps_and_charts_with_out() {
    let dir = tempfile::tempdir().expect("a folder");
    let out = dir.path().join("run");
    let out_arg = out.to_str().expect("utf-8").to_string();
    let trained = worker_with_a_server_of_its_own(&["--epochs", "3", "--out", &out_arg]).await;
    let steps_run = trained.json()["steps"].as_u64().unwrap();
    let epochs = std::fs::read_to_string(out.join("epochs.csv")).expect("epochs.csv");
    let rows: Vec<Vec<f64>> = epochs
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|f| f.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 3, "{epochs}");
    for (epoch, row) in rows.iter().enumerate() {
        assert_eq!(row[0], epoch as f64, "{epochs}");
        assert!(row[1] > 0.0 && (0.0..=1.0).contains(&row[2]), "{epochs}");
    }
    assert!(rows[2][1] < rows[0][1], "the loss falls: {epochs}");
    let steps = std::fs::read_to_string(out.join("steps.csv")).expect("steps.csv");
    assert_eq!(
        steps.lines().count() as u64,
        steps_run + 1,
        "one row a step"
    );
    for chart in ["training.svg", "time_split.svg"] {
        let svg = std::fs::read_to_string(out.join(chart)).expect(chart);
        assert!(svg.starts_with("<svg") && svg.contains("epoch"), "{chart}");
    }
}

/// The `ps-worker --probe-compute` JSON of a run with `RAYON_NUM_THREADS`
/// set to `threads`, or removed.
async fn probe_with_threads(threads: Option<&str>) -> serde_json::Value {
    let mut command = tokio::process::Command::new(binary("ps-worker"));
    command
        .args(["--probe-compute", "--batch-size", "8"])
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    match threads {
        Some(threads) => command.env("RAYON_NUM_THREADS", threads),
        None => command.env_remove("RAYON_NUM_THREADS"),
    };
    let output = tokio::time::timeout(LIMIT, command.output())
        .await
        .expect("ps-worker --probe-compute in time")
        .expect("ps-worker runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "ps-worker failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"))
}

/// candle counts the host's cores on every matrix product unless
/// `RAYON_NUM_THREADS` is set: `ps-worker` sets it for itself (running itself
/// again) and keeps a count the user gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_worker_pins_its_compute_threads_and_keeps_a_given_count() {
    let pinned = probe_with_threads(None).await;
    let threads = pinned["rayon_num_threads"]
        .as_str()
        .unwrap_or_else(|| panic!("no thread count pinned: {pinned}"));
    let threads: usize = threads.parse().expect("a count");
    assert!(threads >= 1, "{pinned}");
    assert!(pinned["step_seconds"].as_f64().unwrap() > 0.0, "{pinned}");

    let given = probe_with_threads(Some("1")).await;
    assert_eq!(given["rayon_num_threads"], "1", "{given}");
}
