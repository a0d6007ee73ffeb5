//! gRPC messages cut out of arbitrarily cut HTTP/2 frames, each decoded as a
//! push and a pull chunk with its data left in the frames and as a session
//! request and answer straight out of the frames, checked against prost.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _messages = ps_proto::fuzzing::framed_chunks(data);
});
