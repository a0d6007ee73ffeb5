//! The worker's side of a shared-memory session, driven by the requests
//! themselves: [`worker_rings`] splits a session into a [`RequestRing`], onto
//! which each request writes itself, an [`AnswerRing`], off which a request
//! waiting for its answer reads answers itself (handing the others' on) until
//! its own comes, and a [`Closed`], which a task awaits to learn when the
//! session ends.
//!
//! A lone request has no task between it and the rings: a worker whose
//! step runs on one thread (the thread that called `block_on`, as a
//! training loop does) writes, spins and reads on that thread, and nothing
//! wakes another thread on the way. With a reader task and a writer task
//! between, every exchange woke two threads, and one worker's
//! `data_parallel` on digits took 1.5-1.8x the single process
//! (docs/benchmarks.md, "Requests that read their own answers"). Requests
//! sent while others are in flight are queued for a writer task
//! ([`RequestRing::queue`]).
//!
//! A request's future may be dropped at any await (a timeout, or its caller
//! giving up), and that must leave the session as it was. A write cut off
//! midway is finished: the message stays with the ring (`Writing`), the
//! writer task is told, and it (or the next write, whichever comes first)
//! writes the rest. A reader waits, reading nothing, until an answer below
//! [`LEND_AT_BYTES`] is on the ring whole, so reading it never waits; a
//! larger one's payloads are lent, and what the borrower leaves unread is
//! read past. Only a read of an answer larger than the ring is cut off
//! midway: that breaks the session, which the next reader learns as an
//! error, and [`Closed`] then closes the socket so the server ends its side
//! too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use ps_proto::v1;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard, mpsc};

use crate::arena::ArenaView;
use crate::handshake::WorkerEnd;
use crate::lent::{Answer, LEND_AT_BYTES, LentPayloads};
use crate::message::{Encoded, MessageError, read_head, remember_spots, skip_words, wait_whole};
use crate::pool::BufferPool;
use crate::ring::{Released, RingReader, RingWriter};

/// Splits the session `end` into its two rings, answers carrying up to
/// `payload_limit` bytes of tensors, and what says when it ends.
pub fn worker_rings(end: WorkerEnd, payload_limit: u64) -> (RequestRing, AnswerRing, Closed) {
    let ending = Arc::new(Ending::default());
    let (alive, handles) = mpsc::channel(1);
    let writing = Arc::new(Mutex::new(Writing {
        ring: end.requests,
        seq: 1,
        current: None,
        broken: None,
        ending: Arc::clone(&ending),
    }));
    let (queued, queue) = mpsc::channel(QUEUED);
    tokio::spawn(write_queued(Arc::clone(&writing), queue));
    let requests = RequestRing {
        writing,
        queued,
        _alive: alive.clone(),
    };
    let answers = AnswerRing {
        reading: Arc::new(Mutex::new(Reading {
            released: end.answers.released(),
            ring: end.answers,
            arena: end.arena,
            seq: 1,
            pool: BufferPool::new(),
            payload_limit,
            reading_from: None,
            skip_to: 0,
            broken: None,
            ending: Arc::clone(&ending),
        })),
        _alive: alive,
    };
    let closed = Closed {
        socket: end.socket,
        handles,
        ending,
    };
    (requests, answers, closed)
}

/// Requests that may wait for the ring's writer task.
const QUEUED: usize = 64;

/// The ring the worker's requests go onto: written by the request itself
/// when nobody else is writing it, else queued for a task that writes them
/// one after another while it holds the ring.
///
/// Requests that each waited for the ring's lock in turn would pay a
/// wake-up of the next at every hand-over; the task writes a queue of them
/// while it holds the ring, as the writer task before it did.
#[derive(Debug)]
pub struct RequestRing {
    writing: Arc<Mutex<Writing>>,
    queued: mpsc::Sender<ToWrite>,
    /// Held so that [`Closed`] learns when both rings are dropped.
    _alive: mpsc::Sender<()>,
}

/// What the writer task is given.
#[derive(Debug)]
enum ToWrite {
    /// A request queued.
    Request(Encoded, Queued),
    /// The rest of a message whose writer was dropped midway.
    Rest,
}

#[derive(Debug)]
struct Writing {
    ring: RingWriter,
    /// The next message's sequence number.
    seq: u64,
    /// The message being written: left here by a writer dropped midway,
    /// for the next one to finish before its own.
    current: Option<Current>,
    /// Why the ring cannot be written any more.
    broken: Option<String>,
    /// Ended when the ring breaks; once the session has ended, nothing more
    /// is written.
    ending: Arc<Ending>,
}

/// A message whose write has begun: where on the ring it began.
#[derive(Debug)]
struct Current {
    message: Encoded,
    seq: u64,
    from: u64,
}

/// How a request went out ([`RequestRing::send`]).
#[derive(Debug)]
pub enum Sent {
    /// Written onto the ring whole.
    Written,
    /// Queued for the writer task.
    Queued(Queued),
}

/// A request queued for the ring's writer task: [`Queued::withdraw`] says,
/// once its session has ended, whether the server can have seen it.
#[derive(Debug, Clone)]
pub struct Queued(Arc<AtomicU8>);

/// A queued request not yet taken by the writer task (or whose write
/// failed: the server never had it whole).
const WAITS: u8 = 0;
/// A queued request the writer task took to write.
const TAKEN: u8 = 1;
/// A queued request withdrawn before the writer task took it.
const WITHDRAWN: u8 = 2;

impl Queued {
    fn new() -> Self {
        Self(Arc::new(AtomicU8::new(WAITS)))
    }

    /// Withdraws the request unless the writer task has taken it (it then
    /// never will): `true` when it did, and the server never had it whole,
    /// so it may go again on a new session, whatever it is.
    pub fn withdraw(&self) -> bool {
        let withdrawn =
            self.0
                .compare_exchange(WAITS, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire);
        withdrawn.is_ok() || withdrawn == Err(WITHDRAWN)
    }

    /// Takes the request to write it, unless it was withdrawn.
    fn take(&self) -> bool {
        let taken = self
            .0
            .compare_exchange(WAITS, TAKEN, Ordering::AcqRel, Ordering::Acquire);
        taken.is_ok()
    }

    /// Gives back a request whose write failed: the server never had it whole.
    fn not_written(&self) {
        self.0.store(WAITS, Ordering::Release);
    }
}

impl RequestRing {
    /// Writes `request` onto the ring when nobody else is writing it, else
    /// queues it for the ring's writer task. Dropped midway through its
    /// write, it leaves the rest to the writer task: the server gets the
    /// request whole either way.
    ///
    /// # Errors
    /// The ring failed now or before: the server did not get this request
    /// whole, and the session is over. A queued request whose write fails
    /// ends the session instead, which fails the requests waiting for
    /// answers.
    pub async fn send(&self, request: v1::SessionRequest) -> Result<Sent, MessageError> {
        let message = Encoded::of(request);
        match self.writing.try_lock() {
            Ok(mut writing) => {
                let mut rest = RestToTask {
                    queued: &self.queued,
                    armed: true,
                };
                let written = writing.write_or_break(message).await;
                rest.armed = false;
                written.map(|()| Sent::Written)
            }
            Err(_) => self.queue_encoded(message).await.map(Sent::Queued),
        }
    }

    /// Queues `request` for the ring's writer task, which writes it after
    /// those queued before it: the way for a request sent while others are
    /// in flight, which the task writes one after another with no hand-over
    /// between them.
    ///
    /// # Errors
    /// The writer task has ended: a write failed, and the session is over.
    pub async fn queue(&self, request: v1::SessionRequest) -> Result<Queued, MessageError> {
        self.queue_encoded(Encoded::of(request)).await
    }

    async fn queue_encoded(&self, message: Encoded) -> Result<Queued, MessageError> {
        let queued = Queued::new();
        self.queued
            .send(ToWrite::Request(message, queued.clone()))
            .await
            .map_err(|_| MessageError::Broken("the session's writer task has ended".to_string()))?;
        Ok(queued)
    }
}

/// Tells the writer task to finish the message being written if this is
/// dropped while `armed` (the write cut off at one of its awaits). A full
/// queue needs no telling: the task finishes the message before it takes
/// anything it holds.
struct RestToTask<'a> {
    queued: &'a mpsc::Sender<ToWrite>,
    armed: bool,
}

impl Drop for RestToTask<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.queued.try_send(ToWrite::Rest);
        }
    }
}

/// Writes what is queued on `queue`, each batch while it holds the ring,
/// until the queue closes or a write fails. Requests it did not write
/// whole (left in the queue, or the one whose write failed) can be
/// withdrawn ([`Queued::withdraw`]).
async fn write_queued(writing: Arc<Mutex<Writing>>, mut queue: mpsc::Receiver<ToWrite>) {
    while let Some(first) = queue.recv().await {
        let mut writing = writing.lock().await;
        let mut next = Some(first);
        while let Some(to_write) = next.take() {
            // A message cut off midway goes first, so that a request is taken
            // only when its own write comes next (and not once the session
            // has ended: it then stays to be withdrawn).
            if writing.finish_or_break().await.is_err() {
                return;
            }
            if let ToWrite::Request(message, queued) = to_write
                && queued.take()
                && writing.write_or_break(message).await.is_err()
            {
                queued.not_written();
                return;
            }
            next = queue.try_recv().ok();
        }
    }
}

impl Writing {
    /// [`Writing::write`]; a failure marks the ring broken and stops the
    /// session.
    async fn write_or_break(&mut self, message: Encoded) -> Result<(), MessageError> {
        let written = self.write(message).await;
        self.break_on(written)
    }

    /// [`Writing::finish`]; a failure marks the ring broken and stops the
    /// session.
    async fn finish_or_break(&mut self) -> Result<(), MessageError> {
        let finished = self.finish().await;
        self.break_on(finished)
    }

    fn break_on(&mut self, done: Result<(), MessageError>) -> Result<(), MessageError> {
        if let Err(error) = &done {
            self.broken.get_or_insert_with(|| error.to_string());
            self.ending.end();
        }
        done
    }

    /// Writes `message` as the next message (after the rest of one whose
    /// writer was dropped midway), unless the ring broke before.
    async fn write(&mut self, message: Encoded) -> Result<(), MessageError> {
        self.finish().await?;
        self.current = Some(Current {
            message,
            seq: self.seq,
            from: self.ring.position(),
        });
        self.seq += 1;
        self.finish().await
    }

    /// Writes the rest of the message being written, if one is, unless the
    /// ring broke before.
    async fn finish(&mut self) -> Result<(), MessageError> {
        if self.ending.has_ended() {
            self.broken
                .get_or_insert_with(|| "the session has ended".to_string());
        }
        if let Some(why) = &self.broken {
            return Err(MessageError::Broken(why.clone()));
        }
        if let Some(current) = &self.current {
            // The ring's position is exact at every await of a write, so
            // what was written is what a dropped writer got to.
            let done = self.ring.position() - current.from;
            current
                .message
                .write_from(&mut self.ring, current.seq, done)
                .await?;
            self.current = None;
        }
        Ok(())
    }
}

/// The ring the server's answers come on, read by whoever holds it
/// ([`AnswerRing::lock`]); clones share it.
#[derive(Debug, Clone)]
pub struct AnswerRing {
    reading: Arc<Mutex<Reading>>,
    _alive: mpsc::Sender<()>,
}

/// The answer ring's reading end and where it stands; lent payloads
/// ([`LentPayloads`]) hold it while they are read.
#[derive(Debug)]
pub(crate) struct Reading {
    pub(crate) ring: RingReader,
    /// The server's values arena, which payloads of its answers may lie in.
    arena: Option<Arc<ArenaView>>,
    /// Where this worker says it is done with them.
    pub(crate) released: Released,
    seq: u64,
    pub(crate) pool: BufferPool,
    payload_limit: u64,
    /// While an answer's head or whole payloads are read: where the ring
    /// stood when the read began.
    reading_from: Option<u64>,
    /// Where the payloads a borrower left unread end: the next answer
    /// starts there.
    pub(crate) skip_to: u64,
    /// Why the ring cannot be read any more.
    pub(crate) broken: Option<String>,
    /// Ended when the ring breaks.
    pub(crate) ending: Arc<Ending>,
}

impl AnswerRing {
    /// Waits until no other request reads the ring (or holds payloads lent
    /// off it), and takes it.
    pub async fn lock(&self) -> AnswerReader {
        AnswerReader {
            reading: Arc::clone(&self.reading).lock_owned().await,
        }
    }

    /// [`AnswerRing::lock`], once an answer is on the ring to be read (or
    /// the ring failed, which the read then meets): reading it whole waits
    /// only when it is larger than the ring. Dropped before it returns, it
    /// has read no answer (at most it read past payloads a borrower left
    /// unread, as the next reader would).
    pub async fn lock_answered(&self) -> AnswerReader {
        let mut reader = self.lock().await;
        let reading = &mut *reader.reading;
        if reading.catch_up().await.is_ok() {
            let _ = wait_whole(&reading.ring, LEND_AT_BYTES).await;
        }
        reader
    }
}

/// The answer ring, held by one request.
#[derive(Debug)]
pub struct AnswerReader {
    reading: OwnedMutexGuard<Reading>,
}

/// What [`AnswerReader::read_next`] read: an answer whole, or its head with
/// the lengths of the payloads still on the ring.
enum Read {
    Whole(v1::SessionAnswer),
    /// The answer, its sequence number, its payloads' length words and the
    /// arena those in it lie in.
    Head(v1::SessionAnswer, u64, (Vec<u64>, Option<Arc<ArenaView>>)),
}

impl AnswerReader {
    /// Reads the next answer, whoever it is for. An answer carrying
    /// [`LEND_AT_BYTES`] or more is returned with its payloads still on the
    /// ring, lent with the ring itself (`None` comes back: the ring is
    /// free again once they drop); smaller ones are read whole, and the
    /// ring comes back with them.
    ///
    /// # Errors
    /// The ring failed, an answer is malformed or past the payload limit, or a
    /// read was cut off midway before: the session is over.
    pub async fn next(mut self) -> Result<(Answer, Option<Self>), MessageError> {
        match self.read_next().await {
            Ok(Read::Whole(message)) => Ok((Answer::whole(message), Some(self))),
            Ok(Read::Head(message, seq, lens)) => {
                let lent = LentPayloads::new(self.reading, seq, lens);
                let answer = Answer {
                    message,
                    lent: Some(lent),
                };
                Ok((answer, None))
            }
            Err(error) => {
                self.reading.broken.get_or_insert_with(|| error.to_string());
                self.reading.ending.end();
                Err(error)
            }
        }
    }

    async fn read_next(&mut self) -> Result<Read, MessageError> {
        let reading = &mut *self.reading;
        reading.catch_up().await?;
        // Waiting reads nothing; a small answer's read then never waits, and
        // cannot be cut off midway (one larger than the ring can).
        wait_whole(&reading.ring, LEND_AT_BYTES).await?;
        reading.reading_from = Some(reading.ring.position());
        let arena = reading.arena.as_ref();
        let mut head =
            read_head::<v1::SessionAnswer>(&mut reading.ring, reading.seq, arena).await?;
        if let Some(arena) = arena {
            remember_spots(&mut head.message, arena);
        }
        let total = head.payload_bytes();
        if total > reading.payload_limit {
            let limit = reading.payload_limit;
            return Err(MessageError::Malformed(format!(
                "an answer carrying {total} bytes of tensors is past the limit of {limit}"
            )));
        }
        let read = if total < LEND_AT_BYTES {
            let releases = head.has_arena_payloads();
            let message = head
                .read_payloads(&mut reading.ring, &reading.pool, None)
                .await?;
            if releases {
                reading.released.store(reading.seq);
            }
            Read::Whole(message)
        } else {
            let (message, lens, arena) = head.into_parts();
            Read::Head(message, reading.seq, (lens, arena))
        };
        reading.reading_from = None;
        reading.seq += 1;
        Ok(read)
    }
}

impl Reading {
    /// Checks that no read was cut off midway, and reads past what a
    /// borrower left unread.
    async fn catch_up(&mut self) -> Result<(), MessageError> {
        if let Some(from) = self.reading_from.take()
            && self.ring.position() != from
        {
            self.broken = Some("an answer's read was cut off midway".to_string());
        }
        if let Some(why) = &self.broken {
            return Err(MessageError::Broken(why.clone()));
        }
        let unread = self.skip_to.saturating_sub(self.ring.position());
        skip_words(&mut self.ring, unread).await?;
        Ok(())
    }
}

/// Says when the session ends: the socket closed (the server's process
/// ended, crashed included), a ring broke, or both rings were dropped.
#[derive(Debug)]
pub struct Closed {
    socket: UnixStream,
    handles: mpsc::Receiver<()>,
    ending: Arc<Ending>,
}

/// Whether a session has ended, shared by its rings and its [`Closed`]: a
/// ring that breaks ends it, and so does [`Closed::wait`] returning, before
/// anyone learns of the end from it. Once it has ended nothing more is
/// written, so a request the session's end found unwritten, or written in
/// part, never reaches the server whole, and may go again on a new one.
#[derive(Debug, Default)]
pub(crate) struct Ending {
    ended: AtomicBool,
    /// Wakes [`Closed::wait`] when a ring breaks.
    broke: Notify,
}

impl Ending {
    /// Ends the session, and wakes [`Closed::wait`].
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.broke.notify_one();
    }

    fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }
}

impl Closed {
    /// Waits until the session ends, closes the socket (which ends the
    /// server's side), and says why.
    pub async fn wait(mut self) -> &'static str {
        let mut byte = [0u8; 1];
        let why = tokio::select! {
            _ = self.socket.read(&mut byte) => "the other process closed its socket",
            () = self.ending.broke.notified() => "a ring broke",
            None = self.handles.recv() => "this side's session ended",
        };
        self.ending.ended.store(true, Ordering::SeqCst);
        why
    }
}
