//! A stream of `TensorChunk`s from arbitrary bytes, assembled.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _taken = ps_proto::fuzzing::chunk_stream(data);
});
