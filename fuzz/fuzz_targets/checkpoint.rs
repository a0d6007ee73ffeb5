//! A checkpoint file's bytes, arbitrary, read.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _taken = ps_server::fuzzing::checkpoint(data);
});
