//! deploy/prometheus: the compose cluster's Prometheus configuration is valid
//! (`promtool check config`), its recording rules give the known answers on
//! made-up series (`promtool test rules`), and it scrapes every service of
//! docker-compose.yml on the port that service serves its metrics on.
//!
//! promtool comes with Debian's `prometheus` package, which `.ci/run` installs;
//! where it is missing the promtool checks say so and pass, unless
//! `PS_REQUIRE_PROMTOOL=1`.

use std::process::Command;

use ps_tests::compose::repo_root;

/// `promtool ARGS` in deploy/prometheus: `None` when promtool is missing.
fn promtool(args: &[&str]) -> Option<std::process::Output> {
    match Command::new("promtool")
        .args(args)
        .current_dir(repo_root().join("deploy/prometheus"))
        .output()
    {
        Ok(output) => Some(output),
        Err(e) => {
            assert!(
                std::env::var_os("PS_REQUIRE_PROMTOOL").is_none(),
                "PS_REQUIRE_PROMTOOL is set but promtool cannot run: {e}"
            );
            eprintln!(
                "SKIPPED: promtool is not installed (apt-get install prometheus), so `promtool {args:?}` did not run"
            );
            None
        }
    }
}

fn assert_passes(args: &[&str]) {
    let Some(output) = promtool(args) else {
        return;
    };
    assert!(
        output.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_configuration_and_its_rules_are_valid() {
    assert_passes(&["check", "config", "prometheus.yml"]);
    assert_passes(&["check", "rules", "rules.yml"]);
}

#[test]
fn the_recording_rules_give_the_known_answers() {
    assert_passes(&["test", "rules", "rules_test.yml"]);
}

/// Every compose service that serves metrics is scraped on that port: the
/// scheduler, the servers and the workers.
#[test]
fn every_service_that_serves_metrics_is_scraped_on_its_port() {
    let read = |path: &str| std::fs::read_to_string(repo_root().join(path)).unwrap();
    let compose = read("docker-compose.yml");
    let config = read("deploy/prometheus/prometheus.yml");
    let listens: Vec<&str> = compose
        .lines()
        .filter_map(|line| line.trim().strip_prefix("PS_METRICS_LISTEN: "))
        .collect();
    assert_eq!(listens, ["0.0.0.0:9100"; 3], "scheduler, server, worker");
    let port = "9100";
    assert!(
        config.contains(&format!("targets: [\"scheduler:{port}\"]")),
        "{config}"
    );
    for service in ["server", "worker"] {
        let job = config
            .split("- job_name: ")
            .find(|job| job.starts_with(service))
            .unwrap_or_else(|| panic!("no {service} job in\n{config}"));
        assert!(
            job.contains(&format!("names: [\"{service}\"]"))
                && job.contains(&format!("port: {port}")),
            "{job}"
        );
    }
}
