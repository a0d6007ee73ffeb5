//! Stamps: the words at the head of a values arena ([`crate::arena`]) that let
//! a worker read a key's current values straight from the arena, with no
//! request to the server, and know that what it read is whole.
//!
//! Each page of the arena has a stamp of four words. The stamp of the page a
//! block starts at holds:
//! - a **sequence** word, odd while the server changes the block's values or
//!   the other words, even otherwise (a sequence lock: a read that finds the
//!   same even word before and after it saw no change);
//! - the block's **id**, unique for the arena's life (0: no block starts
//!   here), so that a worker which learned where a key's values were finds
//!   out when that block was freed and the page reused;
//! - the **version** of the values the block holds while they are the key's
//!   current values, plus one, or 0 while they are not (not yet published,
//!   superseded by a copy elsewhere, or the key's no longer).
//!
//! The first page's stamp, where no block starts, says instead which shard
//! map the server has applied, in its version word ([`crate::arena::Arena::publish_map`]),
//! or none while the server is not serving.
//!
//! Only the server writes stamps, each block's stamp only through the block
//! (its owner, or its last holder as it is freed). A change that finds
//! another under way waits for it, so two never interleave. A worker maps
//! the stamps read-only and reads them with atomic loads.

use std::sync::atomic::{AtomicU64, Ordering, fence};

/// Bytes of one page's stamp.
pub const STAMP_BYTES: u64 = 32;

/// One page's stamp, as laid out in the arena.
#[repr(C)]
pub(crate) struct Stamp {
    seq: AtomicU64,
    id: AtomicU64,
    version: AtomicU64,
    _spare: AtomicU64,
}

/// What a stamp said, read whole (its sequence word even and unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Said {
    /// The id of the block starting at the page; 0 when none.
    pub id: u64,
    /// The version of its values while they are their key's current ones;
    /// `None` when they are not.
    pub version: Option<u64>,
}

impl Stamp {
    /// Runs `change` on the stamp's other words and the block's values
    /// between two steps of the sequence word, so that no reader takes what
    /// it saw meanwhile for whole. A change already under way (another
    /// thread's) is waited for first; one that panics still ends its step.
    pub(crate) fn changing<T>(&self, change: impl FnOnce(&Self) -> T) -> T {
        let seq = loop {
            let seq = self.seq.load(Ordering::Relaxed);
            let odd = Ordering::Relaxed;
            if seq & 1 == 0 && self.seq.compare_exchange(seq, seq + 1, odd, odd).is_ok() {
                break seq;
            }
            std::hint::spin_loop();
        };
        // The odd word is seen before any of the changes.
        fence(Ordering::Release);
        let _end = Ended(&self.seq, seq + 2);
        change(self)
    }

    /// Sets the id of the block starting here (inside [`Stamp::changing`]).
    pub(crate) fn set_id(&self, id: u64) {
        self.id.store(id, Ordering::Relaxed);
    }

    /// Sets the version its values are current at, or that they are not
    /// (inside [`Stamp::changing`]).
    pub(crate) fn set_version(&self, version: Option<u64>) {
        let word = version.map_or(0, |v| v.saturating_add(1));
        self.version.store(word, Ordering::Relaxed);
    }

    /// The sequence word as a read starts: `None` while a change is under way.
    pub(crate) fn begin(&self) -> Option<(u64, Said)> {
        let seq = self.seq.load(Ordering::Acquire);
        let said = Said {
            id: self.id.load(Ordering::Relaxed),
            version: self.version.load(Ordering::Relaxed).checked_sub(1),
        };
        (seq & 1 == 0).then_some((seq, said))
    }

    /// Whether nothing changed since [`Stamp::begin`] returned `seq`: what was
    /// read in between (the words and the block's values) is whole.
    pub(crate) fn unchanged_since(&self, seq: u64) -> bool {
        // The reads in between come before this load.
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == seq
    }

    /// The stamp, read whole; `None` while a change is under way.
    pub(crate) fn read(&self) -> Option<Said> {
        let (seq, said) = self.begin()?;
        self.unchanged_since(seq).then_some(said)
    }
}

/// The stamp of page `page` in a mapping that starts at `base` with stamps.
///
/// # Safety
/// The mapping holds the stamps of at least `page + 1` pages from `base`
/// (aligned: it starts on a page) and outlives `'a`; they are only touched
/// through atomics.
#[allow(unsafe_code)]
pub(crate) unsafe fn stamp_at<'a>(base: *const u8, page: u64) -> &'a Stamp {
    // SAFETY: the caller's promise.
    unsafe { &*base.add((page * STAMP_BYTES) as usize).cast::<Stamp>() }
}

/// Ends a change: sets the sequence word even again as it drops.
struct Ended<'a>(&'a AtomicU64, u64);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

/// Pages of stamps at the head of an arena of `pages` data pages. A page
/// holds 128 stamps, and the stamps cover every page of the file, their own
/// included: 127 data pages and their stamps' share of a page make 128.
pub(crate) fn stamp_pages(pages: u64) -> u64 {
    pages.div_ceil(crate::arena::PAGE / STAMP_BYTES - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            seq: AtomicU64::new(0),
            id: AtomicU64::new(0),
            version: AtomicU64::new(0),
            _spare: AtomicU64::new(0),
        }
    }

    #[test]
    fn a_read_during_a_change_is_refused_and_one_after_it_sees_it_whole() {
        let stamp = stamp();
        assert_eq!(
            stamp.read(),
            Some(Said {
                id: 0,
                version: None
            })
        );
        let seen_inside = stamp.changing(|s| {
            s.set_id(7);
            s.set_version(Some(0));
            s.read()
        });
        assert_eq!(seen_inside, None, "odd while changing");
        let said = Said {
            id: 7,
            version: Some(0),
        };
        assert_eq!(stamp.read(), Some(said), "version 0 is a version");
        stamp.changing(|s| s.set_version(None));
        assert_eq!(
            stamp.read(),
            Some(Said {
                version: None,
                ..said
            })
        );
    }

    #[test]
    fn a_change_between_begin_and_end_is_noticed() {
        let stamp = stamp();
        let (seq, _) = stamp.begin().unwrap();
        stamp.changing(|s| s.set_version(Some(1)));
        assert!(!stamp.unchanged_since(seq));
        let (seq, said) = stamp.begin().unwrap();
        assert_eq!(said.version, Some(1));
        assert!(stamp.unchanged_since(seq));
    }

    /// Two changes never interleave: each waits for the other's to end (a
    /// read-then-write of the version word inside them loses no count), and
    /// one that panics still ends.
    #[test]
    fn changes_take_turns_and_a_panicking_one_still_ends() {
        let stamp = std::sync::Arc::new(stamp());
        let count = |stamp: &Stamp| {
            for _ in 0..20_000 {
                stamp.changing(|s| {
                    let now = s.version.load(Ordering::Relaxed);
                    std::hint::spin_loop();
                    s.version.store(now + 1, Ordering::Relaxed);
                });
            }
        };
        let other = std::thread::spawn({
            let stamp = std::sync::Arc::clone(&stamp);
            move || count(&stamp)
        });
        count(&stamp);
        other.join().unwrap();
        assert_eq!(stamp.read().and_then(|said| said.version), Some(40_000 - 1));

        let panicked = std::panic::catch_unwind(|| stamp.changing(|_| panic!("a change fails")));
        assert!(panicked.is_err());
        assert!(stamp.read().is_some(), "the sequence word is even again");
    }

    #[test]
    fn the_stamp_pages_cover_every_page() {
        assert_eq!(std::mem::size_of::<Stamp>() as u64, STAMP_BYTES);
        for pages in [1, 126, 127, 128, 254, 255, 1 << 20, (1 << 20) + 3] {
            let stamps = stamp_pages(pages);
            let file_pages = pages + stamps;
            assert!(
                stamps * crate::arena::PAGE / STAMP_BYTES >= file_pages,
                "{pages}"
            );
            assert!(
                stamps == 1 || (stamps - 1) * 128 < file_pages,
                "{pages}: no more than needed"
            );
        }
    }
}
