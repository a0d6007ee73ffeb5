//! [`Values`]: a key's `f32` values, shared copy-on-write with the pulls that are
//! sending them. A pull in `f32` on a little-endian machine sends the stored
//! values themselves, with no snapshot copy; an update copies them only while a
//! pull still holds the version it replaces.
//!
//! A large key's values may live in the server's values arena
//! ([`ps_shm::arena`]), which workers on its host map read-only: a pull over
//! shared memory then sends where they are, and the worker copies them
//! once. A copy made for an update goes into the same arena when it has
//! room, and onto the heap when not.

use std::sync::Arc;

use bytes::Bytes;
use ps_proto::codec::DType;
use ps_shm::arena::{ARENA_FROM_BYTES, Arena, Block};

/// A key's values, cheap to share with pulls.
#[derive(Debug, Clone)]
pub struct Values(Arc<Held>);

/// Where the values are.
#[derive(Debug)]
enum Held {
    Heap(Vec<f32>),
    Arena(Block),
}

impl Held {
    fn as_slice(&self) -> &[f32] {
        match self {
            Held::Heap(values) => values,
            Held::Arena(block) => block.as_slice(),
        }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            Held::Heap(values) => values,
            Held::Arena(block) => block.as_mut_slice(),
        }
    }
}

impl Clone for Held {
    /// A copy, in the same arena when it has room.
    fn clone(&self) -> Self {
        match self {
            Held::Heap(values) => Held::Heap(values.clone()),
            Held::Arena(block) => block
                .try_clone()
                .map_or_else(|| Held::Heap(block.as_slice().to_vec()), Held::Arena),
        }
    }
}

impl From<Vec<f32>> for Values {
    fn from(values: Vec<f32>) -> Self {
        Self::new(values)
    }
}

impl PartialEq for Values {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Values {
    /// Values holding `values`, on the heap.
    pub fn new(values: Vec<f32>) -> Self {
        Self(Arc::new(Held::Heap(values)))
    }

    /// A copy of `values`: in `arena` when they are at least
    /// [`ARENA_FROM_BYTES`] and it has room, on the heap otherwise.
    pub fn copied_into(values: &[f32], arena: Option<&Arc<Arena>>) -> Self {
        let large = std::mem::size_of_val(values) >= ARENA_FROM_BYTES;
        let block = arena
            .filter(|_| large)
            .and_then(|arena| arena.block(values));
        match block {
            Some(block) => Self(Arc::new(Held::Arena(block))),
            None => Self::new(values.to_vec()),
        }
    }

    /// These values moved into `arena` when they are at least
    /// [`ARENA_FROM_BYTES`], not there yet, and it has room; as they are
    /// otherwise.
    pub fn placed_in(self, arena: &Arc<Arena>) -> Self {
        let large = std::mem::size_of_val(self.as_slice()) >= ARENA_FROM_BYTES;
        if !large || self.in_arena() {
            return self;
        }
        match arena.block(self.as_slice()) {
            Some(block) => Self(Arc::new(Held::Arena(block))),
            None => self,
        }
    }

    /// Whether the values are in an arena.
    pub fn in_arena(&self) -> bool {
        matches!(*self.0, Held::Arena(_))
    }

    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        self.0.as_slice()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// The values to update in place: copied first only when a pull still holds them.
    pub fn make_mut(&mut self) -> &mut [f32] {
        Arc::make_mut(&mut self.0).as_mut_slice()
    }

    /// The values as `dtype` wire bytes that share this memory, when that encoding
    /// is the memory itself (`f32` on a little-endian machine); `None` otherwise.
    pub fn share_as(&self, dtype: DType) -> Option<Bytes> {
        let same_bytes = dtype == DType::F32 && cfg!(target_endian = "little");
        same_bytes.then(|| Bytes::from_owner(LittleEndianF32(Arc::clone(&self.0))))
    }
}

/// Shared `f32` values seen as their little-endian bytes.
struct LittleEndianF32(Arc<Held>);

impl AsRef<[u8]> for LittleEndianF32 {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(self.0.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_wire_bytes_are_the_values_themselves() {
        let values = Values::new(vec![1.0, -2.5]);
        let wire = values.share_as(DType::F32).unwrap();
        assert_eq!(wire.as_ptr(), values.as_slice().as_ptr().cast::<u8>());
        let expected: Vec<u8> = [1.0f32, -2.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(wire.as_ref(), expected.as_slice());
        assert!(
            values.share_as(DType::F16).is_none(),
            "half precision is encoded"
        );
    }

    #[test]
    fn an_update_copies_only_while_a_pull_holds_the_values() {
        let mut values = Values::new(vec![1.0; 4]);
        let alone = values.as_slice().as_ptr();
        values.make_mut()[0] = 2.0;
        assert_eq!(
            values.as_slice().as_ptr(),
            alone,
            "no pull held them: no copy"
        );

        let pulled = values.share_as(DType::F32).unwrap();
        values.make_mut()[0] = 3.0;
        assert_ne!(
            values.as_slice().as_ptr(),
            alone,
            "a pull held them: copied"
        );
        assert_eq!(
            &pulled[..4],
            2.0f32.to_le_bytes(),
            "the pull keeps its version"
        );
        assert_eq!(values.as_slice()[0], 3.0);
    }

    #[test]
    fn large_values_go_into_the_arena_and_an_update_under_a_pull_copies_within_it() {
        let arena = Arena::create(8 << 20).unwrap();
        let len = ARENA_FROM_BYTES / 4;
        let small = Values::new(vec![1.0; len - 1]).placed_in(&arena);
        assert!(!small.in_arena(), "below the size, on the heap");
        let mut values = Values::new(vec![1.0; len]).placed_in(&arena);
        assert!(values.in_arena());
        let pulled = values.share_as(DType::F32).unwrap();
        let at = arena
            .offset_of(&pulled)
            .expect("a pull's bytes are the arena's");
        values.make_mut()[0] = 5.0;
        assert!(values.in_arena(), "copied into a new block");
        let moved = values.share_as(DType::F32).unwrap();
        assert_ne!(arena.offset_of(&moved), Some(at));
        assert_eq!(
            &pulled[..4],
            1.0f32.to_le_bytes(),
            "the pull keeps its version"
        );
        assert_eq!(values.as_slice()[0], 5.0);
    }

    #[test]
    fn a_full_arena_leaves_values_on_the_heap_and_a_copy_falls_back_to_it() {
        let len = ARENA_FROM_BYTES / 4;
        let arena = Arena::create(ARENA_FROM_BYTES as u64).unwrap();
        let mut values = Values::new(vec![2.0; len]).placed_in(&arena);
        assert!(values.in_arena());
        let other = Values::new(vec![3.0; len]).placed_in(&arena);
        assert!(!other.in_arena(), "no room");
        let _pulled = values.share_as(DType::F32).unwrap();
        values.make_mut()[1] = 4.0;
        assert!(!values.in_arena(), "the copy went to the heap");
        assert_eq!(values.as_slice()[..2], [2.0, 4.0]);
    }
}
