//! [`Region`]: a sealed `memfd` mapped shared into both processes, seen only
//! as a slice of atomic 64-bit words.
//!
//! The server creates the region ([`Region::create`]): an anonymous memory
//! file that has no name anywhere (nothing to guess, nothing to unlink), sealed
//! so that its size can never change; it hands the file descriptor to one
//! worker, which maps it ([`Region::open`], refusing a file that is not
//! sealed so). A peer that cannot shrink the file cannot make an access fault.
//!
//! The other process may write any word at any time, so this crate never
//! makes a Rust reference to the region's bytes: a control word is an atomic
//! load or store ([`Region::words`]), and a ring's data is copied in and out
//! in bulk through raw pointers ([`Region::copy_in`], [`Region::copy_out`],
//! [`Region::copy_out_marked`]) into this process's own buffers. What
//! arrives is checked before it is trusted (`ring.rs`, `message.rs`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64;

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};

use crate::copy::{self, Mark};

/// The seals every region carries: its size is fixed, and so are its seals.
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Why a received file descriptor is not a region this process maps.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Reading the file's seals or size, or mapping it, failed.
    #[error("the shared-memory file cannot be used: {0}")]
    Io(#[from] io::Error),
    /// The file's size could still change under this process.
    #[error("the shared-memory file is not sealed against resizing (seals {0:?})")]
    NotSealed(SealFlags),
    /// The file is not the size the server announced.
    #[error("the shared-memory file holds {actual} bytes where {expected} were announced")]
    WrongSize {
        /// The size announced.
        expected: u64,
        /// The file's size.
        actual: u64,
    },
}

/// One shared-memory region, mapped read-write and shared.
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    file: OwnedFd,
}

impl Region {
    /// A new region of `bytes` bytes (a whole number of words), zeroed and
    /// sealed, its pages all made and mapped.
    ///
    /// # Errors
    /// The system refused a memfd, its size, the memory for its pages, its
    /// seals or its mapping.
    pub fn create(bytes: usize) -> io::Result<Self> {
        assert!(
            bytes > 0 && bytes.is_multiple_of(8),
            "a region is whole words"
        );
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let file = rustix::fs::memfd_create("candle-ps-shm", flags)?;
        rustix::fs::ftruncate(&file, bytes as u64)?;
        // Every page is allocated now, not at its first touch: a ring's
        // first pass through its pages paid a fault on each side for each
        // page, 25-60 µs a step for a small model's first 54 steps
        // (docs/benchmarks.md, "A session's pages made before its first
        // step"). A system short of memory says so here, as an error,
        // instead of at a fault in the middle of a copy.
        rustix::fs::fallocate(&file, FallocateFlags::empty(), 0, bytes as u64)?;
        rustix::fs::fcntl_add_seals(&file, SEALS)?;
        let map = map_populated(&file)?;
        Ok(Self { map, file })
    }

    /// The region in `file`, received from the server, which announced
    /// `bytes` bytes.
    ///
    /// # Errors
    /// [`OpenError`]: the file is not sealed, not that size, or not mappable.
    pub fn open(file: OwnedFd, bytes: u64) -> Result<Self, OpenError> {
        let seals = rustix::fs::fcntl_get_seals(&file).map_err(io::Error::from)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(OpenError::NotSealed(seals));
        }
        let stat = rustix::fs::fstat(&file).map_err(io::Error::from)?;
        let actual = stat.st_size as u64;
        if actual != bytes || bytes == 0 || !bytes.is_multiple_of(8) {
            return Err(OpenError::WrongSize {
                expected: bytes,
                actual,
            });
        }
        // A file whose pages are all made (as this version's servers make
        // them) is mapped with its page tables filled; one with holes is
        // mapped as it is, so that a server cannot make this process
        // allocate the whole of a region it never wrote.
        let made = stat.st_blocks.saturating_mul(512) as u64 >= bytes;
        let map = match made {
            true => map_populated(&file)?,
            false => MmapRaw::map_raw(&file)?,
        };
        Ok(Self { map, file })
    }

    /// The region's file, to hand to the worker.
    pub fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The region's size in bytes.
    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    /// The region as words. The control words (the header, each ring's
    /// positions and waiting words) are only ever loaded and stored through
    /// this view, atomically; a ring's data words are copied in bulk instead
    /// ([`Region::copy_in`], [`Region::copy_out`]).
    #[allow(unsafe_code)]
    pub fn words(&self) -> &[AtomicU64] {
        let ptr = self.map.as_ptr();
        debug_assert_eq!(ptr.align_offset(std::mem::align_of::<AtomicU64>()), 0);
        // SAFETY: the mapping is page-aligned, `map.len()` bytes long (a whole
        // number of words, checked by `create` and `open`), and stays mapped
        // while `self` lives, which the returned slice borrows. Its size cannot
        // change (the file is sealed against shrinking), so no access faults.
        // `AtomicU64` has the size and alignment of `u64`. The slice spans the
        // data words too, which `copy_in`/`copy_out` also reach through raw
        // pointers; the ring never touches a data word both ways (it stores
        // and loads only control words through the slice), so the two views
        // never meet on one word.
        unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), self.map.len() / 8) }
    }

    /// Copies `from` into the region from word `word` on.
    ///
    /// # Panics
    /// The bytes run past the region's end (a bug in the caller, which
    /// works out every span from its own positions).
    pub fn copy_in(&self, word: usize, from: &[u8]) {
        self.copy_in_by(word, from, false);
    }

    /// [`Region::copy_in`], with stores that bypass the cache when
    /// `streaming` (then the bytes are in memory, in order with this
    /// thread's later stores, when it returns).
    ///
    /// # Panics
    /// As [`Region::copy_in`].
    #[allow(unsafe_code)]
    pub fn copy_in_by(&self, word: usize, from: &[u8], streaming: bool) {
        let at = self.byte_span(word, from.len());
        // SAFETY: `byte_span` checked that `at..at + from.len()` lies in the
        // mapping, which stays mapped (and sealed at its size) while `self`
        // lives. Only raw pointers touch the shared bytes, never a reference,
        // and `from` is this process's own memory, so the two cannot overlap.
        unsafe {
            let to = self.map.as_mut_ptr().add(at);
            match streaming {
                true => copy::copy_streaming(from.as_ptr(), to, from.len()),
                false => copy::copy(from.as_ptr(), to, from.len()),
            }
        };
    }

    /// Copies the region's bytes from word `word` on into `into`.
    ///
    /// # Panics
    /// As [`Region::copy_in`].
    #[allow(unsafe_code)]
    pub fn copy_out(&self, word: usize, into: &mut [u8]) {
        let at = self.byte_span(word, into.len());
        // SAFETY: as in `copy_in`, the other way. The ring copies out only
        // words the writer published (acquire on its `tail`), which a
        // well-behaved peer no longer writes. A peer that breaks that and
        // writes during the copy makes it, formally, a data race with another
        // process; what it can change is which bytes arrive (the copy is into
        // this process's own buffer, and any bytes are a valid `u8`), and
        // what arrives is checked before it is trusted.
        unsafe { copy::copy(self.map.as_ptr().add(at), into.as_mut_ptr(), into.len()) };
    }

    /// [`Region::copy_out`], saying whether a whole element of what was
    /// copied (read from `into`'s start) is marked by `mark`, tested in the
    /// same pass ([`crate::copy`]).
    ///
    /// # Panics
    /// As [`Region::copy_in`].
    #[allow(unsafe_code)]
    pub fn copy_out_marked(&self, word: usize, into: &mut [u8], mark: Mark) -> bool {
        let at = self.byte_span(word, into.len());
        // SAFETY: as in `copy_out`: `byte_span` checked the span, and only a
        // raw pointer reads the shared bytes; what is tested is the copy.
        unsafe { copy::copy_marked(self.map.as_ptr().add(at), into, mark) }
    }

    /// The byte offset of word `word`, checked to have `len` bytes of the
    /// region after it.
    fn byte_span(&self, word: usize, len: usize) -> usize {
        let at = word.checked_mul(8);
        let fits = at
            .and_then(|at| at.checked_add(len))
            .is_some_and(|end| end <= self.map.len());
        assert!(
            fits,
            "{len} bytes from word {word} run past the region's end"
        );
        word * 8
    }
}

/// `file` mapped shared, its pages entered in this process's page tables
/// from the start (`MAP_POPULATE`), so that a copy in or out of the region
/// does not wait on a page's first fault.
fn map_populated(file: &OwnedFd) -> io::Result<MmapRaw> {
    MmapOptions::new().populate().map_raw(file)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn a_region_is_shared_through_its_file_and_sealed() {
        let region = Region::create(4096).unwrap();
        let copy = region.file().try_clone_to_owned().unwrap();
        let other = Region::open(copy, 4096).unwrap();
        region.words()[3].store(0xfeed, Ordering::Release);
        assert_eq!(other.words()[3].load(Ordering::Acquire), 0xfeed);
        assert!(rustix::fs::ftruncate(region.file(), 0).is_err(), "sealed");
    }

    /// Every page of a new region is made when the region is, not at its
    /// first touch in a session (a file whose pages are not made yet takes
    /// no blocks).
    #[test]
    fn a_new_regions_pages_are_all_made_up_front() {
        let bytes = 1 << 20;
        let region = Region::create(bytes).unwrap();
        let blocks = rustix::fs::fstat(region.file()).unwrap().st_blocks as usize;
        assert!(blocks * 512 >= bytes, "{blocks} blocks of 512 bytes");
        let bare = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&bare, bytes as u64).unwrap();
        assert_eq!(rustix::fs::fstat(&bare).unwrap().st_blocks, 0);
    }

    /// A file received with holes (no page of it made) is mapped without
    /// making them: a server cannot make a worker allocate a region that
    /// the server never wrote.
    #[test]
    fn a_received_file_with_holes_is_mapped_without_allocating_it() {
        let bytes = 1 << 20;
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let file = rustix::fs::memfd_create("t", flags).unwrap();
        rustix::fs::ftruncate(&file, bytes).unwrap();
        rustix::fs::fcntl_add_seals(&file, SEALS).unwrap();
        let copy = file.try_clone().unwrap();
        let region = Region::open(file, bytes).unwrap();
        assert_eq!(region.bytes(), bytes as usize);
        assert_eq!(rustix::fs::fstat(&copy).unwrap().st_blocks, 0);
    }

    #[test]
    fn an_unsealed_or_resized_file_is_refused() {
        let file = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&file, 4096).unwrap();
        assert!(matches!(
            Region::open(file, 4096),
            Err(OpenError::NotSealed(_))
        ));
        let region = Region::create(4096).unwrap();
        let copy = region.file().try_clone_to_owned().unwrap();
        assert!(matches!(
            Region::open(copy, 8192),
            Err(OpenError::WrongSize { .. })
        ));
    }
}
