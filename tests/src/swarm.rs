//! [`Swarm`] and [`Stack`]: the repository's `deploy/swarm/stack.yml` deployed
//! with `scripts/swarm.sh` on a one-node Docker swarm. A swarm the test made is
//! left (`docker swarm leave --force`) when dropped; a stack is removed with its
//! volumes and secrets when dropped, whatever the test did.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::compose::{Exited, checked, repo_root, try_inspect};

/// True when a Docker engine answers (swarm mode ships with every engine).
pub fn engine_available() -> bool {
    Command::new("docker")
        .args(["info"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn swarm_state() -> String {
    let mut info = Command::new("docker");
    info.args(["info", "--format", "{{.Swarm.LocalNodeState}}"]);
    let output = checked(info, "docker info");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// This engine in a swarm for as long as the value lives.
pub struct Swarm {
    created: bool,
}

impl Swarm {
    /// Makes this engine a one-node swarm (`docker swarm init`), or uses the
    /// swarm it is in already (and leaves that one as it was).
    ///
    /// # Panics
    /// When `docker swarm init` fails.
    pub fn init() -> Self {
        if swarm_state() == "active" {
            eprintln!("the engine is in a swarm already: using it, and leaving it in place");
            return Self { created: false };
        }
        let mut init = Command::new("docker");
        init.args(["swarm", "init", "--advertise-addr", "127.0.0.1"]);
        checked(init, "docker swarm init");
        Self { created: true }
    }

    /// The engine's swarm state now (`active`, `inactive`).
    pub fn state() -> String {
        swarm_state()
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        if !self.created {
            return;
        }
        let left = Command::new("docker")
            .args(["swarm", "leave", "--force"])
            .output();
        if !left.is_ok_and(|o| o.status.success()) {
            eprintln!("WARNING: `docker swarm leave --force` failed; leave the swarm by hand");
        }
    }
}

/// A deployed stack, removed (`scripts/swarm.sh down`) on drop.
pub struct Stack {
    name: String,
    secrets: tempfile::TempDir,
}

impl Stack {
    /// Deploys the stack as `name` (made unique to this process) with
    /// `scripts/swarm.sh up --no-build`, its certificates and tokens in a
    /// folder of its own, and `env` as settings.
    ///
    /// # Panics
    /// When the deploy fails.
    pub fn deploy(name: &str, env: &[(&str, &str)]) -> Self {
        let stack = Self {
            name: format!("{name}-{}", std::process::id()),
            secrets: tempfile::tempdir().expect("a folder for the secrets"),
        };
        let mut up = stack.script(&["up", "--no-build"]);
        up.envs(env.iter().copied());
        checked(up, "scripts/swarm.sh up");
        stack
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut command = Command::new(repo_root().join("scripts/swarm.sh"));
        command
            .args(args)
            .env("PS_STACK", &self.name)
            .env("PS_SWARM_SECRETS", self.secrets.path().join("secrets"))
            .current_dir(repo_root());
        command
    }

    fn docker(args: &[&str]) -> String {
        let mut command = Command::new("docker");
        command.args(args);
        let output = checked(command, &format!("docker {args:?}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }

    /// The full name of `service` in this stack.
    fn service(&self, service: &str) -> String {
        format!("{}_{service}", self.name)
    }

    /// Every container the swarm ran for `service` (running or not), oldest first.
    pub fn containers(&self, service: &str) -> Vec<String> {
        let label = format!(
            "label=com.docker.swarm.service.name={}",
            self.service(service)
        );
        let mut ids = Self::lines(&Self::docker(&["ps", "-a", "-q", "--filter", &label]));
        ids.reverse();
        ids
    }

    /// True while a task of `service` is meant to run (running, starting, or
    /// about to be started again after a failure).
    fn has_live_tasks(&self, service: &str) -> bool {
        let tasks = Self::docker(&[
            "service",
            "ps",
            &self.service(service),
            "--format",
            "{{.DesiredState}}",
        ]);
        tasks.lines().any(|state| state.trim() == "Running")
    }

    /// Waits until no task of `services` is meant to run any more, for at most
    /// `limit`, and returns every container they ran.
    ///
    /// # Panics
    /// When one still runs at the deadline (the stack's logs are in the message).
    pub fn wait_done(&self, services: &[&str], limit: Duration) -> Vec<Exited> {
        let deadline = Instant::now() + limit;
        loop {
            let live: Vec<&&str> = services.iter().filter(|s| self.has_live_tasks(s)).collect();
            let ids: Vec<String> = services.iter().flat_map(|s| self.containers(s)).collect();
            let states: Vec<(Exited, bool)> = ids.iter().filter_map(|id| try_inspect(id)).collect();
            if live.is_empty() && states.iter().all(|(_, running)| !running) {
                return states.into_iter().map(|(e, _)| e).collect();
            }
            assert!(
                Instant::now() < deadline,
                "{live:?} still running after {limit:?}:\n{}",
                self.logs(&[])
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// What the containers of `services` (all when empty) printed, stdout and
    /// stderr, each container under a header.
    pub fn logs(&self, services: &[&str]) -> String {
        let all = ["scheduler", "server", "worker"];
        let services = if services.is_empty() {
            &all[..]
        } else {
            services
        };
        let mut text = String::new();
        for id in services.iter().flat_map(|s| self.containers(s)) {
            let Some((container, _)) = try_inspect(&id) else {
                continue;
            };
            let output = Command::new("docker").args(["logs", &id]).output();
            let (out, err) = output.map(|o| (o.stdout, o.stderr)).unwrap_or_default();
            text.push_str(&format!(
                "--- {} (exit {}) ---\n{}{}",
                container.name,
                container.code,
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            ));
        }
        text
    }

    /// Every JSON object the containers of `service` printed on a line of its
    /// own (workers' summaries).
    pub fn json_lines(&self, service: &str) -> Vec<serde_json::Value> {
        self.containers(service)
            .iter()
            .flat_map(|id| Self::lines(&Self::docker(&["logs", id])))
            .filter(|line| line.starts_with('{'))
            .filter_map(|json| serde_json::from_str(&json).ok())
            .collect()
    }

    /// Runs `args` in the running container of `service` (its own binaries:
    /// the images have no shell); stdout, or `None` when none runs or it fails.
    pub fn exec(&self, service: &str, args: &[&str]) -> Option<String> {
        let id = self
            .containers(service)
            .into_iter()
            .find(|id| try_inspect(id).is_some_and(|(_, running)| running))?;
        let output = Command::new("docker")
            .arg("exec")
            .arg(&id)
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Kills one running container of `service` with SIGKILL and returns its name.
    ///
    /// # Panics
    /// When none runs or the kill fails.
    pub fn kill_one(&self, service: &str) -> String {
        let (id, victim) = self
            .containers(service)
            .into_iter()
            .find_map(|id| match try_inspect(&id) {
                Some((container, true)) => Some((id, container)),
                _ => None,
            })
            .expect("a running container");
        Self::docker(&["kill", "--signal", "KILL", &id]);
        victim.name
    }

    /// Objects of any kind (containers, networks, volumes, secrets, services)
    /// still labelled with this stack's name.
    pub fn leftovers(name_prefix: &str) -> Vec<String> {
        let label = "label=com.docker.stack.namespace";
        let mut left = Vec::new();
        for kind in ["container", "network", "volume", "secret", "service"] {
            let mut args = vec![kind, "ls", "--format", "{{.Name}}", "--filter", label];
            if kind == "container" {
                args[3] = "{{.Names}}";
                args.push("-a");
            }
            let Ok(output) = Command::new("docker").args(&args).output() else {
                continue;
            };
            left.extend(
                Self::lines(&String::from_utf8_lossy(&output.stdout))
                    .into_iter()
                    .filter(|name| name.starts_with(name_prefix))
                    .map(|name| format!("{kind} {name}")),
            );
        }
        left
    }

    /// This stack's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let down = self.script(&["down"]).output();
        if !down.is_ok_and(|o| o.status.success()) {
            eprintln!(
                "WARNING: `scripts/swarm.sh down` of {} failed; remove it by hand",
                self.name
            );
        }
    }
}
