//! Running a session over a region as streams: [`serve_link`] (the server's
//! side) turns the rings into the same request and answer streams a gRPC
//! `Session` stream gives, so the server answers with the one session loop;
//! [`worker_link`] does the same for a worker, over the worker's rings
//! ([`crate::caller`], which a client drives from its requests themselves).
//!
//! The server's side runs a reader task (ring to stream) and a writer task
//! (channel to ring), which sends the payloads that lie in the values arena
//! by their offset ([`crate::lending`]), watched over by a third that holds
//! the socket: when the
//! socket closes (the other process ended, crashed included), when a ring or
//! message is corrupt, or when this side's session ends, all three stop and
//! the socket closes, which the other side sees in turn. A message only half
//! written when its writer died is never handed on. [`worker_link`]'s reader
//! hands a large answer on with its payloads still on the ring
//! ([`crate::lent`]) and reads on once they are dropped, past whatever was
//! left unread.

use std::future::Future;
use std::sync::Arc;

use ps_proto::codec::{DType, exponent_bits};
use ps_proto::header::TensorHeader;
use ps_proto::refusal::refusal_of;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::caller::{AnswerRing, RequestRing, worker_rings};
use crate::copy::Mark;
use crate::handshake::{ServerEnd, WorkerEnd};
use crate::lending::{LENT_LIMIT_BYTES, Lending};
use crate::lent::Answer;
use crate::message::{Encoded, MessageError, gradient_headers, read_head};
use crate::pool::{BufferPool, Hold};
use crate::ring::{RingReader, RingWriter};

/// Messages either side's channels hold ahead of the rings.
const AHEAD: usize = 64;

/// The most payload bytes a server's session holds read off its ring and not
/// yet let go of, but for one request larger than this, which is read alone
/// (so the bound is this or the largest request `Charger` admits); with the
/// payload buffers the pool keeps, it bounds a session's memory beyond its
/// region.
///
/// One MiB: a request of this size or more is applied before the next one's
/// payloads are copied, so its gradient is still in cache when the optimizer
/// reads it. Reading up to 32 MiB ahead, a 1 MiB push was applied after seven
/// others had passed through the cache, and ran at 0.75-0.81 of the
/// copy-then-SGD floor against 0.89-0.91 with this bound; 16 MiB pushes and
/// 4 KiB operations did not slow (docs/benchmarks.md, "A session's read-ahead
/// cut to 1 MiB").
pub const AHEAD_BYTES: u64 = 1 << 20;

/// Admits a request carrying `bytes` of payloads before they are read (what
/// it returns, such as a memory charge, is held until they are dropped), or
/// says why not (the request is then read past and refused).
pub type Charger = Arc<dyn Fn(u64) -> Result<Hold, String> + Send + Sync>;

/// A request carrying at least this many bytes of gradients has them tested
/// for NaN and infinity as they are copied off the ring (its [`Checker`]
/// shown any piece holding one); a smaller one is still in cache when its
/// server scans it whole.
pub const SCAN_FROM_BYTES: u64 = 1 << 20;

/// Refuses a request whose gradient holds a NaN or an infinity, found as
/// its bytes were copied off the ring, in the same pass ([`crate::copy`]):
/// it is given the gradient's header (a header that does not parse is not
/// tested, and is left to the push's own checks), the offset in its bytes of
/// the piece that holds one, and that piece, still in cache. An `Err`
/// refuses the request with that status; its payloads are still read to
/// their end, so the ring stays aligned, and the session goes on. The pieces
/// tested are the server's own copies: the worker cannot change them
/// afterwards.
pub type Checker = Arc<dyn Fn(&TensorHeader, u64, &[u8]) -> Result<(), Status> + Send + Sync>;

/// The server's side of a session: the requests read from the region, and
/// where to send the answers (an `Err` ends the session).
pub struct ServerLink {
    /// The worker's requests, in order; an `Err` when the region failed.
    pub requests: ReceiverStream<Result<v1::SessionRequest, Status>>,
    /// The answers to write.
    pub answers: mpsc::Sender<Result<v1::SessionAnswer, Status>>,
    /// Requests carrying at least this many bytes of gradients were tested
    /// for NaN and infinity as they were read, and refused through the
    /// session's [`Checker`] ([`SCAN_FROM_BYTES`]; `None` without one).
    pub checked_from: Option<u64>,
}

/// The worker's side of a session.
pub struct WorkerLink {
    /// The requests to write.
    pub requests: mpsc::Sender<v1::SessionRequest>,
    /// The server's answers, large payloads lent ([`crate::lent`]); an `Err`
    /// (`UNAVAILABLE`) when the session ended.
    pub answers: ReceiverStream<Result<Answer, Status>>,
}

/// Starts the server's side of the session `end`, each request's payloads
/// admitted by `charge` and read into buffers of `pool` (which the server's
/// sessions share); `stop` ends it early.
pub fn serve_link(
    end: ServerEnd,
    (charge, check): (Charger, Option<Checker>),
    pool: BufferPool,
    stop: impl Future<Output = ()> + Send + 'static,
) -> ServerLink {
    let (requests_in, requests) = mpsc::channel(AHEAD);
    let (answers, answers_out) = mpsc::channel::<Result<v1::SessionAnswer, Status>>(AHEAD);
    let peer = end.peer_pid;
    let checked_from = check.as_ref().map(|_| SCAN_FROM_BYTES);
    let released = end.requests.released();
    let lending = end
        .arena
        .map(|arena| Arc::new(Lending::new(arena, released, LENT_LIMIT_BYTES)));
    let reader = read_requests(
        end.requests,
        requests_in,
        answers.downgrade(),
        (charge, check, pool, lending.clone()),
    );
    let writer = write_answers(end.answers, answers_out, lending);
    tokio::spawn(async move {
        let why = watch(end.socket, reader, writer, stop).await;
        tracing::debug!(?peer, why, "a shared-memory session ended");
    });
    ServerLink {
        requests: ReceiverStream::new(requests),
        answers,
        checked_from,
    }
}

/// Starts the worker's side of the session `end`, taking answers whose
/// tensors carry up to `payload_limit` bytes, as a stream.
pub fn worker_link(end: WorkerEnd, payload_limit: u64) -> WorkerLink {
    let (requests, requests_out) = mpsc::channel(AHEAD);
    let (answers_in, answers) = mpsc::channel(AHEAD);
    let (request_ring, answer_ring, closed) = worker_rings(end, payload_limit);
    let reader = forward_answers(answer_ring, answers_in.clone());
    let writer = forward_requests(requests_out, request_ring);
    tokio::spawn(async move {
        let why = tokio::select! {
            why = reader => why,
            why = writer => why,
            why = closed.wait() => why,
        };
        let status = Status::unavailable(format!(
            "the shared-memory session ended ({why}); a new one is opened for the next request"
        ));
        let _ = answers_in.send(Err(status)).await;
    });
    WorkerLink {
        requests,
        answers: ReceiverStream::new(answers),
    }
}

/// Reads requests from `ring` into `into` until either fails. A request's
/// payloads are read only once they fit the session's read-ahead
/// ([`AHEAD_BYTES`]) and `charge` admits them; a request `charge` refuses is
/// answered on `answers` with `RESOURCE_EXHAUSTED`, and one `check` refuses
/// with its status (the session goes on either way); a failed read ends the
/// session. `answers` is weak: the session ends when its loop lets go of the
/// answers, not when this reader does. Before a request is handed on, the
/// lent payloads the worker released are let go, so that a push right after
/// the worker's pull of the same key finds its values held by nobody else.
async fn read_requests(
    mut ring: RingReader,
    into: mpsc::Sender<Result<v1::SessionRequest, Status>>,
    answers: mpsc::WeakSender<Result<v1::SessionAnswer, Status>>,
    (charge, check, pool, lending): (Charger, Option<Checker>, BufferPool, Option<Arc<Lending>>),
) -> &'static str {
    let mut seq = 1;
    let ahead = Arc::new(Semaphore::new(AHEAD_BYTES as usize));
    let admit = (&charge, check.as_ref());
    loop {
        let read = read_request(&mut ring, seq, &pool, &ahead, admit).await;
        if let Some(lending) = &lending {
            lending.let_go();
        }
        let sent = match read {
            Ok(Ok(request)) => into.send(Ok(request)).await.is_ok(),
            Ok(Err((request, status))) => {
                // Its payloads, read-ahead and charge go before the answer
                // waits for room.
                let id = request.id;
                drop(request);
                let refusal = v1::SessionAnswer {
                    id,
                    outcome: Some(Outcome::Refusal(refusal_of(&status))),
                    pull_waited_us: 0,
                };
                match answers.upgrade() {
                    Some(answers) => answers.send(Ok(refusal)).await.is_ok(),
                    None => false,
                }
            }
            Err(error) => {
                return ended(error, &into, |e| {
                    Status::invalid_argument(format!("the shared-memory session broke: {e}"))
                })
                .await;
            }
        };
        if !sent {
            return "this side's session ended";
        }
        seq += 1;
    }
}

/// A request read off the ring, or the request and the status it is refused
/// with (its payloads read past, or read and dropped).
type Admitted = Result<v1::SessionRequest, (v1::SessionRequest, Status)>;

/// Reads request `seq`, its payloads holding a share of `ahead` and what
/// `charge` returned until the last of them drops, its gradients tested for
/// NaN and infinity as they are copied, any piece holding one given to
/// `check` (when given, and the request carries at least
/// [`SCAN_FROM_BYTES`]).
async fn read_request(
    ring: &mut RingReader,
    seq: u64,
    pool: &BufferPool,
    ahead: &Arc<Semaphore>,
    (charge, check): (&Charger, Option<&Checker>),
) -> Result<Admitted, MessageError> {
    let head = read_head::<v1::SessionRequest>(ring, seq, None).await?;
    let bytes = head.payload_bytes();
    if bytes == 0 {
        return Ok(Ok(head.read_payloads(ring, pool, None).await?));
    }
    let share = bytes.min(AHEAD_BYTES) as u32;
    let Ok(read_ahead) = Arc::clone(ahead).acquire_many_owned(share).await else {
        unreachable!("the read-ahead semaphore is never closed");
    };
    let hold: Hold = match charge(bytes) {
        Ok(charged) => Arc::new((read_ahead, charged)),
        Err(why) => {
            return Ok(Err((
                head.skip(ring).await?,
                Status::resource_exhausted(why),
            )));
        }
    };
    let Some(check) = check.filter(|_| bytes >= SCAN_FROM_BYTES) else {
        return Ok(Ok(head.read_payloads(ring, pool, Some(hold)).await?));
    };
    let grads = gradient_headers(&head.message);
    let marks: Vec<_> = grads
        .iter()
        .map(|grad| grad.as_ref().map(non_finite))
        .collect();
    let mut refused = None;
    let mut marked = |index: usize, offset: usize, piece: &[u8]| {
        if refused.is_none()
            && let Some(Some(grad)) = grads.get(index)
        {
            refused = check(grad, offset as u64, piece).err();
        }
    };
    let request = head
        .read_payloads_marked(ring, pool, Some(hold), &marks, &mut marked)
        .await?;
    Ok(match refused {
        None => Ok(request),
        Some(status) => Err((request, status)),
    })
}

/// The elements a gradient of `header`'s dtype is refused for: NaN and the
/// infinities, whose exponent bits are all ones. Every dtype has one, so
/// no gradient of a scanned request goes untested.
fn non_finite(header: &TensorHeader) -> Mark {
    let bits = exponent_bits(header.dtype);
    match header.dtype {
        DType::F32 => Mark::U32(bits),
        DType::F16 | DType::BF16 => Mark::U16(bits as u16),
    }
}

/// Says why a read failed, on `into` as `status_of` it.
async fn ended<M>(
    error: MessageError,
    into: &mpsc::Sender<Result<M, Status>>,
    status_of: fn(MessageError) -> Status,
) -> &'static str {
    let (why, status) = broke(error, status_of);
    let _ = into.send(Err(status)).await;
    why
}

/// Why a read failed (logged when the ring or a message was corrupt), and
/// the status it is sent on as.
fn broke(error: MessageError, status_of: fn(MessageError) -> Status) -> (&'static str, Status) {
    if error.is_peer_gone() {
        return ("the other process closed its doorbell", status_of(error));
    }
    tracing::warn!(%error, "a shared-memory session is corrupt; ending it");
    ("the ring or a message was corrupt", status_of(error))
}

/// Reads answers from `ring` into `into` until either fails. An answer
/// whose payloads are lent ([`crate::lent`]) holds the ring until it drops.
async fn forward_answers(
    ring: AnswerRing,
    into: mpsc::Sender<Result<Answer, Status>>,
) -> &'static str {
    loop {
        let mut reader = Some(ring.lock().await);
        while let Some(holding) = reader.take() {
            match holding.next().await {
                Ok((answer, still)) => {
                    if into.send(Ok(answer)).await.is_err() {
                        return "this side's session ended";
                    }
                    reader = still;
                }
                Err(error) => {
                    return ended(error, &into, |error| {
                        Status::unavailable(format!("the shared-memory session broke: {error}"))
                    })
                    .await;
                }
            }
        }
    }
}

/// Writes every request from `from` onto `ring`, until the channel closes
/// or the ring fails.
async fn forward_requests(
    mut from: mpsc::Receiver<v1::SessionRequest>,
    ring: RequestRing,
) -> &'static str {
    while let Some(request) = from.recv().await {
        if let Err(error) = ring.send(request).await {
            tracing::warn!(%error, "a shared-memory ring is corrupt; ending the session");
            return "the ring was corrupt";
        }
    }
    "this side's session ended"
}

/// Writes every answer from `from` to `ring`, those of its payloads that lie
/// in the values arena by their offset when `lending`, until the channel
/// closes or an `Err` (the session's end) arrives.
async fn write_answers(
    mut ring: RingWriter,
    mut from: mpsc::Receiver<Result<v1::SessionAnswer, Status>>,
    lending: Option<Arc<Lending>>,
) -> &'static str {
    let mut seq = 1;
    while let Some(item) = from.recv().await {
        let Ok(answer) = item else {
            return "this side ended the session";
        };
        let mut message = Encoded::of(answer);
        if let Some(lending) = &lending {
            // Kept before the worker can read it: its release may come as
            // soon as the answer is published.
            let lent = lending.lend(&mut message);
            if lent > 0 {
                lending.keep(seq, lent, message.lent_payloads());
            }
        }
        let written = message.write(&mut ring, seq).await;
        if let Err(error) = written {
            tracing::warn!(%error, "a shared-memory ring is corrupt; ending the session");
            return "the ring was corrupt";
        }
        seq += 1;
    }
    "this side's session ended"
}

/// Runs `reader` and `writer` until one ends, the socket closes, or `stop`;
/// then ends both and closes the socket. Says why.
async fn watch(
    mut socket: UnixStream,
    reader: impl Future<Output = &'static str> + Send + 'static,
    writer: impl Future<Output = &'static str> + Send + 'static,
    stop: impl Future<Output = ()> + Send,
) -> &'static str {
    let mut reader = tokio::spawn(reader);
    let mut writer = tokio::spawn(writer);
    let mut byte = [0u8; 1];
    let why = tokio::select! {
        _ = socket.read(&mut byte) => "the other process closed its socket",
        why = &mut reader => why.unwrap_or("the reader failed"),
        why = &mut writer => why.unwrap_or("the writer failed"),
        () = stop => "this server is stopping",
    };
    reader.abort();
    writer.abort();
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(dtype: DType) -> TensorHeader {
        TensorHeader::from_wire("w", 0, dtype.to_proto(), &[4]).expect("a header")
    }

    /// Each dtype's mark finds its NaN and infinities, and not its largest
    /// finite values, at any element of a payload.
    #[test]
    fn every_dtype_is_tested_for_its_own_nan_and_infinity() {
        let f32s = |a: f32, b: f32| [a.to_le_bytes().to_vec(), b.to_le_bytes().to_vec()];
        let halves = |a: u16, b: u16| [a.to_le_bytes().to_vec(), b.to_le_bytes().to_vec()];
        // Each dtype, two of its non-finite elements, two of its finite ones.
        let cases = [
            (
                DType::F32,
                f32s(f32::NAN, f32::NEG_INFINITY),
                f32s(f32::MAX, f32::MIN),
            ),
            (DType::F16, halves(0x7e00, 0xfc00), halves(0x7bff, 0xfbff)),
            (DType::BF16, halves(0x7fc0, 0x7f80), halves(0x7f7f, 0xff7f)),
        ];
        for (dtype, bad, finite) in cases {
            let mark = non_finite(&header(dtype));
            for element in &finite {
                assert!(!mark.any_in(&element.repeat(9)), "{dtype:?} {element:?}");
            }
            for element in &bad {
                let mut bytes = finite[0].repeat(9);
                bytes.extend_from_slice(element);
                assert!(mark.any_in(&bytes), "{dtype:?} {element:?}");
            }
        }
    }
}
