//! [`RetryPolicy`]: which failures are worth retrying, and a bounded exponential
//! backoff for them. A retried push keeps its `(worker_id, step)`, so the server
//! applies it once however often it arrives.

use std::future::Future;
use std::time::Duration;

use tonic::{Code, Status};

/// How often and how patiently to retry transient failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// Wait before the first retry; doubled each time.
    pub initial_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// True for failures that may pass: the peer was unreachable, overloaded or
/// restarting. Errors about the request itself are never retried.
pub fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Aborted | Code::Cancelled
    )
}

impl RetryPolicy {
    /// Runs `call` until it succeeds, fails for good, or the attempts are used up.
    ///
    /// # Errors
    /// The last failure.
    pub async fn run<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, Status>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut backoff = self.initial_backoff;
        let mut attempt = 1;
        loop {
            match call().await {
                Ok(value) => return Ok(value),
                Err(status) if attempt < self.attempts && is_transient(&status) => {
                    tracing::warn!(what, attempt, code = ?status.code(), message = status.message(), ?backoff, "retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.max_backoff);
                    attempt += 1;
                }
                Err(status) => return Err(status),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let result = RetryPolicy::default()
            .run("test", || async {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                if n < 3 {
                    Err(Status::unavailable("down"))
                } else {
                    Ok(n)
                }
            })
            .await;
        assert_eq!(result.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_bounded() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy {
            attempts: 3,
            ..RetryPolicy::default()
        };
        let result: Result<(), _> = policy
            .run("test", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(Status::unavailable("down"))
            })
            .await;
        assert_eq!(result.unwrap_err().code(), Code::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn request_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = RetryPolicy::default()
            .run("test", || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(Status::invalid_argument("bad shape"))
            })
            .await;
        assert_eq!(result.unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
