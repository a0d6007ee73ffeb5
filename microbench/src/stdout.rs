//! Results written to standard output, where the reader may close it early
//! (`ps-microbench kv --json | head -1`): a write then fails with
//! [`StdoutClosed`] instead of panicking, as `println!` does, and `main`
//! ends quietly ([`closed_early`]).

use std::fmt::Display;
use std::io::{self, Write};

/// Standard output was closed by its reader before everything was written.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed before the results were all written")]
pub struct StdoutClosed;

/// Writes `text` and a newline to standard output.
///
/// # Errors
/// [`StdoutClosed`] when its reader has gone, or what else failed.
pub fn line(text: impl Display) -> anyhow::Result<()> {
    write(format_args!("{text}\n"))
}

/// Writes `text` to standard output as it is.
///
/// # Errors
/// As [`line()`].
pub fn text(text: impl Display) -> anyhow::Result<()> {
    write(format_args!("{text}"))
}

fn write(text: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_fmt(text).and_then(|()| out.flush()) {
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        written => Ok(written?),
    }
}

/// Whether `error` is standard output closed early, which is no failure:
/// the reader took what it wanted.
pub fn closed_early(error: &anyhow::Error) -> bool {
    error.is::<StdoutClosed>()
}
