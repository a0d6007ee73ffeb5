//! Property tests of the wire contract, over inputs no hand-written case covers:
//! the tensor codec, the chunk assembler and the placement planner never panic
//! on any input, refuse what is malformed, and round-trip what is well formed.

use bytes::Bytes;
use proptest::prelude::*;
use ps_proto::chunk::{Assembler, split};
use ps_proto::codec::{DType, TensorData, encode_f32};
use ps_proto::header::TensorHeader;
use ps_proto::key::ParamKey;
use ps_proto::placement::{MAX_PART_BYTES, Param, plan};
use ps_proto::v1;

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

fn header(dtype: DType, elements: usize) -> TensorHeader {
    TensorHeader {
        key: ParamKey::new("w", 0),
        dtype,
        shape: vec![elements],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes, shape and dtype number from the wire: a tensor exactly when
    /// the bytes fill the shape, an error otherwise, never a panic.
    #[test]
    fn any_wire_tensor_is_decoded_or_refused(
        data in proptest::collection::vec(any::<u8>(), 0..64),
        shape in proptest::collection::vec(any::<u64>(), 0..4),
        dtype in -2i32..6,
    ) {
        let bytes = Bytes::from(data);
        let tensor = v1::Tensor { name: "w".into(), part: 0, dtype, shape: shape.clone(), data: bytes.clone() };
        if let Ok(decoded) = TensorData::from_proto(&tensor) {
            prop_assert_eq!(decoded.byte_len(), bytes.len());
            prop_assert_eq!(decoded.len() * decoded.dtype().size(), bytes.len());
            let values = decoded.to_f32_vec();
            prop_assert_eq!(values.len(), decoded.len());
            let _ = decoded.first_non_finite();
        }
    }

    /// Encoding then decoding gives the values back: exactly for f32, and as
    /// the half type rounds them for f16 and bf16; unaligned data reads the same.
    #[test]
    fn encoded_values_decode_back(
        values in proptest::collection::vec(any::<f32>(), 0..3000),
        dtype in dtype(),
        misalign in 0usize..4,
    ) {
        let encoded = encode_f32(dtype, &values);
        let mut shifted = vec![0u8; misalign];
        shifted.extend_from_slice(&encoded);
        let unaligned = Bytes::from(shifted).slice(misalign..);
        let tensor = TensorData::new(dtype, vec![values.len()], unaligned).unwrap();
        let decoded = tensor.to_f32_vec();
        let again = encode_f32(dtype, &decoded);
        prop_assert_eq!(again, encoded, "decoding then encoding is the identity on the wire");
        if dtype == DType::F32 {
            let first_bad = values.iter().position(|v| !v.is_finite());
            prop_assert_eq!(tensor.first_non_finite().map(|(i, _)| i), first_bad);
        }
    }

    /// A tensor in segments cut anywhere between elements, at any alignment,
    /// reads the same through its runs (in place) as through decoded blocks,
    /// and every run slices where it is asked to.
    #[test]
    fn runs_read_what_blocks_read_at_any_cut_and_alignment(
        values in proptest::collection::vec(any::<f32>(), 0..2000),
        dtype in dtype(),
        misalign in 0usize..4,
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..5),
    ) {
        let encoded = encode_f32(dtype, &values);
        let mut shifted = vec![0u8; misalign];
        shifted.extend_from_slice(&encoded);
        let buffer = Bytes::from(shifted).slice(misalign..);
        let size = dtype.size();
        let mut ends: Vec<usize> = cuts.iter().map(|c| c.index(values.len() + 1) * size).collect();
        ends.push(buffer.len());
        ends.sort_unstable();
        let mut start = 0;
        let segments: Vec<Bytes> = ends.into_iter().map(|end| {
            let segment = buffer.slice(start..end);
            start = end;
            segment
        }).collect();
        let tensor = TensorData::from_segments(dtype, vec![values.len()], segments).unwrap();
        let mut read = vec![f32::NAN; values.len()];
        let mut halves = vec![f32::NAN; values.len()];
        tensor.for_each_f32_run(|first, run| {
            run.copy_to(&mut read[first..first + run.len()]);
            let mid = run.len() / 2;
            run.slice(0..mid).copy_to(&mut halves[first..first + mid]);
            run.slice(mid..run.len()).copy_to(&mut halves[first + mid..first + run.len()]);
        });
        let blocks = tensor.to_f32_vec();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&read), bits(&blocks));
        prop_assert_eq!(bits(&halves), bits(&blocks));
    }

    /// A tensor cut into chunks of any size and assembled again is the same bytes.
    #[test]
    fn split_then_assembled_round_trips(
        data in proptest::collection::vec(any::<u8>(), 0..4096),
        dtype in dtype(),
        chunk_bytes in 1usize..2048,
    ) {
        let whole = data.len() / dtype.size() * dtype.size();
        let data = Bytes::from(data).slice(..whole);
        let header = header(dtype, whole / dtype.size());
        let mut assembler = Assembler::new();
        for (offset, piece) in split(&header, &data, chunk_bytes) {
            assembler.add(header.clone(), offset, piece).unwrap();
        }
        let mut tensors = assembler.finish().unwrap();
        prop_assert_eq!(tensors.len(), 1);
        let (key, tensor) = tensors.pop().unwrap();
        prop_assert_eq!(key, header.key);
        prop_assert_eq!(tensor.to_contiguous(), data);
    }

    /// Chunks at any offsets and of any lengths: the assembler refuses or
    /// completes, never panics, and what it completes is the chunks in order.
    #[test]
    fn any_chunk_sequence_is_assembled_or_refused(
        elements in 0usize..64,
        chunks in proptest::collection::vec((0u64..300, 0usize..300), 0..8),
    ) {
        let header = header(DType::F32, elements);
        let mut assembler = Assembler::new();
        let mut sent = Vec::new();
        let mut refused = false;
        for (offset, len) in chunks {
            let piece = Bytes::from(vec![offset as u8; len]);
            match assembler.add(header.clone(), offset, piece.clone()) {
                Ok(()) => sent.extend_from_slice(&piece),
                Err(_) => { refused = true; break; }
            }
        }
        if !refused && let Ok(mut tensors) = assembler.finish() {
            let (_, tensor) = tensors.pop().unwrap();
            prop_assert_eq!(tensor.byte_len(), elements * 4);
            prop_assert_eq!(tensor.to_contiguous(), Bytes::from(sent));
        }
    }

    /// The planner places every element of every parameter exactly once, in
    /// contiguous parts numbered from 0, on a server that exists, none above the
    /// part limit unless it is a single element or the tensor is whole on one server.
    #[test]
    fn every_element_is_placed_exactly_once(
        sizes in proptest::collection::vec((0usize..3_000_000, 1usize..5), 1..12),
        servers in 1usize..9,
    ) {
        let params: Vec<Param> = sizes
            .iter()
            .enumerate()
            .map(|(i, &(elements, elem_size))| Param { name: format!("p{i}"), elements, elem_size })
            .collect();
        let assignments = plan(&params, servers, MAX_PART_BYTES);
        for (index, param) in params.iter().enumerate() {
            let mut parts: Vec<_> = assignments.iter().filter(|a| a.param == index).collect();
            parts.sort_by_key(|a| a.part);
            prop_assert!(!parts.is_empty(), "{} has no part", param.name);
            let mut next = 0;
            for (i, part) in parts.iter().enumerate() {
                prop_assert_eq!(part.part as usize, i);
                prop_assert_eq!(part.start, next);
                prop_assert!(part.server < servers);
                if parts.len() > 1 {
                    prop_assert!(part.len * param.elem_size <= MAX_PART_BYTES.max(param.elem_size));
                }
                next += part.len;
            }
            prop_assert_eq!(next, param.elements);
        }
        prop_assert_eq!(plan(&params, servers, MAX_PART_BYTES), assignments, "deterministic");
    }
}
