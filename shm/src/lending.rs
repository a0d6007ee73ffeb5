//! `Lending`: the server's side of answers whose payloads lie in its
//! values arena ([`crate::arena`]). An answer sends such a payload by its
//! offset, and the payload's bytes (which hold the key's values as they
//! were, copy-on-write) are kept here until the worker says it has copied
//! them (`crate::ring::Released`); the session's reader lets them go
//! before it hands on the next request, so the worker's own next push
//! updates the values in place rather than copying them first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::arena::Arena;
use crate::message::Encoded;
use crate::ring::Released;

/// The most bytes a session's answers may have lent from the arena that
/// its worker has not released yet. Past it, payloads are copied through
/// the ring as before, so a worker that never releases holds at most this
/// much of the server's old values alive.
pub const LENT_LIMIT_BYTES: u64 = 256 << 20;

/// One session's lent payloads.
#[derive(Debug)]
pub(crate) struct Lending {
    arena: Arc<Arena>,
    released: Released,
    /// The most bytes lent and not released ([`LENT_LIMIT_BYTES`]).
    limit: u64,
    held: Mutex<Held>,
    /// Answers held, read without the lock to skip it when there are none.
    answers: AtomicUsize,
}

#[derive(Debug, Default)]
struct Held {
    /// Each answer's sequence number, bytes lent and payloads.
    answers: VecDeque<(u64, u64, Vec<Bytes>)>,
    bytes: u64,
}

impl Lending {
    /// Lending from `arena` up to `limit` bytes at a time, the worker's
    /// releases read from `released`.
    pub(crate) fn new(arena: Arc<Arena>, released: Released, limit: u64) -> Self {
        Self {
            arena,
            released,
            limit,
            held: Mutex::default(),
            answers: AtomicUsize::new(0),
        }
    }

    /// Marks `message`'s payloads that lie in the arena to go by their
    /// offset, within the limit; says how many bytes it marked.
    pub(crate) fn lend(&self, message: &mut Encoded) -> u64 {
        self.let_go();
        let mut room = self.limit.saturating_sub(self.lock().bytes);
        message.lend_from(&self.arena, &mut |len| {
            let fits = len <= room;
            room -= if fits { len } else { 0 };
            fits
        })
    }

    /// Says in `answer` where its pulled values lie in the arena, for the
    /// worker to read them there again ([`crate::message::tell_spots`]).
    pub(crate) fn tell_spots(&self, answer: &mut ps_proto::v1::SessionAnswer) {
        crate::message::tell_spots(answer, &self.arena);
    }

    /// Keeps answer `seq`'s lent payloads, `bytes` in all, until the worker
    /// releases it.
    pub(crate) fn keep(&self, seq: u64, bytes: u64, payloads: Vec<Bytes>) {
        let mut held = self.lock();
        held.answers.push_back((seq, bytes, payloads));
        held.bytes += bytes;
        self.answers.store(held.answers.len(), Ordering::Release);
    }

    /// Lets go of the payloads of every answer the worker has released.
    pub(crate) fn let_go(&self) {
        if self.answers.load(Ordering::Acquire) == 0 {
            return;
        }
        let through = self.released.load();
        let mut held = self.lock();
        while held
            .answers
            .front()
            .is_some_and(|(seq, _, _)| *seq <= through)
        {
            if let Some((_, bytes, _)) = held.answers.pop_front() {
                held.bytes -= bytes;
            }
        }
        self.answers.store(held.answers.len(), Ordering::Release);
    }

    /// Bytes lent and not released.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> u64 {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use ps_proto::v1;

    use super::*;
    use crate::arena::LEND_FROM_BYTES;
    use crate::region::Region;
    use crate::ring::RELEASED_WORD;

    /// A push carrying `payloads` (the tensors' kind does not matter here).
    fn carrying(payloads: Vec<Bytes>) -> Encoded {
        let grads = payloads
            .into_iter()
            .map(|data| v1::Tensor {
                name: "w".to_string(),
                data,
                ..Default::default()
            })
            .collect();
        let push = v1::PushRequest {
            grads,
            ..Default::default()
        };
        Encoded::of(v1::SessionRequest {
            id: 1,
            deadline_ms: 0,
            op: Some(v1::session_request::Op::Push(push)),
        })
    }

    /// Past the limit, payloads are not lent; once the worker releases an
    /// answer, its bytes are let go and lending goes on.
    #[test]
    fn lending_stops_at_its_limit_and_goes_on_once_the_worker_releases() {
        let arena = Arena::create(1 << 20).unwrap();
        let values = vec![1.0f32; LEND_FROM_BYTES / 4];
        let bytes = || crate::arena::shared_bytes(Arc::new(arena.block(&values).unwrap()));
        let region = Arc::new(Region::create(4096).unwrap());
        let released = Released::of(Arc::clone(&region));
        let lending = Lending::new(Arc::clone(&arena), released, LEND_FROM_BYTES as u64 * 3 / 2);
        let one = LEND_FROM_BYTES as u64;

        let mut first = carrying(vec![Bytes::from(vec![0u8; 1 << 17]), bytes(), bytes()]);
        assert_eq!(
            lending.lend(&mut first),
            one,
            "one fits, the heap's never lends"
        );
        lending.keep(1, one, first.lent_payloads());
        let mut second = carrying(vec![bytes()]);
        assert_eq!(lending.lend(&mut second), 0, "the limit is reached");

        region.words()[RELEASED_WORD].store(1, std::sync::atomic::Ordering::Release);
        let mut third = carrying(vec![bytes()]);
        assert_eq!(lending.lend(&mut third), one, "released, so there is room");
        assert_eq!(lending.held_bytes(), 0, "answer 1 let go");
    }
}
