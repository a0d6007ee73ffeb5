//! Parameters and a server count from arbitrary bytes, planned.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _taken = ps_proto::fuzzing::placement(data);
});
