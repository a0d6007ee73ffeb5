//! Entry points for the fuzzers (`fuzz/`) and the property tests on the
//! worker's side of a session: [`answers`] puts whatever a server could write
//! onto a session's answer ring there and reads it as a worker does. The
//! server is another process: a worker must refuse what it wrote wrong (a
//! length that lies, an arena offset past the arena, a message out of
//! sequence), never panic on it, and never read past the memory it was
//! given: an arena offset is checked against the arena before the copy
//! (`ArenaView::copy_out`), which is what this drives.

use futures::FutureExt;
use ps_proto::v1;

use crate::arena::Arena;
use crate::handshake::in_process_ends_with;
use crate::ring::RingWriter;
use crate::worker_rings;

/// The bytes each ring of a fuzzed session holds.
pub const RING_BYTES: u64 = 64 << 10;

/// The most raw bytes a fuzzer writes onto a ring: less than it holds, so
/// that writing them never waits for the reader.
pub const RAW_BYTES: usize = 60 << 10;

/// The bytes of the server's values arena, whose first 64 KiB hold values,
/// so that an answer may name payloads in it, rightly or not.
const ARENA_BYTES: u64 = 1 << 20;

/// The most bytes of tensors an answer may carry, as a worker's limit.
const PAYLOAD_LIMIT: u64 = 4 << 20;

/// `data` (up to 60 KiB, padded to whole words) written onto a session's
/// answer ring by its server, which hands the worker a values arena, and
/// read by the worker's side (`crate::caller`) answer after answer, each
/// with its lent payloads read whole, until one is refused or the worker
/// waits for words that never come. Returns the answers read whole.
///
/// # Panics
/// Only where this process cannot make a region, or the worker's side
/// panicked on what it read.
pub fn answers(data: &[u8]) -> usize {
    runtime().block_on(async {
        let arena = Arena::create(ARENA_BYTES).expect("this process makes an arena");
        let _values = arena.block(&vec![1.5f32; 16 << 10]);
        let (mut server, worker, _) = in_process_ends_with(RING_BYTES, Some(arena))
            .await
            .expect("this process makes a region for itself");
        let (_requests, answers, _closed) = worker_rings(worker, PAYLOAD_LIMIT);
        server
            .answers
            .write(&ring_words(data))
            .await
            .expect("60 KiB fit the ring");
        server.answers.flush();
        let mut read = 0;
        loop {
            let next = async {
                let (answer, _) = answers.lock().await.next().await.ok()?;
                answer.into_whole().await.ok()
            };
            let answer: Option<v1::SessionAnswer> = tokio::select! {
                answer = next => answer,
                () = reader_sleeps(&server.answers) => None,
            };
            if answer.is_none() {
                return read;
            }
            read += 1;
        }
    })
}

/// `data`'s first [`RAW_BYTES`], padded with zeroes to whole words: what a
/// fuzzer writes onto a ring as it is.
pub fn ring_words(data: &[u8]) -> Vec<u8> {
    let mut words = data[..data.len().min(RAW_BYTES)].to_vec();
    words.resize(words.len().next_multiple_of(8), 0);
    words
}

/// Waits until the reader of `ring` sleeps, wanting words the ring does not
/// hold: a fuzzer driving both ends of a session knows then that the reader
/// has done all it can with what was written.
pub async fn reader_sleeps(ring: &RingWriter) {
    while !ring.reader_sleeps() {
        tokio::task::yield_now().await;
    }
}

/// A runtime for one input: a current thread, with the timers and the
/// sockets a session needs.
///
/// # Panics
/// When the system refuses one.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

/// `answers` as their server writes them onto the ring, each as message 1, 2
/// and so on: the input [`answers`] reads back whole.
///
/// # Panics
/// When the answers do not fit 60 KiB.
pub fn written(answers: Vec<v1::SessionAnswer>) -> Vec<u8> {
    runtime().block_on(async {
        let (mut writer, mut reader, _, _) =
            crate::ring::in_process(RING_BYTES).expect("this process makes a region");
        for (seq, answer) in (1..).zip(answers) {
            // Nobody reads while they are written: a write that waited for
            // room would wait for ever.
            crate::message::write_message(&mut writer, seq, answer)
                .now_or_never()
                .expect("the answers fit the ring")
                .expect("the ring is whole");
        }
        writer.flush();
        let mut bytes = Vec::new();
        while let Some(Ok(word)) = reader.read_word().now_or_never() {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        assert!(bytes.len() <= RAW_BYTES, "the answers fit 60 KiB");
        bytes
    })
}
