//! A `Tensor` message from arbitrary bytes, decoded and read.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _taken = ps_proto::fuzzing::tensor(data);
});
