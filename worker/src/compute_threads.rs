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
//! with it set to the count candle would have found. A value the user set is
//! kept as it is.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The variable candle (and rayon) read the thread count from.
pub const VARIABLE: &str = "RAYON_NUM_THREADS";

/// With `RAYON_NUM_THREADS` unset, runs this program again with it set to
/// candle's own count and does not return; otherwise, or when the program
/// cannot be run again (said on stderr), returns and the process goes on as
/// it is. Call it first in `main`, before a runtime or any thread starts.
pub fn pin_compute_threads() {
    let Some(threads) = threads_to_pin(std::env::var_os(VARIABLE)) else {
        return;
    };
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => return not_pinned(&error),
    };
    let mut args = std::env::args_os();
    let mut again = Command::new(program);
    if let Some(name) = args.next() {
        again.arg0(name);
    }
    let error = again.args(args).env(VARIABLE, threads.to_string()).exec();
    not_pinned(&error);
}

/// The count to run again with: candle's own when the variable is unset
/// (`None`: it is set, to anything, and left alone).
fn threads_to_pin(current: Option<OsString>) -> Option<usize> {
    match current {
        Some(_) => None,
        None => Some(candle_core::utils::get_num_threads()),
    }
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
    fn a_set_variable_is_kept_and_an_unset_one_gets_candles_count() {
        assert_eq!(threads_to_pin(Some("3".into())), None);
        assert_eq!(threads_to_pin(Some("".into())), None);
        let count = threads_to_pin(None).unwrap();
        assert!(count >= 1, "{count}");
    }
}
