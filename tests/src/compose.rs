//! [`Compose`]: one docker-compose project of the repository's `docker-compose.yml`,
//! under a name of its own so it never touches a user's cluster, removed with its
//! volumes when dropped, whatever the test did. Commands go through
//! `scripts/cluster.sh compose`, which picks `docker compose` or `docker-compose`.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::prometheus::PrometheusApi;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// True when a Docker engine answers and a compose tool is installed.
pub fn docker_available() -> bool {
    let answers = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    answers("docker", &["info"])
        && (answers("docker", &["compose", "version"]) || answers("docker-compose", &["version"]))
}

/// Prometheus on a free port of the host's loopback (`127.0.0.1::9090`), so a
/// test never takes a user's 9090 or another test's port.
const PROMETHEUS_PUBLISH: (&str, &str) = ("PS_PROMETHEUS_PUBLISH", "127.0.0.1:");

/// A container's state after it stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    /// The container's name.
    pub name: String,
    /// Its exit code.
    pub code: i64,
}

/// A running compose project, taken down (`down -v`) on drop.
pub struct Compose {
    project: String,
}

/// Runs `command`, and panics naming `what` with its output when it fails.
pub(crate) fn checked(mut command: Command, what: &str) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

impl Compose {
    /// Builds the static binaries and the images (`scripts/cluster.sh build`), or
    /// takes the binaries already built in `PS_BINARIES` when that is set.
    ///
    /// # Panics
    /// When the build fails.
    pub fn build_images() {
        let mut build = Command::new(repo_root().join("scripts/cluster.sh"));
        build.arg("build").current_dir(repo_root());
        checked(build, "scripts/cluster.sh build");
    }

    /// Starts the project `name` detached, with extra `up` arguments (for example
    /// `--scale worker=3`) and environment settings.
    ///
    /// # Panics
    /// When `up` fails (the project is taken down first).
    pub fn up(name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let compose = Self {
            project: format!("{name}-{}", std::process::id()),
        };
        let mut up = compose.command(&["up", "-d", "--no-build"]);
        up.args(args)
            .env(PROMETHEUS_PUBLISH.0, PROMETHEUS_PUBLISH.1);
        up.envs(env.iter().copied());
        checked(up, "compose up");
        compose
    }

    /// The API of this project's Prometheus, on the host port it was given.
    ///
    /// # Panics
    /// When the port cannot be read.
    pub fn prometheus(&self) -> PrometheusApi {
        let port = self.run(&["port", "prometheus", "9090"]);
        PrometheusApi::new(port.trim())
    }

    /// Runs `up -d` again on this project, volumes kept, with `env` (for
    /// example a new `PS_JOB_ID`), as a second `scripts/cluster.sh up` would.
    ///
    /// # Panics
    /// When `up` fails.
    pub fn up_again(&self, env: &[(&str, &str)]) {
        let mut up = self.command(&["up", "-d", "--no-build"]);
        up.env(PROMETHEUS_PUBLISH.0, PROMETHEUS_PUBLISH.1);
        up.envs(env.iter().copied());
        checked(up, "compose up (again)");
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(repo_root().join("scripts/cluster.sh"));
        command
            .arg("compose")
            .args(["--project-name", &self.project])
            .args(args)
            .current_dir(repo_root());
        command
    }

    /// Runs a compose command and returns its stdout.
    ///
    /// # Panics
    /// When it fails.
    pub fn run(&self, args: &[&str]) -> String {
        let output = checked(self.command(args), &format!("compose {args:?}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Container ids of `service` (all of them, running or not).
    pub fn containers(&self, service: &str) -> Vec<String> {
        self.run(&["ps", "-a", "-q", service])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }

    /// Waits until every container of `services` has stopped, for at most `limit`.
    ///
    /// # Panics
    /// When one still runs at the deadline (its logs are in the message).
    pub fn wait_exited(&self, services: &[&str], limit: Duration) -> Vec<Exited> {
        let deadline = Instant::now() + limit;
        let ids: Vec<String> = services.iter().flat_map(|s| self.containers(s)).collect();
        assert!(!ids.is_empty(), "no containers for {services:?}");
        loop {
            let states: Vec<(Exited, bool)> = ids.iter().map(|id| inspect(id)).collect();
            if states.iter().all(|(_, running)| !running) {
                return states.into_iter().map(|(e, _)| e).collect();
            }
            assert!(
                Instant::now() < deadline,
                "still running after {limit:?}: {:?}\n{}",
                states
                    .iter()
                    .filter(|s| s.1)
                    .map(|s| &s.0.name)
                    .collect::<Vec<_>>(),
                self.logs(&[])
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The plain-text logs of `services` (all when empty).
    pub fn logs(&self, services: &[&str]) -> String {
        let mut args = vec!["logs", "--no-color"];
        args.extend_from_slice(services);
        self.command(&args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Every JSON object a service printed on a line of its own (workers' summaries).
    pub fn json_lines(&self, service: &str) -> Vec<serde_json::Value> {
        self.logs(&[service])
            .lines()
            .filter_map(|line| line.find('{').map(|i| &line[i..]))
            .filter_map(|json| serde_json::from_str(json).ok())
            .collect()
    }

    /// Runs `ARGS` in a running container of `service` (its own binaries: the
    /// images have no shell) and returns stdout.
    ///
    /// # Panics
    /// When the command fails.
    pub fn exec(&self, service: &str, args: &[&str]) -> String {
        let mut all = vec!["exec", "-T", service];
        all.extend_from_slice(args);
        self.run(&all)
    }

    /// Kills one container of `service` with SIGKILL and returns its name.
    ///
    /// # Panics
    /// When there is none or the kill fails.
    pub fn kill_one(&self, service: &str) -> String {
        let id = self
            .containers(service)
            .into_iter()
            .next()
            .expect("a container");
        let (victim, _) = inspect(&id);
        let mut kill = Command::new("docker");
        kill.args(["kill", "--signal", "KILL", &id]);
        checked(kill, "docker kill");
        victim.name
    }

    /// Starts a stopped container of this project again, as a restart policy or
    /// an operator would.
    ///
    /// # Panics
    /// When the start fails.
    pub fn start_again(&self, container: &str) {
        let mut start = Command::new("docker");
        start.args(["start", container]);
        checked(start, "docker start");
    }
}

/// Checks a finished job: `expected` containers, every one exited 0, and the
/// scheduler and every server logged that it served over TLS. `logs` gives the
/// logs of the services named (all of them for none).
///
/// # Panics
/// When a check fails, with the logs.
pub fn assert_finished_over_tls(
    exited: &[Exited],
    expected: usize,
    logs: impl Fn(&[&str]) -> String,
) {
    assert_eq!(exited.len(), expected, "one container per task: {exited:?}");
    for container in exited {
        assert_eq!(
            container.code,
            0,
            "{} exited with {}:\n{}",
            container.name,
            container.code,
            logs(&[])
        );
    }
    for (service, listening) in [
        ("scheduler", "ps-scheduler listening"),
        ("server", "ps-server listening"),
    ] {
        let logs = logs(&[service]);
        let lines: Vec<&str> = logs.lines().filter(|l| l.contains(listening)).collect();
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l.contains("tls=true")),
            "{service} did not serve over TLS:\n{logs}"
        );
    }
}

/// The lowest step of the live workers in `status` (what `ps-scheduler status`
/// prints), once it lists `workers` live ones.
pub fn lowest_live_step(status: &str, workers: usize) -> Option<u64> {
    let listed = status.split_once("last step")?.1;
    let steps: Vec<u64> = listed
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 3 && fields[1] == "yes").then(|| fields[2].parse().ok())?
        })
        .collect();
    (steps.len() == workers).then(|| steps.into_iter().min())?
}

/// `(name and exit code, still running)` of a container.
///
/// # Panics
/// When docker cannot inspect it (compose keeps its containers until `down`).
pub(crate) fn inspect(id: &str) -> (Exited, bool) {
    try_inspect(id).unwrap_or_else(|| panic!("docker inspect {id}: no such container"))
}

/// `(name and exit code, still running)` of a container, or `None` when it
/// no longer exists (swarm removes old task containers at any moment, so one
/// listed a moment ago may be gone).
///
/// # Panics
/// When docker fails for another reason.
pub(crate) fn try_inspect(id: &str) -> Option<(Exited, bool)> {
    let output = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{.Name}} {{.State.Running}} {{.State.ExitCode}}",
            id,
        ])
        .output()
        .unwrap_or_else(|e| panic!("docker inspect: cannot run: {e}"));
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr).to_lowercase();
        assert!(
            err.contains("no such object") || err.contains("no such container"),
            "docker inspect {id} failed ({}):\n{err}",
            output.status
        );
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.split_whitespace();
    let name = fields
        .next()
        .unwrap_or_default()
        .trim_start_matches('/')
        .to_string();
    let running = fields.next() == Some("true");
    let code = fields.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
    Some((Exited { name, code }, running))
}

impl Drop for Compose {
    fn drop(&mut self) {
        let down = self
            .command(&[
                "--profile",
                "bench",
                "down",
                "-v",
                "--remove-orphans",
                "-t",
                "5",
            ])
            .output();
        if !down.is_ok_and(|o| o.status.success()) {
            eprintln!(
                "WARNING: `compose down -v` of {} failed; remove it by hand",
                self.project
            );
        }
    }
}
