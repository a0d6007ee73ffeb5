//! A progress bar for long benchmark runs, on stderr and only on a terminal
//! (piped or CI runs get one log line per measurement instead).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `measurements`, named `what`, saying how long the run should take.
pub fn bar(measurements: u64, what: &str, expected: Duration) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(measurements);
    let style =
        ProgressStyle::with_template("{prefix} [{elapsed_precise}] {bar:30} {pos}/{len}  {msg}")
            .expect("a valid template")
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{what} (about {}s)", expected.as_secs()));
    bar
}
