//! [`Answer`] and [`LentPayloads`]: a session answer as the worker receives
//! it, its large payloads still on the ring and lent to the request that
//! waits for them, so they are copied once, from the ring straight into the
//! caller's own memory (a pulled parameter's buffer), instead of into a
//! payload buffer first and from there into the parameter.
//!
//! The payloads hold the answer ring ([`crate::caller::AnswerRing`]): the
//! ring holds one message after another, and the next answer starts where
//! these payloads end. So the session's next answer is read only once the
//! borrower lets go of them: a borrower must never wait for another answer
//! of the same session while it holds them. Whatever the borrower has not
//! read when it lets go (dropped, read in part, or a read cut off midway by
//! its future being dropped) the ring's next reader reads past; only a ring
//! that failed ends the session.
//!
//! A payload that lies in the server's values arena ([`crate::arena`]) is
//! copied from there; once the payloads drop, the server is told it may let
//! those values go (`crate::ring::Released`).

use bytes::Bytes;
use ps_proto::v1;
use tokio::sync::OwnedMutexGuard;
use tonic::Status;

use std::sync::Arc;

use crate::arena::ArenaView;
use crate::caller::Reading;
use crate::message::{IN_ARENA, Payloads, copy_from_arena, payload_len, ring_words};
use crate::ring::RingError;

/// Answers whose payloads come to at least this many bytes are lent to the
/// request; smaller ones are read into payload buffers by whoever reads the
/// ring, where a second small copy costs less than lending the ring to the
/// request and taking it back.
pub const LEND_AT_BYTES: u64 = 256 << 10;

/// A session answer as the worker receives it.
#[derive(Debug)]
pub struct Answer {
    /// The answer; its tensors' bytes empty when they are `lent`.
    pub message: v1::SessionAnswer,
    /// Its payloads, still on the ring; `None` when they are in `message`
    /// (small, or arrived over gRPC).
    pub lent: Option<LentPayloads>,
}

impl Answer {
    /// An answer whose payloads are in it.
    pub fn whole(message: v1::SessionAnswer) -> Self {
        Self {
            message,
            lent: None,
        }
    }

    /// The answer with any lent payloads read into buffers and put back into
    /// its tensors.
    ///
    /// # Errors
    /// `UNAVAILABLE`: the ring failed while the payloads were read.
    pub async fn into_whole(self) -> Result<v1::SessionAnswer, Status> {
        let Some(lent) = self.lent else {
            return Ok(self.message);
        };
        let mut message = self.message;
        message.put_payloads(lent.read_all().await?);
        Ok(message)
    }
}

/// An answer's payloads, in order, still on the ring; the ring is held
/// ([`crate::caller::AnswerRing`]) until they drop.
pub struct LentPayloads {
    reading: OwnedMutexGuard<Reading>,
    /// The payloads' length words ([`IN_ARENA`] set on those in the arena).
    lens: Vec<u64>,
    arena: Option<Arc<ArenaView>>,
    /// The answer's sequence number, when payloads of it lie in the arena:
    /// released when these drop.
    releases: Option<u64>,
    next: usize,
    /// While a read is under way: where the ring stood when it began.
    reading_from: Option<u64>,
    broken: bool,
}

impl std::fmt::Debug for LentPayloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentPayloads")
            .field("lens", &self.lens)
            .field("next", &self.next)
            .field("reading_from", &self.reading_from)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl LentPayloads {
    /// Payloads of answer `seq` with length words `lens` on the ring
    /// `reading` holds, which it holds until they drop; those in the arena
    /// lie in `arena`.
    pub(crate) fn new(
        reading: OwnedMutexGuard<Reading>,
        seq: u64,
        (lens, arena): (Vec<u64>, Option<Arc<ArenaView>>),
    ) -> Self {
        let releases = lens.iter().any(|len| len & IN_ARENA != 0).then_some(seq);
        Self {
            reading,
            lens,
            arena,
            releases,
            next: 0,
            reading_from: None,
            broken: false,
        }
    }

    /// The length in bytes of the next payload; `None` after the last.
    pub fn next_len(&self) -> Option<u64> {
        self.lens.get(self.next).copied().map(payload_len)
    }

    /// Whether the next payload lies in the server's values arena, to be
    /// copied from there rather than off the ring.
    pub fn next_in_arena(&self) -> bool {
        self.lens
            .get(self.next)
            .is_some_and(|len| len & IN_ARENA != 0)
    }

    /// Reads the next payload into `into`, which must be its length.
    ///
    /// # Errors
    /// `INTERNAL` when no payload is left or `into` is not its length (the
    /// ring is untouched); `UNAVAILABLE` when the ring failed (the session
    /// then ends).
    pub async fn read_next(&mut self, into: &mut [u8]) -> Result<(), Status> {
        match self.next_len() {
            Some(len) if len == into.len() as u64 => {}
            Some(len) => {
                return Err(Status::internal(format!(
                    "a payload of {len} bytes read into {} bytes",
                    into.len()
                )));
            }
            None => return Err(Status::internal("no payload is left to read")),
        }
        let ring = &mut self.reading.ring;
        // Cut off at one of the read's awaits (the borrower's future
        // dropped), the ring has read exactly up to its position; `Drop`
        // hands the rest of this payload back to be read past.
        self.reading_from = Some(ring.position());
        let read = match self.lens[self.next] & IN_ARENA {
            0 => ring.read(into).await,
            _ => copy_from_arena(ring, self.arena.as_deref(), into).await,
        };
        if let Err(error) = read {
            self.broken = true;
            return Err(broke(error));
        }
        self.reading_from = None;
        self.next += 1;
        Ok(())
    }

    /// Reads the next payload into a buffer of its own.
    ///
    /// # Errors
    /// As [`LentPayloads::read_next`].
    pub async fn read_next_whole(&mut self) -> Result<Bytes, Status> {
        let len = self
            .next_len()
            .ok_or_else(|| Status::internal("no payload is left to read"))?;
        let pool = self.reading.pool.clone();
        let mut buffer = pool.take(len as usize);
        self.read_next(&mut buffer).await?;
        Ok(pool.bytes(buffer, None))
    }

    /// Reads every payload left, each into a buffer of its own.
    ///
    /// # Errors
    /// As [`LentPayloads::read_next`].
    pub async fn read_all(mut self) -> Result<Vec<Bytes>, Status> {
        let mut payloads = Vec::with_capacity(self.lens.len() - self.next);
        while self.next_len().is_some() {
            payloads.push(self.read_next_whole().await?);
        }
        Ok(payloads)
    }
}

impl Drop for LentPayloads {
    /// Leaves the ring to the next reader: where these payloads end, for it
    /// to read past what was not read, and whether a read failed.
    fn drop(&mut self) {
        let unread: u64 = self
            .lens
            .iter()
            .skip(self.next)
            .copied()
            .map(ring_words)
            .sum();
        // A read cut off midway counts its payload among the unread: take
        // off the words it did read.
        let position = self.reading.ring.position();
        let read = self.reading_from.map_or(0, |from| position - from);
        self.reading.skip_to = position + unread - read;
        if let Some(seq) = self.releases {
            self.reading.released.store(seq);
        }
        if self.broken {
            self.reading
                .broken
                .get_or_insert_with(|| "a lent payload's read failed".to_string());
            self.reading.ending.end();
        }
    }
}

fn broke(error: RingError) -> Status {
    Status::unavailable(format!("the shared-memory session broke: {error}"))
}
