//! Whatever a server writes onto a shared-memory session's answer ring, read
//! by the worker's side answer after answer, lent payloads and arena offsets
//! included.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _read = ps_shm::fuzzing::answers(data);
});
