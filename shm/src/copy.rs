//! The region's bulk copies, in and out (`copy`), and [`Mark`]: elements
//! looked for while bytes are copied off the ring, in the same pass as the
//! copy (`copy_marked`), so that a large gradient is checked for NaN and
//! infinity without reading it a second time.
//!
//! On x86-64 with AVX2 a copy is a loop of 32-byte loads and stores (with the
//! test on the loaded registers). glibc's `memmove` copies such sizes with
//! `rep movsb` instead, which on the AMD EPYC machines this project is
//! measured on ran at 2-3 GB/s for some placements of the two buffers
//! against 29-34 GB/s for this loop, in cache, on one core (stop 55's
//! `docs/benchmarks.md`). Elsewhere a copy is `memmove`, and a marked copy
//! is a copy, then a scan of the copy while it is still in cache.

/// Little-endian elements of one width whose bits under a mask are all ones
/// (for a float, the exponent: NaN and the infinities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// 2-byte elements, and the bits that mark one.
    U16(u16),
    /// 4-byte elements, and the bits that mark one.
    U32(u32),
}

impl Mark {
    /// Whether a whole element of `bytes` (from its start; a trailing
    /// partial one is ignored) is marked. Branch-free, so that it vectorises.
    pub fn any_in(self, bytes: &[u8]) -> bool {
        match self {
            Mark::U16(mask) => bytes.chunks_exact(2).fold(false, |any, e| {
                any | (u16::from_le_bytes([e[0], e[1]]) & mask == mask)
            }),
            Mark::U32(mask) => bytes.chunks_exact(4).fold(false, |any, e| {
                any | (u32::from_le_bytes([e[0], e[1], e[2], e[3]]) & mask == mask)
            }),
        }
    }
}

/// Copies `len` bytes from `from` to `to`.
///
/// # Safety
/// `from` is valid for reads and `to` for writes of `len` bytes, and the
/// two do not overlap. (The bytes may change under the copy, as a region's
/// can.)
#[allow(unsafe_code)]
pub(crate) unsafe fn copy(from: *const u8, to: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present; the caller's promise is passed on.
        return unsafe { avx2::copy(from, to, len) };
    }
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(from, to, len) };
}

/// The least copy out of the values arena that bypasses the cache
/// (`copy_streaming`), whatever the cache's size: see [`stream_from_bytes`].
pub const STREAM_AT_LEAST_BYTES: usize = 1 << 20;

/// A copy of `len` bytes from the values arena into a worker's memory goes
/// with stores that bypass the cache (`copy_streaming`) when `len` is at
/// least this: a sixteenth of the last-level cache
/// ([`crate::cache_size::last_level_cache_bytes`]), but no more than
/// [`L2_TIMES`] a core's second-level cache
/// ([`crate::cache_size::level_two_cache_bytes`]), and never less than
/// [`STREAM_AT_LEAST_BYTES`] (the same where sysfs does not say).
///
/// A pull's destination is a buffer the worker keeps per request in flight
/// or per parameter, so eight pulls in flight write eight destinations.
/// Once they pass about half of the last-level cache, an ordinary store
/// first reads its line from memory and moves half as many bytes again;
/// below that, the lines are in cache and a streaming store only sends them
/// to memory sooner. From a memfd on this project's AMD EPYC machine (32 MiB
/// L3, so 2 MiB here), into eight buffers: 1 MiB ran at 49.8 GB/s with
/// ordinary stores and 41.2 with streaming ones, 2 MiB at 40.8 and 39.4,
/// 4 MiB at 34.7 and 40.7 (`docs/benchmarks.md`, "The streaming copy sized
/// to the last-level cache").
///
/// A virtual machine may report its host socket's whole last-level cache,
/// most of which other tenants' cores hold: this project's 2-vCPU Intel
/// Xeon reports 480 MiB (so a sixteenth is 30 MiB) and 2 MiB of L2 a core.
/// There, into eight buffers, 16 MiB ran at 7.3 GB/s with ordinary stores
/// and 12.7 with streaming ones, 8 MiB at 8.5 and 13.0, 4 MiB at 14.2 and
/// 13.2 (`docs/benchmarks.md`, "The streaming copy bounded by a core's L2"):
/// the cache this process can count on is nearer its own cores' L2 than
/// the socket's L3.
pub fn stream_from_bytes() -> usize {
    use crate::cache_size::{last_level_cache_bytes, level_two_cache_bytes};
    stream_from(last_level_cache_bytes(), level_two_cache_bytes())
}

/// [`stream_from_bytes`] for a machine whose caches are `last_level` and
/// `level_two` bytes.
fn stream_from(last_level: Option<u64>, level_two: Option<u64>) -> usize {
    let sixteenth = last_level.map_or(0, |bytes| bytes / 16);
    let bounded = match level_two {
        Some(l2) => sixteenth.min(l2.saturating_mul(L2_TIMES)),
        None => sixteenth,
    };
    usize::try_from(bounded)
        .unwrap_or(usize::MAX)
        .max(STREAM_AT_LEAST_BYTES)
}

/// How many of a core's second-level caches a copy may span before it
/// streams, whatever the last-level cache reports: see [`stream_from_bytes`].
pub const L2_TIMES: u64 = 4;

/// Copies `len` bytes from `from` to `to` with stores that bypass the
/// cache where the machine has them (AVX2), for a destination too large to
/// stay in it; elsewhere as [`copy`].
///
/// # Safety
/// As [`copy`].
#[allow(unsafe_code)]
pub(crate) unsafe fn copy_streaming(from: *const u8, to: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present; the caller's promise is passed on.
        return unsafe { avx2::copy_streaming(from, to, len) };
    }
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(from, to, len) };
}

/// Copies `into.len()` bytes from `from` into `into`, and says whether a
/// whole element of what was copied is marked, as [`Mark::any_in`] on the
/// copy would.
///
/// # Safety
/// `from` is valid for reads of `into.len()` bytes, which do not overlap
/// `into`. (The bytes may change under the copy, as a region's can: what
/// is tested is what was copied, register by register.)
#[allow(unsafe_code)]
pub(crate) unsafe fn copy_marked(from: *const u8, into: &mut [u8], mark: Mark) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present; the caller's promise is passed on.
        return unsafe {
            match mark {
                Mark::U16(mask) => avx2::copy_marked::<false>(from, into, u32::from(mask)),
                Mark::U32(mask) => avx2::copy_marked::<true>(from, into, mask),
            }
        };
    }
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(from, into.as_mut_ptr(), into.len()) };
    mark.any_in(into)
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    //! Copies, and the copy and the test in one pass, in 32-byte registers.

    use std::arch::x86_64::{
        __m256i, _mm_sfence, _mm256_and_si256, _mm256_cmpeq_epi16, _mm256_cmpeq_epi32,
        _mm256_loadu_si256, _mm256_or_si256, _mm256_set1_epi16, _mm256_set1_epi32,
        _mm256_setzero_si256, _mm256_storeu_si256, _mm256_stream_si256, _mm256_testz_si256,
    };

    use super::Mark;

    /// The bytes each load and store moves.
    const LANE: usize = 32;

    /// [`super::copy`].
    ///
    /// # Safety
    /// AVX2 is present, and as [`super::copy`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy(from: *const u8, to: *mut u8, len: usize) {
        let mut at = 0;
        // SAFETY (every load and store below): `at + LANE * (k + 1) <= len`, and
        // the caller's `from` holds `len` readable bytes and `to` `len`
        // writable ones; the loads and stores are unaligned ones.
        while at + 4 * LANE <= len {
            unsafe {
                let block = [0, 1, 2, 3]
                    .map(|k| _mm256_loadu_si256(from.add(at + k * LANE).cast::<__m256i>()));
                for (k, v) in block.into_iter().enumerate() {
                    _mm256_storeu_si256(to.add(at + k * LANE).cast::<__m256i>(), v);
                }
            }
            at += 4 * LANE;
        }
        while at + LANE <= len {
            unsafe {
                let v = _mm256_loadu_si256(from.add(at).cast::<__m256i>());
                _mm256_storeu_si256(to.add(at).cast::<__m256i>(), v);
            }
            at += LANE;
        }
        // SAFETY: as above, for the last `len - at` bytes.
        unsafe { std::ptr::copy_nonoverlapping(from.add(at), to.add(at), len - at) };
    }

    /// [`super::copy_streaming`]: ordinary stores up to the destination's
    /// first 32-byte boundary and after its last one, streaming stores
    /// between, then a fence, so that the bytes are in memory, in order with
    /// this thread's later stores, before the copy returns.
    ///
    /// # Safety
    /// AVX2 is present, and as [`super::copy`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_streaming(from: *const u8, to: *mut u8, len: usize) {
        let head = to.align_offset(LANE).min(len);
        // SAFETY: the first `head` bytes of the caller's spans.
        unsafe { copy(from, to, head) };
        let mut at = head;
        // SAFETY (every load and store below): `at + LANE * (k + 1) <= len`,
        // the caller's `from` holds `len` readable bytes and `to` `len`
        // writable ones; `to + at` is 32-byte aligned (`head` made it so, and
        // `at` moves by whole lanes), as a streaming store needs.
        while at + 4 * LANE <= len {
            unsafe {
                let block = [0, 1, 2, 3]
                    .map(|k| _mm256_loadu_si256(from.add(at + k * LANE).cast::<__m256i>()));
                for (k, v) in block.into_iter().enumerate() {
                    _mm256_stream_si256(to.add(at + k * LANE).cast::<__m256i>(), v);
                }
            }
            at += 4 * LANE;
        }
        _mm_sfence();
        // SAFETY: the last `len - at` bytes of the caller's spans.
        unsafe { copy(from.add(at), to.add(at), len - at) };
    }

    /// [`super::copy_marked`] for 4-byte elements (`WIDE`) or 2-byte ones,
    /// `mask` their marking bits.
    ///
    /// # Safety
    /// AVX2 is present, and as [`super::copy_marked`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_marked<const WIDE: bool>(
        from: *const u8,
        into: &mut [u8],
        mask: u32,
    ) -> bool {
        let len = into.len();
        let to = into.as_mut_ptr();
        let masks = if WIDE {
            _mm256_set1_epi32(mask as i32)
        } else {
            _mm256_set1_epi16(mask as u16 as i16)
        };
        let marked = |v: __m256i| {
            let bits = _mm256_and_si256(v, masks);
            if WIDE {
                _mm256_cmpeq_epi32(bits, masks)
            } else {
                _mm256_cmpeq_epi16(bits, masks)
            }
        };
        let mut any = _mm256_setzero_si256();
        let mut at = 0;
        // SAFETY (every load and store below): `at + LANE * (k + 1) <= len`, the
        // caller's `from` holds `len` readable bytes and `into` `len`
        // writable ones; the loads and stores are unaligned ones.
        while at + 4 * LANE <= len {
            unsafe {
                let [a, b, c, d] = [0, 1, 2, 3]
                    .map(|k| _mm256_loadu_si256(from.add(at + k * LANE).cast::<__m256i>()));
                for (k, v) in [a, b, c, d].into_iter().enumerate() {
                    _mm256_storeu_si256(to.add(at + k * LANE).cast::<__m256i>(), v);
                }
                let ab = _mm256_or_si256(marked(a), marked(b));
                let cd = _mm256_or_si256(marked(c), marked(d));
                any = _mm256_or_si256(any, _mm256_or_si256(ab, cd));
            }
            at += 4 * LANE;
        }
        while at + LANE <= len {
            unsafe {
                let v = _mm256_loadu_si256(from.add(at).cast::<__m256i>());
                _mm256_storeu_si256(to.add(at).cast::<__m256i>(), v);
                any = _mm256_or_si256(any, marked(v));
            }
            at += LANE;
        }
        // SAFETY: as above, for the last `len - at` bytes.
        unsafe { std::ptr::copy_nonoverlapping(from.add(at), to.add(at), len - at) };
        let rest = if WIDE {
            Mark::U32(mask)
        } else {
            Mark::U16(mask as u16)
        };
        _mm256_testz_si256(any, any) == 0 || rest.any_in(&into[at..])
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;

    const F32_EXPONENT: u32 = 0x7f80_0000;
    const F16_EXPONENT: u32 = 0x7c00;

    fn copied(from: &[u8], mark: Mark) -> (Vec<u8>, bool) {
        let mut into = vec![0u8; from.len()];
        // SAFETY: `from` is a slice of `into.len()` bytes of its own.
        let found = unsafe { copy_marked(from.as_ptr(), &mut into, mark) };
        (into, found)
    }

    fn finite_f32s(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| (i as f32 * 0.25 - 3.0).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_plain_copy_is_exact_at_every_length_and_offset() {
        let bytes: Vec<u8> = (0..1100u32).map(|i| (i * 7 % 251) as u8).collect();
        for len in [0, 1, 31, 32, 33, 127, 128, 129, 300, 999] {
            for start in [0, 1, 5] {
                let from = &bytes[start..start + len];
                let mut into = vec![0u8; len + 3];
                // SAFETY: `from` and `into` are slices of their own, and
                // `into` has room for `len` bytes from byte 1.
                unsafe { copy(from.as_ptr(), into.as_mut_ptr().add(1), len) };
                assert_eq!(&into[1..=len], from, "{len} bytes from {start}");
                assert!(into[0] == 0 && into[len + 1..].iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn copies_stream_from_a_sixteenth_of_the_l3_bounded_by_four_l2s() {
        const MIB: u64 = 1 << 20;
        // The AMD EPYC of stop 62: 32 MiB L3, 1 MiB L2.
        assert_eq!(stream_from(Some(32 * MIB), Some(MIB)), 2 << 20);
        // The Intel Xeon VM of stop 67: a socket's 480 MiB, 2 MiB L2.
        assert_eq!(stream_from(Some(480 * MIB), Some(2 * MIB)), 8 << 20);
        // A small cache, or none reported: never less than the least.
        assert_eq!(
            stream_from(Some(8 * MIB), Some(MIB / 2)),
            STREAM_AT_LEAST_BYTES
        );
        assert_eq!(stream_from(None, None), STREAM_AT_LEAST_BYTES);
        assert_eq!(stream_from(Some(64 * MIB), None), 4 << 20);
    }

    #[test]
    fn a_streaming_copy_is_exact_at_every_length_and_destination_alignment() {
        let bytes: Vec<u8> = (0..1300u32).map(|i| (i * 13 % 251) as u8).collect();
        for len in [0, 1, 31, 32, 33, 127, 128, 129, 160, 300, 1000, 1200] {
            for (start, to_at) in [(0, 0), (1, 0), (0, 1), (5, 31), (3, 17)] {
                let from = &bytes[start..start + len];
                let mut into = vec![0u8; len + 64];
                // SAFETY: `from` and `into` are slices of their own, and
                // `into` has room for `len` bytes from byte `to_at + 1`.
                unsafe { copy_streaming(from.as_ptr(), into.as_mut_ptr().add(to_at + 1), len) };
                let copied = &into[to_at + 1..to_at + 1 + len];
                assert_eq!(copied, from, "{len} bytes from {start} to {to_at}");
                let outside = into[..=to_at].iter().chain(&into[to_at + 1 + len..]);
                assert!(
                    outside.into_iter().all(|&b| b == 0),
                    "{len} {start} {to_at}"
                );
            }
        }
    }

    #[test]
    fn a_copy_is_exact_and_finds_nothing_in_finite_values() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 40, 64, 100, 1000, 16 * 1024 + 3] {
            let bytes = finite_f32s(n);
            for start in [0, 1, 4] {
                let from = &bytes[start.min(bytes.len())..];
                let (into, found) = copied(from, Mark::U32(F32_EXPONENT));
                assert_eq!(into, from, "{n} values from byte {start}");
                assert!(!found, "{n} finite values from byte {start}");
            }
        }
    }

    #[test]
    fn every_position_of_a_non_finite_value_is_found() {
        let n = 300; // nine 128-byte blocks, a 32-byte lane and a tail
        for at in 0..n {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut bytes = finite_f32s(n);
                bytes[at * 4..at * 4 + 4].copy_from_slice(&bad.to_le_bytes());
                let (into, found) = copied(&bytes, Mark::U32(F32_EXPONENT));
                assert_eq!(into, bytes);
                assert!(found, "{bad} at element {at}");
            }
        }
    }

    #[test]
    fn half_precision_is_tested_element_by_element() {
        let n = 200;
        let finite: Vec<u8> = (0..n)
            .flat_map(|i| (i as u16 % 0x7000).to_le_bytes())
            .collect();
        assert!(!copied(&finite, Mark::U16(0x7c00)).1);
        for at in 0..n {
            let mut bytes = finite.clone();
            bytes[at * 2..at * 2 + 2].copy_from_slice(&0xfc00u16.to_le_bytes());
            let (into, found) = copied(&bytes, Mark::U16(0x7c00));
            assert_eq!(into, bytes);
            assert!(found, "-inf at half element {at}");
            // The same bytes read as f32 put the mark across two halves'
            // boundary, where a 4-byte test must not see it whole.
            let as_wide = copied(&bytes, Mark::U32(F32_EXPONENT)).1;
            assert_eq!(as_wide, Mark::U32(F32_EXPONENT).any_in(&bytes), "{at}");
        }
    }

    #[test]
    fn bfloat16_nan_and_infinity_are_found_and_its_largest_value_is_not() {
        let bf16 = Mark::U16(0x7f80);
        let with = |bad: u16, at: usize| {
            let mut bytes: Vec<u8> = (0..150).flat_map(|_| 0x7f7fu16.to_le_bytes()).collect();
            bytes[at * 2..at * 2 + 2].copy_from_slice(&bad.to_le_bytes());
            copied(&bytes, bf16).1
        };
        for at in [0, 1, 63, 64, 127, 149] {
            assert!(with(0x7fc0, at), "NaN at {at}");
            assert!(with(0xff80, at), "-inf at {at}");
            assert!(!with(0xff7f, at), "the lowest finite value at {at}");
        }
    }

    #[test]
    fn a_trailing_partial_element_is_ignored() {
        let mut bytes = finite_f32s(40);
        bytes.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(!copied(&bytes, Mark::U32(F32_EXPONENT)).1);
        assert!(Mark::U16(F16_EXPONENT as u16).any_in(&[0x00, 0x7c]));
        assert!(!Mark::U16(F16_EXPONENT as u16).any_in(&[0x00]));
    }
}
