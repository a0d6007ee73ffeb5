//! Decoding a `ps.v1.PushChunk` or `ps.v1.PullChunk` that arrived in several
//! pieces (the HTTP/2 data frames of a stream) without joining them: the
//! chunk's tensor bytes are handed on as the very pieces they arrived in, and
//! only the few small fields around them are copied and decoded by prost.
//!
//! Protobuf's rules hold: fields may come in any order, a repeated message
//! field is merged (decoding the concatenation of its occurrences), a repeated
//! `bytes` field keeps its last value, and unknown fields are skipped.

use bytes::Bytes;
use prost::Message;

use crate::rope::Rope;
use crate::v1;

/// `PushChunk.chunk`.
const PUSH_CHUNK_CHUNK: u64 = 3;
/// `PullChunk.chunk`.
const PULL_CHUNK_CHUNK: u64 = 1;
/// `TensorChunk.data`.
const TENSOR_CHUNK_DATA: u64 = 6;
/// Wire type of length-delimited fields.
const LENGTH_DELIMITED: u64 = 2;

/// Why the bytes of a message are not the chunk message expected.
#[derive(Debug, thiserror::Error)]
pub enum FieldError {
    /// The message ended inside a field.
    #[error("the message ends inside {what}")]
    Truncated {
        /// What was being read.
        what: &'static str,
    },
    /// A varint longer than ten bytes, or past 64 bits.
    #[error("a varint runs past ten bytes or 64 bits")]
    LongVarint,
    /// A wire type protobuf does not have, or a deprecated group.
    #[error("field {tag} has wire type {wire_type}, which ps.v1 messages never use")]
    WireType {
        /// The field's number.
        tag: u64,
        /// The wire type found.
        wire_type: u64,
    },
    /// A message field that appears more than once.
    #[error("field {tag} appears more than once")]
    Repeated {
        /// The field's number.
        tag: u64,
    },
    /// A length that does not fit in memory.
    #[error("field {tag} declares {len} bytes")]
    Length {
        /// The field's number.
        tag: u64,
        /// The length declared.
        len: u64,
    },
    /// The small fields did not decode.
    #[error(transparent)]
    Prost(#[from] prost::DecodeError),
}

/// Decodes a `PushChunk` from `message`: the message with its chunk's `data`
/// left empty, and that data as the pieces it arrived in.
///
/// # Errors
/// [`FieldError`] when the bytes are not a `PushChunk`.
pub fn decode_push_chunk(message: Rope) -> Result<(v1::PushChunk, Vec<Bytes>), FieldError> {
    decode_with_chunk(message, PUSH_CHUNK_CHUNK, |push: &mut v1::PushChunk| {
        &mut push.chunk
    })
}

/// Decodes a `PullChunk` from `message`, as [`decode_push_chunk`] does a
/// `PushChunk`.
///
/// # Errors
/// [`FieldError`] when the bytes are not a `PullChunk`.
pub fn decode_pull_chunk(message: Rope) -> Result<(v1::PullChunk, Vec<Bytes>), FieldError> {
    decode_with_chunk(message, PULL_CHUNK_CHUNK, |pull: &mut v1::PullChunk| {
        &mut pull.chunk
    })
}

/// Decodes a message whose field `chunk_tag` is the `TensorChunk` that
/// `chunk_of` reaches, its data handed on apart.
///
/// Messages this reader does not split exactly as protobuf would (a
/// deprecated group among the fields, or bytes that do not decode) are joined
/// and decoded by prost instead, so that what is taken, and what is refused,
/// is always what prost takes and refuses.
fn decode_with_chunk<M: Message + Default>(
    message: Rope,
    chunk_tag: u64,
    chunk_of: impl Fn(&mut M) -> &mut Option<v1::TensorChunk>,
) -> Result<(M, Vec<Bytes>), FieldError> {
    if let Ok(split) = split_chunk_data(message.clone(), chunk_tag, &chunk_of) {
        return Ok(split);
    }
    let mut decoded = M::decode(message.into_bytes())?;
    let data = chunk_of(&mut decoded)
        .as_mut()
        .map(|chunk| std::mem::take(&mut chunk.data));
    Ok((decoded, data.into_iter().collect()))
}

/// [`decode_with_chunk`]'s way without a copy: every field but the chunk's
/// data decoded by prost, the data left in the pieces it arrived in.
fn split_chunk_data<M: Message + Default>(
    message: Rope,
    chunk_tag: u64,
    chunk_of: impl Fn(&mut M) -> &mut Option<v1::TensorChunk>,
) -> Result<(M, Vec<Bytes>), FieldError> {
    let (rest, mut chunks) = divert_field(message, chunk_tag)?;
    let mut decoded = M::decode(rest.as_slice())?;
    // Protobuf merges a repeated message field, but prost checks each
    // occurrence on its own: several are left to prost.
    if chunks.len() > 1 {
        return Err(FieldError::Repeated { tag: chunk_tag });
    }
    let Some(chunk) = chunks.pop() else {
        return Ok((decoded, Vec::new()));
    };
    let (rest, data) = divert_field(chunk, TENSOR_CHUNK_DATA)?;
    *chunk_of(&mut decoded) = Some(v1::TensorChunk::decode(rest.as_slice())?);
    let data = data.into_iter().last().map(Rope::into_pieces);
    Ok((decoded, data.unwrap_or_default()))
}

/// Splits a message into the raw bytes of every field but `tag` (to be decoded
/// by prost) and each occurrence of the length-delimited field `tag`, uncopied.
fn divert_field(mut message: Rope, tag: u64) -> Result<(Vec<u8>, Vec<Rope>), FieldError> {
    let mut rest = Vec::new();
    let mut diverted = Vec::new();
    while !message.is_empty() {
        let key = read_varint(&mut message, "a field key")?;
        let (field, wire_type) = (key >> 3, key & 7);
        if field == tag && wire_type == LENGTH_DELIMITED {
            let len = read_length(&mut message, field)?;
            let value = message.split_to(len).ok_or(FieldError::Truncated {
                what: "a length-delimited field",
            })?;
            diverted.push(value);
            continue;
        }
        write_varint(key, &mut rest);
        copy_value(&mut message, field, wire_type, &mut rest)?;
    }
    Ok((rest, diverted))
}

/// Copies the value of a field of `wire_type` from `message` to `out`.
fn copy_value(
    message: &mut Rope,
    tag: u64,
    wire_type: u64,
    out: &mut Vec<u8>,
) -> Result<(), FieldError> {
    let fixed = |message: &mut Rope, out: &mut Vec<u8>, n, what| {
        if message.copy_to(n, out) {
            Ok(())
        } else {
            Err(FieldError::Truncated { what })
        }
    };
    match wire_type {
        0 => {
            let value = read_varint(message, "a varint field")?;
            write_varint(value, out);
            Ok(())
        }
        1 => fixed(message, out, 8, "a 64-bit field"),
        LENGTH_DELIMITED => {
            let len = read_length(message, tag)?;
            write_varint(len as u64, out);
            fixed(message, out, len, "a length-delimited field")
        }
        5 => fixed(message, out, 4, "a 32-bit field"),
        wire_type => Err(FieldError::WireType { tag, wire_type }),
    }
}

fn read_length(message: &mut Rope, tag: u64) -> Result<usize, FieldError> {
    let len = read_varint(message, "a field length")?;
    usize::try_from(len).map_err(|_| FieldError::Length { tag, len })
}

/// Reads a base-128 varint as prost does: at most ten bytes, the tenth
/// holding only the 64th bit.
fn read_varint(message: &mut Rope, what: &'static str) -> Result<u64, FieldError> {
    let mut value = 0u64;
    for count in 0..10 {
        let byte = message.read_u8().ok_or(FieldError::Truncated { what })?;
        value |= u64::from(byte & 0x7f) << (count * 7);
        if byte & 0x80 == 0 {
            if count == 9 && byte >= 0x02 {
                return Err(FieldError::LongVarint);
            }
            return Ok(value);
        }
    }
    Err(FieldError::LongVarint)
}

fn write_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn push_chunk(data: Vec<u8>, name: String, shape: Vec<u64>) -> v1::PushChunk {
        v1::PushChunk {
            worker_id: 3,
            step: 77,
            map_version: 9,
            chunk: Some(v1::TensorChunk {
                name,
                part: 2,
                dtype: 1,
                shape,
                offset: 4096,
                data: Bytes::from(data),
            }),
        }
    }

    /// `bytes` cut at each of `cuts` (positions taken modulo its length).
    fn cut(bytes: &[u8], cuts: &[usize]) -> Rope {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        at.extend([0, bytes.len()]);
        at.sort_unstable();
        let whole = Bytes::copy_from_slice(bytes);
        let mut rope = Rope::new();
        for pair in at.windows(2) {
            rope.push(whole.slice(pair[0]..pair[1]));
        }
        rope
    }

    fn decoded(rope: Rope) -> v1::PushChunk {
        let (mut push, data) = decode_push_chunk(rope).expect("a valid PushChunk");
        if let Some(chunk) = &mut push.chunk {
            assert!(chunk.data.is_empty(), "the data is handed on as pieces");
            chunk.data = Bytes::from(data.concat());
        }
        push
    }

    proptest! {
        #[test]
        fn any_cut_decodes_as_prost_does(
            data in proptest::collection::vec(any::<u8>(), 0..3000),
            name in "[a-z.]{0,40}",
            shape in proptest::collection::vec(any::<u64>(), 0..4),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let message = push_chunk(data, name, shape);
            let wire = message.encode_to_vec();
            prop_assert_eq!(decoded(cut(&wire, &cuts)), message);
        }

        #[test]
        fn arbitrary_bytes_decode_as_prost_does_or_are_refused(
            wire in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let ours = decode_push_chunk(cut(&wire, &cuts));
            match v1::PushChunk::decode(wire.as_slice()) {
                Ok(theirs) => {
                    let (mut push, data) = ours.expect("prost decoded it");
                    if let Some(chunk) = &mut push.chunk {
                        chunk.data = Bytes::from(data.concat());
                    }
                    prop_assert_eq!(push, theirs);
                }
                Err(_) => prop_assert!(ours.is_err()),
            }
        }
    }

    #[test]
    fn the_data_stays_in_the_pieces_it_arrived_in() {
        let message = push_chunk(vec![7u8; 1 << 16], "w".into(), vec![1 << 14]);
        let wire = Bytes::from(message.encode_to_vec());
        let mut rope = Rope::new();
        rope.push(wire.slice(..1000));
        rope.push(wire.slice(1000..));
        let (_, data) = decode_push_chunk(rope).expect("a valid PushChunk");
        assert_eq!(data.len(), 2);
        let received = wire.as_ptr_range();
        for piece in &data {
            let inside =
                received.start <= piece.as_ptr() && piece.as_ptr_range().end <= received.end;
            assert!(inside, "each piece points into the received bytes: no copy");
        }
        assert_eq!(data.iter().map(Bytes::len).sum::<usize>(), 1 << 16);
    }

    #[test]
    fn a_pull_chunk_decodes_with_its_data_left_in_place() {
        let message = v1::PullChunk {
            chunk: push_chunk(vec![5u8; 4000], "p".into(), vec![1000]).chunk,
            version: 12,
        };
        let wire = message.encode_to_vec();
        let (mut decoded, data) = decode_pull_chunk(cut(&wire, &[7, 2100])).unwrap();
        assert_eq!(data.len(), 2, "the data arrived in two pieces and stays so");
        if let Some(chunk) = &mut decoded.chunk {
            chunk.data = Bytes::from(data.concat());
        }
        assert_eq!(decoded, message);
    }

    #[test]
    fn a_varint_past_64_bits_is_refused_as_prost_refuses_it() {
        // Field 1 with a ten-byte varint whose last byte sets bits past the
        // 64th. Found by the framed_chunks fuzz target.
        let wire = [
            0x08, 0xff, 0xbc, 0xbc, 0xbc, 0xbc, 0xc0, 0xbc, 0xff, 0xff, 0x77,
        ];
        assert!(v1::PushChunk::decode(&wire[..]).is_err());
        assert!(decode_push_chunk(cut(&wire, &[4])).is_err());
        let mut largest = wire;
        largest[10] = 0x01;
        let theirs = v1::PushChunk::decode(&largest[..]).expect("bit 64 alone is a u64");
        let (ours, _) = decode_push_chunk(cut(&largest, &[4])).expect("taken as prost takes it");
        assert_eq!(ours, theirs);
    }

    #[test]
    fn a_chunk_field_given_twice_is_taken_or_refused_as_prost_does() {
        // The first occurrence alone is cut short, though the two together
        // would decode. Found by the framed_chunks fuzz target.
        let wire = [0x1a, 0x01, 0x5a, 0x1a, 0x01, 0x00];
        assert!(v1::PushChunk::decode(&wire[..]).is_err());
        assert!(decode_push_chunk(cut(&wire, &[2])).is_err());
    }

    #[test]
    fn an_unknown_group_is_skipped_as_prost_skips_it() {
        // Field 8 as a deprecated group holding field 1 = 0: prost skips it.
        // Found by the framed_chunks fuzz target.
        let wire = [0x43, 0x08, 0x00, 0x44];
        let theirs = v1::PushChunk::decode(&wire[..]).expect("prost skips the group");
        let (ours, data) = decode_push_chunk(cut(&wire, &[1, 3])).expect("taken as prost takes it");
        assert_eq!((ours, data.len()), (theirs, 0));

        let mut message = push_chunk(vec![9u8; 64], "g".into(), vec![16]).encode_to_vec();
        message.extend(wire);
        let (mut ours, data) = decode_push_chunk(cut(&message, &[5, 40])).expect("taken");
        if let Some(chunk) = &mut ours.chunk {
            chunk.data = Bytes::from(data.concat());
        }
        assert_eq!(ours, v1::PushChunk::decode(message.as_slice()).unwrap());
    }

    #[test]
    fn repeated_fields_follow_protobuf_merging() {
        let first = push_chunk(vec![1; 8], "a".into(), vec![2]);
        let second = v1::PushChunk {
            chunk: Some(v1::TensorChunk {
                part: 5,
                data: Bytes::from_static(&[2; 4]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut wire = first.encode_to_vec();
        wire.extend(second.encode_to_vec());
        let theirs = v1::PushChunk::decode(wire.as_slice()).expect("valid");
        assert_eq!(decoded(cut(&wire, &[3, 17])), theirs);
        let chunk = theirs.chunk.expect("merged");
        assert_eq!((chunk.part, &chunk.data[..]), (5, &[2u8; 4][..]));
    }
}
