//! [`SessionLink`]: the client's end of one `Session` stream to a server, the
//! way small pushes and pulls travel by default: each is one message tagged
//! with an id, and its answer is matched back by id, in whatever order the
//! server finishes them.
//!
//! Requests are written, and answers read, as HTTP/2 frames
//! ([`crate::framed`]): a row push's ids and rows go as the buffers they are,
//! and a row pull's rows come out as slices of the frames they arrived in.
//!
//! On a gRPC stream, one task reads the answers and hands each to the request
//! waiting for it. Through shared memory there is no task between a lone
//! request and the rings: it writes itself onto the ring and reads its own
//! answer off the other, on its own thread; while several wait, one of them
//! or a task reads for all ([`rings`]).
//!
//! When the stream breaks (the connection drops, the server restarts or
//! ends an idle session), every request in flight fails with `UNAVAILABLE`,
//! which the retry policy retries as it would a dropped connection; the next
//! request opens a new stream. A refusal comes back as the status (with its
//! metadata) the same unary call would have ended with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use prost::Message;
use ps_proto::auth::AuthChannel;
use ps_proto::grpc_frames::SESSION_PATH;
use ps_proto::refusal::status_of;
use ps_proto::session_body::{Ending, SessionBody};
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use ps_shm::arena::ArenaView;
use ps_shm::{Answer, AnswerRing, LentPayloads, RequestRing, Sent};
use rings::OwnReading;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::{Stream, StreamExt};
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::framed::{FramedAnswer, start_framed_body};

/// Requests the client may have queued ahead of the stream taking them.
const REQUESTS_AHEAD: usize = 64;

type AnswerSlot = oneshot::Sender<Result<Answer, Status>>;

/// The requests waiting for answers, or why the stream ended.
#[derive(Default)]
struct Waiting {
    answers: HashMap<u64, AnswerSlot>,
    ended: Option<Status>,
    /// Who reads a shared-memory session's answers.
    reader: rings::Reader,
}

/// How a session's requests go out and its answers come back.
enum Transport {
    /// A `Session` stream: the requests queued for it; a task reads the
    /// answers.
    Stream(mpsc::Sender<v1::SessionRequest>),
    /// A shared-memory session (`ps_shm`): a lone request writes itself onto
    /// the one ring and reads its answer off the other; others are queued
    /// and read for ([`rings`]).
    Rings(Box<RequestRing>, AnswerRing),
}

/// One open session to a server: a `Session` stream, or a shared-memory
/// session.
pub(crate) struct SessionLink {
    transport: Transport,
    waiting: Arc<Mutex<Waiting>>,
    next_id: AtomicU64,
    /// The server's values arena, for a shared-memory session it handed one to.
    arena: Option<Arc<ArenaView>>,
}

impl SessionLink {
    /// Opens a session over `client`; `None` when the server does not offer
    /// sessions (it answers `UNIMPLEMENTED`).
    ///
    /// # Errors
    /// The status the stream could not be opened with.
    pub(crate) async fn open(channel: AuthChannel, limit: usize) -> Result<Option<Self>, Status> {
        let (requests, queued) = mpsc::channel(REQUESTS_AHEAD);
        let body = Body::new(SessionBody::new(queued, Ending::Plain));
        let metadata = MetadataMap::new();
        let answer = match start_framed_body(channel, SESSION_PATH, metadata, body, limit).await {
            Ok(answer) => answer,
            Err(status) if status.code() == Code::Unimplemented => return Ok(None),
            Err(status) => return Err(status),
        };
        let answers = answers_of(answer).map(|answer| answer.map(Answer::whole));
        Ok(Some(Self::over(requests, answers)))
    }

    /// A session through the shared-memory region `end` hands over. A task
    /// waits for it to end (the server's process gone, a ring broken, or this
    /// link dropped), and then fails every request still waiting.
    pub(crate) fn over_shared_memory(region: ps_shm::handshake::WorkerEnd) -> Self {
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let arena = region.arena.clone();
        let (requests, answers, closed) = ps_shm::worker_rings(region, u64::MAX);
        let watched = Arc::clone(&waiting);
        tokio::spawn(async move {
            let why = closed.wait().await;
            let status = Status::unavailable(format!(
                "the shared-memory session ended ({why}); a new one is opened for the next request"
            ));
            end(&watched, status);
        });
        Self {
            transport: Transport::Rings(Box::new(requests), answers),
            waiting,
            next_id: AtomicU64::new(1),
            arena,
        }
    }

    /// A session whose stream has ended without its reader having seen it
    /// yet: the moment a request can meet when the server closes an idle
    /// session.
    #[cfg(test)]
    pub(crate) fn ended_unnoticed() -> Self {
        let (requests, _) = mpsc::channel(1);
        Self::over(requests, futures::stream::pending())
    }

    /// A gRPC session sending requests to `requests` and matching the answers
    /// read from `answers`.
    fn over(
        requests: mpsc::Sender<v1::SessionRequest>,
        answers: impl Stream<Item = Result<Answer, Status>> + Send + Unpin + 'static,
    ) -> Self {
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        tokio::spawn(read_answers(answers, Arc::clone(&waiting)));
        Self {
            transport: Transport::Stream(requests),
            waiting,
            next_id: AtomicU64::new(1),
            arena: None,
        }
    }

    /// Whether this session runs through shared memory.
    pub(crate) fn is_shared_memory(&self) -> bool {
        matches!(self.transport, Transport::Rings(..))
    }

    /// The server's values arena while this session is open through shared
    /// memory and the server handed one over: where pulls may read values
    /// again with no request ([`ArenaView::read_current`]).
    pub(crate) fn values_arena(&self) -> Option<&Arc<ArenaView>> {
        self.arena.as_ref().filter(|_| !self.has_ended())
    }

    /// Whether the stream has ended (a new request would fail at once).
    pub(crate) fn has_ended(&self) -> bool {
        lock(&self.waiting).ended.is_some()
    }

    /// Sends `op` and waits for what came of it.
    ///
    /// # Errors
    /// [`CallError::NotSent`] when the stream had ended before the request
    /// could go out (the link then counts as ended); otherwise the refusal, as
    /// the status the unary call would have ended with, or `UNAVAILABLE` when
    /// the stream ended before the answer came.
    pub(crate) async fn call(&self, op: Op) -> Result<(Outcome, u64), CallError> {
        let answer = self.answer(op).await?;
        let whole = answer.into_whole().await.map_err(CallError::Failed)?;
        let (outcome, waited_us, _) = outcome_of(whole, None)?;
        Ok((outcome, waited_us))
    }

    /// [`SessionLink::call`], an answer's large payloads left on a
    /// shared-memory ring for the caller to read straight into its own
    /// memory (`Some`; the outcome's tensors then carry no bytes). The
    /// session's next answer waits until they are dropped: the caller must
    /// not wait for another answer of this session while it holds them.
    ///
    /// # Errors
    /// As [`SessionLink::call`].
    pub(crate) async fn call_lending(
        &self,
        op: Op,
    ) -> Result<(Outcome, u64, Option<LentPayloads>), CallError> {
        let answer = self.answer(op).await?;
        outcome_of(answer.message, answer.lent)
    }

    /// Sends `op` and waits for its answer.
    async fn answer(&self, op: Op) -> Result<Answer, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (slot, mut answer) = oneshot::channel();
        {
            let mut waiting = lock(&self.waiting);
            if let Some(ended) = &waiting.ended {
                return Err(CallError::NotSent(ended.clone()));
            }
            waiting.answers.insert(id, slot);
        }
        let request = v1::SessionRequest {
            id,
            deadline_ms: 0,
            op: Some(op),
        };
        let answered = match &self.transport {
            Transport::Stream(requests) => {
                if requests.send(request).await.is_err() {
                    return Err(self.not_sent(id));
                }
                delivered(answer.await)
            }
            Transport::Rings(requests, answers) => {
                // Claimed before the request goes out, so that whoever reads
                // the ring when its answer comes knows it waits.
                let reading = OwnReading::claim(&self.waiting, answers);
                // Dropped before it is written or queued, the request takes
                // its slot back (before the ring passes on): nobody waits
                // for its answer (a write cut off midway is still finished,
                // and the server's answer to it is dropped unclaimed).
                let mut unsent = Unsent {
                    waiting: &self.waiting,
                    id,
                    armed: true,
                };
                // Before the request is written whole, its slot can only be
                // filled by the session's end, and an ended session writes
                // nothing more (`ps_shm::caller`): the server never had the
                // request. (An answer then is a server's error:
                // `answered_unwritten`.) A lone request writes itself,
                // reading meanwhile the answers that come
                // (`OwnReading::while_writing`); one sent while others are
                // in flight goes to the writer task, which writes them in
                // turn.
                let sent = tokio::select! {
                    biased;
                    answered = &mut answer => return Err(self.answered_unwritten(id, answered)),
                    sent = async {
                        match &reading {
                            Some(reading) => {
                                let send = std::pin::pin!(requests.send(request));
                                reading.while_writing(send).await
                            }
                            None => requests.queue(request).await.map(Sent::Queued),
                        }
                    } => sent,
                };
                let sent = match sent {
                    Ok(sent) => sent,
                    Err(error) => {
                        end(&self.waiting, broken(&error));
                        return Err(self.not_sent(id));
                    }
                };
                unsent.armed = false;
                let answered = match reading {
                    Some(reading) => reading.answer(answer).await,
                    None => delivered(answer.await),
                };
                // The session ended with the request still queued: the
                // server never had it, and it may go on a new session.
                if let (Err(_), Sent::Queued(queued)) = (&answered, &sent)
                    && queued.withdraw()
                {
                    return Err(self.not_sent(id));
                }
                answered
            }
        };
        answered.map_err(CallError::Failed)
    }

    /// What came of request `id` when its slot was filled before the request
    /// was written whole: the session's end (it never went out whole, so it
    /// may go again), or an answer, which a server can only make once it has
    /// read the request whole. Such an answer ends the session as broken, and
    /// the request fails rather than go again: the rest of it is still
    /// written, so the server may have it.
    fn answered_unwritten(
        &self,
        id: u64,
        answered: Result<Result<Answer, Status>, oneshot::error::RecvError>,
    ) -> CallError {
        if let Ok(Ok(_)) = answered {
            let why = Status::internal(format!(
                "the server answered request {id} before it was written whole; \
                 the shared-memory session is ended"
            ));
            end(&self.waiting, why.clone());
            return CallError::Failed(why);
        }
        self.not_sent(id)
    }

    /// Takes request `id` out of the waiting ones: it never went out whole,
    /// because the session had ended (with the status that ended it).
    fn not_sent(&self, id: u64) -> CallError {
        let mut waiting = lock(&self.waiting);
        waiting.answers.remove(&id);
        let ended = Status::unavailable("the session stream has ended");
        CallError::NotSent(waiting.ended.get_or_insert(ended).clone())
    }
}

/// A request's slot, taken back out of the waiting ones if this is dropped
/// while `armed` (before the request was written or queued).
struct Unsent<'a> {
    waiting: &'a Mutex<Waiting>,
    id: u64,
    armed: bool,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(self.waiting).answers.remove(&self.id);
        }
    }
}

/// What a request's slot brought: its answer, or why it has none.
fn delivered(
    answer: Result<Result<Answer, Status>, oneshot::error::RecvError>,
) -> Result<Answer, Status> {
    answer.unwrap_or_else(|_| Err(unanswered()))
}

/// What `slot` brought, if it has.
fn taken(slot: &mut oneshot::Receiver<Result<Answer, Status>>) -> Option<Result<Answer, Status>> {
    match slot.try_recv() {
        Ok(answer) => Some(answer),
        Err(oneshot::error::TryRecvError::Empty) => None,
        Err(oneshot::error::TryRecvError::Closed) => Some(Err(unanswered())),
    }
}

/// Why a request whose slot closed unfilled has no answer.
fn unanswered() -> Status {
    Status::unavailable("the session stream ended before the answer")
}

/// The status a shared-memory session ends with when one of its rings
/// fails: `UNAVAILABLE`, which the retry policy retries on a new session.
fn broken(error: &ps_shm::message::MessageError) -> Status {
    Status::unavailable(format!(
        "the shared-memory session broke ({error}); a new one is opened for the next request"
    ))
}

/// What came of a request: its outcome, how long a pull waited, and any
/// payloads still lent; a refusal as the status it stands for.
fn outcome_of(
    answer: v1::SessionAnswer,
    lent: Option<LentPayloads>,
) -> Result<(Outcome, u64, Option<LentPayloads>), CallError> {
    let id = answer.id;
    match answer.outcome {
        Some(Outcome::Refusal(refusal)) => Err(CallError::Failed(status_of(refusal))),
        Some(outcome) => Ok((outcome, answer.pull_waited_us, lent)),
        None => Err(CallError::Failed(Status::internal(format!(
            "the answer to session request {id} carries no outcome"
        )))),
    }
}

/// Why a request on a session came to nothing.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The stream had ended before the request went out: the server never
    /// saw it, so it may be sent again on a new stream, whatever it is.
    NotSent(Status),
    /// Sent, and refused, or the stream ended before its answer.
    Failed(Status),
}

impl CallError {
    pub(crate) fn into_status(self) -> Status {
        match self {
            CallError::NotSent(status) | CallError::Failed(status) => status,
        }
    }
}

/// The answers of a session, each decoded out of the frames it arrived in (a
/// row pull's rows taken as slices of them); the stream ends after an error.
fn answers_of(
    answer: FramedAnswer,
) -> impl Stream<Item = Result<v1::SessionAnswer, Status>> + Send + Unpin + 'static {
    Box::pin(futures::stream::unfold(Some(answer), |answer| async move {
        let mut answer = answer?;
        match answer.next_message().await {
            Ok(Some(message)) => match v1::SessionAnswer::decode(message) {
                Ok(decoded) => Some((Ok(decoded), Some(answer))),
                Err(e) => {
                    let message = format!("a session answer does not decode: {e}");
                    Some((Err(Status::internal(message)), None))
                }
            },
            Ok(None) => None,
            Err(status) => Some((Err(status), None)),
        }
    }))
}

fn lock(waiting: &Mutex<Waiting>) -> MutexGuard<'_, Waiting> {
    waiting
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Hands each answer on `answers` to the request waiting for it; when the
/// stream ends, fails every request still waiting with `UNAVAILABLE`.
async fn read_answers(
    mut answers: impl Stream<Item = Result<Answer, Status>> + Unpin,
    waiting: Arc<Mutex<Waiting>>,
) {
    let ended = loop {
        match answers.next().await.transpose() {
            Ok(Some(answer)) => hand_over(&waiting, answer),
            Ok(None) => break Status::unavailable("the server ended the session stream"),
            Err(status) => {
                break Status::unavailable(format!(
                    "the session stream broke ({:?}: {}); a new one is opened for the next request",
                    status.code(),
                    status.message()
                ));
            }
        }
    };
    end(&waiting, ended);
}

/// Hands `answer` to the request waiting for it (none when it gave up).
fn hand_over(waiting: &Mutex<Waiting>, answer: Answer) {
    let slot = lock(waiting).answers.remove(&answer.message.id);
    if let Some(slot) = slot {
        let _ = slot.send(Ok(answer));
    }
}

/// Ends the session for `why`: every request still waiting fails with it,
/// and so does every later one. The first reason stays.
fn end(waiting: &Mutex<Waiting>, why: Status) {
    let mut waiting = lock(waiting);
    let why = waiting.ended.get_or_insert(why).clone();
    for (_, slot) in waiting.answers.drain() {
        let _ = slot.send(Err(why.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_the_ended_stream_never_took_is_not_sent_and_the_link_counts_as_ended() {
        let link = SessionLink::ended_unnoticed();
        assert!(!link.has_ended(), "its reader has not seen the end");
        let pull = Op::Pull(v1::PullRequest::default());
        match link.call(pull.clone()).await {
            Err(CallError::NotSent(status)) => assert_eq!(status.code(), Code::Unavailable),
            other => panic!("sent on an ended stream: {other:?}"),
        }
        assert!(link.has_ended(), "a new session replaces it");
        assert!(matches!(link.call(pull).await, Err(CallError::NotSent(_))));
    }

    #[tokio::test]
    async fn a_request_whose_stream_ends_before_the_answer_has_failed() {
        let (requests, mut queued) = mpsc::channel(1);
        let (answers, answered) = mpsc::channel(1);
        let link = SessionLink::over(
            requests,
            tokio_stream::wrappers::ReceiverStream::new(answered),
        );
        let call =
            tokio::spawn(async move { link.call(Op::Pull(v1::PullRequest::default())).await });
        assert!(queued.recv().await.is_some(), "the request went out");
        drop(answers);
        match call.await.unwrap() {
            Err(CallError::Failed(status)) => assert_eq!(status.code(), Code::Unavailable),
            other => panic!("{other:?}"),
        }
    }
}

#[path = "session_rings.rs"]
mod rings;

#[cfg(test)]
#[path = "session_rings_tests.rs"]
mod rings_tests;
