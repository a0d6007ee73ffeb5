//! Encoding a `ps.v1.PullChunk` as a gRPC message in two pieces: the few bytes
//! of prefix and small fields, then the chunk's data itself, shared and not
//! copied. tonic's encoder copies every message into one buffer; a pull of a
//! large key sends the stored values as they are.
//!
//! The data field is written last, inside the chunk field written last:
//! protobuf lets fields come in any order, so any decoder reads the same
//! message prost would have written.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use crate::grpc_frames::message_prefix;
use crate::v1;

/// `PullChunk.chunk`.
const PULL_CHUNK_CHUNK: u32 = 1;
/// `TensorChunk.data`.
const TENSOR_CHUNK_DATA: u32 = 6;

/// The gRPC message of `chunk` (whose own `data` is ignored) carrying `data`:
/// a small head, then `data` itself.
pub fn framed_pull_chunk(version: u64, chunk: &v1::TensorChunk, data: Bytes) -> [Bytes; 2] {
    let small = v1::TensorChunk {
        data: Bytes::new(),
        ..chunk.clone()
    };
    let data_head = key_len(TENSOR_CHUNK_DATA) + encoded_len_varint(data.len() as u64);
    let chunk_len = small.encoded_len() + data_head + data.len();
    let outer = v1::PullChunk {
        chunk: None,
        version,
    };
    let message_len = outer.encoded_len()
        + key_len(PULL_CHUNK_CHUNK)
        + encoded_len_varint(chunk_len as u64)
        + chunk_len;
    let mut head = BytesMut::with_capacity(message_len - data.len() + 5);
    head.put_slice(&message_prefix(message_len));
    outer
        .encode(&mut head)
        .expect("the buffer was sized for it");
    encode_key(PULL_CHUNK_CHUNK, WireType::LengthDelimited, &mut head);
    encode_varint(chunk_len as u64, &mut head);
    small
        .encode(&mut head)
        .expect("the buffer was sized for it");
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
            let [head, data] = framed_pull_chunk(version, &chunk, chunk.data.clone());
            prop_assert_eq!(data.as_ptr(), chunk.data.as_ptr(), "the data is not copied");
            let mut reader = MessageReader::new(usize::MAX);
            reader.push(head);
            reader.push(data);
            let message = reader.next_message().unwrap().expect("one whole message");
            let decoded = v1::PullChunk::decode(message.into_pieces().concat().as_slice()).unwrap();
            prop_assert_eq!(decoded, v1::PullChunk { chunk: Some(chunk), version });
            prop_assert_eq!(reader.finish(), Ok(()));
        }
    }
}
