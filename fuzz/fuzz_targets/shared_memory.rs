//! Whatever a worker on this host writes onto its shared-memory session's
//! request ring (raw words, or a request that decodes written as a
//! well-formed message), served by the server's own session loop.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _answered = ps_server::fuzzing::shared_memory_session(data);
});
