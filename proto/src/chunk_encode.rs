//! Encoding a `ps.v1.PullChunk` or `ps.v1.PushChunk` as a gRPC message in two
//! pieces: the few bytes of prefix and small fields, then the chunk's data
//! itself, shared and not copied. tonic's encoder copies every message into one
//! buffer; here a pull of a large key sends the stored values as they are, and
//! a push sends the gradient's own bytes.
//!
//! The data field is written last, inside the chunk field written last:
//! protobuf lets fields come in any order, so any decoder reads the same
//! message prost would have written.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use crate::grpc_frames::{PREFIX_BYTES, message_prefix};
use crate::v1;

/// `PullChunk.chunk`.
const PULL_CHUNK_CHUNK: u32 = 1;
/// `PushChunk.chunk`.
const PUSH_CHUNK_CHUNK: u32 = 3;
/// `TensorChunk.data`.
const TENSOR_CHUNK_DATA: u32 = 6;

/// The gRPC message of `message`: a small head, then its chunk's data itself.
pub fn framed_pull_chunk(mut message: v1::PullChunk) -> [Bytes; 2] {
    let chunk = message.chunk.take();
    framed_with_chunk(&message, PULL_CHUNK_CHUNK, chunk)
}

/// The gRPC message of `message`: a small head, then its chunk's data itself.
pub fn framed_push_chunk(mut message: v1::PushChunk) -> [Bytes; 2] {
    let chunk = message.chunk.take();
    framed_with_chunk(&message, PUSH_CHUNK_CHUNK, chunk)
}

/// `message` as one framed gRPC message (for the small ones).
pub fn framed_message(message: &impl Message) -> Bytes {
    let mut framed = BytesMut::with_capacity(PREFIX_BYTES + message.encoded_len());
    framed.put_slice(&message_prefix(message.encoded_len()));
    message.encode(&mut framed).expect("BytesMut grows");
    framed.freeze()
}

/// `outer` (its chunk field left out) with `chunk` written last as field
/// `chunk_tag`, the chunk's data last in it.
fn framed_with_chunk(
    outer: &impl Message,
    chunk_tag: u32,
    chunk: Option<v1::TensorChunk>,
) -> [Bytes; 2] {
    let Some(mut chunk) = chunk else {
        return [framed_message(outer), Bytes::new()];
    };
    let data = std::mem::take(&mut chunk.data);
    let data_head = key_len(TENSOR_CHUNK_DATA) + encoded_len_varint(data.len() as u64);
    let chunk_len = chunk.encoded_len() + data_head + data.len();
    let message_len =
        outer.encoded_len() + key_len(chunk_tag) + encoded_len_varint(chunk_len as u64) + chunk_len;
    let mut head = BytesMut::with_capacity(PREFIX_BYTES + message_len - data.len());
    head.put_slice(&message_prefix(message_len));
    outer.encode(&mut head).expect("BytesMut grows");
    encode_key(chunk_tag, WireType::LengthDelimited, &mut head);
    encode_varint(chunk_len as u64, &mut head);
    chunk.encode(&mut head).expect("BytesMut grows");
    encode_key(TENSOR_CHUNK_DATA, WireType::LengthDelimited, &mut head);
    encode_varint(data.len() as u64, &mut head);
    [head.freeze(), data]
}

/// Bytes of a field key.
fn key_len(tag: u32) -> usize {
    prost::encoding::key_len(tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc_frames::MessageReader;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decodes_as_the_message_prost_writes(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            name in "[a-z.]{0,30}",
            shape in proptest::collection::vec(any::<u64>(), 0..4),
            offset in any::<u64>(),
            version in any::<u64>(),
        ) {
            let chunk = v1::TensorChunk {
                name,
                part: 3,
                dtype: 1,
                shape,
                offset,
                data: Bytes::from(data),
            };
            let message = v1::PullChunk { chunk: Some(chunk.clone()), version };
            let [head, data] = framed_pull_chunk(message.clone());
            prop_assert_eq!(data.as_ptr(), chunk.data.as_ptr(), "the data is not copied");
            let mut reader = MessageReader::new(usize::MAX);
            reader.push(head);
            reader.push(data);
            let received = reader.next_message().unwrap().expect("one whole message");
            let decoded = v1::PullChunk::decode(received.into_pieces().concat().as_slice()).unwrap();
            prop_assert_eq!(decoded, message);
            prop_assert_eq!(reader.finish(), Ok(()));
        }
    }

    #[test]
    fn a_push_chunk_decodes_as_the_message_prost_writes() {
        let message = v1::PushChunk {
            worker_id: 4,
            step: 99,
            map_version: 2,
            chunk: Some(v1::TensorChunk {
                name: "w".into(),
                part: 1,
                dtype: 1,
                shape: vec![3],
                offset: 0,
                data: Bytes::from_static(&[1; 12]),
            }),
        };
        let [head, data] = framed_push_chunk(message.clone());
        assert_eq!(data.len(), 12);
        let wire = [head, data].concat();
        assert_eq!(&wire[..5], &message_prefix(wire.len() - 5));
        assert_eq!(v1::PushChunk::decode(&wire[5..]).unwrap(), message);
    }

    #[test]
    fn a_chunkless_message_is_framed_whole() {
        let message = v1::PullChunk {
            chunk: None,
            version: 7,
        };
        let [head, data] = framed_pull_chunk(message.clone());
        assert!(data.is_empty());
        assert_eq!(&head[..5], &message_prefix(message.encoded_len()));
        assert_eq!(v1::PullChunk::decode(&head[5..]).unwrap(), message);
    }
}
