//! The worker's side of a session run as streams: [`worker_link`] turns the
//! worker's rings ([`crate::caller`], which a client drives from its requests
//! themselves) into a request channel and an answer stream, for tests and
//! tools that want a session as streams. Its reader hands a large answer on
//! with its payloads still on the ring ([`crate::lent`]) and reads on once
//! they are dropped, past whatever was left unread. The server's side is
//! [`crate::serving`].

use ps_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::caller::{AnswerRing, RequestRing, worker_rings};
use crate::handshake::WorkerEnd;
use crate::lent::Answer;
use crate::message::MessageError;

/// Messages the worker's channels hold ahead of the rings.
const AHEAD: usize = 64;

/// The worker's side of a session.
pub struct WorkerLink {
    /// The requests to write.
    pub requests: mpsc::Sender<v1::SessionRequest>,
    /// The server's answers, large payloads lent ([`crate::lent`]); an `Err`
    /// (`UNAVAILABLE`) when the session ended.
    pub answers: ReceiverStream<Result<Answer, Status>>,
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
pub(crate) fn broke(
    error: MessageError,
    status_of: fn(MessageError) -> Status,
) -> (&'static str, Status) {
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
