//! The docker-compose cluster end to end: images built from the project's static
//! binaries (or, under `.ci/run`, from those `cargo test` built, `PS_BINARIES`),
//! `up` with the default two workers and scaled to three, over TLS with a
//! cluster token (both made by the project's own `ps-scheduler certs` into a
//! volume; the scheduler and servers must log `tls=true`), every worker
//! reaching the accuracy target, every container exiting 0 on its own once the job
//! is done, and the project removed with its volumes even when a check fails.
//! A second job on the same project (`up` again, a new `PS_JOB_ID`) trains the
//! click model, whose embedding table lives on the servers, from scratch.
//! Then chaos in containers, one fault per run, each landing mid-run: a server
//! container killed (SIGKILL; the other takes over its keys from the shared
//! checkpoint volume or the workers' copies), a worker container killed and
//! started again (it rejoins the run under way), and the scheduler container killed
//! and started again (it resumes from its state file). Each run completes within
//! 0.02 of the undisturbed accuracy.
//!
//! The first run also asks the cluster's Prometheus (published on a free host
//! port) that every target is up while the job trains, and, after it, for the
//! servers' push bytes, the workers' step phases and the recording rules.
//!
//! Needs a Docker engine, so it is `#[ignore]`d in `cargo test --workspace`;
//! `.ci/run` runs it when an engine answers and says so when none does. With
//! `PS_REQUIRE_DOCKER=1` a missing engine fails the test instead of skipping it.

use std::time::{Duration, Instant};

use ps_tests::compose::{Compose, assert_finished_over_tls, docker_available, lowest_live_step};
use ps_tests::prometheus::PrometheusApi;

const LIMIT: Duration = Duration::from_secs(240);

fn engine_or_skip() -> bool {
    ps_tests::available_or_skip(
        docker_available(),
        "PS_REQUIRE_DOCKER",
        "no Docker engine (or compose) answers",
        "the compose cluster was not tested",
    )
}

/// The accuracy every worker of a digits job reaches.
const DIGITS_FLOOR: f64 = 0.95;

/// The click model's job: 250 steps of two workers (the table's rows on the
/// servers), and the accuracy each reaches (half the examples are clicks).
const CLICKS_JOB: [(&str, &str); 7] = [
    ("PS_MODEL", "ctr"),
    ("PS_DATASET", "clicks"),
    ("PS_CLICK_TRAIN", "16000"),
    ("PS_EPOCHS", "2"),
    ("PS_BATCH_SIZE", "64"),
    ("PS_ROW_OPTIMIZER", "lazy-adam"),
    ("PS_ROW_LR", "0.005"),
];
const CLICKS_FLOOR: f64 = 0.62;

/// Runs the cluster with `workers` workers, checks what it reports and returns the
/// lowest `test_accuracy`.
fn cluster_trains(name: &str, workers: usize) -> f64 {
    let scale = format!("worker={workers}");
    let cluster = Compose::up(name, &["--scale", &scale], &[]);
    trained(&cluster, workers, DIGITS_FLOOR)
}

/// Waits for `cluster` to finish and checks that every container exited 0 and
/// every one of `workers` reached `floor`; returns the lowest accuracy.
fn trained(cluster: &Compose, workers: usize, floor: f64) -> f64 {
    let exited = cluster.wait_exited(&["worker", "server", "scheduler"], LIMIT);
    assert_finished_over_tls(&exited, workers + 3, |services| cluster.logs(services));
    let summaries = cluster.json_lines("worker");
    assert_eq!(summaries.len(), workers, "{}", cluster.logs(&["worker"]));
    let mut ranks: Vec<u64> = summaries
        .iter()
        .map(|s| s["rank"].as_u64().unwrap())
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..workers as u64).collect::<Vec<_>>());
    for summary in &summaries {
        assert_eq!(
            summary["workers"].as_u64(),
            Some(workers as u64),
            "{summary}"
        );
        let accuracy = summary["test_accuracy"].as_f64().unwrap();
        assert!(
            accuracy >= floor,
            "test_accuracy {accuracy} < {floor}: {summary}"
        );
    }
    summaries
        .iter()
        .filter_map(|s| s["test_accuracy"].as_f64())
        .fold(f64::INFINITY, f64::min)
}

/// After the job: Prometheus holds non-zero push bytes from both servers, the
/// step-time phases of both workers, and the recording rules' cluster push
/// rate and step time split.
fn prometheus_kept_the_run(prometheus: &PrometheusApi) {
    let over_the_run = |series: &str| {
        prometheus
            .query(&format!("max_over_time({series}[1h])"))
            .unwrap_or_else(|e| panic!("{series}: {e}"))
    };
    let push_bytes = over_the_run("candle_ps_server_push_bytes_total");
    assert_eq!(push_bytes.len(), 2, "one series per server: {push_bytes:?}");
    assert!(
        push_bytes.iter().all(|(_, bytes)| *bytes > 0.0),
        "{push_bytes:?}"
    );
    let phases = ["compute", "gather", "push", "wait", "pull", "apply"];
    for phase in phases {
        let series =
            format!("candle_ps_worker_step_phase_duration_seconds_count{{phase=\"{phase}\"}}");
        let steps = over_the_run(&series);
        assert_eq!(steps.len(), 2, "one series per worker: {steps:?}");
        assert!(steps.iter().all(|(_, n)| *n > 0.0), "{series}: {steps:?}");
    }
    let rate = over_the_run("candle_ps:server_push_bytes:rate1m");
    assert!(rate.first().is_some_and(|(_, r)| *r > 0.0), "{rate:?}");
    let shares = over_the_run("candle_ps:worker_step_phase:share1m");
    assert_eq!(shares.len(), phases.len(), "a share per phase: {shares:?}");
}

/// The lowest step any live worker reported, from `ps-scheduler status` run inside
/// the scheduler's container.
fn lowest_step(cluster: &Compose) -> Option<u64> {
    let status = cluster.exec(
        "scheduler",
        &["/ps-scheduler", "status", "--scheduler", "127.0.0.1:7000"],
    );
    lowest_live_step(&status, 2)
}

/// What the chaos runs do to one container once both workers are past step 300.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL one server container; it stays down.
    KillServer,
    /// SIGKILL one worker container, then start it again.
    RestartWorker,
    /// SIGKILL the scheduler container, then start it again (state file in a volume).
    RestartScheduler,
}

impl Fault {
    /// The service hit, the service whose log shows the repair, and the line.
    fn target(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::KillServer => ("server", "worker", "looks lost"),
            Self::RestartWorker => ("worker", "worker", "trainer ready"),
            // Back within a heartbeat or two, the workers may never notice; the
            // scheduler's own log shows where it resumed from.
            Self::RestartScheduler => ("scheduler", "scheduler", "resumed from the state file"),
        }
    }
}

/// True for a log line that shows the repair of `fault`.
fn repaired(fault: Fault, line: &str) -> bool {
    let (_, _, marker) = fault.target();
    match fault {
        // A worker that joined a run under way starts past step 0.
        Fault::RestartWorker => {
            line.contains(marker) && !line.split_whitespace().any(|field| field == "step=0")
        }
        _ => line.contains(marker),
    }
}

/// A 150-epoch run (so the fault lands mid-run) hit by `fault`: every worker
/// finishes with `test_accuracy` >= 0.93 and within 0.02 of `undisturbed`, and
/// every container exits cleanly (the killed server with SIGKILL's 137).
fn survives(fault: Fault, undisturbed: f64) {
    let (service, logged_by, _) = fault.target();
    let cluster = Compose::up("candle-ps-e2e-chaos", &[], &[("PS_EPOCHS", "150")]);
    let deadline = Instant::now() + LIMIT;
    while lowest_step(&cluster).is_none_or(|step| step < 300) {
        assert!(
            Instant::now() < deadline,
            "workers never reached step 300:\n{}",
            cluster.logs(&[])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let victim = cluster.kill_one(service);
    if fault != Fault::KillServer {
        cluster.start_again(&victim);
    }
    eprintln!("{fault:?}: {victim} hit once both workers were past step 300");
    let workers = cluster.wait_exited(&["worker"], LIMIT);
    for worker in &workers {
        assert_eq!(
            worker.code,
            0,
            "{} failed after {fault:?}:\n{}",
            worker.name,
            cluster.logs(&[])
        );
    }
    let summaries = cluster.json_lines("worker");
    assert_eq!(summaries.len(), 2, "{}", cluster.logs(&["worker"]));
    for summary in &summaries {
        let accuracy = summary["test_accuracy"].as_f64().unwrap();
        eprintln!("{fault:?}: test_accuracy {accuracy} (undisturbed {undisturbed})");
        assert!(
            accuracy >= 0.93 && (accuracy - undisturbed).abs() <= 0.02,
            "test_accuracy {accuracy} after {fault:?}, {undisturbed} undisturbed: {summary}"
        );
    }
    let rest = cluster.wait_exited(&["scheduler", "server"], LIMIT);
    for container in &rest {
        let killed = fault == Fault::KillServer && container.name == victim;
        assert!(
            container.code == 0 || (killed && container.code == 137),
            "{} exited with {} after {fault:?}:\n{}",
            container.name,
            container.code,
            cluster.logs(&[])
        );
    }
    let logs = cluster.logs(&[logged_by]);
    assert!(
        logs.lines().any(|line| repaired(fault, line)),
        "no {logged_by} logged the repair of {fault:?}:\n{logs}"
    );
}

#[test]
#[ignore = "builds images and runs containers; .ci/run runs it when a Docker engine answers"]
fn the_compose_cluster_trains_at_two_and_three_workers_and_survives_killed_containers() {
    if !engine_or_skip() {
        return;
    }
    Compose::build_images();
    // 150 epochs, as the chaos runs train, so the job outlasts several of
    // Prometheus's one-second scrapes: a rate needs two samples of a worker's
    // series, and the default 30 epochs of digits can end within a second.
    let first = Compose::up(
        "candle-ps-e2e-default",
        &[],
        &[("PS_JOB_ID", "first"), ("PS_EPOCHS", "150")],
    );
    let prometheus = first.prometheus();
    let targets = prometheus.wait_up(
        &[
            ("scheduler", 1),
            ("server", 2),
            ("worker", 2),
            ("prometheus", 1),
        ],
        LIMIT,
    );
    let up = prometheus.query("up").expect("query up");
    assert_eq!(up.len(), targets.len(), "{up:?}");
    assert!(up.iter().all(|(_, value)| *value == 1.0), "{up:?}");
    let undisturbed = trained(&first, 2, DIGITS_FLOOR);
    prometheus_kept_the_run(&prometheus);
    // `up` again without `down`, as a second `scripts/cluster.sh up` does: a new
    // job trains from scratch, with neither the finished job's state nor its
    // weights. It is the click model, so its embedding table trains in compose.
    let mut second = vec![("PS_JOB_ID", "second")];
    second.extend(CLICKS_JOB);
    first.up_again(&second);
    let clicks = trained(&first, 2, CLICKS_FLOOR);
    eprintln!("click model: test_accuracy {clicks} (at least {CLICKS_FLOOR})");
    let logs = first.logs(&[]);
    for resumed in ["resumed from the state file", "checkpoints loaded"] {
        assert!(
            !logs.contains(resumed),
            "the second job resumed the first:\n{logs}"
        );
    }
    drop(first);
    cluster_trains("candle-ps-e2e-scaled", 3);
    for fault in [
        Fault::KillServer,
        Fault::RestartWorker,
        Fault::RestartScheduler,
    ] {
        survives(fault, undisturbed);
    }
}
