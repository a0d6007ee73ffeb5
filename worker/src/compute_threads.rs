//! How many threads candle computes with on the CPU, fixed once per process.
//!
//! candle 0.11 asks, on every matrix product, how many threads it may use.
//! With `RAYON_NUM_THREADS` unset that means counting the host's physical
//! cores again, which reads `/proc/cpuinfo` each time: 28% of a digits
//! worker's samples, and the reason its compute ran 3.5 times slower than with
//! the variable set (docs/benchmarks.md, "Small-batch training"). Setting the
//! variable inside a running process is `unsafe` (another thread may be
//! reading the environment), so a binary calls [`pin_compute_threads`] first
//! thing in `main`, before any thread starts: with the variable unset, the
//! process runs itself again (`exec`: the same pid, arguments and open files)
//! with it set to the count candle would have found. A count the user set is
//! kept; a value candle would ignore (empty, zero, not a number) is replaced.
//! rayon's global pool takes the same count (it reads the same variable),
//! where it would otherwise have taken the logical CPUs.

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The variable candle (and rayon) read the thread count from.
pub const VARIABLE: &str = "RAYON_NUM_THREADS";

/// With `RAYON_NUM_THREADS` unset (or a value candle ignores), runs this
/// program again with it set to candle's own count and does not return;
/// otherwise, or when the program cannot be run again (said on stderr),
/// returns and the process goes on as it is. Call it first in `main`, before
/// a runtime or any thread starts.
pub fn pin_compute_threads() {
    let Some(threads) = threads_to_pin(std::env::var_os(VARIABLE).as_deref()) else {
        return;
    };
    let mut args = std::env::args_os();
    // The running file itself, even if its path was since replaced.
    let mut again = Command::new("/proc/self/exe");
    if let Some(name) = args.next() {
        again.arg0(name);
    }
    let error = again.args(args).env(VARIABLE, threads.to_string()).exec();
    not_pinned(&error);
}

/// The count to run again with: candle's own when the variable is unset or
/// not a count candle takes (`None`: it holds one, left alone).
fn threads_to_pin(current: Option<&OsStr>) -> Option<usize> {
    let taken = current
        .and_then(OsStr::to_str)
        .and_then(|value| value.parse::<usize>().ok())
        .is_some_and(|threads| threads > 0);
    (!taken).then(candle_core::utils::get_num_threads)
}

/// Says why the process goes on without the variable (before tracing is up).
fn not_pinned(error: &std::io::Error) {
    eprintln!(
        "warning: could not run again with {VARIABLE} set ({error}); candle will count the cores on every matrix product. Set {VARIABLE} to avoid it."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_is_kept_and_anything_else_gets_candles() {
        assert_eq!(threads_to_pin(Some(OsStr::new("3"))), None);
        for ignored in [None, Some(""), Some("0"), Some("many")] {
            let count = threads_to_pin(ignored.map(OsStr::new)).unwrap();
            assert!(count >= 1, "{ignored:?}: {count}");
        }
    }
}
