//! [`BufferPool`]: the buffers a ring's reader copies payloads into, handed
//! on as [`Bytes`] and given back to the pool when the last clone drops.
//!
//! A fresh buffer for every large payload costs the kernel's page faults and
//! zeroing on each message (a 16 MiB push paid more for its fresh pages than
//! for its copy). The pool keeps buffers that came back, so a busy session
//! copies into memory it already has: up to [`KEPT_BUFFERS`] of them, and in
//! bytes up to the most it had lent out at once (at least [`KEPT_BYTES`])
//! within the last [`REMEMBERED`] or so. A step whose payloads are larger
//! than [`KEPT_BYTES`] (a whole 64 MiB variable on its one server) finds them
//! again next step; a burst of payloads is let go once it is that long past
//! (at the pool's next use); and the buffers kept and lent together come to
//! at most that recent most plus what is lent now. What is in flight is what
//! the server's memory budget admitted when its service took the requests.
//! Payloads below [`POOLED_FROM`] come from the allocator and go back to it,
//! with no lock.

use std::any::Any;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;

/// The bytes of buffers one pool keeps for reuse (a server's sessions share
/// one pool) however little it has lent out at once.
pub const KEPT_BYTES: usize = 32 << 20;

/// How long the most a pool had lent out at once sizes what it keeps.
pub const REMEMBERED: Duration = Duration::from_secs(10);

/// The most buffers one pool keeps for reuse (a server's sessions share the
/// pool): [`KEPT_BYTES`] in 512 KiB payloads.
pub const KEPT_BUFFERS: usize = 64;

/// Payloads smaller than this never pass through the pool: the allocator's
/// own per-thread caches hand them out with no page faults, where the pool
/// takes its lock three times a payload (to take, lend and give back), a
/// lock all of a server's sessions share. At 4 KiB pushes with 2 servers
/// and 2 workers, the pool was about 6 % of each server's samples.
pub const POOLED_FROM: usize = 16 << 10;

/// What a lent buffer keeps alive until its last clone drops, such as the
/// memory charge the bytes were read under.
pub type Hold = Arc<dyn Any + Send + Sync>;

/// Reusable payload buffers; cloning shares the pool.
#[derive(Debug, Clone, Default)]
pub struct BufferPool {
    free: Arc<Mutex<Free>>,
}

#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
    /// Bytes of buffers lent out as `Bytes` and not yet back.
    lent: usize,
    /// The most `lent` has been since `since`.
    most: usize,
    /// The most `lent` was in the period before `since`.
    most_before: usize,
    /// When the current period began ([`coarse_now`]); `None` before the
    /// first use.
    since: Option<Duration>,
    /// How long a period lasts: [`REMEMBERED`], or shorter in tests.
    period: Option<Duration>,
}

impl Free {
    /// Bytes this pool keeps at most now.
    fn cap(&self) -> usize {
        KEPT_BYTES.max(self.most).max(self.most_before)
    }

    fn lend(&mut self, size: usize, now: Duration) {
        self.roll(now);
        self.lent += size;
        self.most = self.most.max(self.lent);
    }

    /// A lent buffer is back: kept if there is room.
    fn give_back(&mut self, buffer: &mut Vec<u8>, now: Duration) {
        let size = buffer.capacity();
        self.lent -= size;
        let room = self.bytes + size <= self.cap() && self.buffers.len() < KEPT_BUFFERS;
        if size > 0 && room {
            self.bytes += size;
            self.buffers.push(std::mem::take(buffer));
        }
        self.roll(now);
    }

    /// Starts a new period once the current one is over, and lets go of
    /// what is kept past the new cap.
    fn roll(&mut self, now: Duration) {
        let since = *self.since.get_or_insert(now);
        if now.saturating_sub(since) < self.period.unwrap_or(REMEMBERED) {
            return;
        }
        self.most_before = std::mem::replace(&mut self.most, self.lent);
        self.since = Some(now);
        while self.bytes > self.cap() {
            let Some(dropped) = self.buffers.pop() else {
                break;
            };
            self.bytes -= dropped.capacity();
        }
    }
}

impl BufferPool {
    /// A new, empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new, empty pool whose periods last `period` instead of [`REMEMBERED`].
    #[cfg(test)]
    fn remembering(period: Duration) -> Self {
        let pool = Self::new();
        lock(&pool.free).period = Some(period);
        pool
    }

    /// A buffer of `len` bytes (their contents unspecified): the smallest
    /// kept one that holds `len` without being more than twice the size (a
    /// small payload does not pin a large buffer), else a new one; a new one
    /// from the allocator below [`POOLED_FROM`].
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len < POOLED_FROM {
            return vec![0; len];
        }
        let most = len.saturating_mul(2);
        let kept = {
            let mut free = lock(&self.free);
            let fitting = (free.buffers.iter().enumerate())
                .filter(|(_, b)| (len..=most).contains(&b.capacity()))
                .min_by_key(|(_, b)| b.capacity())
                .map(|(at, _)| at);
            fitting.map(|at| {
                let buffer = free.buffers.swap_remove(at);
                free.bytes -= buffer.capacity();
                buffer
            })
        };
        let mut buffer = kept.unwrap_or_default();
        buffer.resize(len, 0);
        buffer
    }

    /// `buffer` as `Bytes` that give it back to this pool (to the allocator
    /// below [`POOLED_FROM`]), and let go of `hold`, when dropped.
    pub fn bytes(&self, buffer: Vec<u8>, hold: Option<Hold>) -> Bytes {
        if buffer.capacity() < POOLED_FROM {
            return match hold {
                None => Bytes::from(buffer),
                Some(hold) => Bytes::from_owner(Pooled {
                    buffer,
                    pool: Weak::new(),
                    _hold: Some(hold),
                }),
            };
        }
        lock(&self.free).lend(buffer.capacity(), coarse_now());
        Bytes::from_owner(Pooled {
            buffer,
            pool: Arc::downgrade(&self.free),
            _hold: hold,
        })
    }

    /// How many buffers the pool keeps now.
    pub fn kept(&self) -> usize {
        lock(&self.free).buffers.len()
    }
}

/// The monotonic clock to within a few milliseconds
/// (`CLOCK_MONOTONIC_COARSE`), enough for periods of seconds: the pool reads
/// it for every payload it lends and takes back, and a read costs about 5 ns
/// here against 30 ns for the precise clock.
fn coarse_now() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

fn lock(free: &Mutex<Free>) -> std::sync::MutexGuard<'_, Free> {
    free.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A buffer lent out as `Bytes`, going back to its pool (if it came from
/// one, and the pool still exists and has room) when dropped.
struct Pooled {
    buffer: Vec<u8>,
    pool: Weak<Mutex<Free>>,
    _hold: Option<Hold>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        lock(&pool).give_back(&mut self.buffer, coarse_now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_payload_comes_back_and_is_reused() {
        let pool = BufferPool::new();
        let buffer = pool.take(1 << 20);
        let first = buffer.as_ptr();
        let bytes = pool.bytes(buffer, None);
        let clone = bytes.clone();
        drop(bytes);
        assert_eq!(pool.kept(), 0, "a clone still holds it");
        drop(clone);
        assert_eq!(pool.kept(), 1);
        let small = pool.take(POOLED_FROM);
        assert_ne!(small.as_ptr(), first, "a small payload does not pin it");
        let again = pool.take(600 << 10);
        assert_eq!(again.as_ptr(), first, "the kept buffer is reused");
        assert_eq!(again.len(), 600 << 10);
        assert_eq!(pool.kept(), 0);
        // Back at its smaller length, it still serves a full-size payload.
        drop(pool.bytes(again, None));
        let full = pool.take(1 << 20);
        assert_eq!(full.as_ptr(), first);
    }

    #[test]
    fn the_pool_keeps_what_was_once_in_flight_and_no_more() {
        let pool = BufferPool::new();
        // Three buffers of half the floor in flight at once: all three come back.
        let lent: Vec<Bytes> = (0..3)
            .map(|_| pool.bytes(pool.take(KEPT_BYTES / 2), None))
            .collect();
        drop(lent);
        assert_eq!(pool.kept(), 3);
        // A fourth never lent alongside them is not kept beside them.
        drop(pool.bytes(vec![0; KEPT_BYTES / 2], None));
        assert_eq!(pool.kept(), 3);
    }

    #[test]
    fn a_payload_larger_than_the_floor_is_kept_for_the_next_step() {
        let pool = BufferPool::new();
        let large = 2 * KEPT_BYTES;
        let first = pool.take(large);
        let at = first.as_ptr();
        drop(pool.bytes(first, None));
        assert_eq!(pool.kept(), 1);
        let again = pool.take(large);
        assert_eq!(again.as_ptr(), at, "the next step's payload reuses it");
        drop(pool.bytes(again, None));
    }

    #[test]
    fn a_burst_is_let_go_once_it_is_a_period_past() {
        // Periods of no time at all: every use starts a new one.
        let pool = BufferPool::remembering(Duration::ZERO);
        let large = 2 * KEPT_BYTES;
        let burst: Vec<Bytes> = (0..3).map(|_| pool.bytes(pool.take(large), None)).collect();
        drop(burst);
        // Each return counted against the most of the period before it: the
        // last found only one buffer's worth remembered beside the floor.
        assert_eq!(pool.kept(), 1);
        let step = pool.take(large);
        assert_eq!(pool.kept(), 0, "the next step takes what is left");
        drop(pool.bytes(step, None));
        assert_eq!(pool.kept(), 1, "and its own payload is kept");
    }

    #[test]
    fn the_pool_keeps_no_more_buffers_than_its_count() {
        let pool = BufferPool::new();
        let lent: Vec<Bytes> = (0..KEPT_BUFFERS + 3)
            .map(|_| pool.bytes(pool.take(POOLED_FROM), None))
            .collect();
        drop(lent);
        assert_eq!(pool.kept(), KEPT_BUFFERS);
    }

    #[test]
    fn a_small_payload_goes_back_to_the_allocator_and_lets_go_of_its_hold() {
        let pool = BufferPool::new();
        let hold: Hold = Arc::new(7u8);
        let bytes = pool.bytes(pool.take(POOLED_FROM - 1), Some(Arc::clone(&hold)));
        let plain = pool.bytes(pool.take(POOLED_FROM - 1), None);
        assert_eq!(
            (bytes.len(), plain.len()),
            (POOLED_FROM - 1, POOLED_FROM - 1)
        );
        drop((bytes, plain));
        assert_eq!(pool.kept(), 0, "the pool keeps no small buffer");
        assert_eq!(
            Arc::strong_count(&hold),
            1,
            "the hold goes with the payload"
        );
        drop(pool.bytes(pool.take(POOLED_FROM), None));
        assert_eq!(pool.kept(), 1, "from POOLED_FROM on, payloads come back");
    }

    #[test]
    fn payloads_outliving_their_pool_are_freed_and_let_go_of_their_hold() {
        let pool = BufferPool::new();
        let hold: Hold = Arc::new(7u8);
        let bytes = pool.bytes(pool.take(16), Some(Arc::clone(&hold)));
        assert_eq!(Arc::strong_count(&hold), 2);
        drop(pool);
        assert_eq!(bytes.len(), 16);
        drop(bytes);
        assert_eq!(
            Arc::strong_count(&hold),
            1,
            "the hold goes with the payload"
        );
    }
}
