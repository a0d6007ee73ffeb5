//! [`Values`]: a key's `f32` values, shared copy-on-write with the pulls that are
//! sending them. A pull in `f32` on a little-endian machine sends the stored
//! values themselves, with no snapshot copy; an update copies them only while a
//! pull still holds the version it replaces.
//!
//! The values of an `f32` key of 2 KiB or more (`ARENA_FROM_BYTES`) may live
//! in the server's values arena ([`ps_shm::arena`]), which workers on its host
//! map read-only: a pull over shared memory then says where they are (and
//! for 64 KiB or more sends them so, the worker copying them once). A copy
//! made for an update goes into the same arena when it has room, and onto
//! the heap when not (for good: later copies follow). While they are the key's current
//! values, their block's stamp says at which version ([`Values::publish`]),
//! so that a worker may read them again with no request; an update in place
//! is bracketed by the stamp, and values superseded (copied for an update
//! while a pull holds them, replaced, or dropped with their key) say so.

use std::sync::Arc;

use bytes::Bytes;
use ps_proto::codec::DType;
use ps_proto::ids::Version;
use ps_shm::arena::{ARENA_FROM_BYTES, Arena, Block};

/// A key's current values, cheap to share with pulls.
#[derive(Debug)]
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

    /// Runs `update` on the values in place, which makes them the key's
    /// values at `version`: copied first only when a pull still holds them
    /// (those then stop being the key's current values). In an arena, the
    /// block's stamp says the new version in the same change as the update.
    pub fn update<T>(&mut self, version: Version, update: impl FnOnce(&mut [f32]) -> T) -> T {
        if Arc::get_mut(&mut self.0).is_none() {
            self.superseded();
        }
        match Arc::make_mut(&mut self.0) {
            Held::Heap(values) => update(values),
            Held::Arena(block) => block.update(Some(version.get()), update),
        }
    }

    /// Says, for values in an arena, that they are the key's current values
    /// at `version` (workers may then read them there with no request).
    pub fn publish(&self, version: Version) {
        if let Held::Arena(block) = &*self.0 {
            block.publish(Some(version.get()));
        }
    }

    /// Says, for values in an arena, that they are no longer the key's
    /// current values (a pull may still hold them).
    fn superseded(&self) {
        if let Held::Arena(block) = &*self.0 {
            block.publish(None);
        }
    }

    /// The values as `dtype` wire bytes that share this memory, when that encoding
    /// is the memory itself (`f32` on a little-endian machine); `None` otherwise.
    pub fn share_as(&self, dtype: DType) -> Option<Bytes> {
        let same_bytes = dtype == DType::F32 && cfg!(target_endian = "little");
        same_bytes.then(|| Bytes::from_owner(LittleEndianF32(Arc::clone(&self.0))))
    }
}

impl Drop for Values {
    /// Values let go of are no longer their key's: replaced, or the key's
    /// state dropped (a pull may still hold them, and their block).
    fn drop(&mut self) {
        self.superseded();
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
    use ps_shm::arena::ArenaView;

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
        values.update(Version(1), |v| v[0] = 2.0);
        assert_eq!(
            values.as_slice().as_ptr(),
            alone,
            "no pull held them: no copy"
        );

        let pulled = values.share_as(DType::F32).unwrap();
        values.update(Version(1), |v| v[0] = 3.0);
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
        values.update(Version(1), |v| v[0] = 5.0);
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

    /// What a worker reading `values`' block directly would get: their
    /// version, when they are current at `min_version` or later.
    fn read_directly(arena: &Arena, values: &Values, min_version: u64) -> Option<u64> {
        let file = arena.file().try_clone_to_owned().unwrap();
        let view = ArenaView::open(file, arena.bytes(), true).unwrap();
        let bytes = values.share_as(DType::F32).unwrap();
        let key = ps_proto::key::ParamKey::new("w", 0);
        if let Some(spot) = arena.spot_of(&bytes) {
            view.remember(&key, spot);
        }
        drop(bytes);
        let spot = view.spot_of(&key).unwrap();
        view.read_current(spot, (min_version, 0), &mut vec![0u8; spot.len as usize])
    }

    #[test]
    fn values_in_the_arena_are_current_until_superseded_replaced_or_dropped() {
        let arena = Arena::create(8 << 20).unwrap();
        arena.publish_map(Some(0));
        let len = ARENA_FROM_BYTES / 4;
        let mut values = Values::new(vec![1.0; len]).placed_in(&arena);
        assert_eq!(read_directly(&arena, &values, 0), None, "not published yet");
        values.publish(Version(2));
        assert_eq!(read_directly(&arena, &values, 2), Some(2));

        // An update under a pull copies: the pulled block is no longer current.
        let pulled = values.share_as(DType::F32).unwrap();
        let old = Values(Arc::clone(&values.0));
        values.update(Version(1), |v| v[0] = 5.0);
        assert_eq!(read_directly(&arena, &old, 0), None, "superseded");
        values.publish(Version(3));
        assert_eq!(read_directly(&arena, &values, 3), Some(3));
        drop((pulled, old));

        // Dropped while a pull holds them: not current either.
        let held = values.share_as(DType::F32).unwrap();
        let view = Values(Arc::clone(&values.0));
        drop(values);
        assert_eq!(read_directly(&arena, &view, 0), None, "dropped");
        drop((held, view));
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
        values.update(Version(1), |v| v[1] = 4.0);
        assert!(!values.in_arena(), "the copy went to the heap");
        assert_eq!(values.as_slice()[..2], [2.0, 4.0]);
    }
}
