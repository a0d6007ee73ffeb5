//! [`Spares`]: session regions made ahead on the blocking pool, so that a
//! server admitting a worker hands over a region whose pages are made
//! already, instead of making them (about 1.7 ms for the default 2 MiB
//! region on this project's machines) while the worker waits.
//!
//! Each spare is new and handed to one worker only: a region is never used
//! by two sessions. Spares are made only for regions of at most
//! [`SPARE_AT_MOST_BYTES`], and at most [`SPARE_REGIONS`] of them exist or
//! are being made at once, so they hold at most 16 MiB of a server's memory
//! outside its budget (a session's region is charged when it is admitted).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::region::Region;

/// How many regions a server keeps made ahead: two workers that open their
/// sessions at once (as `ps-local`'s do) both find one.
pub const SPARE_REGIONS: usize = 2;

/// The largest region made ahead; a server with larger rings makes each
/// session's region when the worker is admitted.
pub const SPARE_AT_MOST_BYTES: usize = 8 << 20;

/// Regions of one size made ahead (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Spares {
    bytes: usize,
    state: Mutex<State>,
    made_one: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Oldest first: a region is taken in the order it was made.
    made: VecDeque<Region>,
    making: usize,
}

impl Spares {
    /// Spares of regions of `bytes` bytes; none is made until
    /// [`Spares::refill`].
    pub(crate) fn new(bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            bytes,
            state: Mutex::default(),
            made_one: tokio::sync::Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A region made ahead, if one is ready (otherwise the caller makes
    /// its own); either way, starts making the next.
    pub(crate) fn take(self: &Arc<Self>) -> Option<Region> {
        let taken = self.state().made.pop_front();
        self.refill();
        taken
    }

    /// Starts making regions on the blocking pool until [`SPARE_REGIONS`]
    /// are made or being made. Does nothing for regions larger than
    /// [`SPARE_AT_MOST_BYTES`] or outside a runtime. A region the system
    /// refuses is not retried until the next refill.
    pub(crate) fn refill(self: &Arc<Self>) {
        if self.bytes > SPARE_AT_MOST_BYTES {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut state = self.state();
        while state.made.len() + state.making < SPARE_REGIONS {
            state.making += 1;
            let spares = Arc::clone(self);
            runtime.spawn_blocking(move || spares.make_one());
        }
    }

    /// Makes one region and keeps it (on the blocking pool).
    fn make_one(&self) {
        let made = Region::create(self.bytes);
        let mut state = self.state();
        state.making -= 1;
        match made {
            Ok(region) => state.made.push_back(region),
            Err(error) => {
                tracing::debug!(%error, bytes = self.bytes, "a spare region could not be made")
            }
        }
        drop(state);
        self.made_one.notify_waiters();
    }

    /// The inodes of the spares ready now (for tests).
    #[cfg(test)]
    pub(crate) fn made_inodes(&self) -> Vec<u64> {
        let state = self.state();
        let inode = |region: &Region| rustix::fs::fstat(region.file()).map_or(0, |s| s.st_ino);
        state.made.iter().map(inode).collect()
    }

    /// Waits until `count` spares are ready (for tests).
    #[cfg(test)]
    pub(crate) async fn ready(&self, count: usize) {
        loop {
            let made = self.made_one.notified();
            tokio::pin!(made);
            made.as_mut().enable();
            if self.state().made.len() >= count {
                return;
            }
            made.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;

    use super::*;

    fn inode(region: &Region) -> u64 {
        rustix::fs::fstat(region.file().as_fd()).unwrap().st_ino
    }

    #[tokio::test]
    async fn spares_are_new_zeroed_regions_each_handed_out_once() {
        let spares = Spares::new(1 << 16);
        spares.refill();
        spares.ready(SPARE_REGIONS).await;
        let first = spares.take().expect("made ahead");
        let second = spares.take().expect("made ahead");
        assert_ne!(inode(&first), inode(&second), "two regions, not one twice");
        assert_eq!(first.bytes(), 1 << 16);
        assert!(first.words().iter().all(|w| w.load(Ordering::Relaxed) == 0));
        // Taking started the next ones; never more than the count exist.
        spares.ready(SPARE_REGIONS).await;
        let state = spares.state();
        assert_eq!(state.made.len() + state.making, SPARE_REGIONS);
    }

    #[tokio::test]
    async fn large_regions_are_not_made_ahead() {
        let spares = Spares::new(SPARE_AT_MOST_BYTES + 8);
        spares.refill();
        assert!(spares.take().is_none());
        let state = spares.state();
        assert_eq!((state.made.len(), state.making), (0, 0));
    }

    #[test]
    fn outside_a_runtime_nothing_is_made_ahead() {
        let spares = Spares::new(1 << 16);
        assert!(spares.take().is_none());
        assert_eq!(spares.state().making, 0);
    }
}
