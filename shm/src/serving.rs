//! The server's side of a session over a region, served on the session's
//! own task: [`serve_link`] gives the worker's requests as a stream that
//! reads them off the ring as it is polled, and [`Answers`], which writes
//! each answer onto the other ring as it is sent, those of its payloads that
//! lie in the values arena by their offset ([`crate::lending`]). An
//! operation is read, run and answered on one task, with no channel or other
//! task on the way (with a reader task and a writer task between, each
//! operation passed through three tasks and two channels on each server);
//! only an answer that does not fit the ring's free space, and those after
//! it until the ring catches up, go through an answer task.
//!
//! A task of its own holds the socket: when the socket closes (the other
//! process ended, crashed included), the answer task ends (a write failed),
//! or `stop` comes, it says so through [`ServerLink::ended`]. When the
//! session ends its answers (an `Err` sent, or [`Answers`] dropped), the
//! answer task stops, what it still held unwritten, and the socket closes,
//! which the worker sees in turn. A message only half written when its
//! writer died is never handed on, and an answer whose write was cut off
//! midway ends the session, so none follows it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use ps_proto::codec::{DType, exponent_bits};
use ps_proto::header::TensorHeader;
use ps_proto::refusal::refusal_of;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};
use tokio::task::{AbortHandle, JoinHandle};
use tonic::Status;

use crate::copy::Mark;
use crate::handshake::ServerEnd;
use crate::lending::{LENT_LIMIT_BYTES, Lending};
use crate::link::broke;
use crate::message::{Encoded, MessageError, gradient_headers, read_head};
use crate::pool::{BufferPool, Hold};
use crate::ring::{RingError, RingReader, RingWriter};

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

/// What a session reads next: a request to run, or the answer refusing one
/// that was read past or dropped (its payloads refused by the [`Charger`] or
/// the [`Checker`]), to send as it is.
pub type Read = Result<v1::SessionRequest, v1::SessionAnswer>;

/// The worker's requests, in order, each read off the ring as the stream is
/// polled (a read cut off by dropping `next()` goes on at the next poll);
/// an `Err` when the region failed, and then its end.
pub type Requests = Pin<Box<dyn Stream<Item = Result<Read, Status>> + Send>>;

/// The server's side of a session.
pub struct ServerLink {
    /// The worker's requests.
    pub requests: Requests,
    /// Where the answers go.
    pub answers: Answers,
    /// Comes when the socket closed (the worker ended), the answer task
    /// ended (a write failed, or the session ended its answers) or the
    /// server is stopping, saying which: the session should end then.
    pub ended: Ended,
    /// Requests carrying at least this many bytes of gradients were tested
    /// for NaN and infinity as they were read, and refused through the
    /// session's [`Checker`] ([`SCAN_FROM_BYTES`]; `None` without one).
    pub checked_from: Option<u64>,
}

/// Starts the server's side of the session `end`, each request's payloads
/// admitted by `charge` and read into buffers of `pool` (which the server's
/// sessions share); `stop` ends it early (through [`ServerLink::ended`]).
pub fn serve_link(
    end: ServerEnd,
    (charge, check): (Charger, Option<Checker>),
    pool: BufferPool,
    stop: impl Future<Output = ()> + Send + 'static,
) -> ServerLink {
    let peer = end.peer_pid;
    let checked_from = check.as_ref().map(|_| SCAN_FROM_BYTES);
    let released = end.requests.released();
    let lending = end
        .arena
        .map(|arena| Arc::new(Lending::new(arena, released, LENT_LIMIT_BYTES)));
    let reader = Reader {
        ring: end.requests,
        seq: 1,
        ahead: Arc::new(Semaphore::new(AHEAD_BYTES as usize)),
        admit: (charge, check),
        pool,
        lending: lending.clone(),
    };
    let (answers, writer) = Answers::new(end.answers, lending);
    let (tell, told) = oneshot::channel();
    tokio::spawn(async move {
        let why = watch(end.socket, writer, stop, tell).await;
        tracing::debug!(?peer, why, "a shared-memory session ended");
    });
    ServerLink {
        requests: reader.into_stream(),
        answers,
        ended: Ended(told),
        checked_from,
    }
}

/// What reads the requests off the ring.
struct Reader {
    ring: RingReader,
    /// The sequence number of the next request.
    seq: u64,
    /// The read-ahead ([`AHEAD_BYTES`]) that requests' payloads hold a share of.
    ahead: Arc<Semaphore>,
    admit: (Charger, Option<Checker>),
    pool: BufferPool,
    lending: Option<Arc<Lending>>,
}

impl Reader {
    /// The requests as a stream, ending after the first failed read (and
    /// polled after its end, ending again).
    fn into_stream(self) -> Requests {
        let requests = futures::stream::unfold(Some(self), |reader| async move {
            let mut reader = reader?;
            match reader.next().await {
                Ok(read) => Some((Ok(read), Some(reader))),
                Err(error) => {
                    let (_, status) = broke(error, |e| {
                        Status::invalid_argument(format!("the shared-memory session broke: {e}"))
                    });
                    Some((Err(status), None))
                }
            }
        });
        Box::pin(requests.fuse())
    }

    /// Reads the next request. Its payloads are read only once they fit the
    /// session's read-ahead ([`AHEAD_BYTES`]) and the charge admits them; a
    /// request the charge refuses comes as its `RESOURCE_EXHAUSTED` answer,
    /// and one the checker refuses as the checker's (the session goes on
    /// either way). Before a request is handed on, the lent payloads the
    /// worker released are let go, so that a push right after the worker's
    /// pull of the same key finds its values held by nobody else.
    async fn next(&mut self) -> Result<Read, MessageError> {
        let (charge, check) = (&self.admit.0, self.admit.1.as_ref());
        let read = read_request(
            &mut self.ring,
            self.seq,
            &self.pool,
            &self.ahead,
            (charge, check),
        )
        .await;
        if let Some(lending) = &self.lending {
            lending.let_go();
        }
        let read = read?;
        self.seq += 1;
        Ok(read.map_err(|(request, status)| {
            // Its payloads, read-ahead and charge go before it is answered.
            let id = request.id;
            drop(request);
            v1::SessionAnswer {
                id,
                outcome: Some(Outcome::Refusal(refusal_of(&status))),
                pull_waited_us: 0,
            }
        }))
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

/// Where a session's answers go: onto the answer ring, as they are sent.
///
/// An answer that fits the ring's free space is written at once, by the
/// session's own task, and that write never waits. One that does not fit,
/// and every answer after it until the ring has caught up, is handed to the
/// session's answer task, which writes them in order as the worker frees
/// room: the session goes on reading requests meanwhile, until the task
/// holds [`ANSWERS_QUEUED`]. (A session that waited for room itself would
/// leave the requests behind an answer larger than the free space unread
/// until the worker read that answer.)
///
/// Dropped, it stops the answer task, with whatever it still held unwritten.
pub struct Answers {
    writing: Arc<Mutex<AnswerWriting>>,
    /// Answers handed to the answer task and not yet written.
    backlog: Arc<AtomicUsize>,
    queue: mpsc::Sender<(Encoded, u64)>,
    /// Stops the answer task.
    task: AbortHandle,
    /// The sequence number of the next answer.
    seq: u64,
    lending: Option<Arc<Lending>>,
    /// Why no more answers go, once none can.
    ended: Option<&'static str>,
}

/// The answer ring, and why it cannot be written any more.
struct AnswerWriting {
    ring: RingWriter,
    broken: Option<&'static str>,
}

/// Answers the answer task may hold before the session waits for it. A
/// bound, so that a worker that never reads its answers cannot make the
/// server hold an unbounded number. The client's lone request waiting for
/// room on the request ring (`ps_client`'s `OwnReading::while_writing`)
/// reads the answers that come meanwhile, those to requests it gave up
/// included, so a session waiting here is not left waiting for a worker
/// that waits for it.
pub const ANSWERS_QUEUED: usize = 64;

/// No more answers go on a session: it ended, saying why.
#[derive(Debug, thiserror::Error)]
#[error("the shared-memory session has ended: {0}")]
pub struct SessionEnded(pub &'static str);

impl Answers {
    /// The answers of a session written onto `ring`, and their answer task,
    /// which ends once the session has let go of them and it has written
    /// those it held, or a write failed (saying which).
    fn new(ring: RingWriter, lending: Option<Arc<Lending>>) -> (Self, JoinHandle<&'static str>) {
        let writing = Arc::new(Mutex::new(AnswerWriting { ring, broken: None }));
        let backlog = Arc::new(AtomicUsize::new(0));
        let (queue, queued) = mpsc::channel(ANSWERS_QUEUED);
        let task = tokio::spawn(write_queued(
            (Arc::clone(&writing), Arc::clone(&backlog)),
            queued,
        ));
        let answers = Self {
            writing,
            backlog,
            queue,
            task: task.abort_handle(),
            seq: 1,
            lending,
            ended: None,
        };
        (answers, task)
    }

    /// Sends `answer`: writes it onto the ring when it fits the free space
    /// and nothing is queued before it, else queues it for the answer task
    /// (waiting only while that task holds [`ANSWERS_QUEUED`]). An `Err`
    /// ends the session: nothing more is written, and the answer task stops
    /// with what it held.
    ///
    /// # Errors
    /// [`SessionEnded`] once the session has ended: a ring found corrupt,
    /// or a write cut off midway (this future dropped before it finished),
    /// ends it.
    pub async fn send(
        &mut self,
        answer: Result<v1::SessionAnswer, Status>,
    ) -> Result<(), SessionEnded> {
        if let Some(why) = self.ended {
            return Err(SessionEnded(why));
        }
        let Ok(mut answer) = answer else {
            self.ended = Some("this side ended the session");
            self.task.abort();
            return Ok(());
        };
        if let Some(lending) = &self.lending {
            lending.tell_spots(&mut answer);
        }
        let mut message = Encoded::of(answer);
        if let Some(lending) = &self.lending {
            // Kept before the worker can read it: its release may come as
            // soon as the answer is published.
            let lent = lending.lend(&mut message);
            if lent > 0 {
                lending.keep(self.seq, lent, message.lent_payloads());
            }
        }
        let seq = self.seq;
        self.seq += 1;
        // Set until the answer is written or queued: a send cut off midway
        // has lost it.
        self.ended = Some("an answer's send was cut off midway");
        let message = match self.write_now(message, seq).await {
            Now::Written => {
                self.ended = None;
                return Ok(());
            }
            Now::Broken(why) => {
                self.ended = Some(why);
                return Err(SessionEnded(why));
            }
            Now::Later(message) => message,
        };
        self.backlog.fetch_add(1, Ordering::AcqRel);
        if self.queue.send((message, seq)).await.is_err() {
            self.backlog.fetch_sub(1, Ordering::AcqRel);
            let why = "the answer task has ended (a write failed, or the socket closed)";
            self.ended = Some(why);
            return Err(SessionEnded(why));
        }
        self.ended = None;
        Ok(())
    }

    /// Writes `message` as answer `seq` if nothing is queued before it and
    /// it fits the ring's free space, so that the write never waits.
    async fn write_now(&self, message: Encoded, seq: u64) -> Now {
        if self.backlog.load(Ordering::Acquire) > 0 {
            return Now::Later(message);
        }
        // Held only by the answer task, while it writes what was queued.
        let Ok(mut writing) = self.writing.try_lock() else {
            return Now::Later(message);
        };
        if let Some(why) = writing.broken {
            return Now::Broken(why);
        }
        let fits = writing
            .ring
            .free_words()
            .map(|free| free >= message.ring_words());
        let written = match fits {
            Ok(false) => return Now::Later(message),
            Ok(true) => message.write(&mut writing.ring, seq).await,
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => Now::Written,
            Err(error) => Now::Broken(writing.break_on(&error)),
        }
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What [`Answers::write_now`] did.
enum Now {
    Written,
    /// It did not fit or others were queued: for the answer task.
    Later(Encoded),
    /// The ring broke, now or before.
    Broken(&'static str),
}

impl AnswerWriting {
    /// Marks the ring broken by `error`; says why.
    fn break_on(&mut self, error: &RingError) -> &'static str {
        tracing::warn!(%error, "a shared-memory ring is corrupt; ending the session");
        self.broken.get_or_insert("the ring was corrupt")
    }
}

/// Writes the answers queued on `queued` in order, each once the worker has
/// freed room for it, until a write fails (saying so) or it is stopped
/// ([`Answers`] dropped, or sent an `Err`).
async fn write_queued(
    (writing, backlog): (Arc<Mutex<AnswerWriting>>, Arc<AtomicUsize>),
    mut queued: mpsc::Receiver<(Encoded, u64)>,
) -> &'static str {
    while let Some((message, seq)) = queued.recv().await {
        let mut writing = writing.lock().await;
        let written = message.write(&mut writing.ring, seq).await;
        // Still holding the ring: once this is zero, nothing is being written.
        backlog.fetch_sub(1, Ordering::AcqRel);
        if let Err(error) = written {
            return writing.break_on(&error);
        }
    }
    "this side's session ended"
}
/// Comes when a session's socket closed or its server is stopping, saying which.
pub struct Ended(oneshot::Receiver<&'static str>);

impl Future for Ended {
    type Output = &'static str;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<&'static str> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|told| told.unwrap_or("the session's watcher ended"))
    }
}

/// Holds `socket` until it closes, `stop` comes, or the answer task ends
/// (the session ended its answers, or a write failed); then ends the
/// answer task, tells the session which on `tell`, and closes the socket.
/// Says why.
async fn watch(
    mut socket: UnixStream,
    mut writer: JoinHandle<&'static str>,
    stop: impl Future<Output = ()> + Send,
    tell: oneshot::Sender<&'static str>,
) -> &'static str {
    let mut byte = [0u8; 1];
    let why = tokio::select! {
        _ = socket.read(&mut byte) => "the other process closed its socket",
        why = &mut writer => why.unwrap_or("this side's session ended its answers"),
        () = stop => "this server is stopping",
    };
    writer.abort();
    let _ = tell.send(why);
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
