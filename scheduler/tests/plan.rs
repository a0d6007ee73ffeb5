//! `ps-scheduler plan` as a user runs it: the real binary on the built-in
//! models and a range of clusters, its JSON read back and held to the
//! planner's invariants, and its plan file written and read again.

use std::process::Command;

use ps_scheduler::plan::cli::read_plan;
use ps_scheduler::plan::{Placement, Plan, WORTH_A_SERVER};

fn plan(args: &[&str]) -> Plan {
    let output = Command::new(env!("CARGO_BIN_EXE_ps-scheduler"))
        .arg("plan")
        .args(args)
        .arg("--json")
        .output()
        .expect("ps-scheduler runs");
    assert!(
        output.status.success(),
        "plan {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the JSON is a plan")
}

/// What every plan must hold: candidates fastest first, the chosen one the
/// fastest no rule sets aside, within the memory budget, and with servers on
/// their own hosts never given less link in all than the workers have.
fn check_invariants(plan: &Plan) {
    assert!(!plan.candidates.is_empty());
    let steps: Vec<f64> = plan.candidates.iter().map(|c| c.terms.step).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "fastest first");
    let chosen = plan
        .candidates
        .iter()
        .find(|c| c.setup == plan.chosen)
        .expect("the chosen setup is a candidate");
    assert!(chosen.ruled_out.is_none());
    let fastest = plan
        .candidates
        .iter()
        .find(|c| c.ruled_out.is_none())
        .unwrap();
    assert!(chosen.terms.step <= fastest.terms.step * (1.0 + WORTH_A_SERVER));
    for candidate in &plan.candidates {
        let terms = &candidate.terms;
        let sum =
            terms.compute + terms.push + terms.pull + terms.apply + terms.requests + terms.overlap;
        assert!(
            (sum - terms.step).abs() < 1e-9,
            "the terms add up: {terms:?}"
        );
        assert!(terms.overlap <= 0.0 && terms.step >= terms.compute);
        assert!(terms.imbalance >= 1.0 - 1e-9);
        let over_budget = candidate.server_memory > plan.choices.server_memory;
        let servers = f64::from(candidate.setup.servers);
        let workers = f64::from(plan.cluster.workers);
        let short_of_link = candidate.setup.placement == Placement::Dedicated
            && servers * plan.cluster.server_link < workers * plan.cluster.worker_link;
        assert_eq!(
            over_budget || short_of_link,
            candidate.ruled_out.is_some(),
            "{candidate:?}"
        );
    }
}

#[test]
fn plans_of_the_built_in_models_hold_the_invariants() {
    for model in ["resnet50", "bert-base", "mlp:1024,2048,2048,10"] {
        for (workers, link, server_hosts) in [
            ("1", "1gbit", "0"),
            ("4", "500mbit", "3"),
            ("8", "10gbit", "8"),
        ] {
            let plan = plan(&[
                "--model",
                model,
                "--workers",
                workers,
                "--link",
                link,
                "--server-hosts",
                server_hosts,
                "--compute",
                "50ms",
                "--server-memory",
                "4GiB",
            ]);
            check_invariants(&plan);
            assert_eq!(plan.model, model);
        }
    }
}

#[test]
fn a_tight_budget_and_few_server_links_are_never_chosen() {
    // bert-base is 438 MB: three f32 copies do not fit one 1 GiB server,
    // and two dedicated 1 Gbit/s servers are less link than four workers'.
    let plan = plan(&[
        "--model",
        "bert-base",
        "--workers",
        "4",
        "--server-hosts",
        "2",
        "--max-servers",
        "4",
        "--server-memory",
        "1GiB",
    ]);
    check_invariants(&plan);
    assert!(
        plan.candidates
            .iter()
            .any(|c| c.ruled_out.as_deref().is_some_and(|w| w.contains("budget")))
    );
    assert!(
        plan.candidates
            .iter()
            .any(|c| c.ruled_out.as_deref().is_some_and(|w| w.contains("link")))
    );
    assert!(plan.chosen.servers >= 2);
}

#[test]
fn the_plan_file_reads_back_and_explain_shows_every_constant() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    let output = Command::new(env!("CARGO_BIN_EXE_ps-scheduler"))
        .args([
            "plan",
            "--model",
            "resnet50",
            "--workers",
            "2",
            "--explain",
            "--out",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for needed in [
        "chosen:",
        "request CPU",
        "worker rate",
        "apply rate",
        "link efficiency",
        "step ",
    ] {
        assert!(text.contains(needed), "{needed} missing from:\n{text}");
    }
    let plan = read_plan(&file).unwrap();
    check_invariants(&plan);
    assert!(!plan.made.is_empty());
}

#[test]
fn bad_input_is_a_clear_error() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ps-scheduler"))
            .arg("plan")
            .args(args)
            .output()
            .unwrap()
    };
    let unknown = run(&["--model", "resnet5"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("not resnet50, bert-base or mlp"));
    let too_big = run(&[
        "--model",
        "bert-base",
        "--workers",
        "1",
        "--server-memory",
        "1GiB",
    ]);
    assert!(String::from_utf8_lossy(&too_big.stderr).contains("no setup fits"));
    let no_workers = run(&["--workers", "0"]);
    assert!(!no_workers.status.success());
    assert!(String::from_utf8_lossy(&no_workers.stderr).contains("at least one worker"));
}

/// A child process killed when dropped (so a failed assertion leaves none).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `ps-microbench serve` on free loopback ports, and its gRPC address.
fn bench_server() -> (Killed, String) {
    use std::io::{BufRead, BufReader};
    let mut server = Command::new(ps_common::processes::binary("ps-microbench"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tcp-listen",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ps-microbench serve starts");
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .expect("serve names its address")
        .to_string();
    (Killed(server), addr)
}

#[test]
fn a_measured_link_and_compute_go_into_the_plan_file_with_where_they_came_from() {
    // The programs the measurements run, beside ps-scheduler.
    ps_common::processes::binary("ps-worker");
    let (server, addr) = bench_server();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    let file_arg = file.to_str().unwrap();
    let args = [
        "--model",
        "mlp:64,32,10",
        "--measure-link",
        &addr,
        "--measure-compute",
        "--batch-size",
        "16",
        "--out",
        file_arg,
    ];
    let planned = plan(&args);
    drop(server);
    check_invariants(&planned);
    let cluster = &planned.cluster;
    assert!(cluster.rtt > 0.0 && cluster.rtt < 0.1, "{cluster:?}");
    assert!(cluster.worker_link > 1e6, "loopback moves more than 1 MB/s");
    assert_eq!(cluster.server_link, cluster.worker_link);
    assert!(
        cluster.compute > 0.0 && cluster.compute < 10.0,
        "{cluster:?}"
    );
    let constants = &planned.constants;
    assert!(constants.request_seconds > 0.0 && constants.worker_bytes_per_sec > 0.0);
    assert!(constants.apply_bytes_per_sec > 0.0);
    assert!(constants.link_efficiency > 0.0 && constants.link_efficiency <= 1.0);
    for i in [0, 1, 3] {
        assert!(
            constants.sources[i].contains(&addr),
            "{:?}",
            constants.sources
        );
    }
    assert!(constants.sources[2].contains("--measure-compute"));
    assert_eq!(planned.measured.len(), 2, "{:?}", planned.measured);
    assert!(planned.measured[0].contains(&addr) && planned.measured[1].contains("mlp:64,32,10"));
    assert_eq!(
        read_plan(&file).unwrap(),
        planned,
        "the file holds what was printed"
    );
}

#[test]
fn measuring_a_model_the_worker_cannot_run_or_a_given_link_is_refused() {
    let refused = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_ps-scheduler"))
            .arg("plan")
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} was taken");
        String::from_utf8_lossy(&output.stderr).to_string()
    };
    let stderr = refused(&["--model", "resnet50", "--measure-compute"]);
    assert!(stderr.contains("--compute"), "{stderr}");
    let stderr = refused(&["--measure-link", "127.0.0.1:1", "--link", "1gbit"]);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    let stderr = refused(&["--measure-compute", "--compute", "5ms"]);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn plan_env_prints_the_chosen_setup_as_the_variables_compose_and_swarm_pass_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    let mut planned = plan(&[
        "--model",
        "mlp:64,2048,2048,10",
        "--workers",
        "2",
        "--link",
        "500mbit",
        "--allow-bf16",
    ]);
    planned.chosen.servers = 3;
    planned.chosen.pipeline = false;
    planned.chosen.backward_segments = 4;
    planned.chosen.wire_bytes = 2;
    planned.chosen.partition_bytes = 4 << 20;
    planned.chosen.requests_per_server = 2;
    ps_scheduler::plan::cli::write_plan(&planned, &file).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ps-scheduler"))
        .arg("plan-env")
        .arg(&file)
        .args(["--hidden", "2048,2048"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        printed,
        "PS_SERVERS=3\nPS_CONSISTENCY=bsp\nPS_NO_PIPELINE=true\nPS_BACKWARD_SEGMENTS=3\nPS_WIRE_DTYPE=bf16\nPS_PARTITION_BYTES=4194304\nPS_REQUESTS_PER_SERVER=2\n",
        "three layers cap the plan's four segments"
    );
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for settings in ["docker-compose.yml", "deploy/swarm/stack.yml"] {
        let text = std::fs::read_to_string(root.join(settings)).unwrap();
        for line in printed.lines() {
            let name = line.split('=').next().unwrap();
            assert!(
                text.contains(&format!("{name}:")),
                "{settings} does not pass {name} on"
            );
        }
    }

    let missing = Command::new(env!("CARGO_BIN_EXE_ps-scheduler"))
        .args(["plan-env", "/nonexistent/plan.json"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("reading the plan"));
}

#[test]
fn a_resources_file_gives_the_cluster_and_its_flags_are_refused_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.json");
    std::fs::write(
        &file,
        r#"{"workers": 4, "link": "10gbit", "server_hosts": 4, "cores": 16, "compute": "40ms"}"#,
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let planned = plan(&["--model", "bert-base", "--resources", path]);
    check_invariants(&planned);
    assert_eq!(planned.cluster.workers, 4);
    assert_eq!(planned.cluster.cores, 16);
    assert!((planned.cluster.worker_link - 1.25e9).abs() < 1.0);
    assert!((planned.cluster.compute - 0.04).abs() < 1e-12);
    assert_eq!(planned.choices.server_hosts, 4);
    let both = Command::new(env!("CARGO_BIN_EXE_ps-scheduler"))
        .args(["plan", "--resources", path, "--workers", "3"])
        .output()
        .unwrap();
    assert!(!both.status.success());
    let said = String::from_utf8_lossy(&both.stderr);
    assert!(
        said.contains("--workers") && said.contains("--resources"),
        "{said}"
    );
}
