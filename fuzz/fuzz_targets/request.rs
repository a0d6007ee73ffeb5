//! A Push, Pull, Register, JoinGroup or Stats request from arbitrary bytes,
//! answered by a fresh server's handlers in-process.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _taken = ps_server::fuzzing::request(data);
});
