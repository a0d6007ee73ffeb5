//! A worker that shares its host's cores with its servers lets them run
//! first ([`yield_to_servers`]).
//!
//! A server's work is on every worker's path: each step's push and pull wait
//! for it. A server that spins for requests gives its core to the system
//! between looks, and a thread that yielded stays queued on its core behind
//! whatever runs there; when that is a worker's compute, the server's answer
//! waits for the compute to end. With two servers and two workers as four
//! processes on two cores, half of the steps took over 200 µs where a third
//! took 100-150. At a lower priority the worker's compute is cut short for
//! the queued server (docs/benchmarks.md, "A worker that shares its host
//! lets its servers run first").
//!
//! Linux keeps a priority per thread. A new thread takes its creator's, so
//! the call lowers every thread the process has; threads made afterwards
//! by any of them start lowered. A priority weighs only against threads of
//! the same scheduling group: with autogroup on, processes started from
//! different sessions (or run as different systemd units or containers with
//! their own cgroups) are weighed as groups, and the worker's lower priority
//! does not put the servers first.

use std::collections::HashSet;
use std::io;

use ps_client::PsClient;
use rustix::process::{Pid, getpriority_process, setpriority_process};

/// Lowers this process's priority by `by` (see [`yield_to_servers`]) when
/// `client` reaches a server through shared memory, which means the server
/// shares this host's cores; said in the log. Called once the trainer has
/// made its first pull, which opened each server's session. Does nothing
/// for `by` 0.
pub async fn when_servers_share_this_host(client: &PsClient, by: u8) {
    if by == 0 {
        return;
    }
    let shared = client.servers_on_this_host().await;
    if shared == 0 {
        return;
    }
    let before = current_nice().unwrap_or(LOWEST);
    match yield_to_servers(by) {
        Ok(nice) if nice > before => tracing::info!(
            servers_on_this_host = shared,
            nice,
            "sharing this host's cores with its servers: this worker runs at a lower priority so that they run first (--yield-to-servers 0 keeps it)"
        ),
        Ok(nice) => tracing::info!(
            servers_on_this_host = shared,
            nice,
            "sharing this host's cores with its servers, at the lowest priority already"
        ),
        Err(error) => tracing::warn!(
            %error,
            "could not lower the priority of every thread of this worker for the servers on its host; training goes on"
        ),
    }
}

/// The least priority (the largest nice value) a thread can have.
const LOWEST: i32 = 19;

/// Sets every thread of this process to the calling thread's nice value
/// plus `by` (at most 19, the lowest priority), leaving a thread already at
/// or past it.
/// Returns that nice value. Calling it again lowers by `by` again.
///
/// Threads are listed twice: a thread made during the first pass by one not
/// yet lowered started at the old priority. One made by a thread not yet
/// lowered during the second pass as well is missed.
///
/// # Errors
/// The process's threads could not be listed, or a thread's priority read or
/// set (the error of the last that failed; every other thread is still
/// lowered, and a thread that ended meanwhile is skipped).
pub fn yield_to_servers(by: u8) -> io::Result<i32> {
    let target = (current_nice()? + i32::from(by)).min(LOWEST);
    let mut seen = HashSet::new();
    let mut failed = None;
    for _ in 0..2 {
        for thread in threads()? {
            if seen.insert(thread)
                && let Err(error) = lower_to(thread, target)
            {
                failed = Some(error);
            }
        }
    }
    match failed {
        Some(error) => Err(error),
        None => Ok(target),
    }
}

/// The calling thread's nice value.
///
/// # Errors
/// The priority could not be read.
pub fn current_nice() -> io::Result<i32> {
    Ok(getpriority_process(None)?)
}

/// This process's thread ids, from `/proc/self/task`.
fn threads() -> io::Result<Vec<i32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        if let Some(id) = entry?
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Sets thread `id` to nice `target` unless it is there or lower already;
/// a thread that has ended is left.
fn lower_to(id: i32, target: i32) -> io::Result<()> {
    let Some(pid) = Pid::from_raw(id) else {
        return Ok(());
    };
    let now = match getpriority_process(Some(pid)) {
        Ok(now) => now,
        Err(rustix::io::Errno::SRCH) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    if now >= target {
        return Ok(());
    }
    match setpriority_process(Some(pid), target) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(error) => Err(error.into()),
    }
}
