//! [`RetryPolicy`]: which failures are worth retrying, and a bounded exponential
//! backoff for them. A retried push keeps its `(worker_id, step)`, so the server
//! applies it once however often it arrives. Every retry a policy makes is
//! counted by RPC in its [`RetryTally`], which the clients built from one
//! config share and a worker's metrics read.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::{Code, Status};

/// How often and how patiently to retry transient failures, and where the
/// retries are counted.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// Wait before the first retry; doubled each time.
    pub initial_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
    /// Where the retries are counted; shared by every clone of the policy.
    pub tally: RetryTally,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            tally: RetryTally::default(),
        }
    }
}

/// Retries made, by what was retried: one count per RPC, shared by clones.
#[derive(Debug, Clone, Default)]
pub struct RetryTally(Arc<Mutex<BTreeMap<String, u64>>>);

impl RetryTally {
    /// The retries counted so far, by RPC.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn count(&self, what: &str) {
        let mut retries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match retries.get_mut(what) {
            Some(count) => *count += 1,
            None => {
                retries.insert(what.to_string(), 1);
            }
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
                    self.tally.count(what);
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
    async fn retries_are_counted_by_what_was_retried() {
        let policy = RetryPolicy::default();
        let calls = AtomicU32::new(0);
        let result = policy
            .clone()
            .run("counted", || async {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                if n < 2 {
                    Err(Status::unavailable("down"))
                } else {
                    Ok(())
                }
            })
            .await;
        result.unwrap();
        assert_eq!(
            policy.tally.counts()["counted"],
            2,
            "counted in the clone's tally"
        );
        assert!(
            RetryPolicy::default().tally.counts().is_empty(),
            "a new policy starts at none"
        );
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
