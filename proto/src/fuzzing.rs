//! Entry points for the fuzzers (`fuzz/`): each takes arbitrary bytes, drives
//! the real decoding code with them, and panics only when that code breaks one
//! of its own promises. A malformed input must be refused, never panic.

use bytes::Bytes;
use prost::Message;

use crate::chunk::Assembler;
use crate::chunk_decode::{decode_pull_chunk, decode_push_chunk};
use crate::codec::TensorData;
use crate::grpc_frames::MessageReader;
use crate::placement::{Param, plan};
use crate::rope::Rope;
use crate::v1;

/// A `Tensor` message decoded from `data`: either refused, or a tensor whose
/// bytes fill its shape, every element of which can be read, the same in place
/// (`for_each_f32_run`) as decoded. True when taken.
pub fn tensor(data: &[u8]) -> bool {
    let Ok(message) = v1::Tensor::decode(data) else {
        return false;
    };
    let Ok(tensor) = TensorData::from_proto(&message) else {
        return false;
    };
    assert_eq!(tensor.byte_len(), message.data.len());
    assert_eq!(tensor.len() * tensor.dtype().size(), tensor.byte_len());
    let decoded = tensor.to_f32_vec();
    assert_eq!(decoded.len(), tensor.len());
    let mut in_place = vec![0f32; tensor.len()];
    tensor.for_each_f32_run(|first, run| run.copy_to(&mut in_place[first..first + run.len()]));
    let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&in_place),
        bits(&decoded),
        "runs read what blocks decode"
    );
    if let Some((index, value)) = tensor.first_non_finite() {
        assert!(index < tensor.len() && !value.is_finite());
    }
    true
}

/// A stream of `TensorChunk`s (length-delimited, as many as `data` holds) fed to
/// the assembler: refused, or tensors of exactly the bytes the chunks carried.
/// True when assembled.
pub fn chunk_stream(data: &[u8]) -> bool {
    let mut data = Bytes::copy_from_slice(data);
    let mut assembler = Assembler::new();
    let mut carried = 0;
    while let Ok(chunk) = v1::TensorChunk::decode_length_delimited(&mut data) {
        if assembler.add_chunk(&chunk).is_err() {
            return false;
        }
        carried += chunk.data.len();
        assert_eq!(assembler.received_bytes(), carried);
    }
    let Ok(tensors) = assembler.finish() else {
        return false;
    };
    let assembled: usize = tensors.iter().map(|(_, t)| t.byte_len()).sum();
    assert_eq!(assembled, carried);
    true
}

/// gRPC messages cut out of `data` (its first byte sets where the HTTP/2
/// frames are cut) and each decoded as a `PushChunk` and a `PullChunk` with
/// the data left in the frames, and as a `SessionRequest` and a
/// `SessionAnswer` straight out of the frames (as a session reads them): each
/// decodes exactly as prost decodes the joined bytes, or is refused where
/// prost refuses them. The number of messages read.
pub fn framed_chunks(data: &[u8]) -> usize {
    let Some((&cut, wire)) = data.split_first() else {
        return 0;
    };
    let wire = Bytes::copy_from_slice(wire);
    let step = usize::from(cut) + 1;
    let mut reader = MessageReader::new(1 << 20);
    let mut messages = 0;
    for start in (0..wire.len()).step_by(step) {
        reader.push(wire.slice(start..(start + step).min(wire.len())));
        loop {
            match reader.next_message() {
                Ok(Some(message)) => {
                    decodes_in_place_as_joined::<v1::SessionRequest>(&message);
                    decodes_in_place_as_joined::<v1::SessionAnswer>(&message);
                    agrees_with_prost(message.clone(), decode_push_chunk, |m, data| {
                        if let Some(chunk) = m.chunk.as_mut() {
                            chunk.data = data;
                        }
                    });
                    agrees_with_prost(message, decode_pull_chunk, |m, data| {
                        if let Some(chunk) = m.chunk.as_mut() {
                            chunk.data = data;
                        }
                    });
                    messages += 1;
                }
                Ok(None) => break,
                Err(_) => return messages,
            }
        }
    }
    messages
}

/// Checks prost decoding `M` out of `message`'s pieces (`Rope` as a `Buf`)
/// against prost on its joined bytes.
fn decodes_in_place_as_joined<M: Message + Default + PartialEq + std::fmt::Debug>(message: &Rope) {
    let joined = message.clone().into_pieces().concat();
    match (M::decode(message.clone()), M::decode(joined.as_slice())) {
        (Ok(ours), Ok(theirs)) => assert_eq!(ours, theirs, "decoded in place, it differs"),
        (Err(_), Err(_)) => {}
        (Ok(_), Err(_)) => panic!("decoded in place, it took bytes prost refuses"),
        (Err(_), Ok(_)) => panic!("decoded in place, it refused bytes prost takes"),
    }
}

/// Checks `decode` on `message` against prost on its joined bytes, putting
/// the data pieces back in place with `put_data`.
fn agrees_with_prost<M: Message + Default + PartialEq + std::fmt::Debug, E>(
    message: Rope,
    decode: impl Fn(Rope) -> Result<(M, Vec<Bytes>), E>,
    put_data: impl Fn(&mut M, Bytes),
) {
    let joined = message.clone().into_pieces().concat();
    match (decode(message), M::decode(joined.as_slice())) {
        (Ok((mut ours, data)), Ok(theirs)) => {
            put_data(&mut ours, Bytes::from(data.concat()));
            assert_eq!(ours, theirs, "the framed decode differs from prost's");
        }
        (Err(_), Err(_)) => {}
        (Ok(_), Err(_)) => panic!("the framed decode took bytes prost refuses"),
        (Err(_), Ok(_)) => panic!("the framed decode refused bytes prost takes"),
    }
}

/// Parameters and a server count read from `data`, planned: every element of
/// every parameter is placed exactly once, on a server that exists. The number
/// of parameters planned.
pub fn placement(data: &[u8]) -> usize {
    let Some((&servers, rest)) = data.split_first() else {
        return 0;
    };
    let servers = usize::from(servers % 64) + 1;
    // Up to 64 parameters of up to a million elements: past that a plan takes
    // longer than a fuzzer can wait, and tells nothing new.
    let params: Vec<Param> = rest
        .chunks_exact(3)
        .take(64)
        .enumerate()
        .map(|(i, bytes)| Param {
            name: format!("p{i}"),
            elements: usize::from(u16::from_le_bytes([bytes[0], bytes[1]])) * 16,
            elem_size: usize::from(bytes[2] % 4) + 1,
        })
        .collect();
    let max_part_bytes = (usize::from(rest.first().copied().unwrap_or(0)) + 1) << 16;
    let assignments = plan(&params, servers, max_part_bytes);
    for (index, param) in params.iter().enumerate() {
        let mut parts: Vec<_> = assignments.iter().filter(|a| a.param == index).collect();
        parts.sort_by_key(|a| a.part);
        assert!(!parts.is_empty(), "{} has no part", param.name);
        let mut next = 0;
        for (i, part) in parts.iter().enumerate() {
            assert_eq!(part.part as usize, i);
            assert_eq!(part.start, next);
            assert!(part.server < servers);
            next += part.len;
        }
        assert_eq!(next, param.elements, "{} is placed whole", param.name);
    }
    params.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk_encode::framed_push_chunk;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            framed_chunks(&data);
        }

        #[test]
        fn framed_pushes_are_read_back_whatever_the_cut(
            cut in any::<u8>(),
            data in proptest::collection::vec(any::<u8>(), 0..600),
            count in 1usize..4,
        ) {
            let message = v1::PushChunk {
                worker_id: 1,
                step: 2,
                map_version: 3,
                chunk: Some(v1::TensorChunk {
                    name: "w".into(),
                    data: Bytes::from(data),
                    ..Default::default()
                }),
            };
            let mut input = vec![cut];
            for _ in 0..count {
                input.extend(framed_push_chunk(message.clone()).concat());
            }
            prop_assert_eq!(framed_chunks(&input), count);
        }
    }

    proptest! {
        #[test]
        fn framed_session_answers_are_read_back_whatever_the_cut(
            cut in any::<u8>(),
            rows in 0usize..70_000,
        ) {
            let answer = v1::SessionAnswer {
                id: 9,
                outcome: Some(v1::session_answer::Outcome::PullRows(v1::PullRowsResponse {
                    blocks: vec![v1::PulledRows { bucket: 2, version: 5 }],
                    rows: Bytes::from(vec![7; rows]),
                })),
                pull_waited_us: 1,
            };
            let mut input = vec![cut];
            input.extend(crate::session_frames::framed_session_answer(answer).concat());
            prop_assert_eq!(framed_chunks(&input), 1);
        }
    }

    #[test]
    fn well_formed_inputs_reach_the_code_under_test() {
        let message = v1::Tensor {
            name: "w".into(),
            dtype: v1::DType::DtypeF32 as i32,
            shape: vec![2],
            data: Bytes::from_static(&[0, 0, 128, 63, 0, 0, 128, 127]),
            ..v1::Tensor::default()
        };
        assert!(tensor(&message.encode_to_vec()));
        assert!(!tensor(&[0x1a, 0xff]), "a cut-off message is refused");
        let chunk = v1::TensorChunk {
            name: "w".into(),
            dtype: v1::DType::DtypeF32 as i32,
            shape: vec![1],
            offset: 0,
            data: Bytes::from_static(&[0, 0, 128, 63]),
            ..v1::TensorChunk::default()
        };
        assert!(chunk_stream(&chunk.encode_length_delimited_to_vec()));
        assert!(!chunk_stream(&[]), "an empty stream is refused");
        assert_eq!(placement(&[3, 1, 2, 3, 1, 0, 9, 9]), 2);
    }
}
