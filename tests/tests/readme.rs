//! README's recipes work when pasted: every shell block marked ```` ```sh runnable ````
//! runs in bash, start to end, and must exit 0 and leave no process behind.
//!
//! Three things differ from a paste, each so that the test runs inside
//! `cargo test`: `target/release/` is read as this test run's build folder (whose
//! binaries `cargo test` has built), so `cargo build` lines are left out; and the
//! ports the recipes name (7000, 7070, 7071) are replaced by free loopback ports,
//! so the test never depends on a fixed port being free.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ps_tests::{binary, example};

/// The longest a recipe may take (each trains a small model once).
const RECIPE_DEADLINE: Duration = Duration::from_secs(300);

/// The ports the README's recipes use.
const README_PORTS: [u16; 3] = [7000, 7070, 7071];

/// A runnable block: the line its fence is on, and its text.
struct Recipe {
    line: usize,
    script: String,
}

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn runnable_recipes(readme: &str) -> Vec<Recipe> {
    let mut recipes = Vec::new();
    let mut open: Option<Recipe> = None;
    for (index, line) in readme.lines().enumerate() {
        match open.as_mut() {
            None if line.trim() == "```sh runnable" => {
                open = Some(Recipe {
                    line: index + 1,
                    script: String::new(),
                });
            }
            Some(_) if line.trim() == "```" => recipes.extend(open.take()),
            Some(recipe) => {
                recipe.script.push_str(line);
                recipe.script.push('\n');
            }
            None => {}
        }
    }
    recipes
}

/// Free loopback ports, one for each README port.
fn free_ports() -> Vec<u16> {
    let listeners: Vec<_> = README_PORTS
        .iter()
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("bound").port())
        .collect()
}

/// The recipe as this test runs it (see the module documentation).
fn adapted(script: &str, build_dir: &Path, ports: &[u16]) -> String {
    let mut adapted = String::new();
    for line in script.lines() {
        if line.trim_start().starts_with("cargo build") {
            continue;
        }
        let mut line = line.replace("target/release/", &format!("{}/", build_dir.display()));
        for (from, to) in README_PORTS.iter().zip(ports) {
            line = line.replace(&format!(":{from}"), &format!(":{to}"));
        }
        adapted.push_str(&line);
        adapted.push('\n');
    }
    adapted
}

/// Whether any process of the group `pgid` is still running.
fn group_alive(pgid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn kill_group(pgid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Runs one recipe in its own process group; returns its output, and whether
/// processes of it were left running (they are killed).
async fn run(script: &str, dir: &Path) -> (std::process::Output, bool) {
    let child = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn bash");
    let pgid = child.id().expect("a running child");
    let output = tokio::time::timeout(RECIPE_DEADLINE, child.wait_with_output()).await;
    let left_running = group_alive(pgid);
    kill_group(pgid);
    let output = output
        .unwrap_or_else(|_| panic!("the recipe ran past {RECIPE_DEADLINE:?}:\n{script}"))
        .expect("bash ran");
    (output, left_running)
}

fn build_dir() -> PathBuf {
    // Build what the recipes run, as `cargo build --release` would.
    for bin in ["ps-scheduler", "ps-server", "ps-worker"] {
        binary(bin);
    }
    let data_parallel = example("data_parallel");
    data_parallel
        .parent()
        .and_then(Path::parent)
        .expect("examples/ is inside the build folder")
        .to_path_buf()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runnable_readme_recipe_works_when_pasted() {
    let recipes = runnable_recipes(&readme());
    assert!(
        recipes.len() >= 2,
        "README marks its recipes ```sh runnable (the cluster by hand, data_parallel)"
    );
    let build_dir = build_dir();
    for recipe in recipes {
        let dir = tempfile::tempdir().expect("a folder");
        let script = adapted(&recipe.script, &build_dir, &free_ports());
        let (output, left_running) = run(&script, dir.path()).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let context = format!(
            "README.md:{} as run:\n{script}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            recipe.line
        );
        assert!(output.status.success(), "the recipe failed: {context}");
        assert!(
            !left_running,
            "the recipe left processes running: {context}"
        );
        assert!(
            stdout.contains("test_accuracy") || stdout.contains("test accuracy"),
            "the recipe trained and reported an accuracy: {context}"
        );
    }
}

#[test]
fn recipes_are_found_and_adapted() {
    let readme = "text\n```sh runnable\ncargo build --release\ntarget/release/ps-server --listen 0.0.0.0:7070 &\n```\n```sh\nnot runnable\n```\n";
    let recipes = runnable_recipes(readme);
    assert_eq!(recipes.len(), 1);
    assert_eq!(recipes[0].line, 2);
    assert_eq!(
        adapted(&recipes[0].script, Path::new("/b"), &[1, 2, 3]),
        "/b/ps-server --listen 0.0.0.0:2 &\n"
    );
}
