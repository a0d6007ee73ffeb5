//! [`Arena`]: a server's memory file for the values of its keys of
//! [`ARENA_FROM_BYTES`] or more,
//! which every worker holding a shared-memory session with it maps
//! read-only ([`ArenaView`]). A pull's answer then names where large values
//! are ([`LEND_FROM_BYTES`]) instead of carrying them, and the worker copies
//! them once, from the arena straight into its own memory: one copy across
//! the cores, where a copy into the ring and another out of it made two.
//!
//! The server allocates a key's values in the arena ([`Arena::block`]) and
//! owns them there as [`Block`]s; copy-on-write stays as it was (a block a
//! pull still holds is copied into a new block before an update). The file is
//! sealed at its size, and against any write but through the mapping the
//! server made before sealing it (`F_SEAL_FUTURE_WRITE`); a worker gets a
//! file descriptor opened read-only. So nobody but the server writes the
//! arena's bytes, and the server may hold Rust references to its own blocks.
//!
//! A worker can read every value of this server's keys in the arena through
//! its view, as it could by pulling them. The file is sized by the server
//! (twice its memory budget: `ps_server`'s `shared_memory::arena`) and made
//! sparse: a page takes memory only once a block that holds it is written. A freed block's pages stay made, for the next
//! block placed there.
//!
//! The file starts with a [stamp](crate::stamp) per page. A block's stamp
//! says which block it is and, while its values are their key's current
//! ones, their version ([`Block::publish`]); every change to the values goes
//! through [`Block::update`], which the stamp's sequence word brackets. A
//! worker that learned where a key's values are (from a pull's answer) then
//! reads them again with no request ([`ArenaView::read_current`]): when the
//! block is still that key's and current, at the version it needs, and
//! nothing changed while it copied.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};
use offset_allocator::{Allocation, Allocator};
use ps_proto::key::ParamKey;
use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};

use crate::copy;
use crate::stamp::{STAMP_BYTES, Stamp, stamp_at, stamp_pages};

/// The arena's unit of allocation: one page.
pub const PAGE: u64 = 4096;

/// Keys of at least this many bytes of values are kept in the arena, where
/// a worker reads them again with no request ([`ArenaView::read_current`]);
/// smaller ones stay on the heap. A block takes whole pages, so up to a page
/// less a few bytes is left unused: half of a key of this size's page. (A
/// 4 KiB key split over two servers is two parts of this size.)
pub const ARENA_FROM_BYTES: usize = 2 << 10;

/// An answer's payloads of at least this many bytes that lie in the arena
/// go by their offset, and the worker copies them from there
/// ([`crate::lending`]); smaller ones are copied through the ring, where a
/// second copy of a few kilobytes costs less than keeping them lent.
pub const LEND_FROM_BYTES: usize = 64 << 10;

/// The most data pages an arena addresses (its allocator counts in `u32`):
/// 16 TiB.
const MOST_PAGES: u64 = u32::MAX as u64;

/// The seals every arena carries: its size is fixed, nothing but the
/// server's own mapping writes it, and so are its seals.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::FUTURE_WRITE)
    .union(SealFlags::SEAL);

/// The seals a worker insists on before it maps an arena: its size cannot
/// change under the mapping, so no read can fault.
const SIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW);

/// A server's arena, mapped read-write.
pub struct Arena {
    map: MmapRaw,
    /// Opened read-only, to hand to workers.
    read_only: OwnedFd,
    /// The data pages, counted from the first after the stamps.
    pages: Mutex<Allocator>,
    /// Pages of stamps before the first data page.
    stamp_pages: u64,
    /// The id of the last block made.
    last_id: AtomicU64,
    /// Set once the server stops serving ([`Arena::close`]).
    closed: AtomicBool,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("bytes", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl Arena {
    /// A new arena of `bytes` for values (rounded up to whole pages, and to
    /// at most 16 TiB) after its stamps, none of its pages made yet.
    ///
    /// # Errors
    /// The system refused the memfd, its size, its mapping or its seals.
    pub fn create(bytes: u64) -> io::Result<Arc<Self>> {
        let pages = bytes.div_ceil(PAGE).clamp(1, MOST_PAGES);
        let stamp_pages = stamp_pages(pages);
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let file = rustix::fs::memfd_create("candle-ps-values", flags)?;
        rustix::fs::ftruncate(&file, (stamp_pages + pages) * PAGE)?;
        // Mapped before it is sealed against writes: this mapping stays the
        // only writable one there can ever be.
        let map = MmapOptions::new().map_raw(&file)?;
        rustix::fs::fcntl_add_seals(&file, SEALS)?;
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
        let read_only = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Arc::new(Self {
            map,
            read_only,
            pages: Mutex::new(Allocator::new(pages as u32)),
            stamp_pages,
            last_id: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }))
    }

    /// The arena's file, opened read-only, to hand to a worker.
    pub fn file(&self) -> BorrowedFd<'_> {
        self.read_only.as_fd()
    }

    /// The arena's size in bytes, its stamps included.
    pub fn bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// A block holding a copy of `values`; `None` when the arena has no room
    /// for it (the caller keeps them on its heap instead).
    pub fn block(self: &Arc<Self>, values: &[f32]) -> Option<Block> {
        let bytes = std::mem::size_of_val(values) as u64;
        let pages = u32::try_from(bytes.div_ceil(PAGE).max(1)).ok()?;
        let allocation = self.lock().allocate(pages)?;
        let mut block = Block {
            arena: Arc::clone(self),
            allocation,
            len: values.len(),
        };
        let id = self.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        block.changing(|stamp, slice| {
            stamp.set_id(id);
            stamp.set_version(None);
            slice.copy_from_slice(values);
        });
        Some(block)
    }

    /// Says which shard-map version the server has applied (0: it follows
    /// no scheduler), or (`None`) that it is not serving, in the stamp of
    /// the arena's first page (a page of stamps, where no block starts).
    /// Until the first call, and after a `None`, workers read nothing with
    /// no request; with a version, only reads routed by it, or by none
    /// ([`ArenaView::read_current`]).
    pub fn publish_map(&self, version: Option<u64>) {
        self.stamp(0).changing(|stamp| {
            let closed = self.closed.load(Ordering::SeqCst);
            stamp.set_version(version.filter(|_| !closed));
        });
    }

    /// Says, for good, that the server is not serving: from now on workers
    /// read nothing with no request (their requests are refused while the
    /// server shuts down, and so are these reads).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.publish_map(None);
    }

    /// The stamp of the page at byte `offset`.
    #[allow(unsafe_code)]
    fn stamp(&self, offset: u64) -> &Stamp {
        let page = offset / PAGE;
        assert!(
            page < self.stamp_pages * (PAGE / STAMP_BYTES),
            "a page the stamps cover"
        );
        // SAFETY: the stamps fill the first `stamp_pages` pages of the
        // mapping, which lives as long as `self`; the page's stamp lies there
        // (checked above).
        unsafe { stamp_at(self.map.as_ptr(), page) }
    }

    /// Where `bytes` lie as the values of a block from its start, and which
    /// block, while it holds them (the caller keeps `bytes`, and so the
    /// block, alive): what a pull's answer tells the worker
    /// ([`ArenaView::remember`]). `None` when they do not lie in the arena
    /// from a block's start, or its stamp is changing.
    pub fn spot_of(&self, bytes: &[u8]) -> Option<Spot> {
        let data_from = self.stamp_pages * PAGE;
        let offset = self
            .offset_of(bytes)
            .filter(|&at| at.is_multiple_of(PAGE) && at >= data_from)?;
        // A stamp names a block only on its first page, and only while it
        // lives (a freed block's is cleared).
        let said = self.stamp(offset).read().filter(|said| said.id != 0)?;
        Some(Spot {
            offset,
            len: bytes.len() as u64,
            id: said.id,
        })
    }

    /// Where `bytes` lie in the arena, when they lie wholly in it.
    pub fn offset_of(&self, bytes: &[u8]) -> Option<u64> {
        let start = self.map.as_ptr() as usize;
        let at = (bytes.as_ptr() as usize).checked_sub(start)?;
        let fits = at.checked_add(bytes.len())? <= self.map.len();
        fits.then_some(at as u64)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Allocator> {
        self.pages.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `f32` values in an arena, owned by this process alone.
pub struct Block {
    arena: Arc<Arena>,
    allocation: Allocation,
    len: usize,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("offset", &self.offset())
            .field("len", &self.len)
            .finish()
    }
}

impl Block {
    /// The block's byte offset in its arena.
    pub fn offset(&self) -> u64 {
        (self.arena.stamp_pages + u64::from(self.allocation.offset)) * PAGE
    }

    /// A copy of the block in a new block of the same arena; `None` when
    /// the arena has no room.
    pub fn try_clone(&self) -> Option<Self> {
        self.arena.block(self.as_slice())
    }

    /// The values.
    #[allow(unsafe_code)]
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: the allocation covers `len` values from `offset()` (made so
        // by `Arena::block`) inside the mapping, which lives as long as the
        // arena this block holds. Pages are aligned, so the `f32`s are. No
        // other block overlaps it while it lives (it is freed only on drop),
        // and no other process can write the file: it is sealed against any
        // write but through this process's mapping, and handed out read-only.
        unsafe {
            let at = self.arena.map.as_ptr().add(self.offset() as usize);
            std::slice::from_raw_parts(at.cast::<f32>(), self.len)
        }
    }

    /// Runs `update` on the values in place and says in the same change of
    /// the block's stamp that they are current at `version` (or, `None`,
    /// not), so that no reader sees the new values under the old version.
    pub fn update<T>(&mut self, version: Option<u64>, update: impl FnOnce(&mut [f32]) -> T) -> T {
        self.changing(|stamp, slice| {
            let updated = update(slice);
            stamp.set_version(version);
            updated
        })
    }

    /// Says in the block's stamp that its values are their key's current
    /// values at `version`, or (`None`) that they are not. Called by the
    /// block's owner while it holds the block.
    pub fn publish(&self, version: Option<u64>) {
        self.arena
            .stamp(self.offset())
            .changing(|stamp| stamp.set_version(version));
    }

    /// Runs `change` on the block's stamp and values between two steps of
    /// the stamp's sequence word.
    #[allow(unsafe_code)]
    fn changing<T>(&mut self, change: impl FnOnce(&Stamp, &mut [f32]) -> T) -> T {
        let offset = self.offset();
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference
        // to the block's bytes in this process. The stamp is another page's.
        let slice = unsafe {
            let at = self.arena.map.as_mut_ptr().add(offset as usize);
            std::slice::from_raw_parts_mut(at.cast::<f32>(), self.len)
        };
        self.arena
            .stamp(offset)
            .changing(|stamp| change(stamp, slice))
    }
}

/// A block's values as their bytes in memory (little-endian `f32` on
/// x86-64), sharing it and holding the block while they live.
pub fn shared_bytes(block: Arc<Block>) -> bytes::Bytes {
    bytes::Bytes::from_owner(BlockBytes(block))
}

struct BlockBytes(Arc<Block>);

impl AsRef<[u8]> for BlockBytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(self.0.as_slice())
    }
}

impl Drop for Block {
    /// Clears the block's stamp (no reader takes the page for it any more),
    /// then frees its pages.
    fn drop(&mut self) {
        self.arena.stamp(self.offset()).changing(|stamp| {
            stamp.set_id(0);
            stamp.set_version(None);
        });
        self.arena.lock().free(self.allocation);
    }
}

/// A server's arena as a worker maps it: read-only.
#[derive(Debug)]
pub struct ArenaView {
    map: MmapRaw,
    /// Whether the server said its arena starts with stamps.
    stamped: bool,
    /// Where pulls found each key's values.
    spots: Mutex<HashMap<ParamKey, Spot>>,
}

/// Where a key's values were found in an arena: a block, by its first byte
/// and its id, and their length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spot {
    /// The block's first byte.
    pub offset: u64,
    /// The values' length in bytes.
    pub len: u64,
    /// The block's id, as its stamp said.
    pub id: u64,
}

/// Why a received file is not an arena this process maps.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// Reading the file's seals or size, or mapping it, failed.
    #[error("the values' shared-memory file cannot be used: {0}")]
    Io(#[from] io::Error),
    /// The file's size could still change under this process.
    #[error("the values' shared-memory file is not sealed against resizing (seals {0:?})")]
    NotSealed(SealFlags),
    /// The file is not the size the server announced.
    #[error("the values' shared-memory file holds {actual} bytes where {expected} were announced")]
    WrongSize {
        /// The size announced.
        expected: u64,
        /// The file's size.
        actual: u64,
    },
}

impl ArenaView {
    /// The arena in `file`, received from the server, which announced
    /// `bytes` bytes, and whether it starts with stamps; mapped read-only,
    /// nothing of it read or made now.
    ///
    /// # Errors
    /// [`ArenaError`]: the file is not sealed, not that size, or not mappable.
    pub fn open(file: OwnedFd, bytes: u64, stamped: bool) -> Result<Self, ArenaError> {
        let seals = rustix::fs::fcntl_get_seals(&file).map_err(io::Error::from)?;
        if !seals.contains(SIZE_SEALS) {
            return Err(ArenaError::NotSealed(seals));
        }
        let actual = rustix::fs::fstat(&file).map_err(io::Error::from)?.st_size as u64;
        if actual != bytes || bytes == 0 {
            return Err(ArenaError::WrongSize {
                expected: bytes,
                actual,
            });
        }
        let map = MmapOptions::new().map_raw_read_only(&file)?;
        Ok(Self {
            map,
            stamped,
            spots: Mutex::new(HashMap::new()),
        })
    }

    /// Copies `into.len()` bytes from `offset` into `into`.
    ///
    /// # Errors
    /// The span runs past the arena's end (nothing is copied).
    #[allow(unsafe_code)]
    pub fn copy_out(&self, offset: u64, into: &mut [u8]) -> Result<(), String> {
        if !self.holds(offset, into.len()) {
            return Err(format!(
                "{} bytes at offset {offset} run past the end of a values arena of {} bytes",
                into.len(),
                self.map.len()
            ));
        }
        // SAFETY: the span lies in the mapping (checked above), which stays
        // mapped while `self` lives and cannot shrink (sealed, checked by
        // `open`); only a raw pointer reads it, into this process's own buffer.
        // The server leaves these bytes unchanged until this worker says it
        // is done with them; one that breaks that changes only which bytes
        // arrive.
        unsafe { self.copy_unchecked(offset, into) };
        Ok(())
    }

    /// Copies the values at `spot` into `into` (their length) when the
    /// block's stamp says they are still that block's, current, at
    /// `min_version` or later, and nothing changed them while they were
    /// copied, and the server is serving by shard map `routed_by` (or the
    /// read is routed by none, 0, as a request made without a scheduler):
    /// then their version. `None` otherwise (what `into` holds is then
    /// unspecified), and for a view of an arena without stamps.
    #[allow(unsafe_code)]
    pub fn read_current(
        &self,
        spot: Spot,
        (min_version, routed_by): (u64, u64),
        into: &mut [u8],
    ) -> Option<u64> {
        if !self.map_admits(routed_by) {
            return None;
        }
        let stamp = self.stamp(spot.offset)?;
        let fits = spot.len == into.len() as u64 && self.holds(spot.offset, into.len());
        let (seq, said) = stamp.begin().filter(|_| fits)?;
        let same_block = said.id == spot.id && said.id != 0;
        let version = said.version.filter(|&v| same_block && v >= min_version)?;
        // SAFETY: the span lies in the mapping (checked above). The server
        // may change these bytes while they are copied (it writes through
        // its own mapping, in another process); the stamp then tells, and
        // the copy is thrown away.
        unsafe { self.copy_unchecked(spot.offset, into) };
        stamp.unchanged_since(seq).then_some(version)
    }

    /// Remembers that a pull's answer found `key`'s values at `spot`, as
    /// the server said ([`Arena::spot_of`]). Nothing is remembered from an
    /// arena without stamps, for a block with no id, or for a spot that
    /// does not start a page of the mapping and lie in it.
    pub fn remember(&self, key: &ParamKey, spot: Spot) {
        let fits = usize::try_from(spot.len).is_ok_and(|len| self.holds(spot.offset, len));
        let starts_a_page = spot.offset.is_multiple_of(PAGE);
        if spot.id == 0 || !fits || !starts_a_page || self.stamp(spot.offset).is_none() {
            return;
        }
        self.lock_spots().insert(key.clone(), spot);
    }

    /// Whether the server is serving ([`Arena::publish_map`]) and a read
    /// routed by shard map `routed_by` is as a request it admits at once:
    /// routed by no map (0), or by the map it has applied. (A request
    /// routed by a newer map waits for the server to catch up, and one by an
    /// older map is refused: such reads are asked for.)
    fn map_admits(&self, routed_by: u64) -> bool {
        let applied = self
            .stamp(0)
            .and_then(Stamp::read)
            .and_then(|said| said.version);
        applied.is_some_and(|applied| routed_by == 0 || routed_by == applied)
    }

    /// Where `key`'s values were last found, if anywhere.
    pub fn spot_of(&self, key: &ParamKey) -> Option<Spot> {
        self.lock_spots().get(key).copied()
    }

    /// The stamp of the page at byte `offset`, when the arena has stamps and
    /// they cover it.
    #[allow(unsafe_code)]
    fn stamp(&self, offset: u64) -> Option<&Stamp> {
        let page = offset / PAGE;
        let at = page.checked_mul(STAMP_BYTES)?;
        let covered = self.stamped && at < stamp_bytes_of(self.map.len() as u64);
        // SAFETY: the stamp lies in the mapping (its first pages hold the
        // stamps, checked above), which lives as long as `self`.
        covered.then(|| unsafe { stamp_at(self.map.as_ptr(), page) })
    }

    /// Whether `len` bytes from `offset` lie in the mapping.
    fn holds(&self, offset: u64, len: usize) -> bool {
        offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.map.len() as u64)
    }

    /// Copies `into.len()` bytes from `offset` into `into`.
    ///
    /// # Safety
    /// The span lies in the mapping.
    #[allow(unsafe_code)]
    unsafe fn copy_unchecked(&self, offset: u64, into: &mut [u8]) {
        // SAFETY: the caller's promise; the mapping cannot shrink (sealed,
        // checked by `open`), and `into` is this process's own buffer.
        unsafe {
            let from = self.map.as_ptr().add(offset as usize);
            match into.len() >= copy::stream_from_bytes() {
                true => copy::copy_streaming(from, into.as_mut_ptr(), into.len()),
                false => copy::copy(from, into.as_mut_ptr(), into.len()),
            }
        }
    }

    fn lock_spots(&self) -> std::sync::MutexGuard<'_, HashMap<ParamKey, Spot>> {
        self.spots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Bytes of stamps at the head of an arena file of `bytes` bytes: one stamp
/// for every page of the file, in as many whole pages as that takes.
fn stamp_bytes_of(bytes: u64) -> u64 {
    let stamps = bytes / PAGE;
    (stamps * STAMP_BYTES).div_ceil(PAGE) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view_of(arena: &Arena) -> ArenaView {
        let file = arena.file().try_clone_to_owned().unwrap();
        ArenaView::open(file, arena.bytes(), true).unwrap()
    }

    #[test]
    fn a_block_is_read_through_a_workers_view_where_the_arena_says() {
        let arena = Arena::create(1 << 20).unwrap();
        let values: Vec<f32> = (0..3000).map(|i| i as f32 * 0.5).collect();
        let block = arena.block(&values).unwrap();
        let bytes: &[u8] = bytemuck::cast_slice(block.as_slice());
        let offset = arena.offset_of(bytes).unwrap();
        assert_eq!(offset, block.offset());
        let mut read = vec![0u8; bytes.len()];
        view_of(&arena).copy_out(offset, &mut read).unwrap();
        assert_eq!(read, bytes);
        assert_eq!(arena.offset_of(&read), None, "the heap is not the arena");
    }

    #[test]
    fn copies_on_both_sides_of_the_streaming_size_are_exact() {
        let from = copy::stream_from_bytes();
        assert!(from >= copy::STREAM_AT_LEAST_BYTES);
        let arena = Arena::create(4 * from as u64).unwrap();
        let view = view_of(&arena);
        for len in [from - 4, from, from + 4 * 1031] {
            let values: Vec<f32> = (0..len / 4).map(|i| i as f32 - 7.25).collect();
            let block = arena.block(&values).unwrap();
            let mut read = vec![0u8; len];
            view.copy_out(block.offset(), &mut read).unwrap();
            assert_eq!(
                read,
                bytemuck::cast_slice::<f32, u8>(&values),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn blocks_do_not_overlap_and_freed_room_is_used_again() {
        let arena = Arena::create(4 * PAGE).unwrap();
        let page = vec![1.0f32; (PAGE / 4) as usize];
        let blocks: Vec<_> = (0..4).map(|_| arena.block(&page).unwrap()).collect();
        let mut offsets: Vec<_> = blocks.iter().map(Block::offset).collect();
        offsets.sort_unstable();
        offsets.dedup();
        assert_eq!(offsets.len(), 4);
        assert!(arena.block(&page).is_none(), "full");
        drop(blocks);
        assert!(arena.block(&page).is_some(), "freed room is used again");
    }

    #[test]
    fn a_workers_file_cannot_write_the_arena_nor_resize_it() {
        let arena = Arena::create(1 << 20).unwrap();
        let file = arena.file().try_clone_to_owned().unwrap();
        assert!(rustix::io::write(&file, &[1, 2, 3]).is_err(), "read-only");
        assert!(rustix::fs::ftruncate(&file, 0).is_err(), "sealed");
        // Opened again for writing, the file still refuses writes and
        // writable shared mappings.
        let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
        if let Ok(again) = rustix::fs::open(path, OFlags::RDWR, Mode::empty()) {
            assert!(
                rustix::io::write(&again, &[1]).is_err(),
                "sealed for writes"
            );
            assert!(
                MmapOptions::new().map_raw(&again).is_err(),
                "no writable map"
            );
        }
    }

    fn key(name: &str) -> ParamKey {
        ParamKey::new(name, 0)
    }

    /// An arena of `bytes` whose server serves with no scheduler.
    fn serving(bytes: u64) -> Arc<Arena> {
        let arena = Arena::create(bytes).unwrap();
        arena.publish_map(Some(0));
        arena
    }

    /// Learns where `block` lies, as a pull's answer would tell the worker.
    fn learned(view: &ArenaView, name: &str, block: &Block) -> Spot {
        let spot = block.arena.spot_of(bytemuck::cast_slice(block.as_slice()));
        view.remember(&key(name), spot.expect("a block's values start it"));
        view.spot_of(&key(name)).expect("remembered")
    }

    #[test]
    fn current_values_are_read_again_at_their_version_and_no_others() {
        let arena = serving(1 << 20);
        let view = view_of(&arena);
        let mut block = arena.block(&[1.0; 2048]).unwrap();
        let spot = learned(&view, "w", &block);
        let mut into = vec![0u8; spot.len as usize];
        assert_eq!(
            view.read_current(spot, (0, 0), &mut into),
            None,
            "not published yet"
        );

        block.publish(Some(3));
        assert_eq!(view.read_current(spot, (3, 0), &mut into), Some(3));
        assert_eq!(into, bytemuck::cast_slice::<f32, u8>(&[1.0; 2048]));
        assert_eq!(
            view.read_current(spot, (4, 0), &mut into),
            None,
            "older than asked"
        );

        block.update(Some(4), |values| values.fill(2.0));
        assert_eq!(view.read_current(spot, (4, 0), &mut into), Some(4));
        assert_eq!(into, bytemuck::cast_slice::<f32, u8>(&[2.0; 2048]));

        block.publish(None);
        assert_eq!(
            view.read_current(spot, (0, 0), &mut into),
            None,
            "superseded"
        );
        block.publish(Some(5));
        let mut short = vec![0u8; 8];
        assert_eq!(
            view.read_current(spot, (0, 0), &mut short),
            None,
            "not its length"
        );
        let past = Spot {
            offset: arena.bytes(),
            ..spot
        };
        assert_eq!(
            view.read_current(past, (0, 0), &mut into),
            None,
            "past the end"
        );
    }

    #[test]
    fn a_freed_block_is_not_read_for_the_one_placed_where_it_was() {
        let arena = serving(1 << 20);
        let view = view_of(&arena);
        let old = arena.block(&[1.0; 1024]).unwrap();
        old.publish(Some(1));
        let spot = learned(&view, "w", &old);
        let offset = old.offset();
        drop(old);
        let new = arena.block(&[9.0; 1024]).unwrap();
        assert_eq!(new.offset(), offset, "the same pages");
        new.publish(Some(1));
        let mut into = vec![0u8; spot.len as usize];
        assert_eq!(
            view.read_current(spot, (0, 0), &mut into),
            None,
            "another block"
        );
    }

    #[test]
    fn a_read_is_admitted_as_a_request_by_the_map_the_server_serves_at_once() {
        let arena = Arena::create(1 << 20).unwrap();
        let view = view_of(&arena);
        let block = arena.block(&[1.0; 1024]).unwrap();
        block.publish(Some(1));
        let spot = learned(&view, "w", &block);
        let read = |routed_by| view.read_current(spot, (0, routed_by), &mut [0u8; 4096]);
        assert_eq!(read(0), None, "not serving yet");
        arena.publish_map(Some(0));
        assert_eq!(read(0), Some(1), "no scheduler");
        arena.publish_map(Some(4));
        assert_eq!(read(3), None, "stale: asked, and refused");
        assert_eq!(read(4), Some(1));
        assert_eq!(read(5), None, "the server behind: asked, and waits");
        assert_eq!(read(0), Some(1), "routed by no map");
        arena.close();
        assert_eq!((read(0), read(4)), (None, None), "shutting down");
        arena.publish_map(Some(5));
        assert_eq!(read(5), None, "closed for good");
    }

    #[test]
    fn an_arena_without_stamps_is_never_read_directly() {
        let arena = Arena::create(1 << 20).unwrap();
        let file = arena.file().try_clone_to_owned().unwrap();
        let view = ArenaView::open(file, arena.bytes(), false).unwrap();
        let block = arena.block(&[1.0; 1024]).unwrap();
        block.publish(Some(1));
        let spot = arena.spot_of(bytemuck::cast_slice(block.as_slice()));
        view.remember(&key("w"), spot.expect("the server knows where it is"));
        assert_eq!(view.spot_of(&key("w")), None, "nothing remembered");
    }

    /// A worker reading while the server updates in place either gets one
    /// update's values whole, at that update's version, or nothing: never a
    /// mix of two.
    #[test]
    fn a_read_racing_updates_in_place_is_whole_or_refused() {
        let arena = serving(8 << 20);
        let view = view_of(&arena);
        let len = 256 << 10;
        let mut block = arena.block(&vec![0.0; len]).unwrap();
        block.publish(Some(0));
        let spot = learned(&view, "w", &block);
        let updates = 400u64;
        let writer = std::thread::spawn(move || {
            for version in 1..=updates {
                block.update(Some(version), |values| values.fill(version as f32));
            }
            block
        });
        let mut into = vec![0u8; spot.len as usize];
        let (mut whole, mut refused) = (0, 0);
        while !writer.is_finished() {
            match view.read_current(spot, (0, 0), &mut into) {
                Some(version) => {
                    let values: &[f32] = bytemuck::cast_slice(&into);
                    let first = values[0];
                    assert!(values.iter().all(|&v| v == first), "a torn read");
                    assert!(
                        first >= version as f32,
                        "values older than the version said"
                    );
                    whole += 1;
                }
                None => refused += 1,
            }
        }
        let block = writer.join().unwrap();
        assert_eq!(
            view.read_current(spot, (updates, 0), &mut into),
            Some(updates)
        );
        assert!(whole + refused > 0);
        drop(block);
    }

    #[test]
    fn a_view_refuses_an_unsealed_or_resized_file_and_a_span_past_its_end() {
        let bare = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&bare, PAGE).unwrap();
        assert!(matches!(
            ArenaView::open(bare, PAGE, true),
            Err(ArenaError::NotSealed(_))
        ));
        let arena = Arena::create(PAGE).unwrap();
        assert_eq!(
            arena.bytes(),
            2 * PAGE,
            "a page of values, a page of stamps"
        );
        let file = arena.file().try_clone_to_owned().unwrap();
        assert!(matches!(
            ArenaView::open(file, 3 * PAGE, true),
            Err(ArenaError::WrongSize { .. })
        ));
        let view = view_of(&arena);
        let mut into = [0u8; 16];
        assert!(view.copy_out(2 * PAGE - 8, &mut into).is_err());
        assert!(view.copy_out(u64::MAX - 4, &mut into).is_err());
        assert!(view.copy_out(2 * PAGE - 16, &mut into).is_ok());
    }
}
