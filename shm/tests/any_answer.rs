//! Whatever a server writes onto a session's answer ring, read by the
//! worker's side (`ps_shm::fuzzing::answers`, which the fuzzer drives too):
//! well-formed answers, pulled values in the arena among them, are read back
//! whole; any other words are refused or waited on, never a panic.

use bytes::Bytes;
use proptest::prelude::*;
use ps_proto::v1;
use ps_shm::fuzzing::{answers, written};

/// The answer to request `id`: a pull of `values`' bytes (whole f32s).
fn pulled(id: u64, values: &[u8]) -> v1::SessionAnswer {
    let values = &values[..values.len() / 4 * 4];
    v1::SessionAnswer {
        id,
        outcome: Some(v1::session_answer::Outcome::Pull(v1::PullResponse {
            tensors: vec![v1::PulledTensor {
                version: 1,
                arena: None,
                tensor: Some(v1::Tensor {
                    name: "w".into(),
                    part: 0,
                    dtype: v1::DType::DtypeF32 as i32,
                    shape: vec![values.len() as u64 / 4],
                    data: Bytes::copy_from_slice(values),
                }),
            }],
        })),
        pull_waited_us: 0,
    }
}

#[test]
fn answers_written_whole_are_read_whole_and_a_torn_one_is_not() {
    let sent: Vec<_> = (1..=3).map(|id| pulled(id, &[id as u8; 1000])).collect();
    let bytes = written(sent);
    assert_eq!(answers(&bytes), 3);
    // The third cut short: the worker waits for the rest, reading none of it.
    assert_eq!(answers(&bytes[..bytes.len() - 8]), 2);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_words_on_the_answer_ring_are_refused_or_read_never_a_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let _read = answers(&bytes);
    }

    #[test]
    fn a_well_formed_answer_followed_by_any_words_is_read(
        values in proptest::collection::vec(any::<u8>(), 0..2000),
        rest in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut bytes = written(vec![pulled(1, &values)]);
        bytes.extend_from_slice(&rest);
        prop_assert!(answers(&bytes) >= 1);
    }
}
