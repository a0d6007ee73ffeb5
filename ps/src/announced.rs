//! [`Announced`]: the version a key or a bucket has announced, which pulls
//! wait on. An announcement is an atomic maximum and one atomic load while no
//! pull waits; it wakes the waiting pulls only when there are some.
//!
//! This is what tokio's `watch` channel did here, less its cost: a `watch`
//! send takes the channel's lock and wakes its eight notifiers, whether or
//! not anyone waits, on every push that makes a version (5 % of a server's
//! samples on 4 KiB pushes over shared memory).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ps_proto::ids::Version;
use tokio::sync::Notify;

/// A version that only grows, and the pulls waiting for it to reach theirs.
#[derive(Debug, Default)]
pub(crate) struct Announced {
    version: AtomicU64,
    /// Pulls inside [`Announced::reached`]; an announcement wakes them only
    /// when this is not zero.
    waiting: AtomicUsize,
    changed: Notify,
}

impl Announced {
    /// Starts at `version`.
    pub(crate) fn new(version: Version) -> Self {
        Self {
            version: AtomicU64::new(version.get()),
            ..Self::default()
        }
    }

    /// The version announced last.
    pub(crate) fn get(&self) -> Version {
        Version(self.version.load(Ordering::Acquire))
    }

    /// Announces `version` and wakes the pulls waiting; never lowers the
    /// announced version.
    pub(crate) fn announce(&self, version: Version) {
        // Sequentially consistent with `reached`: either this load sees a
        // waiter, or that waiter's check sees the new version.
        let before = self.version.fetch_max(version.get(), Ordering::SeqCst);
        if version.get() > before && self.waiting.load(Ordering::SeqCst) > 0 {
            self.changed.notify_waiters();
        }
    }

    /// Resolves once the announced version is `wanted` or later.
    pub(crate) async fn reached(&self, wanted: Version) {
        if self.get() >= wanted {
            return;
        }
        let _waiting = Waiting::on(&self.waiting);
        loop {
            // A `Notified` made before `notify_waiters` is woken by it, polled
            // or not; so one made before the check misses no announcement.
            let notified = self.changed.notified();
            if self.version.load(Ordering::SeqCst) >= wanted.get() {
                return;
            }
            notified.await;
        }
    }
}

/// One pull counted in [`Announced::waiting`] for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn on(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::SeqCst);
        Self(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_version_already_there_is_reached_at_once_and_none_is_lowered() {
        let announced = Announced::new(Version(3));
        announced.reached(Version(2)).await;
        announced.reached(Version(3)).await;
        announced.announce(Version(1));
        assert_eq!(announced.get(), Version(3));
        assert_eq!(announced.waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_waiting_pull_wakes_at_its_version_and_not_before() {
        let announced = Arc::new(Announced::new(Version(0)));
        let waiter = tokio::spawn({
            let announced = Arc::clone(&announced);
            async move { announced.reached(Version(2)).await }
        });
        while announced.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        announced.announce(Version(1));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "woke at version 1 waiting for 2");
        announced.announce(Version(2));
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken by the announcement")
            .unwrap();
        assert_eq!(announced.waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_pull_given_up_is_no_longer_counted() {
        let announced = Announced::new(Version(0));
        let gave_up =
            tokio::time::timeout(Duration::from_millis(1), announced.reached(Version(1))).await;
        assert!(gave_up.is_err());
        assert_eq!(announced.waiting.load(Ordering::SeqCst), 0);
    }

    /// Waiters and announcers racing on two threads: every waiter ends, so no
    /// announcement was missed between a waiter's check and its sleep.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_announcement_is_missed_by_a_racing_waiter() {
        for _ in 0..200 {
            let announced = Arc::new(Announced::new(Version(0)));
            let waiters: Vec<_> = (1..=8)
                .map(|wanted| {
                    let announced = Arc::clone(&announced);
                    tokio::spawn(async move { announced.reached(Version(wanted)).await })
                })
                .collect();
            let announcer = tokio::spawn({
                let announced = Arc::clone(&announced);
                async move {
                    for version in 1..=8 {
                        announced.announce(Version(version));
                        tokio::task::yield_now().await;
                    }
                }
            });
            announcer.await.unwrap();
            for waiter in waiters {
                tokio::time::timeout(Duration::from_secs(10), waiter)
                    .await
                    .expect("a waiter missed its announcement")
                    .unwrap();
            }
        }
    }
}
