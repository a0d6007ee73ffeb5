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
//! the queued server: the digits job as those four processes ran at
//! 468-588k examples/s with the workers at nice 5, against 313-367k at 0
//! (docs/benchmarks.md, "A worker that shares its host lets its servers run
//! first").
//!
//! Linux keeps a priority per thread. A new thread takes its creator's, so
//! the call lowers every thread the process has; threads made afterwards
//! by any of them start lowered.

use std::io;

use ps_client::PsClient;
use rustix::process::{Pid, getpriority_process, setpriority_process};

/// Lowers this process's priority by `by` (see [`yield_to_servers`]) when
/// `client` reaches a server through shared memory, which means the server
/// shares this host's cores; said in the log. Called once the variables are
/// registered, so that each session is opened with rings sized to what is
/// placed on its server. Does nothing for `by` 0.
pub async fn when_servers_share_this_host(client: &PsClient, by: u8) {
    if by == 0 {
        return;
    }
    let shared = client.servers_on_this_host().await;
    if shared == 0 {
        return;
    }
    match yield_to_servers(by) {
        Ok(nice) => tracing::info!(
            servers_on_this_host = shared,
            nice,
            "sharing this host's cores with its servers: this worker runs at a lower priority so that they run first (--yield-to-servers 0 keeps it)"
        ),
        Err(error) => tracing::warn!(
            %error,
            "could not lower this worker's priority for the servers on its host; training goes on at its own"
        ),
    }
}

/// The least priority (the largest nice value) a thread can have.
const LOWEST: i32 = 19;

/// Lowers every thread of this process by `by` nice levels (to at most
/// [`LOWEST`]). Returns the calling thread's nice value afterwards.
///
/// # Errors
/// The process's threads could not be listed, or one's priority read or set
/// (a thread that ended meanwhile is skipped).
pub fn yield_to_servers(by: u8) -> io::Result<i32> {
    // Twice: a thread made during the first pass by a thread not yet lowered
    // started at the old priority.
    let mut lowered = std::collections::HashSet::new();
    for _ in 0..2 {
        for thread in threads()? {
            if lowered.insert(thread) {
                lower(thread, by)?;
            }
        }
    }
    Ok(getpriority_process(None)?)
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

/// Lowers thread `id` by `by`; a thread that has ended is left.
fn lower(id: i32, by: u8) -> io::Result<()> {
    let Some(pid) = Pid::from_raw(id) else {
        return Ok(());
    };
    let now = match getpriority_process(Some(pid)) {
        Ok(now) => now,
        Err(rustix::io::Errno::SRCH) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    match setpriority_process(Some(pid), (now + i32::from(by)).min(LOWEST)) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(error) => Err(error.into()),
    }
}
