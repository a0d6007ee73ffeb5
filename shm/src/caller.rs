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
//! giving up): a write or read cut off before it moved the ring leaves the
//! ring as it was; one cut off midway breaks the session, which the next
//! user of that ring learns as an error, and [`Closed`] then closes the
//! socket so the server ends its side too.

use std::sync::Arc;

use ps_proto::v1;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard, mpsc};

use crate::handshake::WorkerEnd;
use crate::lent::{Answer, LEND_AT_BYTES, LentPayloads};
use crate::message::{MessageError, read_head, skip_words, write_message};
use crate::pool::BufferPool;
use crate::ring::{RingReader, RingWriter};

/// Splits the session `end` into its two rings, answers carrying up to
/// `payload_limit` bytes of tensors, and what says when it ends.
pub fn worker_rings(end: WorkerEnd, payload_limit: u64) -> (RequestRing, AnswerRing, Closed) {
    let stop = Arc::new(Notify::new());
    let (alive, handles) = mpsc::channel(1);
    let writing = Arc::new(Mutex::new(Writing {
        ring: end.requests,
        seq: 1,
        writing_from: None,
        broken: None,
        stop: Arc::clone(&stop),
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
            ring: end.answers,
            seq: 1,
            pool: BufferPool::new(),
            payload_limit,
            reading_from: None,
            skip_to: 0,
            broken: None,
            stop: Arc::clone(&stop),
        })),
        _alive: alive,
    };
    let closed = Closed {
        socket: end.socket,
        handles,
        stop,
    };
    (requests, answers, closed)
}

/// Requests that may wait for the ring's writer task.
const QUEUED: usize = 64;

/// The ring the worker's requests go onto: written by the request itself
/// when nobody else is writing, else queued for a task that writes them one
/// after another while it holds the ring.
///
/// Requests that each waited for the ring's lock in turn would pay a
/// wake-up of the next at every hand-over; the task writes a queue of them
/// while it holds the ring, as the writer task before it did.
#[derive(Debug)]
pub struct RequestRing {
    writing: Arc<Mutex<Writing>>,
    queued: mpsc::Sender<v1::SessionRequest>,
    /// Held so that [`Closed`] learns when both rings are dropped.
    _alive: mpsc::Sender<()>,
}

#[derive(Debug)]
struct Writing {
    ring: RingWriter,
    seq: u64,
    /// While a write is under way: where the ring stood when it began.
    writing_from: Option<u64>,
    /// Why the ring cannot be written any more.
    broken: Option<String>,
    /// Told when the ring breaks, to end the session.
    stop: Arc<Notify>,
}

impl RequestRing {
    /// Writes `request` onto the ring when nobody else is writing it, else
    /// queues it for the ring's writer task.
    ///
    /// # Errors
    /// The ring failed now or before, or a write was cut off midway before;
    /// the server did not get this request whole, and the session is over.
    /// A queued request whose write fails ends the session instead, which
    /// fails the requests waiting for answers.
    pub async fn send(&self, request: v1::SessionRequest) -> Result<(), MessageError> {
        match self.writing.try_lock() {
            Ok(mut writing) => writing.write_or_break(request).await,
            Err(_) => self.queue(request).await,
        }
    }

    /// Queues `request` for the ring's writer task, which writes it after
    /// those queued before it: the way for a request sent while others are
    /// in flight, which the task writes one after another with no hand-over
    /// between them.
    ///
    /// # Errors
    /// The writer task has ended: a write failed, and the session is over.
    pub async fn queue(&self, request: v1::SessionRequest) -> Result<(), MessageError> {
        self.queued
            .send(request)
            .await
            .map_err(|_| MessageError::Broken("the session's writer task has ended".to_string()))
    }
}

/// Writes the requests queued on `queue`, each batch while it holds the
/// ring, until the queue closes or a write fails.
async fn write_queued(writing: Arc<Mutex<Writing>>, mut queue: mpsc::Receiver<v1::SessionRequest>) {
    while let Some(first) = queue.recv().await {
        let mut writing = writing.lock().await;
        let mut next = Some(first);
        while let Some(request) = next.take() {
            if writing.write_or_break(request).await.is_err() {
                return;
            }
            next = queue.try_recv().ok();
        }
    }
}

impl Writing {
    /// [`Writing::write`]; a failure marks the ring broken and stops the
    /// session.
    async fn write_or_break(&mut self, request: v1::SessionRequest) -> Result<(), MessageError> {
        let written = self.write(request).await;
        if let Err(error) = &written {
            self.broken.get_or_insert_with(|| error.to_string());
            self.stop.notify_one();
        }
        written
    }

    /// Writes `request` as the next message, unless the ring broke or a
    /// write was cut off midway before.
    async fn write(&mut self, request: v1::SessionRequest) -> Result<(), MessageError> {
        if let Some(from) = self.writing_from.take()
            && self.ring.position() != from
        {
            self.broken = Some("a request's write was cut off midway".to_string());
        }
        if let Some(why) = &self.broken {
            return Err(MessageError::Broken(why.clone()));
        }
        self.writing_from = Some(self.ring.position());
        write_message(&mut self.ring, self.seq, request).await?;
        self.writing_from = None;
        self.seq += 1;
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
    /// Told when the ring breaks, to end the session.
    pub(crate) stop: Arc<Notify>,
}

impl AnswerRing {
    /// Waits until no other request reads the ring (or holds payloads lent
    /// off it), and takes it.
    pub async fn lock(&self) -> AnswerReader {
        AnswerReader {
            reading: Arc::clone(&self.reading).lock_owned().await,
        }
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
    Head(v1::SessionAnswer, Vec<u64>),
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
            Ok(Read::Head(message, lens)) => {
                let lent = LentPayloads::new(self.reading, lens);
                let answer = Answer {
                    message,
                    lent: Some(lent),
                };
                Ok((answer, None))
            }
            Err(error) => {
                self.reading.broken.get_or_insert_with(|| error.to_string());
                self.reading.stop.notify_one();
                Err(error)
            }
        }
    }

    async fn read_next(&mut self) -> Result<Read, MessageError> {
        let reading = &mut *self.reading;
        reading.catch_up().await?;
        reading.reading_from = Some(reading.ring.position());
        let head = read_head::<v1::SessionAnswer>(&mut reading.ring, reading.seq).await?;
        let total = head.payload_bytes();
        if total > reading.payload_limit {
            let limit = reading.payload_limit;
            return Err(MessageError::Malformed(format!(
                "an answer carrying {total} bytes of tensors is past the limit of {limit}"
            )));
        }
        let read = if total < LEND_AT_BYTES {
            let message = head
                .read_payloads(&mut reading.ring, &reading.pool, None)
                .await?;
            Read::Whole(message)
        } else {
            let (message, lens) = head.into_parts();
            Read::Head(message, lens)
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
    stop: Arc<Notify>,
}

impl Closed {
    /// Waits until the session ends, closes the socket (which ends the
    /// server's side), and says why.
    pub async fn wait(mut self) -> &'static str {
        let mut byte = [0u8; 1];
        tokio::select! {
            _ = self.socket.read(&mut byte) => "the other process closed its socket",
            () = self.stop.notified() => "a ring broke",
            None = self.handles.recv() => "this side's session ended",
        }
    }
}
