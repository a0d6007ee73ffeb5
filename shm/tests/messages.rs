//! Session messages through a region's rings in one process: every message
//! written whole is read back equal and in order, large ones streaming through
//! rings much smaller than they are; a message cut short by its writer is
//! never handed on; a replayed or skipped one is refused.

use std::future::Future;
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use ps_proto::v1;
use ps_proto::v1::session_request::Op;
use ps_shm::copy::Mark;
use ps_shm::message::{Arrived, MessageError, read_message, write_message};
use ps_shm::pool::BufferPool;
use ps_shm::ring::in_process;

fn push(id: u64, payloads: &[Vec<u8>]) -> v1::SessionRequest {
    v1::SessionRequest {
        id,
        deadline_ms: 0,
        op: Some(Op::Push(v1::PushRequest {
            worker_id: 1,
            step: id,
            map_version: 0,
            grads: payloads
                .iter()
                .enumerate()
                .map(|(i, data)| v1::Tensor {
                    name: format!("w{i}"),
                    part: 0,
                    dtype: v1::DType::DtypeF32 as i32,
                    shape: vec![data.len() as u64],
                    data: Bytes::from(data.clone()),
                })
                .collect(),
        })),
    }
}

/// Message `seq`, which must arrive whole.
async fn read_whole(
    reader: &mut ps_shm::ring::RingReader,
    seq: u64,
) -> Result<v1::SessionRequest, MessageError> {
    match read_message(reader, seq, u64::MAX, &BufferPool::new()).await? {
        Arrived::Whole(request) => Ok(request),
        Arrived::PastLimit(_, why) => panic!("no limit, yet past it: {why}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn messages_arrive_whole_equal_and_in_order(
        messages in prop::collection::vec(
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20_000), 0..4),
            1..8,
        ),
    ) {
        runtime().block_on(async {
            let (mut writer, mut reader, _, _) = in_process(4096).unwrap();
            let sent: Vec<_> = messages.iter().enumerate().map(|(i, m)| push(i as u64, m)).collect();
            let writing = {
                let sent = sent.clone();
                tokio::spawn(async move {
                    for (seq, message) in sent.into_iter().enumerate() {
                        write_message(&mut writer, seq as u64 + 1, message).await.unwrap();
                    }
                })
            };
            for (seq, expected) in sent.iter().enumerate() {
                let got: v1::SessionRequest =
                    read_whole(&mut reader, seq as u64 + 1).await.unwrap();
                assert_eq!(&got, expected);
            }
            writing.await.unwrap();
        });
    }

    #[test]
    fn a_message_cut_short_is_never_handed_on(
        ring_kib in 4u64..64,
        payload in 1usize..300_000,
    ) {
        runtime().block_on(async {
            let (mut writer, mut reader, _, _) = in_process(ring_kib * 1024).unwrap();
            write_message(&mut writer, 1, push(1, &[vec![7; 100]])).await.unwrap();
            // A writer that dies mid-message: it writes what fits, then is gone.
            {
                let mut writing = Box::pin(write_message(&mut writer, 2, push(2, &[vec![9; payload]])));
                let waker = futures::task::noop_waker();
                let done = writing.as_mut().poll(&mut Context::from_waker(&waker));
                prop_assume!(done.is_pending(), "the message fit the ring whole");
            }
            let first: v1::SessionRequest = read_whole(&mut reader, 1).await.unwrap();
            assert_eq!(first.id, 1);
            let second = tokio::time::timeout(
                Duration::from_millis(50),
                read_whole(&mut reader, 2),
            )
            .await;
            assert!(second.is_err(), "a message cut short was handed on: {second:?}");
            Ok(())
        })?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_or_skipped_message_is_refused() {
    let (mut writer, mut reader, _, _) = in_process(1 << 16).unwrap();
    write_message(&mut writer, 1, push(1, &[vec![1; 10]]))
        .await
        .unwrap();
    write_message(&mut writer, 1, push(1, &[vec![1; 10]]))
        .await
        .unwrap();
    let first: v1::SessionRequest = read_whole(&mut reader, 1).await.unwrap();
    assert_eq!(first.id, 1);
    let replayed = read_whole(&mut reader, 2).await;
    assert!(matches!(
        replayed,
        Err(MessageError::Sequence {
            expected: 2,
            got: 1
        })
    ));

    let (mut writer, mut reader, _, _) = in_process(1 << 16).unwrap();
    write_message(&mut writer, 2, push(2, &[])).await.unwrap();
    let skipped = read_whole(&mut reader, 1).await;
    assert!(matches!(
        skipped,
        Err(MessageError::Sequence {
            expected: 1,
            got: 2
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_past_the_limit_or_not_matching_the_tensors_are_refused() {
    // Past the limit: the header alone, the payload read past, the next
    // message whole.
    let (mut writer, mut reader, _, _) = in_process(4096).unwrap();
    let writing = tokio::spawn(async move {
        write_message(&mut writer, 1, push(1, &[vec![1; 100_000]]))
            .await
            .unwrap();
        write_message(&mut writer, 2, push(2, &[vec![2; 10]]))
            .await
            .unwrap();
    });
    let over = read_message::<v1::SessionRequest>(&mut reader, 1, 999, &BufferPool::new()).await;
    match over {
        Ok(Arrived::PastLimit(request, why)) => {
            assert_eq!(request.id, 1);
            assert!(why.contains("100000 bytes") && why.contains("999"), "{why}");
        }
        other => panic!("not refused as past the limit: {other:?}"),
    }
    assert_eq!(
        read_whole(&mut reader, 2).await.unwrap(),
        push(2, &[vec![2; 10]])
    );
    writing.await.unwrap();

    // A header naming no tensors, followed by one payload.
    let (mut writer, mut reader, _, _) = in_process(1 << 16).unwrap();
    writer.write_word(2 | 1 << 32).await.unwrap();
    writer.write_word(1).await.unwrap();
    writer.write_word(8).await.unwrap();
    writer.write(&[8, 1]).await.unwrap();
    writer.write(&[0; 8]).await.unwrap();
    writer.flush();
    let mismatched = read_whole(&mut reader, 1).await;
    assert!(
        matches!(mismatched, Err(MessageError::Malformed(_))),
        "{mismatched:?}"
    );
}

mod handshake {
    use std::os::linux::net::SocketAddrExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use ps_proto::codec::first_non_finite;
    use ps_proto::v1::session_answer::Outcome;
    use ps_shm::handshake::{Offers, admit, connect, in_process_ends, in_process_ends_over_pipes};
    use ps_shm::pool::Hold;
    use ps_shm::serving::{Charger, Checker};
    use ps_shm::{HandshakeError, serve_link, worker_link};
    use tokio_stream::StreamExt;

    use super::*;

    /// The next request the server's side reads, which it hands on.
    async fn next_request(serving: &mut ps_shm::ServerLink) -> v1::SessionRequest {
        let read = serving.requests.next().await.expect("a request");
        read.expect("the session goes on")
            .expect("handed on, not refused")
    }

    /// Gives a test charge's bytes back when dropped.
    struct Release(Arc<AtomicU64>, u64);

    impl Drop for Release {
        fn drop(&mut self) {
            self.0.fetch_sub(self.1, Ordering::SeqCst);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_offer_taken_over_the_socket_carries_a_session_both_ways() {
        let (server, worker, offer) = in_process_ends(1 << 16).await.unwrap();
        carries_a_session_both_ways(server, worker, offer).await;
    }

    /// The same over pipe doorbells, as between two processes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_offer_taken_over_the_socket_carries_a_session_both_ways_over_pipes() {
        let (server, worker, offer) = in_process_ends_over_pipes(1 << 16).await.unwrap();
        carries_a_session_both_ways(server, worker, offer).await;
    }

    /// Requests, a refusal and an answer through a session, then the
    /// server's side ending it.
    async fn carries_a_session_both_ways(
        server: ps_shm::handshake::ServerEnd,
        worker: ps_shm::handshake::WorkerEnd,
        offer: v1::SharedMemoryOffer,
    ) {
        // The server charges each request's payloads while they live, and
        // refuses a request past 1 MB.
        let held = Arc::new(AtomicU64::new(0));
        let charge: Charger = {
            let held = Arc::clone(&held);
            Arc::new(move |bytes| {
                if bytes > 1_000_000 {
                    return Err(format!("{bytes} bytes is past the test's limit"));
                }
                held.fetch_add(bytes, Ordering::SeqCst);
                Ok(Arc::new(Release(Arc::clone(&held), bytes)) as Hold)
            })
        };
        let mut serving = serve_link(
            server,
            (charge, None),
            BufferPool::new(),
            std::future::pending(),
        );
        let mut working = worker_link(worker, u64::MAX);
        let request = push(5, &[vec![3; 300_000], vec![4; 1000]]);
        working.requests.send(request.clone()).await.unwrap();
        let got = next_request(&mut serving).await;
        assert_eq!(got, request);
        assert_eq!(
            held.load(Ordering::SeqCst),
            301_000,
            "charged while it lives"
        );
        drop(got);
        assert_eq!(held.load(Ordering::SeqCst), 0, "given back when dropped");

        // A request the charge refuses is read past and comes as its
        // RESOURCE_EXHAUSTED answer, which reaches the worker; the session
        // goes on.
        working
            .requests
            .send(push(6, &[vec![1; 2_000_000]]))
            .await
            .unwrap();
        let refusal = serving.requests.next().await.unwrap().unwrap();
        let refusal = refusal.expect_err("refused, not handed on");
        serving.answers.send(Ok(refusal.clone())).await.unwrap();
        let refused = working.answers.next().await.unwrap().unwrap().message;
        assert_eq!(refused, refusal);
        assert_eq!(refused.id, 6);
        let Some(Outcome::Refusal(refusal)) = refused.outcome else {
            panic!("a refusal: {refused:?}");
        };
        assert!(
            refusal.message.contains("past the test's limit"),
            "{refusal:?}"
        );
        working.requests.send(request.clone()).await.unwrap();
        assert_eq!(next_request(&mut serving).await, request);
        let answer = v1::SessionAnswer {
            id: 5,
            outcome: None,
            pull_waited_us: 9,
        };
        serving.answers.send(Ok(answer.clone())).await.unwrap();
        let answered = working.answers.next().await.unwrap().unwrap();
        assert_eq!(answered.message, answer);

        // Nobody listens any more: a second connection is refused by the system.
        let again = connect(&offer).await;
        let listener_gone = matches!(again, Err(HandshakeError::NoSocket { .. }));
        assert!(listener_gone, "nobody accepts now: {again:?}");

        // The server's side ends: the worker's answers end with UNAVAILABLE.
        drop(serving);
        let ended = working.answers.next().await.unwrap().unwrap_err();
        assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    }

    /// A push of 1 MiB or more is tested for NaN as it is copied off the
    /// ring, and the session's checker is shown the piece that holds one;
    /// a push it refuses (here in its second gradient, far in) is answered
    /// with the checker's status instead of being handed on, finite pushes and
    /// smaller ones are not shown to it, and the session goes on in step:
    /// the next requests arrive whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_push_the_checker_refuses_is_answered_and_the_session_goes_on() {
        let (server, worker, _) = in_process_ends(1 << 16).await.unwrap();
        let charge: Charger = Arc::new(|_| Ok(Arc::new(()) as Hold));
        let pieces = Arc::new(std::sync::Mutex::new(Vec::new()));
        let check: Checker = {
            let pieces = Arc::clone(&pieces);
            Arc::new(
                move |grad: &ps_proto::header::TensorHeader, offset, piece: &[u8]| {
                    pieces
                        .lock()
                        .unwrap()
                        .push(offset..offset + piece.len() as u64);
                    match first_non_finite(grad.dtype, piece) {
                        Some((at, _)) => Err(tonic::Status::invalid_argument(format!(
                            "{} element {}",
                            grad.key.name,
                            offset / 4 + at as u64
                        ))),
                        None => Ok(()),
                    }
                },
            )
        };
        let mut serving = serve_link(
            server,
            (charge, Some(check)),
            BufferPool::new(),
            std::future::pending(),
        );
        let working = worker_link(worker, u64::MAX);
        let with_nan = |len: usize, at: usize| {
            let mut bytes = vec![1u8; len];
            bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            bytes
        };

        let bad = with_nan(1 << 20, 700_000);
        working
            .requests
            .send(push(1, &[vec![1; 1000], bad]))
            .await
            .unwrap();
        let refused = serving.requests.next().await.unwrap().unwrap();
        let refused = refused.expect_err("refused, not handed on");
        assert_eq!(refused.id, 1);
        let Some(Outcome::Refusal(refusal)) = refused.outcome else {
            panic!("a refusal: {refused:?}");
        };
        assert_eq!(refusal.message, "w1 element 175000", "{refusal:?}");
        let shown = std::mem::take(&mut *pieces.lock().unwrap());
        assert!(
            matches!(shown.as_slice(), [piece] if piece.contains(&700_000)),
            "only the piece holding the NaN: {shown:?}"
        );

        // A small push is not tested, even with a NaN, nor a finite large one.
        let small = push(2, &[with_nan(64, 0)]);
        working.requests.send(small.clone()).await.unwrap();
        assert_eq!(next_request(&mut serving).await, small);
        let finite = push(3, &[vec![5; 2 << 20]]);
        working.requests.send(finite.clone()).await.unwrap();
        assert_eq!(next_request(&mut serving).await, finite);
        assert!(pieces.lock().unwrap().is_empty(), "nothing shown");
    }

    /// The server reads a request's payloads only once they fit the
    /// session's read-ahead: two requests of a quarter of it are both read
    /// while the first is held, but one of three quarters is not read (nor
    /// charged) while those two are, and arrives once they are let go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_past_the_read_ahead_waits_for_the_ones_held() {
        use ps_shm::serving::AHEAD_BYTES;

        let (server, worker, _) = in_process_ends(1 << 16).await.unwrap();
        let charged = Arc::new(AtomicU64::new(0));
        let charge: Charger = {
            let charged = Arc::clone(&charged);
            Arc::new(move |_| {
                charged.fetch_add(1, Ordering::SeqCst);
                Ok(Arc::new(()) as Hold)
            })
        };
        let mut serving = serve_link(
            server,
            (charge, None),
            BufferPool::new(),
            std::future::pending(),
        );
        let working = worker_link(worker, u64::MAX);
        let (quarter, three_quarters) =
            ((AHEAD_BYTES / 4) as usize, (AHEAD_BYTES * 3 / 4) as usize);
        let requests = [
            push(1, &[vec![1; quarter]]),
            push(2, &[vec![2; quarter]]),
            push(3, &[vec![3; three_quarters]]),
        ];
        for request in &requests {
            working.requests.send(request.clone()).await.unwrap();
        }

        // Requests that should arrive are waited for at most 10 s, so that a
        // bound too strict fails the test instead of hanging it.
        let arrives = async |serving: &mut ps_shm::ServerLink| {
            tokio::time::timeout(Duration::from_secs(10), serving.requests.next())
                .await
                .expect("within the read-ahead, yet not read")
                .unwrap()
                .unwrap()
                .expect("handed on, not refused")
        };
        let first = arrives(&mut serving).await;
        let second = arrives(&mut serving).await;
        assert_eq!([&first, &second], [&requests[0], &requests[1]]);
        // A negative, so bounded by time: correct code never fails it.
        let early = tokio::time::timeout(Duration::from_millis(300), serving.requests.next()).await;
        assert!(early.is_err(), "read while the others were held: {early:?}");
        assert_eq!(
            charged.load(Ordering::SeqCst),
            2,
            "the third not charged yet"
        );

        drop((first, second));
        assert_eq!(arrives(&mut serving).await, requests[2]);
        assert_eq!(charged.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nonce_not_offered_or_used_twice_gets_no_region_and_holds_no_charge() {
        let (offers, listener) = Offers::bind(1 << 16).unwrap();
        let charges = Arc::new(AtomicU64::new(0));
        let accepting = {
            let (offers, charges) = (offers.clone(), Arc::clone(&charges));
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                for connection in 0..4 {
                    let (socket, _) = listener.accept().await.unwrap();
                    let charges = Arc::clone(&charges);
                    // The fourth connection's charge is refused: over budget.
                    let charge = move |bytes: u64| {
                        charges.fetch_add(1, Ordering::SeqCst);
                        match connection {
                            3 => Err(format!("{bytes} bytes are past the test's budget")),
                            _ => Ok(()),
                        }
                    };
                    admitted.push(admit(&offers, socket, charge).await.is_ok());
                }
                admitted
            })
        };
        let mut forged = offers.offer().unwrap();
        forged.nonce = vec![0; 32].into();
        let refused = connect(&forged).await.unwrap_err();
        assert!(matches!(refused, HandshakeError::Refused(_)), "{refused}");
        assert!(refused.to_string().contains("nonce"), "{refused}");
        let offer = offers.offer().unwrap();
        let _kept = connect(&offer).await.unwrap();
        let twice = connect(&offer).await.unwrap_err();
        assert!(matches!(twice, HandshakeError::Refused(_)), "{twice}");
        let over_budget = connect(&offers.offer().unwrap()).await.unwrap_err();
        assert!(
            over_budget.to_string().contains("past the test's budget"),
            "the worker is told why: {over_budget}"
        );
        assert_eq!(accepting.await.unwrap(), vec![false, true, false, false]);
        assert_eq!(
            charges.load(Ordering::SeqCst),
            2,
            "only the connections with a good nonce were charged"
        );
    }

    /// A process of another user that reaches the socket (abstract sockets
    /// have no permissions) is refused on its credentials, before it is read
    /// or charged. Needs root, to connect from a thread running as `nobody`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_process_of_another_uid_gets_no_region_and_holds_no_charge() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: not root, so no thread can connect as another user here");
            return;
        }
        let (offers, listener) = Offers::bind(1 << 16).unwrap();
        let name = offers.socket().trim_start_matches('@').to_string();
        // Credentials are per thread in the kernel: only this thread becomes
        // `nobody`, and the socket records them when it connects.
        let connected = std::thread::spawn(move || {
            rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(65534)).unwrap();
            let address =
                std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            std::os::unix::net::UnixStream::connect_addr(&address).unwrap()
        });
        let (socket, _) = listener.accept().await.unwrap();
        let _client = connected.join().unwrap();
        let charges = AtomicU64::new(0);
        let admitted = admit(&offers, socket, |_| {
            charges.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        })
        .await;
        let Err(refused) = admitted else {
            panic!("another user is refused");
        };
        assert!(
            refused.to_string().contains("uid 65534"),
            "the refusal names the user: {refused}"
        );
        assert_eq!(charges.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_offer_from_another_host_or_user_is_not_taken() {
        let (offers, _listener) = Offers::bind(1 << 16).unwrap();
        let mut elsewhere = offers.offer().unwrap();
        elsewhere.boot_id = "another-host".to_string();
        let error = connect(&elsewhere).await.unwrap_err();
        assert!(
            error.is_elsewhere() && error.to_string().contains("another host"),
            "{error}"
        );
        let mut other_user = offers.offer().unwrap();
        other_user.uid += 1;
        let error = connect(&other_user).await.unwrap_err();
        assert!(
            error.is_elsewhere() && error.to_string().contains("uid"),
            "{error}"
        );
        let mut no_socket = offers.offer().unwrap();
        no_socket.socket_path = "@candle-ps-shm-nobody-listens-here".to_string();
        let error = connect(&no_socket).await.unwrap_err();
        assert!(matches!(error, HandshakeError::NoSocket { .. }), "{error}");
    }

    #[test]
    fn the_socket_has_no_file_and_closes_with_its_listener() {
        let runtime = runtime();
        runtime.block_on(async {
            let (offers, listener) = Offers::bind(1 << 16).unwrap();
            let name = offers.socket().to_string();
            assert!(name.starts_with("@candle-ps-shm-"), "{name}");
            let abstract_sockets = || std::fs::read_to_string("/proc/net/unix").unwrap();
            assert!(abstract_sockets().contains(&name), "listed while bound");
            let offer = offers.offer().unwrap();
            drop(listener);
            assert!(
                !abstract_sockets().contains(&name),
                "gone with the listener"
            );
            let refused = connect(&offer).await.unwrap_err();
            assert!(
                matches!(refused, HandshakeError::NoSocket { .. }),
                "{refused}"
            );
        });
    }
}

/// `read_marked` copies a payload larger than the ring whole, and hands on
/// exactly the pieces that hold a marked element (NaN, by its exponent bits),
/// in order, each in whole words (but the last) no larger than what one
/// publication carries; one of them is the last element, in the payload's
/// trailing half word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_read_hands_on_the_pieces_holding_a_mark() {
    const ELEMENTS: usize = 250_001;
    let bad = [3, 100_000, 100_001, ELEMENTS - 1];
    let values = (0..ELEMENTS).map(|i| if bad.contains(&i) { f32::NAN } else { i as f32 });
    let payload: Vec<u8> = values.flat_map(f32::to_le_bytes).collect();
    let read = |payload: Vec<u8>| async move {
        let (mut writer, mut reader, _, _) = in_process(256 << 10).unwrap();
        let sent = payload.clone();
        let writing = tokio::spawn(async move {
            writer.write(&sent).await.unwrap();
            writer.flush();
        });
        let mut into = vec![0u8; payload.len()];
        let mut pieces = Vec::new();
        let mut marked = |offset: usize, piece: &[u8]| {
            assert!(piece.len() <= ps_shm::ring::PUBLISH_WORDS as usize * 8);
            let last = offset + piece.len() == payload.len();
            assert!(
                piece.len().is_multiple_of(8) || last,
                "a piece of whole words"
            );
            assert_eq!(piece, &payload[offset..offset + piece.len()]);
            pieces.push(offset..offset + piece.len());
        };
        let nan = Some(Mark::U32(0x7f80_0000));
        reader
            .read_marked(&mut into, nan, &mut marked)
            .await
            .unwrap();
        writing.await.unwrap();
        assert_eq!(into, payload, "the copy is whole");
        pieces
    };
    let pieces = read(payload.clone()).await;
    assert!(
        pieces.windows(2).all(|two| two[0].end <= two[1].start),
        "in order: {pieces:?}"
    );
    let holds_a_mark =
        |piece: &std::ops::Range<usize>| bad.iter().any(|&i| piece.contains(&(i * 4)));
    assert!(
        pieces.iter().all(holds_a_mark),
        "only pieces with a mark: {pieces:?}"
    );
    for i in bad {
        assert!(
            pieces.iter().any(|piece| piece.contains(&(i * 4))),
            "element {i} in {pieces:?}"
        );
    }
    let finite: Vec<u8> = (0..ELEMENTS)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    assert!(
        read(finite).await.is_empty(),
        "finite values hand on nothing"
    );
}
