//! `ps-testbed` end to end: a digits job in an emulated cluster (a scheduler
//! host, 2 server hosts and 2 worker hosts, every link shaped to 1 Gbit/s both
//! ways) trains to the accuracy the same job reaches on loopback (`ps-local`),
//! its traffic crosses the server links within their rate, and nothing is left
//! behind; a run stopped with Ctrl-C removes every namespace and process it
//! made; `ps-testbed clean` removes what a killed run left.
//!
//! Needs root, `ip` and `tc`, so it is `#[ignore]`d in `cargo test
//! --workspace`; `.ci/run` runs it with `PS_REQUIRE_ROOT=1`, which makes a
//! machine without them fail the test instead of skipping it. Its namespaces
//! are under the prefix `psci` (`psciplan` for plan-check), apart from a
//! developer's runs (`psbed`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ps_common::processes::binary;
use serde_json::Value;

const PREFIX: &str = "psci";

/// The plan-check test's own prefix: the tests run at once, and each checks
/// that its namespaces are gone while the others may still hold theirs.
const PLAN_PREFIX: &str = "psciplan";

fn root_or_skip() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let tools = ["ip", "tc"]
        .iter()
        .all(|t| Command::new(t).arg("-V").output().is_ok());
    ps_tests::available_or_skip(
        root && tools,
        "PS_REQUIRE_ROOT",
        "this is not root with `ip` and `tc`",
        "the testbed needs them",
    )
}

/// The testbed's namespaces under `prefix` now.
fn namespaces(prefix: &str) -> Vec<String> {
    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect()
}

/// Builds the binaries the testbed starts, next to it.
fn testbed() -> std::path::PathBuf {
    for name in ["ps-scheduler", "ps-server", "ps-worker", "ps-local"] {
        binary(name);
    }
    binary("ps-testbed")
}

/// The last line of `stdout` that is not empty, as JSON: `what` a program
/// printed with `--json`.
fn last_json_line(stdout: &[u8], what: &str) -> Value {
    let line = stdout
        .split(|b| *b == b'\n')
        .rfind(|l| !l.is_empty())
        .unwrap_or_else(|| panic!("no line of {what}"));
    serde_json::from_slice(line).unwrap_or_else(|e| panic!("{what} is not JSON: {e}"))
}

fn accuracies(summaries: &[Value]) -> Vec<f64> {
    summaries
        .iter()
        .map(|s| s["test_accuracy"].as_f64().expect("an accuracy"))
        .collect()
}

#[test]
#[ignore = "needs root, ip and tc; .ci/run runs it"]
fn a_digits_job_on_shaped_links_trains_as_on_loopback_and_leaves_nothing() {
    if !root_or_skip() {
        return;
    }
    let testbed = testbed();
    let out = tempfile::tempdir().expect("a folder for the logs");
    let run = Command::new(&testbed)
        .args(["run", "--prefix", PREFIX, "--json", "--link", "1gbit"])
        .args(["--hosts", "scheduler=1,server=2,worker=2", "--out"])
        .arg(out.path())
        .output()
        .expect("run ps-testbed");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "ps-testbed failed:\n{stderr}");
    let report = last_json_line(&run.stdout, "ps-testbed's report");
    assert!(namespaces(PREFIX).is_empty(), "namespaces left behind");

    let workers = report["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 2, "{report}");
    let local = Command::new(binary("ps-local"))
        .args(["--json", "--servers", "2", "--workers", "2"])
        .stderr(Stdio::null())
        .output()
        .expect("run ps-local");
    assert!(local.status.success());
    let local = last_json_line(&local.stdout, "ps-local's summary");
    let on_loopback = accuracies(
        local["per_worker"]
            .as_array()
            .expect("per-worker summaries"),
    );
    let shaped = accuracies(workers);
    let base = on_loopback.iter().copied().fold(f64::INFINITY, f64::min);
    for accuracy in &shaped {
        assert!(
            *accuracy >= 0.93 && (accuracy - base).abs() <= 0.02,
            "accuracy {shaped:?} on shaped links against {on_loopback:?} on loopback"
        );
    }

    let links = report["links"].as_array().expect("links");
    let seconds = workers
        .iter()
        .map(|w| w["training_seconds"].as_f64().unwrap())
        .fold(0.0, f64::max);
    for link in links {
        let (sent, received) = (
            link["sent_bytes"].as_u64().unwrap(),
            link["received_bytes"].as_u64().unwrap(),
        );
        if link["role"] != "scheduler" {
            assert!(sent > 0 && received > 0, "no traffic on {link}");
        }
        // The shaper holds each direction to 1 Gbit/s; the counted bytes also
        // include the registration before training and evaluation after it,
        // so the bound is on the whole run.
        let whole_run = report["seconds"].as_f64().unwrap().max(seconds);
        for bytes in [sent, received] {
            assert!(
                bytes as f64 <= 1.05 * 125e6 * whole_run,
                "{bytes} bytes in {whole_run} s is over 1 Gbit/s: {link}"
            );
        }
    }
    for host in ["scheduler", "server1", "server2", "worker1", "worker2"] {
        assert!(
            out.path().join(format!("{host}.log")).is_file(),
            "no log for {host}"
        );
    }
}

/// Waits until `path` holds `text`, for at most `limit`.
fn wait_for_text(path: &Path, text: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains(text)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{} never said {text:?}", path.display());
}

#[test]
#[ignore = "needs root, ip and tc; .ci/run runs it"]
fn ctrl_c_mid_run_removes_every_namespace_and_process() {
    if !root_or_skip() {
        return;
    }
    let testbed = testbed();
    let out = tempfile::tempdir().expect("a folder for the logs");
    let prefix = format!("{PREFIX}int");
    let mut run = Command::new(&testbed)
        .args(["run", "--prefix", &prefix, "--link", "100mbit", "--out"])
        .arg(out.path())
        .args(["--hosts", "server=1,worker=1", "--", "--epochs", "100000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ps-testbed");
    wait_for_text(
        &out.path().join("worker1.log"),
        "training",
        Duration::from_secs(60),
    );
    let made = namespaces(&prefix);
    assert_eq!(
        made.len(),
        4,
        "switch, scheduler, server and worker: {made:?}"
    );
    let pids: Vec<String> = made
        .iter()
        .flat_map(|ns| {
            let listed = Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
                .unwrap();
            String::from_utf8_lossy(&listed.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(pids.len(), 3, "scheduler, server and worker run: {pids:?}");

    let interrupted = Command::new("kill")
        .args(["-INT", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let exited = run.wait().expect("ps-testbed exits");
    let mut said = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut said).unwrap();
    assert!(!exited.success(), "an interrupted run fails");
    assert!(said.contains("interrupted"), "it says why: {said}");
    assert!(namespaces(&prefix).is_empty(), "namespaces left behind");
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = || {
        pids.iter()
            .filter(|p| Path::new(&format!("/proc/{p}")).exists())
            .count()
    };
    while alive() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(alive(), 0, "processes left behind: {pids:?}");
}

#[test]
#[ignore = "needs root, ip and tc; .ci/run runs it"]
fn clean_removes_what_a_killed_run_left_and_nothing_else() {
    if !root_or_skip() {
        return;
    }
    let testbed = testbed();
    let prefix = format!("{PREFIX}clean");
    // A pid above the kernel's largest: no process owns it.
    let dead = format!("{prefix}-4194399-switch");
    let live = format!("{prefix}-{}-switch", std::process::id());
    for name in [&dead, &live] {
        let added = Command::new("ip")
            .args(["netns", "add", name])
            .status()
            .unwrap();
        assert!(added.success());
    }
    let cleaned = Command::new(&testbed)
        .args(["clean", "--prefix", &prefix])
        .output()
        .expect("run ps-testbed clean");
    assert!(cleaned.status.success());
    let left = namespaces(&prefix);
    Command::new("ip")
        .args(["netns", "del", &live])
        .status()
        .unwrap();
    assert_eq!(left, [live], "only the dead run's namespace goes");
}

/// `ps-testbed plan-check` on the smallest grid (the compute-bound model, one
/// link rate, one server, pipelined or not): every setup runs, is predicted
/// and compared, the tables are written, and nothing is left behind.
#[test]
#[ignore = "needs root, ip and tc; .ci/run runs it"]
fn plan_check_runs_a_grid_and_compares_each_setup_with_its_prediction() {
    if !root_or_skip() {
        return;
    }
    let testbed = testbed();
    let out = tempfile::tempdir().expect("a folder for the results");
    let run = Command::new(&testbed)
        .args([
            "plan-check",
            "--prefix",
            PLAN_PREFIX,
            "--links",
            "1gbit",
            "--servers",
            "1",
        ])
        .args(["--models", "compute-bound", "--out"])
        .arg(out.path())
        .output()
        .expect("run ps-testbed plan-check");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "plan-check failed:\n{stderr}");
    assert!(namespaces(PLAN_PREFIX).is_empty(), "namespaces left behind");
    let rows: Vec<Value> =
        serde_json::from_slice(&std::fs::read(out.path().join("plan-check.json")).unwrap())
            .unwrap();
    assert_eq!(rows.len(), 2, "one server, pipelined and not");
    for row in &rows {
        let (predicted, measured) = (
            row["predicted_ms"].as_f64().unwrap(),
            row["measured_ms"].as_f64().unwrap(),
        );
        assert!(predicted > 0.0 && measured > 0.0, "{row}");
        let error = row["error"].as_f64().unwrap();
        assert!((error - (predicted / measured - 1.0)).abs() < 1e-9, "{row}");
    }
    let table = std::fs::read_to_string(out.path().join("plan-check.md")).unwrap();
    assert!(
        table.contains("Within ±20 %") && table.contains("plan's pick"),
        "{table}"
    );
    let chart = std::fs::read_to_string(out.path().join("plan-check.svg")).unwrap();
    assert_eq!(
        chart.matches("<circle").count(),
        2 + 1,
        "a point per setup, a mark per model"
    );
}

/// A plan of `model` for two workers on 1 Gbit/s links, with at most
/// `max_servers` servers and `server_hosts` hosts of their own, bf16 when
/// `allow_bf16`; the tests then set the chosen setup they run.
fn a_plan(
    model: &str,
    max_servers: u32,
    server_hosts: u32,
    allow_bf16: bool,
) -> ps_scheduler::plan::Plan {
    let model = ps_scheduler::plan::ModelShapes::from_spec(model).unwrap();
    let cluster = ps_scheduler::plan::Cluster {
        workers: 2,
        worker_link: 125e6,
        server_link: 125e6,
        rtt: 100e-6,
        compute: 1e-3,
        cores: 2,
    };
    let choices = ps_scheduler::plan::Choices {
        max_servers,
        server_hosts,
        allow_bf16,
        staleness: 0,
        server_memory: 1 << 30,
        optimizer_state: 0,
    };
    let constants = ps_scheduler::plan::Constants::default();
    ps_scheduler::plan::plan(&model, &cluster, &choices, &constants).unwrap()
}

/// `ps-testbed calibrate`'s own prefix.
const CALIBRATE_PREFIX: &str = "pscical";

/// `ps-testbed calibrate` across 200 Mbit/s links: `ps-scheduler plan
/// --measure-link` on the worker host finds the shaped rate, not loopback's;
/// the plan file it writes carries the measured constants, which `plan-check
/// --constants` then predicts an earlier grid with; nothing is left behind.
#[test]
#[ignore = "needs root, ip and tc; .ci/run runs it"]
fn calibrate_measures_the_shaped_link_from_a_worker_host() {
    if !root_or_skip() {
        return;
    }
    let testbed = testbed();
    binary("ps-microbench");
    let out = tempfile::tempdir().expect("a folder for the plan");
    let plan_file = out.path().join("plan.json");
    let run = Command::new(&testbed)
        .args([
            "calibrate",
            "--prefix",
            CALIBRATE_PREFIX,
            "--link",
            "200mbit",
        ])
        .arg("--out")
        .arg(out.path())
        .args(["--", "--model", "mlp:64,32,10", "--json", "--out"])
        .arg(&plan_file)
        .output()
        .expect("run ps-testbed calibrate");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "calibrate failed:\n{stderr}");
    assert!(
        namespaces(CALIBRATE_PREFIX).is_empty(),
        "namespaces left behind"
    );
    let plan: Value = serde_json::from_slice(&std::fs::read(&plan_file).unwrap()).unwrap();
    let shaped = 200e6 / 8.0;
    let link = plan["cluster"]["worker_link"].as_f64().unwrap();
    assert!(
        link > 0.8 * shaped && link < 1.05 * shaped,
        "measured {link} B/s across a {shaped} B/s link"
    );
    let sources = plan["constants"]["sources"].to_string();
    assert!(sources.contains("--measure-link 10.77.0."), "{sources}");
    assert_eq!(plan["measured"].as_array().unwrap().len(), 1, "{plan}");

    let grid = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench/plan-check.json");
    let table = |constants: Option<&Path>| {
        let mut command = Command::new(&testbed);
        command.args(["plan-check", "--table"]).arg(&grid);
        if let Some(file) = constants {
            command.arg("--constants").arg(file);
        }
        let run = command.output().expect("run ps-testbed plan-check --table");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        String::from_utf8(run.stdout).unwrap()
    };
    let measured = table(Some(&plan_file));
    assert!(measured.contains("Within ±20 %"), "{measured}");
    assert_ne!(
        measured,
        table(None),
        "the measured constants predict otherwise"
    );
}

/// `ps-testbed run --plan`'s own prefix.
const PLANNED_PREFIX: &str = "pscirun";

/// `ps-testbed run --plan FILE` runs the setup the plan chose: its server
/// hosts instead of `--hosts`', and bf16 on the wire, which halves the bytes
/// each worker's link carries per step against the same job in f32.
#[test]
#[ignore = "needs root, ip and tc; .ci/run runs it"]
fn run_with_a_plan_takes_its_servers_and_puts_bf16_on_the_wire() {
    if !root_or_skip() {
        return;
    }
    let testbed = testbed();
    let mut plan = a_plan("mlp:64,64,10", 3, 3, true);
    plan.chosen.servers = 1;
    plan.chosen.placement = ps_scheduler::plan::Placement::Dedicated;
    let dir = tempfile::tempdir().unwrap();
    let mut per_step_sent = |wire_bytes: u32| {
        plan.chosen.wire_bytes = wire_bytes;
        let file = dir.path().join(format!("plan-{wire_bytes}.json"));
        ps_scheduler::plan::cli::write_plan(&plan, &file).unwrap();
        let run = Command::new(&testbed)
            .args([
                "run",
                "--prefix",
                PLANNED_PREFIX,
                "--json",
                "--link",
                "1gbit",
            ])
            .args(["--hosts", "scheduler=1,server=2,worker=2", "--plan"])
            .arg(&file)
            .args(["--", "--epochs", "2", "--hidden", "512"])
            .output()
            .expect("run ps-testbed --plan");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "ps-testbed --plan failed:\n{stderr}");
        assert!(
            namespaces(PLANNED_PREFIX).is_empty(),
            "namespaces left behind"
        );
        let report = last_json_line(&run.stdout, "ps-testbed's report");
        let links = report["links"].as_array().unwrap();
        let servers = links.iter().filter(|l| l["role"] == "server").count();
        assert_eq!(
            servers, 1,
            "the plan's one server, not --hosts' two: {report}"
        );
        for accuracy in accuracies(report["workers"].as_array().unwrap()) {
            assert!(accuracy > 0.8, "{report}");
        }
        let worker = links.iter().find(|l| l["role"] == "worker").unwrap();
        worker["sent_per_step"].as_f64().unwrap()
    };
    let f32_sent = per_step_sent(4);
    let bf16_sent = per_step_sent(2);
    let ratio = bf16_sent / f32_sent;
    assert!(
        (0.45..0.65).contains(&ratio),
        "a worker sent {bf16_sent} B a step in bf16 against {f32_sent} in f32"
    );
}

/// Prefix of the colocated `run --plan` test's namespaces.
const COLOCATED_PREFIX: &str = "pscicolo";

/// `ps-testbed run --plan` of a plan that puts its two servers beside the
/// workers, with 256 KiB partitions: no server host is built, each worker
/// host runs a server too (and its worker reaches that one through shared
/// memory), and the scheduler cuts the model's 4 MiB layer into 16 parts of
/// 256 KiB instead of the default's 4 of 1 MiB.
#[test]
#[ignore = "needs root, ip and tc; .ci/run runs it"]
fn run_with_a_colocated_plan_puts_servers_beside_workers_with_its_partitions() {
    if !root_or_skip() {
        return;
    }
    let mut plan = a_plan("mlp:64,1024,1024,10", 2, 0, false);
    plan.chosen.servers = 2;
    plan.chosen.placement = ps_scheduler::plan::Placement::Colocated;
    plan.chosen.partition_bytes = 256 << 10;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    ps_scheduler::plan::cli::write_plan(&plan, &file).unwrap();
    let out = dir.path().join("out");
    let run = Command::new(testbed())
        .args([
            "run",
            "--prefix",
            COLOCATED_PREFIX,
            "--json",
            "--link",
            "1gbit",
        ])
        .args(["--hosts", "scheduler=1,server=1,worker=2", "--plan"])
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .args(["--", "--epochs", "1", "--hidden", "1024,1024"])
        .output()
        .expect("run ps-testbed --plan");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "ps-testbed --plan failed:\n{stderr}");
    assert!(
        namespaces(COLOCATED_PREFIX).is_empty(),
        "namespaces left behind"
    );
    let report = last_json_line(&run.stdout, "ps-testbed's report");
    let links = report["links"].as_array().unwrap();
    assert!(
        links.iter().all(|l| l["role"] != "server"),
        "no server host: {report}"
    );
    let beside = links.iter().filter(|l| l["server_beside"] == true).count();
    assert_eq!(beside, 2, "a server beside each worker: {report}");
    let processes: Vec<&str> = report["cpu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["host"].as_str().unwrap())
        .collect();
    for name in ["worker1-server", "worker2-server"] {
        assert!(processes.contains(&name), "{name} in {processes:?}");
    }
    for accuracy in accuracies(report["workers"].as_array().unwrap()) {
        assert!(accuracy > 0.8, "{report}");
    }
    let worker_log = std::fs::read_to_string(out.join("worker1.log")).unwrap();
    assert!(
        worker_log.contains("pushes and pulls go through shared memory"),
        "worker1 reaches the server on its host through shared memory:\n{worker_log}"
    );
    let scheduler_log = std::fs::read_to_string(out.join("scheduler.log")).unwrap();
    let placed = scheduler_log
        .lines()
        .find(|l| l.contains("placed the parameters"))
        .unwrap_or_else(|| panic!("no placement in the scheduler's log:\n{scheduler_log}"));
    assert!(
        placed.contains("largest_part_bytes=262144") && placed.contains("partition_bytes=262144"),
        "{placed}"
    );
}
