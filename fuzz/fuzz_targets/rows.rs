//! A PushRows, PullRows or DeclareTable request from arbitrary bytes (the row
//! decoder: ids, rows, buckets), answered by a fresh server's handlers in-process.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _taken = ps_server::fuzzing::rows(data);
});
