//! A [`SessionLink`] over a real shared-memory session (handshake, region,
//! rings) against a hand-driven server side: requests in flight together each
//! get their own answer in whatever order the server answers, large answers
//! lent to others included, whether the request reading the ring hands them
//! over or, once its own answer came, a task does; a request given up while
//! it read the ring leaves the session to the others; a session whose
//! server went fails what waits and sends nothing more; requests it never
//! had whole (one written in part, one still queued) are not sent, so they
//! may go again; a request waiting for room on the request ring reads the
//! answers nobody waits for, which the server may wait on, and given up
//! while it reads them leaves the session whole; and an answer to a
//! request not yet written whole, which only a broken server sends, ends
//! the session.

use std::sync::Arc;

use bytes::Bytes;
use ps_proto::v1;
use ps_shm::handshake::{ServerEnd, WorkerEnd, in_process_ends, in_process_ends_over_pipes};
use ps_shm::pool::BufferPool;
use ps_shm::serving::Charger;
use ps_shm::{ServerLink, serve_link};
use tokio_stream::StreamExt;

use super::*;

/// A link over a region whose rings hold 64 KiB, and the server's side of
/// it, answered by hand.
async fn linked() -> (Arc<SessionLink>, ServerLink) {
    let (server, worker, _) = in_process_ends(1 << 16).await.unwrap();
    link_over(server, worker)
}

/// [`linked`], its doorbells pipes, as between two processes.
async fn linked_over_pipes() -> (Arc<SessionLink>, ServerLink) {
    let (server, worker, _) = in_process_ends_over_pipes(1 << 16).await.unwrap();
    link_over(server, worker)
}

fn link_over(server: ServerEnd, worker: WorkerEnd) -> (Arc<SessionLink>, ServerLink) {
    let charge: Charger = Arc::new(|_| Ok(Arc::new(())));
    let serving = serve_link(
        server,
        (charge, None),
        BufferPool::new(),
        std::future::pending(),
    );
    (Arc::new(SessionLink::over_shared_memory(worker)), serving)
}

/// Request `n`: a pull, told apart from the others by its minimum version.
fn pull(n: u64) -> Op {
    Op::Pull(v1::PullRequest {
        min_version: n,
        ..Default::default()
    })
}

/// The bytes answering request `n`: 300 KB (lent) for even `n`, 4 KiB
/// (read whole) for odd, in a pattern of `n`'s own.
fn values(n: u64) -> Vec<u8> {
    let len = if n.is_multiple_of(2) { 300_000 } else { 4096 };
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7) ^ n as u8)
        .collect()
}

/// The server's answer to `request`, carrying [`values`] of the `n` it
/// asked with.
fn answer_to(request: &v1::SessionRequest) -> v1::SessionAnswer {
    let Some(Op::Pull(pull)) = &request.op else {
        panic!("not a pull: {request:?}");
    };
    let n = pull.min_version;
    let data = values(n);
    let tensor = v1::Tensor {
        name: "w".into(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![data.len() as u64 / 4],
        data: Bytes::from(data),
    };
    v1::SessionAnswer {
        id: request.id,
        outcome: Some(Outcome::Pull(v1::PullResponse {
            tensors: vec![v1::PulledTensor {
                version: n,
                arena: None,
                tensor: Some(tensor),
            }],
        })),
        pull_waited_us: 0,
    }
}

/// A push of 200 KB of gradients: more than a 64 KiB ring holds, so its
/// write waits for the server to read.
fn large_push() -> Op {
    let gradient = v1::Tensor {
        name: "w".into(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![50_000],
        data: Bytes::from(vec![1u8; 200_000]),
    };
    Op::Push(v1::PushRequest {
        worker_id: 1,
        step: 1,
        map_version: 0,
        grads: vec![gradient],
    })
}

/// Checks that `outcome` answers request `n`.
fn assert_answers(n: u64, outcome: &Outcome) {
    let Outcome::Pull(pulled) = outcome else {
        panic!("request {n} got {outcome:?}");
    };
    assert_eq!(
        pulled.tensors[0].version, n,
        "request {n} got another's answer"
    );
    let data = &pulled.tensors[0].tensor.as_ref().unwrap().data;
    assert!(*data == values(n), "request {n}'s bytes differ");
}

/// Waits for `future`, failing the test instead of hanging it.
async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), future)
        .await
        .expect("no answer within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_together_each_get_their_own_answer_in_any_order() {
    each_gets_its_own_answer_in_any_order(linked().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_together_over_pipes_each_get_their_own_answer_in_any_order() {
    each_gets_its_own_answer_in_any_order(linked_over_pipes().await).await;
}

async fn each_gets_its_own_answer_in_any_order(
    (link, mut serving): (Arc<SessionLink>, ServerLink),
) {
    const CALLS: u64 = 16;
    let calls: Vec<_> = (1..=CALLS)
        .map(|n| {
            let link = Arc::clone(&link);
            tokio::spawn(async move { (n, link.call(pull(n)).await) })
        })
        .collect();
    let mut requests = Vec::new();
    for _ in 0..CALLS {
        requests.push(serving.requests.next().await.unwrap().unwrap().unwrap());
    }
    // Last asked, first answered: every request but the last reads answers
    // meant for others, large ones among them.
    for request in requests.iter().rev() {
        serving.answers.send(Ok(answer_to(request))).await.unwrap();
    }
    for call in calls {
        let (n, answered) = within(call).await.unwrap();
        let (outcome, _) = answered.unwrap_or_else(|e| panic!("request {n}: {e:?}"));
        assert_answers(n, &outcome);
    }
    assert!(!link.has_ended());
    // The request that read was answered last, with nobody left waiting: no
    // task was started, and the next request reads for itself.
    assert_eq!(lock(&link.waiting).reader, rings::Reader::Nobody);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reading_request_answered_first_leaves_the_ring_to_a_task_for_the_others() {
    let (link, mut serving) = linked().await;
    let call = |n| {
        let link = Arc::clone(&link);
        tokio::spawn(async move { (n, link.call(pull(n)).await) })
    };
    // Alone when it went out: it reads the ring.
    let reader = call(100);
    let first = serving.requests.next().await.unwrap().unwrap().unwrap();
    let others: Vec<_> = (1..=15).map(call).collect();
    let mut requests = Vec::new();
    for _ in &others {
        requests.push(serving.requests.next().await.unwrap().unwrap().unwrap());
    }
    serving.answers.send(Ok(answer_to(&first))).await.unwrap();
    let (n, answered) = within(reader).await.unwrap();
    assert_answers(n, &answered.unwrap().0);
    // Fifteen still wait, large answers among them: a task reads for them.
    for request in requests.iter().rev() {
        serving.answers.send(Ok(answer_to(request))).await.unwrap();
    }
    for call in others {
        let (n, answered) = within(call).await.unwrap();
        let (outcome, _) = answered.unwrap_or_else(|e| panic!("request {n}: {e:?}"));
        assert_answers(n, &outcome);
    }
    // Nobody waits: the next request is answered, by the task if it still
    // stays, else reading for itself.
    let last = call(7);
    let request = serving.requests.next().await.unwrap().unwrap().unwrap();
    serving.answers.send(Ok(answer_to(&request))).await.unwrap();
    let (n, answered) = within(last).await.unwrap();
    assert_answers(n, &answered.unwrap().0);
    assert!(!link.has_ended());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_while_it_read_the_ring_leaves_the_session_to_the_others() {
    let (link, mut serving) = linked().await;
    // Boxed, so that dropping it drops the request itself.
    let mut given_up = Box::pin(link.call(pull(2)));
    // Driven until the server has it: it then reads the ring, waiting.
    let request = tokio::select! {
        answered = &mut given_up => panic!("answered before the server saw it: {answered:?}"),
        request = serving.requests.next() => request.unwrap().unwrap().unwrap(),
    };
    drop(given_up);
    // Its answer, nobody's now (and lent), comes before the next one's.
    serving.answers.send(Ok(answer_to(&request))).await.unwrap();
    let next = tokio::spawn({
        let link = Arc::clone(&link);
        async move { link.call(pull(3)).await }
    });
    let request = serving.requests.next().await.unwrap().unwrap().unwrap();
    serving.answers.send(Ok(answer_to(&request))).await.unwrap();
    let (outcome, _) = within(next).await.unwrap().unwrap();
    assert_answers(3, &outcome);
    assert!(!link.has_ended(), "nothing was cut off midway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_server_went_fails_what_waits_and_sends_nothing_more() {
    let (link, mut serving) = linked().await;
    let waiting = tokio::spawn({
        let link = Arc::clone(&link);
        async move { link.call(pull(1)).await }
    });
    serving.requests.next().await.unwrap().unwrap().unwrap();
    drop(serving);
    match within(waiting).await.unwrap() {
        Err(CallError::Failed(status)) => assert_eq!(status.code(), Code::Unavailable),
        other => panic!("{other:?}"),
    }
    assert!(link.has_ended());
    match link.call(pull(2)).await {
        Err(CallError::NotSent(status)) => assert_eq!(status.code(), Code::Unavailable),
        other => panic!("sent on an ended session: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_server_never_had_whole_when_it_went_are_not_sent() {
    let (mut server, worker, _) = in_process_ends(1 << 16).await.unwrap();
    let link = Arc::new(SessionLink::over_shared_memory(worker));
    // 200 KB through a 64 KiB ring nobody reads: the push writes itself
    // and waits for room; a pull sent meanwhile waits in the writer task's
    // queue.
    let large = large_push();
    let call = |op| {
        let link = Arc::clone(&link);
        tokio::spawn(async move { link.call(op).await })
    };
    let pushing = call(large);
    within(server.requests.read_word()).await.unwrap();
    let queued = call(pull(2));
    within(async {
        while lock(&link.waiting).answers.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    drop(server);
    // The push was written in part, and an ended session writes nothing
    // more; the pull never went out. Neither reached the server whole.
    match within(pushing).await.unwrap() {
        Err(CallError::NotSent(status)) => assert_eq!(status.code(), Code::Unavailable),
        other => panic!("a request never written whole counts as sent: {other:?}"),
    }
    match within(queued).await.unwrap() {
        Err(CallError::NotSent(status)) => assert_eq!(status.code(), Code::Unavailable),
        other => panic!("a request never written counts as sent: {other:?}"),
    }
}

/// The answer to push `id`, taken.
fn pushed(id: u64) -> v1::SessionAnswer {
    v1::SessionAnswer {
        id,
        outcome: Some(Outcome::Push(v1::PushResponse::default())),
        pull_waited_us: 0,
    }
}

/// A server's session, as a session's loop runs it, that first sends
/// answers to requests the link never had in flight, standing in for those
/// given up midway through their writes (their slots taken back, the rest
/// of each written by the writer task), large ones among them: they fill the
/// answer ring and then the answer task's queue, and the server reads the
/// next request, a push it answers, only once they are all handed over,
/// which takes the worker reading them. Tells `eleven_sent` once it has
/// sent eleven.
fn answers_to_nobody_then_the_push(
    mut serving: ServerLink,
    eleven_sent: Option<mpsc::Sender<()>>,
) -> tokio::task::JoinHandle<ServerLink> {
    tokio::spawn(async move {
        for n in 0..2 * ps_shm::serving::ANSWERS_QUEUED as u64 {
            let request = v1::SessionRequest {
                id: 1_000 + n,
                deadline_ms: 0,
                op: Some(pull(n)),
            };
            serving.answers.send(Ok(answer_to(&request))).await.unwrap();
            if let (10, Some(told)) = (n, &eleven_sent) {
                told.send(()).await.unwrap();
            }
        }
        let request = serving.requests.next().await.unwrap().unwrap().unwrap();
        assert!(matches!(request.op, Some(Op::Push(_))), "{request:?}");
        serving.answers.send(Ok(pushed(request.id))).await.unwrap();
        serving
    })
}

/// Sends a pull on `link` and checks it gets its own answer from the
/// server's session `server` hands back once it is done with what it sent;
/// returns that session, which ends when dropped.
async fn the_next_pull_is_answered(
    link: &Arc<SessionLink>,
    server: tokio::task::JoinHandle<ServerLink>,
) -> ServerLink {
    let next = tokio::spawn({
        let link = Arc::clone(link);
        async move { link.call(pull(3)).await }
    });
    let mut serving = within(server).await.unwrap();
    let request = serving.requests.next().await.unwrap().unwrap().unwrap();
    serving.answers.send(Ok(answer_to(&request))).await.unwrap();
    let (outcome, _) = within(next).await.unwrap().unwrap();
    assert_answers(3, &outcome);
    serving
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_room_reads_the_answers_nobody_waits_for() {
    let (link, serving) = linked().await;
    let server = answers_to_nobody_then_the_push(serving, None);
    // Larger than the request ring: its write waits for the server.
    let (outcome, _) = within(link.call(large_push())).await.unwrap();
    assert!(matches!(outcome, Outcome::Push(_)), "{outcome:?}");
    // The session goes on: the next request is answered.
    let _serving = the_next_pull_is_answered(&link, server).await;
    assert!(!link.has_ended());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_request_not_yet_written_whole_ends_the_session() {
    let (link, mut serving) = linked().await;
    // Larger than the request ring, which this server does not read: the
    // push waits for room, reading the answer ring meanwhile.
    let pushing = tokio::spawn({
        let link = Arc::clone(&link);
        async move { link.call(large_push()).await }
    });
    within(async {
        while lock(&link.waiting).answers.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // Only a server that broke the protocol answers it now; the push may
    // yet reach it whole, so it fails instead of counting as never sent.
    serving.answers.send(Ok(pushed(1))).await.unwrap();
    match within(pushing).await.unwrap() {
        Err(CallError::Failed(status)) => assert_eq!(status.code(), Code::Internal, "{status:?}"),
        other => panic!("answered before it was written whole: {other:?}"),
    }
    assert!(link.has_ended(), "a new session replaces it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_while_it_read_for_its_write_leaves_the_session_whole() {
    let (link, serving) = linked().await;
    let (eleven_sent, mut sent_eleven) = mpsc::channel(1);
    let server = answers_to_nobody_then_the_push(serving, Some(eleven_sent));
    // Given up while it waits for room, reading the answers nobody waits
    // for (lent ones among them, read past as they are dropped).
    let pushing = tokio::spawn({
        let link = Arc::clone(&link);
        async move { link.call(large_push()).await }
    });
    within(sent_eleven.recv()).await.unwrap();
    pushing.abort();
    let _ = pushing.await;
    // The next request reads what is left, and gets its own answer.
    let _serving = the_next_pull_is_answered(&link, server).await;
    assert!(!link.has_ended(), "nothing was cut off midway");
}
