//! Chaos with real processes: a 2-server, 2-worker digits run with `kill -9` of a
//! server, of a worker (restarted at once), or of the scheduler (restarted from
//! its state file) at a random step. Each run must finish with every worker within
//! 0.02 of an undisturbed run's accuracy and at least 0.93, and take no longer
//! than the undisturbed run plus the heartbeat timeout and a margin: nothing hangs.
//! The click model, whose embedding table lives on the servers, survives a
//! killed server too: its lost buckets come back from the checkpoints.
//! Worker 0 pushes and pulls on session streams and worker 1 with unary calls, so
//! every fault is survived on both paths in the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use ps_proto::transport::http_uri;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_tests::{ServerProcess, spawn_worker};
use tokio::process::Child;

const HEARTBEAT_TIMEOUT_MS: u64 = 1500;

/// What the workers train, and how close to the undisturbed run a disturbed
/// one must come.
#[derive(Debug, Clone, Copy)]
struct Job {
    args: &'static [&'static str],
    /// The least accuracy a worker may end with.
    floor: f64,
    /// How far from the undisturbed accuracy it may end.
    tolerance: f64,
    /// The steps a fault lands on, drawn at random: after the first
    /// checkpoints, well before the run's last step.
    /// (first, last + 1).
    fault_steps: (u64, u64),
}

/// The MLP on digits, 40 epochs.
const DIGITS: Job = Job {
    args: &["--epochs", "40"],
    floor: 0.93,
    tolerance: 0.02,
    fault_steps: (60, 400),
};

/// The click model: about 280 steps per worker. A bucket restored from a checkpoint
/// loses the row updates since it (at most 25 steps), so it may end a little
/// further from the undisturbed run (half the examples are clicks).
const CLICKS: Job = Job {
    args: &[
        "--model",
        "ctr",
        "--dataset",
        "clicks",
        "--click-train",
        "12000",
        "--epochs",
        "3",
        "--batch-size",
        "64",
        "--row-optimizer",
        "lazy-adam",
        "--row-lr",
        "0.005",
    ],
    floor: 0.62,
    tolerance: 0.05,
    fault_steps: (40, 200),
};

/// What goes wrong, and when.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Nothing.
    None,
    /// `kill -9` of one of the two servers at this step.
    KillServer(u64),
    /// `kill -9` of one of the two servers at this step, restarted at once at its
    /// address (as a restart policy would, before the scheduler declares it dead).
    RestartServer(u64),
    /// `kill -9` of one of the two servers at this step, restarted at its address
    /// once the scheduler has declared it dead and moved its keys away.
    RejoinServer(u64),
    /// `kill -9` of worker 1 at this step, and a new worker process started.
    RestartWorker(u64),
    /// `kill -9` of the scheduler at this step, restarted a second later.
    RestartScheduler(u64),
}

/// What a run reports.
struct Outcome {
    accuracies: Vec<f64>,
    took: Duration,
    /// Worker log lines about repairs (lost servers, new maps).
    repairs: Vec<String>,
}

/// How a worker reaches the servers.
#[derive(Debug, Clone, Copy)]
enum Reach {
    /// One session stream per server (the default).
    Session,
    /// A unary call per operation (`--unary`).
    Unary,
}

fn worker(scheduler: &str, reach: Reach, job: Job) -> Child {
    let mut args = vec![
        "--scheduler",
        scheduler,
        "--json",
        "--pull-timeout-secs",
        "30",
    ];
    args.extend_from_slice(job.args);
    if let Reach::Unary = reach {
        args.push("--unary");
    }
    spawn_worker(&args)
}

async fn lowest_step(scheduler: &str) -> Option<u64> {
    let mut client = SchedulerClient::connect(http_uri(scheduler)).await.ok()?;
    let status = client.status(v1::StatusRequest {}).await.ok()?.into_inner();
    let live: Vec<u64> = status
        .workers
        .iter()
        .filter(|w| w.alive)
        .map(|w| w.last_step)
        .collect();
    (live.len() == 2).then(|| live.into_iter().min())?
}

async fn wait_for_step(scheduler: &str, step: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while lowest_step(scheduler).await.is_none_or(|s| s < step) {
        assert!(
            Instant::now() < deadline,
            "workers never reached step {step}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the scheduler sees the server at `addr` alive, and how many parts it
/// gives it.
async fn server_seen(scheduler: &str, addr: &str) -> Option<(bool, u64)> {
    let mut client = SchedulerClient::connect(http_uri(scheduler)).await.ok()?;
    let status = client.status(v1::StatusRequest {}).await.ok()?.into_inner();
    let server = status.servers.into_iter().find(|s| s.addr == addr)?;
    Some((server.alive, server.parts))
}

/// Polls the scheduler until the server at `addr` is seen as `wanted`.
async fn wait_for_server(scheduler: &str, addr: &str, wanted: impl Fn(bool, u64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server_seen(scheduler, addr)
        .await
        .is_some_and(|(alive, parts)| wanted(alive, parts))
    {
        assert!(
            Instant::now() < deadline,
            "the scheduler never saw {addr} as expected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn scheduler_at(listen: &str, state: &Path) -> ServerProcess {
    let timeout = HEARTBEAT_TIMEOUT_MS.to_string();
    let state = state.to_str().expect("utf-8 path");
    ServerProcess::start_scheduler_at(
        listen,
        &[
            "--workers",
            "2",
            "--servers",
            "2",
            "--heartbeat-ms",
            "250",
            "--heartbeat-timeout-ms",
            &timeout,
            "--state-file",
            state,
        ],
    )
    .await
}

/// Waits for every worker (all at once, reading each one's output as it comes,
/// so that none blocks on a full pipe) and collects its accuracy and repair log
/// lines. When one failed (or hung), every worker's log goes into the failure,
/// since the cause may lie with one that did not fail.
async fn finish(children: Vec<Child>, accuracies: &mut Vec<f64>, repairs: &mut Vec<String>) {
    let waits = children
        .into_iter()
        .map(|child| tokio::time::timeout(Duration::from_secs(240), child.wait_with_output()));
    let mut logs = Vec::new();
    let mut failed = None;
    for (index, waited) in futures::future::join_all(waits)
        .await
        .into_iter()
        .enumerate()
    {
        let Ok(Ok(output)) = waited else {
            failed.get_or_insert(format!(
                "worker process {index} hung or could not be waited for"
            ));
            continue;
        };
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let summary = stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        match summary.and_then(|s| s["test_accuracy"].as_f64()) {
            Some(accuracy) if output.status.success() => accuracies.push(accuracy),
            _ if failed.is_none() => {
                failed = Some(format!("worker process {index} failed ({})", output.status));
            }
            _ => {}
        }
        repairs.extend(stderr.lines().filter(|l| is_repair(l)).map(str::to_string));
        logs.push(format!("--- worker process {index} ---\n{stderr}"));
    }
    if let Some(what) = failed {
        panic!("{what}; every worker's log:\n{}", logs.join("\n"));
    }
}

/// A worker log line about a repair: lost servers, new maps, a rejoin.
fn is_repair(line: &str) -> bool {
    // A worker that joined a run already under way starts past step 0.
    let rejoined =
        line.contains("trainer ready") && !line.split_whitespace().any(|field| field == "step=0");
    rejoined
        || [
            "looks lost",
            "lacks keys",
            "back at its address",
            "shard map moved on",
            "reachable again",
            "joining at the group's step",
            "offering this worker's copy",
        ]
        .iter()
        .any(|marker| line.contains(marker))
}

/// One cluster at a time: the runs' timings are compared.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(fault: Fault, job: Job) -> Outcome {
    let dir = tempfile::tempdir().expect("a folder for checkpoints and state");
    let checkpoints = dir.path().join("checkpoints");
    let state = dir.path().join("scheduler.json");
    let mut scheduler = scheduler_at("127.0.0.1:0", &state).await;
    let root = checkpoints.to_str().expect("utf-8 path").to_string();
    let server_args = [
        "--scheduler",
        &scheduler.addr,
        "--checkpoint-dir",
        &root,
        "--checkpoint-every-steps",
        "25",
    ];
    let mut servers = vec![
        ServerProcess::start(&server_args).await,
        ServerProcess::start(&server_args).await,
    ];
    let started = Instant::now();
    let mut workers = vec![
        worker(&scheduler.addr, Reach::Session, job),
        worker(&scheduler.addr, Reach::Unary, job),
    ];
    let (mut accuracies, mut repairs) = (Vec::new(), Vec::new());
    match fault {
        Fault::None => {}
        Fault::KillServer(step) => {
            wait_for_step(&scheduler.addr, step).await;
            servers.pop().expect("two servers").kill().await;
        }
        Fault::RestartServer(step) => {
            wait_for_step(&scheduler.addr, step).await;
            let victim = servers.pop().expect("two servers");
            let addr = victim.addr.clone();
            victim.kill().await;
            servers.push(ServerProcess::start_at(&addr, &server_args).await);
        }
        Fault::RejoinServer(step) => {
            wait_for_step(&scheduler.addr, step).await;
            let victim = servers.pop().expect("two servers");
            let addr = victim.addr.clone();
            victim.kill().await;
            wait_for_server(&scheduler.addr, &addr, |alive, parts| !alive && parts == 0).await;
            servers.push(ServerProcess::start_at(&addr, &server_args).await);
            // It takes keys again in the next map.
            wait_for_server(&scheduler.addr, &addr, |alive, parts| alive && parts > 0).await;
        }
        Fault::RestartWorker(step) => {
            wait_for_step(&scheduler.addr, step).await;
            // Worker 1, the unary one, restarted as it was.
            let mut victim = workers.pop().expect("two workers");
            victim.kill().await.expect("kill -9 a worker");
            workers.push(worker(&scheduler.addr, Reach::Unary, job));
        }
        Fault::RestartScheduler(step) => {
            wait_for_step(&scheduler.addr, step).await;
            let addr = scheduler.addr.clone();
            scheduler.kill().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            scheduler = scheduler_at(&addr, &state).await;
        }
    }
    finish(workers, &mut accuracies, &mut repairs).await;
    let took = started.elapsed();
    for server in servers {
        server.stop().await;
    }
    scheduler.stop().await;
    Outcome {
        accuracies,
        took,
        repairs,
    }
}

/// A step among `steps` (first, last + 1), different from run to run.
fn random_step((first, end): (u64, u64)) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    first + u64::from(nanos) % (end - first)
}

/// Runs the digits job undisturbed, then with `fault` at a random step, and compares.
async fn survives(fault: impl Fn(u64) -> Fault, repaired: &[&str]) {
    job_survives(DIGITS, fault, repaired).await;
}

/// Runs `job` undisturbed, then with `fault` at a random step, and compares.
async fn job_survives(job: Job, fault: impl Fn(u64) -> Fault, repaired: &[&str]) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let calm = run(Fault::None, job).await;
    assert!(
        calm.repairs.is_empty(),
        "nothing to repair: {:#?}",
        calm.repairs
    );
    let fault = fault(random_step(job.fault_steps));
    let hit = run(fault, job).await;
    eprintln!(
        "undisturbed {:?} in {:?}; {fault:?}: {:?} in {:?}\n{}",
        calm.accuracies,
        calm.took,
        hit.accuracies,
        hit.took,
        hit.repairs.join("\n")
    );
    assert!(
        hit.repairs
            .iter()
            .any(|l| repaired.iter().any(|marker| l.contains(marker))),
        "{fault:?} happened mid-run, so a worker must have logged one of {repaired:?}"
    );
    let base = calm
        .accuracies
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    for &after in &hit.accuracies {
        assert!(after >= job.floor, "accuracy {after} after {fault:?}");
        assert!(
            (after - base).abs() <= job.tolerance,
            "accuracy {after} after {fault:?} vs {base} undisturbed"
        );
    }
    let allowed = calm.took + Duration::from_millis(HEARTBEAT_TIMEOUT_MS) + Duration::from_secs(20);
    assert!(
        hit.took <= allowed,
        "took {:?}, allowed {allowed:?}",
        hit.took
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_two_servers_mid_run_still_reaches_the_undisturbed_accuracy() {
    survives(Fault::KillServer, &["looks lost"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_server_mid_run_of_the_click_model_restores_its_table_buckets() {
    job_survives(CLICKS, Fault::KillServer, &["looks lost"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_restarted_at_its_address_gets_its_keys_back() {
    // Whether a worker's retry reaches the new process (which then lacks the
    // keys) or gives up first (and finds it back), the keys are restored to it.
    survives(Fault::RestartServer, &["lacks keys", "back at its address"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_declared_dead_and_restarted_rejoins_and_takes_keys_again() {
    // Workers find it lost, or, when the new map came while they retried, learn
    // the moved placement from a server; either way they restore the keys.
    survives(
        Fault::RejoinServer,
        &["looks lost", "lacks keys", "shard map moved on"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_and_restarted_mid_run_rejoins_and_the_run_completes() {
    survives(Fault::RestartWorker, &["trainer ready"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_killed_and_restarted_from_its_state_file_loses_nothing() {
    survives(Fault::RestartScheduler, &["reachable again"]).await;
}
