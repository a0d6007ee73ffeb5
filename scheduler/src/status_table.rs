//! The table `ps-scheduler status` prints: the shard map's version, the servers
//! with their parts, bytes, share of the load and pushes, and the workers with
//! their step and the time since their last heartbeat. Given the snapshot
//! before, it adds the rates in between (pushes/s, bytes/s, steps/s), which is
//! what `status --watch` refreshes every second.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use ps_proto::v1;

/// One `Status` answer and how long after the one before it came.
#[derive(Debug, Clone, Copy)]
pub struct Earlier<'a> {
    /// The answer before.
    pub status: &'a v1::StatusResponse,
    /// The time between the two.
    pub elapsed: Duration,
}

/// `status` as a table; with the rates since `earlier` when given ("-" without).
pub fn render(status: &v1::StatusResponse, earlier: Option<Earlier<'_>>) -> String {
    let mut out = String::new();
    let waiting = if status.waiting_for.is_empty() {
        String::new()
    } else {
        format!(" (waiting for: {})", status.waiting_for)
    };
    let _ = writeln!(out, "shard map version {}{waiting}", status.map_version);
    render_servers(&mut out, status, earlier);
    render_workers(&mut out, status, earlier);
    out
}

fn render_servers(out: &mut String, status: &v1::StatusResponse, earlier: Option<Earlier<'_>>) {
    let _ = writeln!(
        out,
        "\n{:>6}  {:<24}  {:>5}  {:>6}  {:>14}  {:>6}  {:>9}  {:>10}  {:>8}",
        "server", "address", "alive", "parts", "bytes", "load", "pushes/s", "MB/s in", "silent"
    );
    let total: u64 = status.servers.iter().map(|s| s.bytes).sum();
    let live = status.servers.iter().filter(|s| s.alive).count().max(1) as f64;
    let before: BTreeMap<u32, &v1::ServerStatus> = earlier
        .map(|e| e.status.servers.iter().map(|s| (s.id, s)).collect())
        .unwrap_or_default();
    for s in &status.servers {
        let load = if total == 0 {
            0.0
        } else {
            s.bytes as f64 / (total as f64 / live)
        };
        let then = before.get(&s.id);
        let pushes = rate(then.map(|t| t.pushes), s.pushes, earlier, 1.0);
        let megabytes = rate(then.map(|t| t.push_bytes), s.push_bytes, earlier, 1e6);
        let _ = writeln!(
            out,
            "{:>6}  {:<24}  {:>5}  {:>6}  {:>14}  {:>5.2}x  {:>9}  {:>10}  {:>8}",
            s.id,
            s.addr,
            alive_word(s.alive, s.left),
            s.parts,
            s.bytes,
            load,
            pushes,
            megabytes,
            silent(s.alive, s.silent_ms)
        );
    }
}

fn render_workers(out: &mut String, status: &v1::StatusResponse, earlier: Option<Earlier<'_>>) {
    let _ = writeln!(
        out,
        "\n{:>6}  {:>5}  {:>9}  {:>8}  {:>8}",
        "worker", "alive", "last step", "steps/s", "silent"
    );
    let before: BTreeMap<u32, u64> = earlier
        .map(|e| {
            e.status
                .workers
                .iter()
                .map(|w| (w.rank, w.last_step))
                .collect()
        })
        .unwrap_or_default();
    for w in &status.workers {
        let steps = rate(before.get(&w.rank).copied(), w.last_step, earlier, 1.0);
        let _ = writeln!(
            out,
            "{:>6}  {:>5}  {:>9}  {:>8}  {:>8}",
            w.rank,
            alive_word(w.alive, w.left),
            w.last_step,
            steps,
            silent(w.alive, w.silent_ms)
        );
    }
}

/// `(now - then) / elapsed / unit`, one decimal; "-" without an earlier value
/// (the first table, or a member that just appeared) or when a counter went
/// back (a server that restarted).
fn rate(then: Option<u64>, now: u64, earlier: Option<Earlier<'_>>, unit: f64) -> String {
    let (Some(then), Some(earlier)) = (then, earlier) else {
        return "-".into();
    };
    let seconds = earlier.elapsed.as_secs_f64();
    if now < then || seconds <= 0.0 {
        return "-".into();
    }
    format!("{:.1}", (now - then) as f64 / seconds / unit)
}

/// The time since a live member's last heartbeat; "-" for one that is gone.
fn silent(alive: bool, silent_ms: u64) -> String {
    if alive {
        format!("{:.1}s", silent_ms as f64 / 1000.0)
    } else {
        "-".into()
    }
}

/// How a member's liveness reads: a clean departure is not a death.
fn alive_word(alive: bool, left: bool) -> &'static str {
    match (alive, left) {
        (true, _) => "yes",
        (false, true) => "left",
        (false, false) => "DEAD",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(pushes: u64, push_bytes: u64) -> v1::ServerStatus {
        v1::ServerStatus {
            id: 0,
            addr: "10.0.0.1:7070".into(),
            alive: true,
            parts: 4,
            bytes: 1000,
            left: false,
            pushes,
            push_bytes,
            silent_ms: 250,
        }
    }

    fn worker(last_step: u64, alive: bool) -> v1::WorkerStatus {
        v1::WorkerStatus {
            rank: 0,
            alive,
            last_step,
            left: !alive,
            silent_ms: 100,
        }
    }

    fn status(server: v1::ServerStatus, worker: v1::WorkerStatus) -> v1::StatusResponse {
        v1::StatusResponse {
            servers: vec![server],
            workers: vec![worker],
            map_version: 3,
            waiting_for: String::new(),
        }
    }

    #[test]
    fn the_first_table_has_no_rates_and_the_next_has_the_rates_in_between() {
        let before = status(server(100, 4_000_000), worker(50, true));
        let first = render(&before, None);
        assert!(first.contains("shard map version 3"), "{first}");
        assert!(first.contains("1.00x"), "{first}");
        assert!(first.contains("0.2s"), "{first}");
        let after = status(server(300, 12_000_000), worker(90, true));
        let earlier = Earlier {
            status: &before,
            elapsed: Duration::from_secs(2),
        };
        let next = render(&after, Some(earlier));
        let server_row = next.lines().find(|l| l.contains("10.0.0.1:7070")).unwrap();
        let fields: Vec<&str> = server_row.split_whitespace().collect();
        // 200 pushes and 8 MB in 2 s.
        assert_eq!(fields[6..8], ["100.0", "4.0"], "{next}");
        let worker_row = next.lines().last().unwrap();
        let fields: Vec<&str> = worker_row.split_whitespace().collect();
        assert_eq!(fields, ["0", "yes", "90", "20.0", "0.1s"], "{next}");
    }

    #[test]
    fn a_counter_that_went_back_or_a_member_that_left_shows_no_rate() {
        let before = status(server(300, 9), worker(90, true));
        let after = status(server(10, 1), worker(90, false));
        let earlier = Earlier {
            status: &before,
            elapsed: Duration::from_secs(1),
        };
        let table = render(&after, Some(earlier));
        let server_row = table.lines().find(|l| l.contains("10.0.0.1")).unwrap();
        let fields: Vec<&str> = server_row.split_whitespace().collect();
        assert_eq!(fields[6..8], ["-", "-"], "{table}");
        let worker_row = table.lines().last().unwrap();
        assert_eq!(
            worker_row.split_whitespace().collect::<Vec<_>>(),
            ["0", "left", "90", "0.0", "-"],
            "{table}"
        );
    }
}
