//! [`MemoryBudget`]: the bytes a server may hold, and [`Charge`], one holder's
//! share of them.
//!
//! Every allocation a client can cause is charged before it is made: a key's
//! values, optimizer state, BSP accumulator and pull snapshot when it is
//! registered (not when it is first touched), the chunks a stream buffers as they
//! arrive, and each pull while its answer is alive. A charge that would pass the
//! limit is refused with [`Error::OverBudget`] and changes nothing; a [`Charge`]
//! gives its bytes back when dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::Stream;

use crate::error::{Error, Result};

/// Share of physical memory a server may hold when no budget is given.
const DEFAULT_SHARE_OF_MEMORY: f64 = 0.75;

/// The budget when physical memory cannot be read.
const FALLBACK_BUDGET: usize = 16 << 30;

/// The default budget: three quarters of physical memory (16 GiB where it cannot
/// be read).
pub fn default_budget() -> usize {
    physical_memory().map_or(FALLBACK_BUDGET, |total| {
        (total as f64 * DEFAULT_SHARE_OF_MEMORY) as usize
    })
}

/// Physical memory in bytes, from `/proc/meminfo`.
fn physical_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The bytes one server may hold, and how many it holds now.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    held: AtomicUsize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes, none of them held.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: AtomicUsize::new(0),
        })
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `bytes` for `what` (a phrase such as "registering 3 keys").
    ///
    /// # Errors
    /// `OverBudget` when the budget cannot hold them; nothing is taken then.
    pub fn charge(self: &Arc<Self>, bytes: usize, what: impl FnOnce() -> String) -> Result<Charge> {
        self.take(bytes, what)?;
        Ok(Charge {
            budget: Arc::clone(self),
            bytes,
        })
    }

    fn take(&self, bytes: usize, what: impl FnOnce() -> String) -> Result<()> {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&after| after <= self.limit)
            });
        match taken {
            Ok(_) => Ok(()),
            Err(held) => Err(Error::OverBudget {
                what: what(),
                bytes,
                held,
                limit: self.limit,
            }),
        }
    }
}

/// Bytes taken from a [`MemoryBudget`], given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl Charge {
    /// Takes `bytes` more for the same holder.
    ///
    /// # Errors
    /// `OverBudget`, and this charge keeps what it had.
    pub fn grow(&mut self, bytes: usize, what: impl FnOnce() -> String) -> Result<()> {
        self.budget.take(bytes, what)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Moves up to `bytes` of this charge into a charge of their own, taking
    /// nothing more from the budget.
    pub fn split_off(&mut self, bytes: usize) -> Charge {
        let moved = bytes.min(self.bytes);
        self.bytes -= moved;
        Charge {
            budget: Arc::clone(&self.budget),
            bytes: moved,
        }
    }

    /// Takes over `other`'s bytes (a charge on the same budget), taking
    /// nothing more from the budget.
    pub fn merge(&mut self, mut other: Charge) {
        debug_assert!(Arc::ptr_eq(&self.budget, &other.budget));
        self.bytes += std::mem::take(&mut other.bytes);
    }

    /// The bytes this charge holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A response stream (or the iterator of its messages) that holds its
/// [`Charge`] until it is dropped: a pull's chunks share the snapshot they were
/// cut from, which a newer version may have replaced in the key, so it stays
/// charged until the last chunk is gone.
#[derive(Debug)]
pub struct Charged<S> {
    inner: S,
    _charge: Charge,
}

impl<S> Charged<S> {
    /// `inner`, holding `charge` for as long as it lives.
    pub fn new(inner: S, charge: Charge) -> Self {
        Self {
            inner,
            _charge: charge,
        }
    }
}

impl<S: Stream + Unpin> Stream for Charged<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<I: Iterator> Iterator for Charged<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        self.inner.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_given_back_when_dropped() {
        let budget = MemoryBudget::new(100);
        let first = budget.charge(60, || "first".into()).unwrap();
        assert_eq!(budget.held(), 60);
        let refused = budget.charge(41, || "second".into()).unwrap_err();
        assert!(
            matches!(refused, Error::OverBudget { bytes: 41, held: 60, limit: 100, ref what } if what == "second")
        );
        assert_eq!(budget.held(), 60, "a refused charge takes nothing");
        drop(first);
        assert_eq!(budget.held(), 0);
        let _second = budget.charge(100, || "second".into()).unwrap();
        assert_eq!(budget.held(), 100);
    }

    #[test]
    fn a_charge_grows_until_the_limit_and_keeps_what_it_had() {
        let budget = MemoryBudget::new(10);
        let mut charge = budget.charge(4, || "stream".into()).unwrap();
        charge.grow(6, || "stream".into()).unwrap();
        assert!(charge.grow(1, || "stream".into()).is_err());
        assert_eq!((charge.bytes(), budget.held()), (10, 10));
        drop(charge);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_split_charge_gives_back_each_part_on_its_own() {
        let budget = MemoryBudget::new(10);
        let mut whole = budget.charge(10, || "keys".into()).unwrap();
        let part = whole.split_off(4);
        assert_eq!((whole.bytes(), part.bytes(), budget.held()), (6, 4, 10));
        drop(whole);
        assert_eq!(budget.held(), 4);
        drop(part);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn an_overflowing_charge_is_refused() {
        let budget = MemoryBudget::new(usize::MAX);
        let _held = budget.charge(10, || "some".into()).unwrap();
        assert!(budget.charge(usize::MAX, || "all".into()).is_err());
        assert_eq!(budget.held(), 10);
    }

    #[test]
    fn the_default_is_a_share_of_this_machine() {
        let budget = default_budget();
        assert!(budget > 0);
        if let Some(total) = physical_memory() {
            assert!(budget < total);
        }
    }
}
