//! Tensors on the wire: dtypes, shapes, validation, and `f32` access without
//! per-element allocation.
//!
//! A [`TensorData`] is a validated tensor whose bytes may live in several
//! [`Bytes`] segments (the chunks of a stream, sliced straight out of receive
//! buffers). Reading it as `f32` never copies an `f32` segment, aligned or not:
//! [`TensorData::for_each_f32_run`] hands out aligned segments as `&[f32]` and
//! unaligned ones as little-endian `[u8; 4]` elements, which a loop loads with
//! unaligned vector loads. Half precision is widened in a tight loop per block
//! through a stack buffer. No path allocates.

use bytes::Bytes;
use half::{bf16, f16};

use crate::v1;

/// Elements copied or widened at a time on the unaligned and half-precision
/// paths: 16 KiB of `f32`, well inside L1 and L2 alongside what it is applied to.
const DECODE_BLOCK: usize = 4096;

/// Errors found while validating a tensor received from the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The dtype field was left at its default.
    #[error("dtype is unspecified; set it to DTYPE_F32, DTYPE_F16 or DTYPE_BF16")]
    UnspecifiedDtype,
    /// The dtype number is not one this protocol version knows.
    #[error("dtype {value} is not a known ps.v1.DType (1 = f32, 2 = f16, 3 = bf16)")]
    UnknownDtype {
        /// The number received.
        value: i32,
    },
    /// The product of the dimensions (or the byte length) does not fit in memory.
    #[error("shape {shape:?} has too many elements to address")]
    ShapeOverflow {
        /// The shape received.
        shape: Vec<u64>,
    },
    /// The data is not `elements * dtype size` bytes long.
    #[error(
        "data is {got} bytes but shape {shape:?} of {dtype} needs {expected} bytes \
         ({elements} elements x {elem_size} bytes)"
    )]
    LengthMismatch {
        /// The shape received.
        shape: Vec<usize>,
        /// The dtype received.
        dtype: DType,
        /// Elements implied by the shape.
        elements: usize,
        /// Bytes per element.
        elem_size: usize,
        /// Bytes implied by the shape.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
}

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Reads a dtype from its protobuf number.
    ///
    /// # Errors
    /// [`CodecError::UnspecifiedDtype`] for 0, [`CodecError::UnknownDtype`] for numbers
    /// this version does not know.
    pub fn from_proto(value: i32) -> Result<Self, CodecError> {
        match v1::DType::try_from(value) {
            Ok(v1::DType::DtypeF32) => Ok(DType::F32),
            Ok(v1::DType::DtypeF16) => Ok(DType::F16),
            Ok(v1::DType::DtypeBf16) => Ok(DType::BF16),
            Ok(v1::DType::DtypeUnspecified) => Err(CodecError::UnspecifiedDtype),
            Err(_) => Err(CodecError::UnknownDtype { value }),
        }
    }

    /// The protobuf number of this dtype.
    pub fn to_proto(self) -> i32 {
        let dtype = match self {
            DType::F32 => v1::DType::DtypeF32,
            DType::F16 => v1::DType::DtypeF16,
            DType::BF16 => v1::DType::DtypeBf16,
        };
        dtype as i32
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        })
    }
}

/// Converts a wire shape to `usize` dimensions and checks that the element count
/// and the byte length of a tensor of `dtype` are addressable.
///
/// # Errors
/// [`CodecError::ShapeOverflow`] when the product or the byte length overflows.
pub fn checked_shape(shape: &[u64], dtype: DType) -> Result<Vec<usize>, CodecError> {
    let overflow = || CodecError::ShapeOverflow {
        shape: shape.to_vec(),
    };
    let dims = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| overflow()))
        .collect::<Result<Vec<_>, _>>()?;
    let elements = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    elements.checked_mul(dtype.size()).ok_or_else(overflow)?;
    Ok(dims)
}

/// A shape as the wire carries it (the inverse of [`checked_shape`]).
pub fn wire_shape(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| d as u64).collect()
}

/// Number of elements of a shape already checked by [`checked_shape`].
pub fn element_count(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A validated tensor: dtype, shape, and its bytes in one or more segments.
///
/// Invariants: every segment holds a whole number of elements, and the segments
/// together hold exactly `element_count(shape) * dtype.size()` bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorData {
    dtype: DType,
    shape: Vec<usize>,
    segments: Vec<Bytes>,
}

impl TensorData {
    /// Validates a tensor held in one buffer.
    ///
    /// # Errors
    /// [`CodecError::LengthMismatch`] when `data` is not exactly the size the shape implies.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Bytes) -> Result<Self, CodecError> {
        Self::from_segments(dtype, shape, vec![data])
    }

    /// Validates a tensor held in several buffers, in order.
    ///
    /// # Errors
    /// [`CodecError::LengthMismatch`] when the segments do not add up to the size the
    /// shape implies or one of them splits an element.
    pub fn from_segments(
        dtype: DType,
        shape: Vec<usize>,
        segments: Vec<Bytes>,
    ) -> Result<Self, CodecError> {
        let elements = element_count(&shape);
        let expected = elements * dtype.size();
        let got: usize = segments.iter().map(Bytes::len).sum();
        let split_element = segments.iter().any(|s| s.len() % dtype.size() != 0);
        if got != expected || split_element {
            return Err(CodecError::LengthMismatch {
                shape,
                dtype,
                elements,
                elem_size: dtype.size(),
                expected,
                got,
            });
        }
        let segments = segments.into_iter().filter(|s| !s.is_empty()).collect();
        Ok(Self {
            dtype,
            shape,
            segments,
        })
    }

    /// Validates a `ps.v1.Tensor`'s dtype, shape and data (the name is the caller's).
    ///
    /// # Errors
    /// Any [`CodecError`].
    pub fn from_proto(tensor: &v1::Tensor) -> Result<Self, CodecError> {
        let dtype = DType::from_proto(tensor.dtype)?;
        let shape = checked_shape(&tensor.shape, dtype)?;
        Self::new(dtype, shape, tensor.data.clone())
    }

    /// Encodes `values` in `dtype` (rounding to nearest for half precision).
    /// Costs one allocation and one pass.
    pub fn from_f32(dtype: DType, shape: Vec<usize>, values: &[f32]) -> Self {
        assert_eq!(
            element_count(&shape),
            values.len(),
            "from_f32: shape {shape:?} does not match {} values",
            values.len()
        );
        let data = encode_f32(dtype, values);
        Self {
            dtype,
            shape,
            segments: vec![data],
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        element_count(&self.shape)
    }

    /// True for a tensor with no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of data.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype.size()
    }

    /// The data segments, in order.
    pub fn segments(&self) -> &[Bytes] {
        &self.segments
    }

    /// The data as one buffer: free for a single segment, one copy otherwise.
    pub fn to_contiguous(&self) -> Bytes {
        match self.segments.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => Bytes::from(many.concat()),
        }
    }

    /// Calls `f(first_element_index, run)` over consecutive runs of elements that
    /// together cover every element in order. An `f32` segment is one run where it
    /// lies, aligned or not; half precision is widened block by block through a
    /// stack buffer. Neither copies nor allocates for `f32`.
    pub fn for_each_f32_run(&self, mut f: impl FnMut(usize, F32Run<'_>)) {
        let mut index = 0;
        for segment in &self.segments {
            let mut each = |run: F32Run<'_>| {
                let len = run.len();
                f(index, run);
                index += len;
            };
            match self.dtype {
                DType::F32 => each(F32Run::of_le_bytes(segment)),
                dtype => for_each_segment_block(dtype, segment, |values| {
                    each(F32Run::Values(values));
                }),
            }
        }
    }

    /// Calls `f(first_element_index, values)` over consecutive blocks that together
    /// cover every element in order, decoding half precision and unaligned data
    /// through a stack buffer (no heap allocation).
    pub fn for_each_f32_block(&self, mut f: impl FnMut(usize, &[f32])) {
        let mut index = 0;
        for segment in &self.segments {
            for_each_segment_block(self.dtype, segment, |values| {
                f(index, values);
                index += values.len();
            });
        }
    }

    /// All elements as `f32`, in one allocation.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        self.for_each_f32_block(|_, values| out.extend_from_slice(values));
        out
    }

    /// The first element that is NaN or infinite, as `(index, value)`. Reads the
    /// wire bytes where they lie, however aligned: see [`first_non_finite`].
    pub fn first_non_finite(&self) -> Option<(usize, f32)> {
        let mut start = 0;
        for segment in &self.segments {
            if let Some((i, value)) = first_non_finite(self.dtype, segment) {
                return Some((start + i, value));
            }
            start += segment.len() / self.dtype.size();
        }
        None
    }
}

/// The first element of little-endian `dtype` bytes that is NaN or infinite, as
/// `(index, value)`, testing each element's exponent bits where it lies, however
/// aligned: no copy and no conversion. A trailing partial element is ignored.
pub fn first_non_finite(dtype: DType, bytes: &[u8]) -> Option<(usize, f32)> {
    let mask = exponent_bits(dtype);
    let found = match dtype {
        DType::F32 => first_all_ones::<4>(bytes, mask),
        DType::F16 | DType::BF16 => first_all_ones::<2>(bytes, mask),
    }?;
    let size = dtype.size();
    let mut value = None;
    for_each_segment_block(dtype, &bytes[found * size..(found + 1) * size], |v| {
        value = v.first().copied();
    });
    value.map(|v| (found, v))
}

/// The bits of a little-endian `dtype` element (its exponent) that are all
/// ones exactly when it is NaN or infinite.
pub fn exponent_bits(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => F32_EXPONENT,
        DType::F16 => F16_EXPONENT,
        DType::BF16 => BF16_EXPONENT,
    }
}

/// The exponent bits of a little-endian element that are all ones exactly when
/// it is NaN or infinite.
const F32_EXPONENT: u32 = 0x7f80_0000;
const F16_EXPONENT: u32 = 0x7c00;
const BF16_EXPONENT: u32 = 0x7f80;

/// The index of the first `N`-byte little-endian element of `bytes` whose `mask`
/// bits are all ones. Branch-free over each run of 64 elements, which the
/// compiler vectorises with unaligned loads; stops at the first run holding one.
fn first_all_ones<const N: usize>(bytes: &[u8], mask: u32) -> Option<usize> {
    const RUN: usize = 64;
    let bits = |element: &[u8]| {
        let mut word = [0u8; 4];
        word[..N].copy_from_slice(element);
        u32::from_le_bytes(word) & mask == mask
    };
    bytes
        .chunks(RUN * N)
        .enumerate()
        .find_map(|(run_index, run)| {
            let any = run
                .chunks_exact(N)
                .fold(0u32, |any, e| any | u32::from(bits(e)));
            if any == 0 {
                return None;
            }
            run.chunks_exact(N)
                .position(bits)
                .map(|i| run_index * RUN + i)
        })
}

/// Consecutive `f32` elements of a tensor, as they lie in memory.
#[derive(Debug, Clone, Copy)]
pub enum F32Run<'a> {
    /// Aligned values (or half precision already widened).
    Values(&'a [f32]),
    /// Little-endian `f32` elements at any alignment.
    LittleEndian(&'a [[u8; 4]]),
}

impl<'a> F32Run<'a> {
    /// The elements of little-endian `f32` bytes: values where they are aligned
    /// (on a little-endian machine), bytes otherwise. A trailing partial element
    /// is left out.
    pub fn of_le_bytes(bytes: &'a [u8]) -> Self {
        let whole = &bytes[..bytes.len() - bytes.len() % 4];
        match bytemuck::try_cast_slice::<u8, f32>(whole) {
            Ok(values) if cfg!(target_endian = "little") => F32Run::Values(values),
            _ => F32Run::LittleEndian(bytemuck::cast_slice(whole)),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            F32Run::Values(values) => values.len(),
            F32Run::LittleEndian(elements) => elements.len(),
        }
    }

    /// True for a run of no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `range` of the run.
    ///
    /// # Panics
    /// When `range` reaches past the run.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        match self {
            F32Run::Values(values) => F32Run::Values(&values[range]),
            F32Run::LittleEndian(elements) => F32Run::LittleEndian(&elements[range]),
        }
    }

    /// Writes the run into `out`, which must be exactly as long: one `memcpy` on
    /// a little-endian machine, whatever the alignment.
    ///
    /// # Panics
    /// When `out`'s length differs from the run's.
    pub fn copy_to(&self, out: &mut [f32]) {
        match self {
            F32Run::Values(values) => out.copy_from_slice(values),
            F32Run::LittleEndian(elements) if cfg!(target_endian = "little") => {
                let bytes: &[u8] = bytemuck::cast_slice(elements);
                bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes);
            }
            F32Run::LittleEndian(elements) => {
                assert_eq!(out.len(), elements.len(), "copy_to: lengths differ");
                for (out, element) in out.iter_mut().zip(elements.iter()) {
                    *out = f32::from_le_bytes(*element);
                }
            }
        }
    }
}

/// Encodes `values` as little-endian bytes of `dtype`.
pub fn encode_f32(dtype: DType, values: &[f32]) -> Bytes {
    match dtype {
        DType::F32 if cfg!(target_endian = "little") => {
            Bytes::copy_from_slice(bytemuck::cast_slice(values))
        }
        DType::F32 => narrow(values.iter().copied(), values.len(), f32::to_le_bytes),
        DType::F16 => narrow(values.iter().copied(), values.len(), |v| {
            f16::from_f32(v).to_le_bytes()
        }),
        DType::BF16 => narrow(values.iter().copied(), values.len(), |v| {
            bf16_bits(v.to_bits()).to_le_bytes()
        }),
    }
}

/// Encodes little-endian `f32` bytes (a whole number of them) as
/// little-endian bytes of `dtype`, without widening them into a vector of
/// `f32` first: what a worker's bf16 or f16 wire does to each tensor's host
/// copy on every step.
pub fn encode_f32_le(dtype: DType, f32_le: &[u8]) -> Bytes {
    let count = f32_le.len() / 4;
    match dtype {
        DType::F32 => Bytes::copy_from_slice(&f32_le[..count * 4]),
        DType::F16 | DType::BF16 => {
            let mut narrowed = Vec::with_capacity(count);
            narrow_into(dtype, f32_le, &mut narrowed);
            Bytes::from_owner(HalfWords(narrowed))
        }
    }
}

/// `f32_le`'s values (little-endian `f32`, a whole number of them) as
/// `dtype`'s 16-bit patterns, into `out` (emptied first, its memory reused),
/// each stored little-endian whatever the host, so that `out`'s memory is
/// the wire's bytes. `dtype` is `F16` or `BF16`; for `F32`, `out` is left
/// empty. What a worker's bf16 or f16 wire does to each tensor's host copy on
/// every step, into a buffer it keeps from step to step.
pub fn narrow_into(dtype: DType, f32_le: &[u8], out: &mut Vec<u16>) {
    out.clear();
    match dtype {
        DType::F32 => {}
        DType::F16 => fill_half(f32_le, out, |x| f16::from_f32(f32::from_bits(x)).to_bits()),
        DType::BF16 => fill_half(f32_le, out, bf16_bits),
    }
}

/// `out` extended with `bits` of each of `f32_le`'s values: in one pass over
/// them as words where they are aligned (the compiler vectorizes it).
fn fill_half(f32_le: &[u8], out: &mut Vec<u16>, bits: impl Fn(u32) -> u16) {
    let whole = &f32_le[..f32_le.len() / 4 * 4];
    match bytemuck::try_cast_slice::<u8, u32>(whole) {
        Ok(words) if cfg!(target_endian = "little") => {
            out.extend(words.iter().map(|&x| bits(x)));
        }
        _ => out.extend(
            whole
                .chunks_exact(4)
                .map(|b| bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le()),
        ),
    }
}

/// 16-bit values stored little-endian ([`narrow_into`]'s), as their bytes.
struct HalfWords(Vec<u16>);

impl AsRef<[u8]> for HalfWords {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// `bf16::from_f32(f32::from_bits(x))`'s bits, without branches, so the loop
/// over a tensor vectorizes (half's rounds one value at a time behind a
/// branch: 84 MB of gradients took 60 ms to narrow on a GPU machine's host).
/// Rounds to the nearest even; a NaN keeps its sign and top payload bits and
/// is made quiet.
#[inline]
fn bf16_bits(x: u32) -> u16 {
    let nan = (x & 0x7FFF_FFFF) > 0x7F80_0000;
    let quiet = ((x >> 16) as u16) | 0x0040;
    let lsb = (x >> 16) & 1;
    let rounded = (x.wrapping_add(0x7FFF + lsb) >> 16) as u16;
    if nan { quiet } else { rounded }
}

/// `count` values, each written as the `N` bytes `encode` makes of it, into
/// one buffer sized once (collecting a `flat_map` pushed a byte at a time
/// into a buffer that grew as it went).
fn narrow<const N: usize>(
    values: impl Iterator<Item = f32>,
    count: usize,
    encode: impl Fn(f32) -> [u8; N],
) -> Bytes {
    let mut out = vec![0u8; count * N];
    for (slot, value) in out.chunks_exact_mut(N).zip(values) {
        slot.copy_from_slice(&encode(value));
    }
    Bytes::from(out)
}

fn for_each_segment_block(dtype: DType, bytes: &[u8], mut f: impl FnMut(&[f32])) {
    let mut buffer = [0f32; DECODE_BLOCK];
    match dtype {
        DType::F32 if cfg!(target_endian = "little") => {
            if let Ok(values) = bytemuck::try_cast_slice::<u8, f32>(bytes) {
                return f(values);
            }
            for block in bytes.chunks(DECODE_BLOCK * 4) {
                let n = block.len() / 4;
                bytemuck::cast_slice_mut::<f32, u8>(&mut buffer[..n]).copy_from_slice(block);
                f(&buffer[..n]);
            }
        }
        DType::F32 => widen_blocks(bytes, &mut buffer, f, |e: &[u8; 4]| f32::from_le_bytes(*e)),
        DType::F16 => widen_blocks(bytes, &mut buffer, f, |e: &[u8; 2]| {
            f16::from_le_bytes(*e).to_f32()
        }),
        DType::BF16 => widen_blocks(bytes, &mut buffer, f, |e: &[u8; 2]| {
            bf16::from_le_bytes(*e).to_f32()
        }),
    }
}

/// Converts `bytes` block by block through `buffer` with `widen`, one element of
/// `N` bytes at a time, in a loop the dtype is already chosen for.
fn widen_blocks<const N: usize>(
    bytes: &[u8],
    buffer: &mut [f32; DECODE_BLOCK],
    mut f: impl FnMut(&[f32]),
    widen: impl Fn(&[u8; N]) -> f32,
) {
    for block in bytes.chunks(DECODE_BLOCK * N) {
        let n = block.len() / N;
        for (out, element) in buffer.iter_mut().zip(block.chunks_exact(N)) {
            // `chunks_exact(N)` makes every element N bytes: the fallback never runs.
            *out = widen(&element.try_into().unwrap_or([0; N]));
        }
        f(&buffer[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn unaligned_f32_is_decoded_correctly() {
        let values: Vec<f32> = (0..3000).map(|i| i as f32 * 0.5 - 7.0).collect();
        let mut raw = vec![0u8];
        raw.extend(f32_bytes(&values));
        let unaligned = Bytes::from(raw).slice(1..);
        assert_ne!(
            unaligned.as_ptr() as usize % 4,
            0,
            "test needs an odd address"
        );
        let tensor = TensorData::new(DType::F32, vec![3000], unaligned).unwrap();
        assert_eq!(tensor.to_f32_vec(), values);
    }

    #[test]
    fn f32_bytes_narrow_as_the_values_do_in_every_dtype() {
        let values: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) * 0.37).collect();
        let mut raw = vec![0u8];
        raw.extend(f32_bytes(&values));
        let unaligned = &raw[1..];
        let aligned: &[u8] = bytemuck::cast_slice(&values);
        for (dtype, f32_le) in [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .flat_map(|d| [(d, unaligned), (d, aligned)])
        {
            let narrowed = encode_f32_le(dtype, f32_le);
            assert_eq!(narrowed.len(), values.len() * dtype.size());
            assert_eq!(narrowed, encode_f32(dtype, &values), "{dtype:?}");
            let bf16_of_first = bf16::from_f32(values[0]).to_le_bytes();
            if dtype == DType::BF16 {
                assert_eq!(narrowed[..2], bf16_of_first);
            }
        }
    }

    #[test]
    fn bf16_rounding_is_halfs_bit_for_bit() {
        let edges = [
            0u32,
            0x8000_0000,
            0x0000_0001,
            0x0000_8000,
            0x0001_8000,
            0x0000_7FFF,
            0x3F80_8000,
            0x3F81_8000,
            0x3F80_8001,
            0x7F7F_FFFF,
            0x7F7F_8000,
            0x7F80_0000,
            0xFF80_0000,
            0x7F80_0001,
            0x7FC0_0000,
            0xFFFF_FFFF,
            0x7FFF_8000,
        ];
        // Every edge, and a sweep of bit patterns that touches every exponent
        // and the round, sticky and lowest kept bits in all their combinations.
        let sweep = (0..=u32::MAX).step_by(65_521);
        for x in edges.into_iter().chain(sweep) {
            let expected = bf16::from_f32(f32::from_bits(x)).to_bits();
            assert_eq!(bf16_bits(x), expected, "{x:#010x}");
        }
    }

    #[test]
    fn aligned_f32_is_read_in_place() {
        let values: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let tensor = TensorData::from_f32(DType::F32, vec![10, 10], &values);
        let mut blocks = 0;
        tensor.for_each_f32_block(|start, block| {
            assert_eq!(start, 0);
            assert_eq!(block, values.as_slice());
            blocks += 1;
        });
        assert_eq!(blocks, 1);
    }

    #[test]
    fn runs_cover_every_element_in_place_however_aligned() {
        let values: Vec<f32> = (0..3001).map(|i| i as f32 * 0.25 - 9.0).collect();
        let mut raw = vec![0u8];
        raw.extend(f32_bytes(&values));
        let buffer = Bytes::from(raw);
        // Two odd-addressed segments, cut between elements.
        let parts = vec![buffer.slice(1..4001), buffer.slice(4001..)];
        let tensor = TensorData::from_segments(DType::F32, vec![3001], parts).unwrap();
        let mut out = vec![0f32; values.len()];
        let mut starts = Vec::new();
        tensor.for_each_f32_run(|start, run| {
            let F32Run::LittleEndian(elements) = run else {
                panic!("an odd-addressed segment came out as aligned values");
            };
            let bytes: &[u8] = bytemuck::cast_slice(elements);
            let lies = buffer[1 + start * 4..].as_ptr();
            assert_eq!(bytes.as_ptr(), lies, "read where it lies");
            run.copy_to(&mut out[start..start + run.len()]);
            starts.push(start);
        });
        assert_eq!(starts, vec![0, 1000]);
        assert_eq!(out, values);

        for dtype in [DType::F16, DType::BF16] {
            let half = TensorData::from_f32(dtype, vec![4], &[0.5, -2.0, 1024.0, 0.0]);
            let mut out = [1f32; 4];
            half.for_each_f32_run(|start, run| run.copy_to(&mut out[start..start + run.len()]));
            assert_eq!(out, [0.5, -2.0, 1024.0, 0.0], "{dtype}");
        }
    }

    #[test]
    fn segments_are_read_in_order_with_running_index() {
        let values: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let bytes = Bytes::from(f32_bytes(&values));
        let parts = vec![bytes.slice(0..12), bytes.slice(12..12), bytes.slice(12..40)];
        let tensor = TensorData::from_segments(DType::F32, vec![10], parts).unwrap();
        let mut starts = Vec::new();
        tensor.for_each_f32_block(|start, _| starts.push(start));
        assert_eq!(starts, vec![0, 3]);
        assert_eq!(tensor.to_f32_vec(), values);
    }

    #[test]
    fn half_precision_round_trips() {
        let values = [0.5f32, -2.0, 1024.0, 0.0];
        for dtype in [DType::F16, DType::BF16] {
            let tensor = TensorData::from_f32(dtype, vec![4], &values);
            assert_eq!(tensor.byte_len(), 8);
            assert_eq!(tensor.to_f32_vec(), values);
        }
    }

    #[test]
    fn length_mismatch_names_expected_and_received_bytes() {
        let err = TensorData::new(DType::F32, vec![2, 3], Bytes::from(vec![0u8; 20])).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("20 bytes"), "{message}");
        assert!(message.contains("needs 24 bytes"), "{message}");
    }

    #[test]
    fn split_element_is_a_length_mismatch() {
        let bytes = Bytes::from(vec![0u8; 8]);
        let parts = vec![bytes.slice(0..3), bytes.slice(3..8)];
        let err = TensorData::from_segments(DType::F32, vec![2], parts).unwrap_err();
        assert!(matches!(err, CodecError::LengthMismatch { .. }));
    }

    #[test]
    fn empty_tensors_are_valid() {
        let tensor = TensorData::new(DType::F32, vec![0, 5], Bytes::new()).unwrap();
        assert!(tensor.is_empty());
        assert_eq!(tensor.to_f32_vec(), Vec::<f32>::new());
    }

    #[test]
    fn scalar_has_one_element() {
        let tensor = TensorData::from_f32(DType::F32, vec![], &[3.0]);
        assert_eq!(tensor.len(), 1);
    }

    #[test]
    fn shape_overflow_is_detected() {
        let err = checked_shape(&[u64::MAX, 2], DType::F32).unwrap_err();
        assert!(matches!(err, CodecError::ShapeOverflow { .. }));
        let err = checked_shape(&[1 << 62], DType::F32).unwrap_err();
        assert!(matches!(err, CodecError::ShapeOverflow { .. }));
    }

    #[test]
    fn dtype_numbers_are_checked() {
        assert_eq!(DType::from_proto(0), Err(CodecError::UnspecifiedDtype));
        assert_eq!(
            DType::from_proto(42),
            Err(CodecError::UnknownDtype { value: 42 })
        );
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(DType::from_proto(dtype.to_proto()), Ok(dtype));
        }
    }

    #[test]
    fn unaligned_segments_are_read_in_order_across_block_boundaries() {
        let n = 3 * DECODE_BLOCK + 5;
        let values: Vec<f32> = (0..n).map(|i| i as f32 - 1000.25).collect();
        let mut raw = vec![0u8; 3];
        raw.extend(f32_bytes(&values));
        let bytes = Bytes::from(raw).slice(3..);
        let split = 4 * (DECODE_BLOCK + 1);
        let segments = vec![bytes.slice(..split), bytes.slice(split..)];
        let tensor = TensorData::from_segments(DType::F32, vec![n], segments).unwrap();
        let mut blocks = Vec::new();
        tensor.for_each_f32_block(|start, block| {
            assert_eq!(start, blocks.len(), "blocks in order");
            blocks.extend_from_slice(block);
        });
        assert_eq!(blocks, values);
        assert_eq!(tensor.to_f32_vec(), values);
    }

    #[test]
    fn a_non_finite_element_is_found_wherever_it_sits() {
        for index in [0, 63, 64, 4095, 4096, 9999] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut values = vec![-3.5f32; 10_000];
                values[index] = bad;
                let tensor = TensorData::from_f32(DType::F32, vec![10_000], &values);
                let found = tensor.first_non_finite().map(|(i, _)| i);
                assert_eq!(found, Some(index), "{bad} at {index}");
            }
        }
        let big = TensorData::from_f32(DType::F32, vec![2], &[f32::MAX, f32::MIN]);
        assert_eq!(big.first_non_finite(), None, "the largest finite values");
    }

    #[test]
    fn non_finite_is_found_in_unaligned_segments_of_every_dtype() {
        let n = 1000;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for index in [0, 63, 64, 500, 501, 999] {
                let mut values = vec![65504.0f32; n];
                values[index] = f32::NEG_INFINITY;
                let encoded = encode_f32(dtype, &values);
                let mut raw = vec![0u8];
                raw.extend_from_slice(&encoded);
                let bytes = Bytes::from(raw).slice(1..);
                let split = 501 * dtype.size();
                let segments = vec![bytes.slice(..split), bytes.slice(split..)];
                let tensor = TensorData::from_segments(dtype, vec![n], segments).unwrap();
                assert_eq!(
                    tensor.first_non_finite(),
                    Some((index, f32::NEG_INFINITY)),
                    "{dtype} at {index}"
                );
            }
            let finite = TensorData::from_f32(dtype, vec![2], &[65504.0, -65504.0]);
            assert_eq!(finite.first_non_finite(), None, "{dtype}'s largest finite");
        }
    }

    #[test]
    fn first_non_finite_reports_index_and_value() {
        let mut values = vec![1.0f32; 2500];
        values[2100] = f32::NAN;
        values[2200] = f32::INFINITY;
        let tensor = TensorData::from_f32(DType::F32, vec![2500], &values);
        let (index, value) = tensor.first_non_finite().unwrap();
        assert_eq!(index, 2100);
        assert!(value.is_nan());
        let finite = TensorData::from_f32(DType::F32, vec![3], &[1.0, 2.0, 3.0]);
        assert_eq!(finite.first_non_finite(), None);
    }
}
