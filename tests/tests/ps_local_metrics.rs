//! `ps-local --metrics-listen`: every in-process part (the scheduler, each
//! server, each worker) serves its own metrics on its own port while the job
//! trains, in exposition that Prometheus's own checker (`promtool check
//! metrics`, from Debian's `prometheus` package) accepts.

use std::process::Stdio;
use std::time::{Duration, Instant};

use ps_tests::{binary, http_get, metric_sample, read_log_until_count};

/// One part's metrics address, as `ps-local` logs it.
#[derive(Debug)]
struct Part {
    name: String,
    addr: String,
}

/// Reads `part="NAME"` and `addr=ADDR` from a `part metrics listening` line.
fn part_of(line: &str) -> Part {
    let name = line
        .split("part=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no part in {line:?}"));
    let addr = line
        .split("addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    Part {
        name: name.to_string(),
        addr: addr.to_string(),
    }
}

/// The program a part's build info names, and a series that shows it at work.
fn expected(part: &str) -> (&'static str, &'static str, f64) {
    match part.split(' ').next() {
        Some("scheduler") => ("ps-scheduler", "candle_ps_scheduler_live_workers", 2.0),
        Some("server") => ("ps-server", "candle_ps_server_push_bytes_total", 1.0),
        Some("worker") => ("ps-worker", "candle_ps_worker_steps_total", 5.0),
        _ => panic!("an unknown part {part:?}"),
    }
}

/// Scrapes `part` until `series` reaches `at_least`, within a minute.
async fn scrape_at_work(part: &Part, series: &str, at_least: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, text) = http_get(&part.addr, "/metrics").await;
        assert!(status.contains("200"), "{}: {status}", part.name);
        if metric_sample(&text, series).is_some_and(|value| value >= at_least) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {series} did not reach {at_least} in 60 s:\n{text}",
            part.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `promtool check metrics` on `text`: `None` when promtool is not installed
/// (`.ci/run` installs it), else its verdict with what it printed.
fn promtool_check(text: &str) -> Option<Result<(), String>> {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(text.as_bytes()).expect("feed promtool");
    drop(stdin);
    let output = child.wait_with_output().expect("promtool ran");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Some(match output.status.success() && said.trim().is_empty() {
        true => Ok(()),
        false => Err(said),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_of_ps_local_serves_its_own_metrics_while_it_trains() {
    let mut local = tokio::process::Command::new(binary("ps-local"))
        .args(["--servers", "2", "--workers", "2", "--epochs", "300"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ps-local");
    let (lines, log) = read_log_until_count(&mut local, "part metrics listening", 5).await;
    let parts: Vec<Part> = lines.iter().map(|line| part_of(line)).collect();
    let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["scheduler", "server 0", "server 1", "worker 0", "worker 1"],
        "{lines:#?}"
    );
    let mut unchecked = Vec::new();
    for part in &parts {
        let (program, series, at_least) = expected(&part.name);
        let text = scrape_at_work(part, series, at_least).await;
        assert!(
            text.contains(&format!("program=\"{program}\"")),
            "{} is served by {program}:\n{text}",
            part.name
        );
        match promtool_check(&text) {
            Some(Ok(())) => {}
            Some(Err(said)) => panic!("promtool refused {}'s metrics: {said}\n{text}", part.name),
            None => unchecked.push(part.name.clone()),
        }
    }
    if !unchecked.is_empty() {
        eprintln!("promtool is not installed, so {unchecked:?} were not checked with it");
    }
    local.kill().await.expect("stop ps-local");
    drop(log);
}
