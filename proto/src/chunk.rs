//! Streams of tensor chunks: [`split`] cuts a tensor into chunks of a few MiB, and
//! [`Assembler`] rebuilds tensors from chunks, refusing streams whose chunks change
//! the header, overlap, leave gaps, overrun, split an element, or end early.
//!
//! Reassembly never copies: a tensor keeps the received chunk buffers as its
//! segments (see [`TensorData::from_segments`]).

use std::collections::HashMap;

use bytes::Bytes;

use crate::codec::{CodecError, TensorData};
use crate::header::TensorHeader;
use crate::key::ParamKey;
use crate::v1;

/// Default bytes per chunk: well under the 4 MiB default message limit.
pub const DEFAULT_CHUNK_BYTES: usize = 2 << 20;

/// Errors found while reassembling a chunk stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// The stream carried no chunk at all.
    #[error("the stream carried no chunks; send at least one chunk per tensor")]
    EmptyStream,
    /// A chunk's dtype or shape is invalid.
    #[error("chunk of {key}: {source}")]
    Codec {
        /// The tensor.
        key: ParamKey,
        /// What is wrong.
        source: CodecError,
    },
    /// A chunk's dtype or shape differs from the first chunk of the same tensor.
    #[error("chunk of {key} says {now}, but its first chunk said {first}")]
    HeaderChanged {
        /// The tensor.
        key: ParamKey,
        /// dtype and shape of the first chunk.
        first: String,
        /// dtype and shape of this chunk.
        now: String,
    },
    /// A chunk starts or ends inside an element.
    #[error("chunk of {key} at byte {offset} with {len} bytes splits a {elem_size}-byte element")]
    Misaligned {
        /// The tensor.
        key: ParamKey,
        /// Byte offset of the chunk.
        offset: u64,
        /// Bytes in the chunk.
        len: usize,
        /// Bytes per element.
        elem_size: usize,
    },
    /// A chunk starts before the end of the previous one.
    #[error(
        "chunk of {key} at byte {offset} overlaps bytes already received (next expected byte {expected})"
    )]
    Overlap {
        /// The tensor.
        key: ParamKey,
        /// Byte offset of the chunk.
        offset: u64,
        /// The offset that was expected.
        expected: u64,
    },
    /// A chunk starts after the end of the previous one.
    #[error(
        "chunk of {key} at byte {offset} leaves a gap (next expected byte {expected}); send chunks in order"
    )]
    Gap {
        /// The tensor.
        key: ParamKey,
        /// Byte offset of the chunk.
        offset: u64,
        /// The offset that was expected.
        expected: u64,
    },
    /// A chunk runs past the end of the tensor.
    #[error(
        "chunk of {key} at byte {offset} with {len} bytes runs past the tensor's {total} bytes"
    )]
    Overrun {
        /// The tensor.
        key: ParamKey,
        /// Byte offset of the chunk.
        offset: u64,
        /// Bytes in the chunk.
        len: usize,
        /// Bytes of the whole tensor.
        total: usize,
    },
    /// The stream ended before a tensor was complete.
    #[error("the stream ended after {received} of {total} bytes of {key}; nothing was applied")]
    Incomplete {
        /// The tensor.
        key: ParamKey,
        /// Bytes received.
        received: usize,
        /// Bytes of the whole tensor.
        total: usize,
    },
}

/// Where a stream is in one tensor: checks that each chunk repeats the header and
/// continues exactly where the previous one ended, within the tensor.
#[derive(Debug, Clone)]
pub struct ChunkCursor {
    header: TensorHeader,
    received: usize,
}

impl ChunkCursor {
    /// A cursor at the start of the tensor `header` describes.
    pub fn new(header: TensorHeader) -> Self {
        Self {
            header,
            received: 0,
        }
    }

    /// The tensor's header.
    pub fn header(&self) -> &TensorHeader {
        &self.header
    }

    /// Bytes received so far.
    pub fn received(&self) -> usize {
        self.received
    }

    /// Takes the next chunk: `len` bytes at byte `offset`, under `header`.
    ///
    /// # Errors
    /// `HeaderChanged`, `Misaligned`, `Overlap`, `Gap` or `Overrun`.
    pub fn advance(
        &mut self,
        header: &TensorHeader,
        offset: u64,
        len: usize,
    ) -> Result<(), ChunkError> {
        self.check(header, offset, len)?;
        self.received += len;
        Ok(())
    }

    /// Checks that every byte arrived.
    ///
    /// # Errors
    /// [`ChunkError::Incomplete`] when bytes are missing at the end.
    pub fn finish(&self) -> Result<(), ChunkError> {
        let total = self.header.byte_len();
        if self.received == total {
            Ok(())
        } else {
            Err(ChunkError::Incomplete {
                key: self.header.key.clone(),
                received: self.received,
                total,
            })
        }
    }

    /// Why `len` bytes at `offset` under `header` cannot be the next chunk, if
    /// they cannot.
    fn check(&self, header: &TensorHeader, offset: u64, len: usize) -> Result<(), ChunkError> {
        let key = || header.key.clone();
        if self.header != *header {
            return Err(ChunkError::HeaderChanged {
                key: key(),
                first: self.header.describe(),
                now: header.describe(),
            });
        }
        let elem_size = header.dtype.size();
        if !offset.is_multiple_of(elem_size as u64) || !len.is_multiple_of(elem_size) {
            return Err(ChunkError::Misaligned {
                key: key(),
                offset,
                len,
                elem_size,
            });
        }
        let expected = self.received as u64;
        if offset < expected {
            return Err(ChunkError::Overlap {
                key: key(),
                offset,
                expected,
            });
        }
        if offset > expected {
            return Err(ChunkError::Gap {
                key: key(),
                offset,
                expected,
            });
        }
        let total = header.byte_len();
        if self.received + len > total {
            return Err(ChunkError::Overrun {
                key: key(),
                offset,
                len,
                total,
            });
        }
        Ok(())
    }
}

struct Partial {
    cursor: ChunkCursor,
    segments: Vec<Bytes>,
}

/// Rebuilds whole tensors from the chunks of a stream, in first-seen order.
#[derive(Default)]
pub struct Assembler {
    order: Vec<ParamKey>,
    partials: HashMap<ParamKey, Partial>,
}

impl Assembler {
    /// An assembler with nothing received.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a wire chunk.
    ///
    /// # Errors
    /// Any [`ChunkError`] except `Incomplete` and `EmptyStream`.
    pub fn add_chunk(&mut self, chunk: &v1::TensorChunk) -> Result<(), ChunkError> {
        let header = TensorHeader::from_wire(&chunk.name, chunk.part, chunk.dtype, &chunk.shape)?;
        self.add(header, chunk.offset, chunk.data.clone())
    }

    /// Adds the bytes at `offset` of the tensor described by `header`.
    ///
    /// # Errors
    /// Any [`ChunkError`] except `Incomplete` and `EmptyStream`.
    pub fn add(
        &mut self,
        header: TensorHeader,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ChunkError> {
        let partial = self.partial(&header);
        partial.cursor.advance(&header, offset, data.len())?;
        partial.segments.push(data);
        Ok(())
    }

    /// Adds the bytes at `offset` of the tensor described by `header`, given
    /// as the pieces they arrived in. Pieces are kept as they are; only an
    /// element cut between two pieces is copied, into a piece of its own, so
    /// that every piece holds whole elements.
    ///
    /// Returns the pieces as kept, each of whole elements.
    ///
    /// # Errors
    /// As [`Assembler::add`].
    pub fn add_pieces(
        &mut self,
        header: TensorHeader,
        offset: u64,
        pieces: Vec<Bytes>,
    ) -> Result<&[Bytes], ChunkError> {
        let len = pieces.iter().map(Bytes::len).sum();
        let partial = self.partial(&header);
        partial.cursor.advance(&header, offset, len)?;
        let first = partial.segments.len();
        partial
            .segments
            .extend(whole_elements(pieces, header.dtype.size()));
        Ok(&partial.segments[first..])
    }

    fn partial(&mut self, header: &TensorHeader) -> &mut Partial {
        if !self.partials.contains_key(&header.key) {
            self.order.push(header.key.clone());
        }
        self.partials
            .entry(header.key.clone())
            .or_insert_with(|| Partial {
                cursor: ChunkCursor::new(header.clone()),
                segments: Vec::new(),
            })
    }

    /// Bytes received so far, over all tensors.
    pub fn received_bytes(&self) -> usize {
        self.partials.values().map(|p| p.cursor.received()).sum()
    }

    /// The tensors, in the order their first chunks arrived.
    ///
    /// # Errors
    /// [`ChunkError::EmptyStream`] when nothing arrived, [`ChunkError::Incomplete`] when
    /// a tensor is missing bytes at its end.
    pub fn finish(mut self) -> Result<Vec<(ParamKey, TensorData)>, ChunkError> {
        if self.order.is_empty() {
            return Err(ChunkError::EmptyStream);
        }
        let mut tensors = Vec::with_capacity(self.order.len());
        for key in self.order {
            let partial = self
                .partials
                .remove(&key)
                .expect("every ordered key has a partial");
            let Partial { cursor, segments } = partial;
            cursor.finish()?;
            let header = cursor.header;
            let tensor = TensorData::from_segments(header.dtype, header.shape, segments).map_err(
                |source| ChunkError::Codec {
                    key: key.clone(),
                    source,
                },
            )?;
            tensors.push((key, tensor));
        }
        Ok(tensors)
    }
}

/// `pieces` (whole elements of `size` bytes in all) as pieces that each hold
/// whole elements: an element cut between pieces is copied into a piece of its
/// own, and nothing else is copied.
pub fn whole_elements(pieces: Vec<Bytes>, size: usize) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(pieces.len() * 2);
    let mut straddling: Vec<u8> = Vec::new();
    for mut piece in pieces {
        if !straddling.is_empty() {
            let take = (size - straddling.len()).min(piece.len());
            straddling.extend_from_slice(&piece.split_to(take));
            if straddling.len() < size {
                continue;
            }
            out.push(Bytes::from(std::mem::take(&mut straddling)));
        }
        let tail = piece.len() % size;
        let whole = piece.split_to(piece.len() - tail);
        if !whole.is_empty() {
            out.push(whole);
        }
        straddling.extend_from_slice(&piece);
    }
    if !straddling.is_empty() {
        // Only when the pieces were not whole elements in all; the cursor has
        // refused that already, so this is kept for the length check to see.
        out.push(Bytes::from(straddling));
    }
    out
}

/// Cuts `data` (the bytes of the tensor `header`) into `(offset, bytes)` pieces of at
/// most `chunk_bytes` (rounded down to whole elements, at least one element), without
/// copying. An empty tensor yields one empty piece, so that it is still announced.
pub fn split(header: &TensorHeader, data: &Bytes, chunk_bytes: usize) -> Vec<(u64, Bytes)> {
    let elem_size = header.dtype.size();
    let step = (chunk_bytes / elem_size).max(1) * elem_size;
    if data.is_empty() {
        return vec![(0, Bytes::new())];
    }
    (0..data.len())
        .step_by(step)
        .map(|start| {
            (
                start as u64,
                data.slice(start..(start + step).min(data.len())),
            )
        })
        .collect()
}

/// Cuts a tensor into wire chunks of at most `chunk_bytes` each (see [`split`]).
pub fn to_wire_chunks(
    header: &TensorHeader,
    data: &Bytes,
    chunk_bytes: usize,
) -> Vec<v1::TensorChunk> {
    let shape = crate::codec::wire_shape(&header.shape);
    split(header, data, chunk_bytes)
        .into_iter()
        .map(|(offset, data)| v1::TensorChunk {
            name: header.key.name.clone(),
            part: header.key.part,
            dtype: header.dtype.to_proto(),
            shape: shape.clone(),
            offset,
            data,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::DType;

    /// A chunk as (offset, byte range of the data).
    type Piece = (u64, std::ops::Range<usize>);
    /// Whether an error is the expected one.
    type Check = fn(&ChunkError) -> bool;

    fn header(elements: usize) -> TensorHeader {
        TensorHeader {
            key: ParamKey::new("w", 0),
            dtype: DType::F32,
            shape: vec![elements],
        }
    }

    fn bytes_of(values: &[f32]) -> Bytes {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn pieces_cut_inside_elements_are_mended_and_the_rest_kept_in_place() {
        let values: Vec<f32> = (0..100).map(|i| i as f32 * 0.5).collect();
        let data = bytes_of(&values);
        let cuts = [0, 3, 5, 6, 161, 200, 400];
        let pieces: Vec<Bytes> = cuts.windows(2).map(|w| data.slice(w[0]..w[1])).collect();
        let mut assembler = Assembler::new();
        assembler
            .add_pieces(header(100), 0, pieces.clone())
            .expect("whole elements in all");
        let (_, tensor) = assembler.finish().unwrap().remove(0);
        assert_eq!(tensor.to_f32_vec(), values);
        assert!(tensor.segments().iter().all(|s| s.len() % 4 == 0));
        let shared = tensor
            .segments()
            .iter()
            .any(|s| s.as_ptr() == pieces[4].slice(3..).as_ptr());
        assert!(shared, "the long piece is kept where it arrived");

        let mut assembler = Assembler::new();
        let ragged = vec![data.slice(0..6)];
        assert!(matches!(
            assembler.add_pieces(header(100), 0, ragged),
            Err(ChunkError::Misaligned { len: 6, .. })
        ));
    }

    #[test]
    fn split_then_assemble_round_trips() {
        let values: Vec<f32> = (0..1001).map(|i| i as f32).collect();
        let h = header(values.len());
        let data = bytes_of(&values);
        let pieces = split(&h, &data, 400);
        assert_eq!(pieces.len(), 11, "1001 elements in chunks of 100");
        let mut assembler = Assembler::new();
        for (offset, bytes) in pieces {
            assembler.add(h.clone(), offset, bytes).unwrap();
        }
        let tensors = assembler.finish().unwrap();
        assert_eq!(tensors.len(), 1);
        assert_eq!(tensors[0].1.to_f32_vec(), values);
    }

    #[test]
    fn chunk_size_is_rounded_to_whole_elements() {
        let h = header(10);
        let pieces = split(&h, &bytes_of(&[0.0; 10]), 7);
        assert!(pieces.iter().all(|(_, b)| b.len() == 4));
    }

    #[test]
    fn empty_tensor_is_one_empty_chunk() {
        let h = header(0);
        let pieces = split(&h, &Bytes::new(), 1024);
        assert_eq!(pieces.len(), 1);
        let mut assembler = Assembler::new();
        assembler.add(h, 0, Bytes::new()).unwrap();
        assert!(assembler.finish().unwrap()[0].1.is_empty());
    }

    #[test]
    fn stream_errors_are_detected() {
        let h = header(4);
        let data = bytes_of(&[1.0, 2.0, 3.0, 4.0]);
        let cases: Vec<(&str, Vec<Piece>, Check)> = vec![
            ("ends early", vec![(0, 0..8)], |e| {
                matches!(
                    e,
                    ChunkError::Incomplete {
                        received: 8,
                        total: 16,
                        ..
                    }
                )
            }),
            ("overlap", vec![(0, 0..8), (4, 4..8)], |e| {
                matches!(
                    e,
                    ChunkError::Overlap {
                        offset: 4,
                        expected: 8,
                        ..
                    }
                )
            }),
            ("gap", vec![(0, 0..4), (8, 8..12)], |e| {
                matches!(
                    e,
                    ChunkError::Gap {
                        offset: 8,
                        expected: 4,
                        ..
                    }
                )
            }),
            ("overrun", vec![(0, 0..16), (16, 0..4)], |e| {
                matches!(e, ChunkError::Overrun { .. })
            }),
            ("misaligned", vec![(0, 0..6)], |e| {
                matches!(e, ChunkError::Misaligned { .. })
            }),
        ];
        for (name, chunks, expected) in cases {
            let mut assembler = Assembler::new();
            let outcome = chunks
                .into_iter()
                .try_for_each(|(offset, range)| assembler.add(h.clone(), offset, data.slice(range)))
                .and_then(|()| assembler.finish().map(drop));
            let err = outcome.expect_err(name);
            assert!(expected(&err), "{name}: unexpected {err:?}");
        }
    }

    #[test]
    fn header_change_is_refused() {
        let mut assembler = Assembler::new();
        assembler.add(header(4), 0, bytes_of(&[1.0])).unwrap();
        let err = assembler.add(header(8), 4, bytes_of(&[2.0])).unwrap_err();
        assert!(matches!(err, ChunkError::HeaderChanged { .. }), "{err:?}");
        assert!(err.to_string().contains("[8]"), "{err}");
    }

    #[test]
    fn empty_stream_is_refused() {
        assert_eq!(
            Assembler::new().finish().unwrap_err(),
            ChunkError::EmptyStream
        );
    }

    #[test]
    fn interleaved_tensors_keep_first_seen_order() {
        let a = TensorHeader {
            key: ParamKey::new("a", 0),
            ..header(2)
        };
        let b = TensorHeader {
            key: ParamKey::new("b", 3),
            ..header(2)
        };
        let mut assembler = Assembler::new();
        assembler.add(b.clone(), 0, bytes_of(&[1.0])).unwrap();
        assembler.add(a.clone(), 0, bytes_of(&[5.0])).unwrap();
        assembler.add(b, 4, bytes_of(&[2.0])).unwrap();
        assembler.add(a, 4, bytes_of(&[6.0])).unwrap();
        let tensors = assembler.finish().unwrap();
        assert_eq!(tensors[0].0, ParamKey::new("b", 3));
        assert_eq!(tensors[0].1.to_f32_vec(), vec![1.0, 2.0]);
        assert_eq!(tensors[1].1.to_f32_vec(), vec![5.0, 6.0]);
    }
}
