//! The tokio runtime each program runs on, sized for a machine it shares.
//!
//! A multi-threaded runtime wakes a parked worker thread whenever a task
//! becomes ready while another thread is busy. Where servers and workers share
//! a machine (a benchmark, `ps-local`'s neighbours, a compose cluster on one
//! host), each process's extra threads mostly trade wake-ups with each other:
//! on 2 cores, two processes of 2 runtime threads each ran 4 KiB operations at
//! 25,000-37,000/s, and of 1 thread each at 52,000/s (docs/benchmarks.md).
//! Large arithmetic does not run on these threads (blocking pool and rayon),
//! so one thread per two cores keeps the I/O fed.

use std::future::Future;

/// Runtime threads when none are asked for: half the cores, at least one.
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / 2).max(1)
}

/// Runs `main` to completion on a multi-threaded runtime of `threads` worker
/// threads ([`default_threads`] for `None`), with I/O and timers enabled.
///
/// # Errors
/// When the runtime cannot be built (the operating system refused a thread
/// or an event queue).
pub fn block_on<F: Future>(threads: Option<usize>, main: F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.unwrap_or_else(default_threads).max(1))
        .enable_all()
        .build()?;
    Ok(runtime.block_on(main))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_of_the_threads_asked_for_runs_the_future() {
        let threads = block_on(Some(3), async {
            tokio::runtime::Handle::current().metrics().num_workers()
        })
        .unwrap();
        assert_eq!(threads, 3);
        let default = block_on(None, async {
            tokio::runtime::Handle::current().metrics().num_workers()
        })
        .unwrap();
        assert_eq!(default, default_threads());
        assert!(default >= 1);
    }
}
