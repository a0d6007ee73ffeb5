//! `Session`: one long-lived stream per worker, carrying pushes and pulls as
//! messages tagged with an id and answering each as it finishes.
//!
//! A unary call pays for a whole HTTP/2 request per operation (HEADERS with
//! HPACK, a stream opened and closed, a service dispatch, trailers); on a
//! session an operation is one message each way, in as few DATA frames as
//! its size allows (`ps_proto::session_frames`). Each operation goes
//! through the same steps as its unary method ([`ParameterService::push_grads`],
//! [`ParameterService::pull_response`]; a `PushPull` is the one and then the
//! other, answered together): the map version and memory budget are
//! admitted, the store applies it, and a refusal becomes the same status,
//! carried in the answer with its metadata. The role was checked once, when
//! the stream opened (the `Access` layer); every operation's answer is recorded
//! in the server's metrics under its own name (`Push`, `Pull`, `PushPull`).
//!
//! A shared-memory session (`crate::shared_memory`) is served by the same
//! loop, its requests read from the region instead of the stream.
//!
//! One task serves a stream: it reads requests and drives the operations in
//! flight side by side, so a pull waiting for its version holds up nothing
//! behind it. The stream ends when the client ends it, at the first message
//! that does not decode, or after the idle timeout with nothing in flight (at
//! most twice the timeout after its last message); when nobody reads its
//! answers any more (the client went away), it stops at once, dropping the
//! operations in flight.

use std::collections::HashSet;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{Future, Stream, StreamExt, TryStreamExt};
use ps_common::access::Answers;
use ps_proto::refusal::refusal_of;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use tokio::sync::mpsc;
use tonic::{Code, Status};

use crate::service::ParameterService;

/// Answers a stream's task may have written ahead of the client reading them.
const ANSWERS_AHEAD: usize = 64;

/// What a gRPC session stream's task sends back: answers, or the status that ends it.
pub(crate) type AnswerSender = mpsc::Sender<Result<v1::SessionAnswer, Status>>;

/// Where a session's answers go.
pub(crate) enum AnswerSink {
    /// A gRPC `Session` stream's: a channel its response body reads.
    Stream(AnswerSender),
    /// A shared-memory session's: its answer ring, written by the session's
    /// own task.
    Rings(ps_shm::serving::Answers),
}

impl AnswerSink {
    /// A gRPC stream's sink sending to `sender`, and what comes when its
    /// response body is dropped (the client went away).
    fn stream(sender: AnswerSender) -> (Self, impl Future<Output = ()>) {
        let gone = {
            let sender = sender.clone();
            async move { sender.closed().await }
        };
        (Self::Stream(sender), gone)
    }

    /// Sends `answer` (an `Err` ends the session); `Err` when nobody takes
    /// answers any more.
    async fn send(&mut self, answer: Result<v1::SessionAnswer, Status>) -> Result<(), ()> {
        match self {
            Self::Stream(sender) => sender.send(answer).await.map_err(drop),
            Self::Rings(ring) => ring.send(answer).await.map_err(drop),
        }
    }
}

/// What a session reads: a request to run, or an answer refusing one that
/// was read past (`ps_shm::serving::Read`), or the status that ends it.
pub(crate) type Incoming = Result<ps_shm::serving::Read, Status>;

/// How a session's requests reach it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    /// The most bytes a pull's values may take.
    pub(crate) largest: usize,
    /// Pushes carrying at least this many bytes of gradients were scanned for
    /// NaN and infinity as they were read (a shared-memory session's, piece
    /// by piece off the ring: `ps_shm::serving::ServerLink::checked_from`), and
    /// the store does not scan them again.
    pub(crate) scanned_from: Option<u64>,
}

impl Reading {
    /// A gRPC session's: pulls up to `largest` bytes, nothing scanned yet.
    pub(crate) fn grpc(largest: usize) -> Self {
        Self {
            largest,
            scanned_from: None,
        }
    }

    /// Whether `push`'s gradients were scanned as they were read.
    fn scanned(self, push: &v1::PushRequest) -> bool {
        let bytes: u64 = push.grads.iter().map(|grad| grad.data.len() as u64).sum();
        self.scanned_from.is_some_and(|from| bytes >= from)
    }
}

type Operation<'a> = Pin<Box<dyn Future<Output = v1::SessionAnswer> + Send + 'a>>;

/// Serves a session whose requests are `requests` (a gRPC `Session` stream)
/// on a task of its own: its answers, then the status that ended it, if one did.
pub(crate) fn open(
    service: &ParameterService,
    requests: impl Stream<Item = Result<v1::SessionRequest, Status>> + Send + Unpin + 'static,
) -> mpsc::Receiver<Result<v1::SessionAnswer, Status>> {
    let (answers, answered) = mpsc::channel(ANSWERS_AHEAD);
    let idle = service.config().transport.idle_connection_timeout;
    let limit = service.max_message_bytes();
    tokio::spawn(serve(
        service.clone(),
        requests.map_ok(Ok),
        AnswerSink::stream(answers),
        idle,
        Reading::grpc(limit),
    ));
    answered
}

/// Serves one session until it ends: reads `requests` (a gRPC `Session`
/// stream's, or a shared-memory session's, read off its ring as they are
/// polled), runs each operation on `service`, and sends every answer to
/// `answers`. It ends when `gone` says nobody takes answers any more (the
/// client went away), once the requests end and every answer is handed to
/// `answers`, at the first request that does not decode, or after `idle`
/// (at most twice that) with nothing sent or in flight. `read_as` says how many bytes a pull's values may take (the
/// message limit on gRPC; none in shared memory) and which pushes were
/// scanned for NaN and infinity as they were read.
///
/// An operation that finishes when first run (a push, or a pull whose
/// version is there) is answered at once; one that waits runs beside the
/// others, so a pull waiting for its version holds up nothing behind it.
pub(crate) async fn serve(
    service: ParameterService,
    mut requests: impl Stream<Item = Incoming> + Unpin,
    (mut answers, gone): (AnswerSink, impl Future<Output = ()>),
    idle: Option<Duration>,
    read_as: Reading,
) {
    let mut in_flight: FuturesUnordered<Operation<'_>> = FuturesUnordered::new();
    let mut ids = HashSet::new();
    let mut reading = true;
    // Messages and answers so far, and their count when the idle timer last
    // fired: a session busy since then gets another `idle`, so one is ended
    // between `idle` and twice that after its last message. Counting costs
    // nothing where reading the clock at each message did (30 ns a read here),
    // and setting the timer afresh each time would take its lock.
    let (mut activity, mut activity_at_timer) = (0u64, 0u64);
    let idle_timer = tokio::time::sleep(idle.unwrap_or(Duration::MAX / 4));
    tokio::pin!(idle_timer, gone);
    loop {
        tokio::select! {
            message = requests.next(), if reading => match message {
                Some(Ok(Ok(request))) => {
                    activity = activity.wrapping_add(1);
                    if let Some(refused) = admit_id(&mut ids, &request) {
                        if answers.send(Ok(refused)).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let mut operation: Operation<'_> = Box::pin(operate(&service, request, read_as));
                    match futures::poll!(operation.as_mut()) {
                        Poll::Ready(answer) => {
                            ids.remove(&answer.id);
                            if answers.send(Ok(answer)).await.is_err() {
                                return;
                            }
                        }
                        Poll::Pending => in_flight.push(operation),
                    }
                }
                Some(Ok(Err(refused))) => {
                    activity = activity.wrapping_add(1);
                    if answers.send(Ok(refused)).await.is_err() {
                        return;
                    }
                }
                None => reading = false,
                Some(Err(status)) => {
                    let _ = answers.send(Err(status)).await;
                    return;
                }
            },
            Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                ids.remove(&answer.id);
                activity = activity.wrapping_add(1);
                if answers.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
            () = &mut gone, if reading || !in_flight.is_empty() => return,
            () = &mut idle_timer, if reading && in_flight.is_empty() && idle.is_some() => {
                let idle = idle.unwrap_or_default();
                if activity != activity_at_timer {
                    activity_at_timer = activity;
                    idle_timer.as_mut().reset(tokio::time::Instant::now() + idle);
                    continue;
                }
                let message = format!(
                    "the session sent nothing for {idle:?} with nothing in flight; open a new one"
                );
                let _ = answers.send(Err(Status::cancelled(message))).await;
                return;
            }
            else => return,
        }
    }
}

/// Takes `request`'s id as in flight; the refusal to answer it with instead,
/// when a request with the same id is.
fn admit_id(ids: &mut HashSet<u64>, request: &v1::SessionRequest) -> Option<v1::SessionAnswer> {
    if ids.insert(request.id) {
        return None;
    }
    let status = Status::invalid_argument(format!(
        "session request {} is already in flight on this stream; give each request in flight its own id",
        request.id
    ));
    Some(refused(request.id, &status))
}

/// What an operation comes to: its outcome and, for a pull, how long it
/// waited for its version.
type Done = Result<(Outcome, Duration), Status>;

/// Runs one operation within its deadline and records its answer.
async fn operate(
    service: &ParameterService,
    request: v1::SessionRequest,
    reading: Reading,
) -> v1::SessionAnswer {
    let largest = reading.largest;
    let started = service.metrics().map(|_| Instant::now());
    let (method, work): (_, Pin<Box<dyn Future<Output = Done> + Send + '_>>) = match request.op {
        Some(Op::Push(push)) => ("Push", Box::pin(push_answer(service, push, reading))),
        Some(Op::Pull(pull)) => ("Pull", Box::pin(pull_answer(service, pull, largest))),
        Some(Op::PushPull(both)) => (
            "PushPull",
            Box::pin(push_pull_answer(service, both, reading)),
        ),
        Some(Op::PullRows(pull)) => (
            "PullRows",
            Box::pin(pull_rows_answer(service, pull, largest)),
        ),
        Some(Op::PushRows(push)) => ("PushRows", Box::pin(push_rows_answer(service, push))),
        None => {
            let status = Status::invalid_argument(format!(
                "session request {} carries no operation; set push, pull, push_pull, pull_rows or push_rows",
                request.id
            ));
            return refused(request.id, &status);
        }
    };
    let answer = match within(request.deadline_ms, work).await {
        Ok((outcome, waited)) => v1::SessionAnswer {
            id: request.id,
            outcome: Some(outcome),
            pull_waited_us: waited.as_micros() as u64,
        },
        Err(status) => refused(request.id, &status),
    };
    if let (Some(metrics), Some(started)) = (service.metrics(), started) {
        metrics.answered(method, code_of(&answer), started.elapsed());
    }
    answer
}

/// `work`, ended with `DEADLINE_EXCEEDED` after `deadline_ms` milliseconds
/// (0: no deadline).
async fn within(deadline_ms: u64, work: impl Future<Output = Done>) -> Done {
    if deadline_ms == 0 {
        return work.await;
    }
    let deadline = Duration::from_millis(deadline_ms);
    tokio::time::timeout(deadline, work)
        .await
        .unwrap_or_else(|_| {
            Err(Status::deadline_exceeded(format!(
                "the session request's deadline of {deadline:?} passed"
            )))
        })
}

/// A push's answer, as `Push` gives it.
async fn push_answer(
    service: &ParameterService,
    request: v1::PushRequest,
    reading: Reading,
) -> Done {
    let scanned = reading.scanned(&request);
    let pushed = service.refusal(service.push_grads(&request, scanned).await)?;
    Ok((
        Outcome::Push(crate::wire::push_response(pushed)),
        Duration::ZERO,
    ))
}

/// A pull's answer, as `Pull` gives it, and how long it waited for its version.
async fn pull_answer(service: &ParameterService, request: v1::PullRequest, largest: usize) -> Done {
    let (response, waited) = service.refusal(service.pull_response(&request, largest).await)?;
    Ok((Outcome::Pull(response), waited))
}

/// A row pull's answer, as `PullRows` gives it.
async fn pull_rows_answer(
    service: &ParameterService,
    request: v1::PullRowsRequest,
    largest: usize,
) -> Done {
    let pulled = service.refusal(service.pull_table_rows(&request, largest).await)?;
    Ok((Outcome::PullRows(pulled), Duration::ZERO))
}

/// A row push's answer, as `PushRows` gives it.
async fn push_rows_answer(service: &ParameterService, request: v1::PushRowsRequest) -> Done {
    let pushed = service.refusal(service.push_table_rows(&request).await)?;
    Ok((Outcome::PushRows(pushed), Duration::ZERO))
}

/// A push and then a pull, answered together once the pull has its values.
async fn push_pull_answer(
    service: &ParameterService,
    request: v1::PushPull,
    reading: Reading,
) -> Done {
    let missing = |half| Status::invalid_argument(format!("a push_pull without its {half}"));
    let push = request.push.ok_or_else(|| missing("push"))?;
    let pull = request.pull.ok_or_else(|| missing("pull"))?;
    let pushed = service.refusal(service.push_grads(&push, reading.scanned(&push)).await)?;
    // The push's tensors go before the pull waits: nothing of them is needed
    // now, and a shared-memory session's read-ahead is held while they live.
    drop(push);
    let (pulled, waited) = service.refusal(service.pull_response(&pull, reading.largest).await)?;
    let response = v1::PushPullResponse {
        push: Some(crate::wire::push_response(pushed)),
        pull: Some(pulled),
    };
    Ok((Outcome::PushPull(response), waited))
}

/// The answer refusing request `id` with `status`, its metadata kept.
pub(crate) fn refused(id: u64, status: &Status) -> v1::SessionAnswer {
    v1::SessionAnswer {
        id,
        outcome: Some(Outcome::Refusal(refusal_of(status))),
        pull_waited_us: 0,
    }
}

fn code_of(answer: &v1::SessionAnswer) -> Code {
    match &answer.outcome {
        Some(Outcome::Refusal(refusal)) => Code::from_i32(refusal.code),
        _ => Code::Ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Session request `id`: a pull of `w` at `min_version`, waiting up to
    /// `timeout_ms`.
    fn pull_of_w(id: u64, min_version: u64, timeout_ms: u64) -> v1::SessionRequest {
        let pull = v1::PullRequest {
            keys: vec![v1::KeyRef {
                name: "w".into(),
                part: 0,
            }],
            min_version,
            timeout_ms,
            ..v1::PullRequest::default()
        };
        v1::SessionRequest {
            id,
            deadline_ms: 0,
            op: Some(Op::Pull(pull)),
        }
    }

    /// A session whose client has sent its last request ends once that
    /// request is answered (the stream's trailers follow).
    #[tokio::test]
    async fn a_session_ends_once_its_last_request_is_answered() {
        let (service, _store) = crate::fuzzing::one_key_service();
        let request = pull_of_w(7, 0, 0);
        let (answers, mut answered) = mpsc::channel(1);
        let requests = Box::pin(futures::stream::iter([Ok(Ok(request))]));
        let serving = tokio::spawn(serve(
            service,
            requests,
            (AnswerSink::Stream(answers), std::future::pending()),
            None,
            Reading::grpc(1 << 20),
        ));
        let answer = answered
            .recv()
            .await
            .expect("an answer")
            .expect("not an error");
        assert_eq!(answer.id, 7);
        assert!(
            matches!(answer.outcome, Some(Outcome::Pull(_))),
            "{answer:?}"
        );
        tokio::time::timeout(Duration::from_secs(30), serving)
            .await
            .expect("the session ended after its last answer")
            .expect("the session task ended cleanly");
        assert!(answered.recv().await.is_none(), "nothing follows");
    }

    /// A session whose answers nobody reads any more (its client went away)
    /// stops at once, instead of holding its pull until the pull's timeout.
    #[tokio::test]
    async fn a_session_nobody_reads_stops_with_its_pull_in_flight() {
        let (service, _store) = crate::fuzzing::one_key_service();
        let request = pull_of_w(1, 1, 600_000);
        let requests = futures::stream::iter([Ok(Ok(request))]).chain(futures::stream::pending());
        let (answers, answered) = mpsc::channel(1);
        let serving = tokio::spawn(serve(
            service,
            Box::pin(requests),
            AnswerSink::stream(answers),
            None,
            Reading::grpc(1 << 20),
        ));
        tokio::task::yield_now().await;
        drop(answered);
        tokio::time::timeout(Duration::from_secs(30), serving)
            .await
            .expect("the session stopped once its answers had no reader")
            .expect("the session task ended cleanly");
    }

    /// A session busy for longer than its idle timeout is not ended; once it
    /// falls quiet it is ended between one and two timeouts after its last
    /// message.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_session_ends_within_twice_its_idle_timeout_and_a_busy_one_never() {
        let (service, _store) = crate::fuzzing::one_key_service();
        let idle = Duration::from_secs(1);
        let (send, requests) = mpsc::channel(1);
        let (answers, mut answered) = mpsc::channel(1);
        let serving = tokio::spawn(serve(
            service,
            Box::pin(tokio_stream::wrappers::ReceiverStream::new(requests)),
            AnswerSink::stream(answers),
            Some(idle),
            Reading::grpc(1 << 20),
        ));
        for id in 0..10 {
            tokio::time::sleep(idle * 2 / 5).await;
            send.send(Ok(Ok(pull_of_w(id, 0, 0)))).await.unwrap();
            let answer = answered
                .recv()
                .await
                .expect("still open")
                .expect("answered");
            assert_eq!(answer.id, id, "busy for {:?}", idle * 4 * id as u32 / 10);
        }
        let quiet = tokio::time::Instant::now();
        let ended = answered.recv().await.expect("the session says why it ends");
        let after = quiet.elapsed();
        assert_eq!(ended.unwrap_err().code(), Code::Cancelled);
        assert!(
            after >= idle && after <= idle * 2,
            "ended {after:?} after its last message"
        );
        serving.await.expect("the session task ended cleanly");
        drop(send);
    }
}
