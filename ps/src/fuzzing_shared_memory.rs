//! [`shared_memory_session`]: whatever a worker on this host writes onto its
//! shared-memory session's request ring, read and served by the server's own
//! session loop over a real region. The worker is another process, and the
//! ring is memory it writes as it likes: words that are no message, a
//! message whose lengths lie, one cut short, one out of sequence.

use bytes::Bytes;
use prost::Message;
use ps_proto::v1;
use ps_shm::fuzzing::{RING_BYTES, reader_sleeps, ring_words, runtime};
use ps_shm::handshake::{WorkerEnd, in_process_ends};
use ps_shm::message::{read_message, write_message};
use ps_shm::pool::BufferPool;
use ps_shm::ring::{RingReader, RingWriter};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::one_key_service;

/// How long the session may take to end once its worker has gone.
const ENDS_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// `data` written onto a shared-memory session's request ring: with its
/// first byte even, the rest as it is (up to 60 KiB, padded to whole
/// words); odd, the rest decoded as a `SessionRequest` and written as the
/// session's first message, well formed, its tensors' bytes as its
/// payloads. The server's session loop (`crate::shared_memory::serve`)
/// serves it on a fresh server holding `w`, and the worker reads the
/// answers until the server waits for more words or has ended the session;
/// then the worker goes.
///
/// The session must then end, the server keep `w`, and whatever the
/// requests charged to the memory budget be given back. Returns the answers
/// the worker read before the server waited for words (one still being
/// made then, such as a pull waiting for a version, is not counted).
///
/// # Panics
/// When the server broke one of those promises, or panicked itself.
pub fn shared_memory_session(data: &[u8]) -> usize {
    let Some((&kind, rest)) = data.split_first() else {
        return 0;
    };
    let request = match kind % 2 {
        0 => None,
        _ => match v1::SessionRequest::decode(rest) {
            Ok(request) => Some(request),
            Err(_) => return 0,
        },
    };
    runtime().block_on(async move {
        let (service, store) = one_key_service();
        let held_before = store.budget().held();
        let (server, worker, _) = in_process_ends(RING_BYTES)
            .await
            .expect("this process makes a region for itself");
        let mut serving = tokio::spawn(crate::shared_memory::serve(
            server,
            service,
            BufferPool::new(),
            CancellationToken::new(),
        ));
        let WorkerEnd {
            mut requests,
            mut answers,
            socket,
            arena: _,
        } = worker;
        let mut answered = 0;
        // A message larger than the ring is written only as the server reads
        // it, which it stops doing when it ends the session.
        let ended = tokio::select! {
            () = write_input(&mut requests, request, rest) => {
                let reading = (&requests, &mut answers, &mut answered);
                read_until_the_server_waits(reading, &mut serving).await
            }
            served = &mut serving => {
                rethrow(served);
                true
            }
        };
        drop((requests, answers, socket));
        if !ended {
            ends_in_time(serving).await;
        }
        super::assert_keeps_w(&store);
        assert_eq!(
            store.budget().held(),
            held_before,
            "the session gave back what its requests charged"
        );
        answered
    })
}

/// Writes the input onto the request ring: `request` as message 1, well
/// formed, or else `raw` as whole words (`ps_shm::fuzzing::ring_words`), and
/// publishes it.
async fn write_input(requests: &mut RingWriter, request: Option<v1::SessionRequest>, raw: &[u8]) {
    match request {
        Some(request) => {
            let _ = write_message(requests, 1, request).await;
        }
        None => {
            let _ = requests.write(&ring_words(raw)).await;
        }
    }
    requests.flush();
}

/// Reads the server's answers, counting them in `answered`, until the
/// server's reader sleeps wanting more words (false) or the session ends
/// (true).
///
/// # Panics
/// When the server writes a malformed answer, or the session panicked.
async fn read_until_the_server_waits(
    (requests, answers, answered): (&RingWriter, &mut RingReader, &mut usize),
    serving: &mut JoinHandle<()>,
) -> bool {
    let pool = BufferPool::new();
    loop {
        let seq = *answered as u64 + 1;
        tokio::select! {
            biased;
            served = &mut *serving => {
                rethrow(served);
                return true;
            }
            answer = read_message::<v1::SessionAnswer>(answers, seq, u64::MAX, &pool) => {
                if let Err(error) = answer {
                    panic!("the server wrote a malformed answer: {error}");
                }
                *answered += 1;
            }
            () = reader_sleeps(requests) => return false,
        }
    }
}

/// Waits for the session to end now that its worker has gone.
///
/// # Panics
/// When it does not within [`ENDS_WITHIN`], or it panicked.
async fn ends_in_time(serving: JoinHandle<()>) {
    match tokio::time::timeout(ENDS_WITHIN, serving).await {
        Ok(served) => rethrow(served),
        Err(_) => panic!("the session did not end within {ENDS_WITHIN:?} of its worker going"),
    }
}

/// Panics again with the panic that ended the session, if one did.
fn rethrow(served: Result<(), tokio::task::JoinError>) {
    if let Err(error) = served
        && error.is_panic()
    {
        std::panic::resume_unwind(error.into_panic());
    }
}

/// A well-formed first message for [`shared_memory_session`]: worker 1's
/// step-0 push of `grad` to `w`, as its input bytes (an odd first byte, then
/// the request).
pub fn shared_memory_push(grad: [f32; 4]) -> Vec<u8> {
    let data: Vec<u8> = grad.iter().flat_map(|v| v.to_le_bytes()).collect();
    let request = v1::SessionRequest {
        id: 1,
        deadline_ms: 0,
        op: Some(v1::session_request::Op::Push(v1::PushRequest {
            worker_id: 1,
            step: 0,
            map_version: 0,
            grads: vec![v1::Tensor {
                name: "w".into(),
                part: 0,
                dtype: v1::DType::DtypeF32 as i32,
                shape: vec![4],
                data: Bytes::from(data),
            }],
        })),
    };
    let mut input = vec![1];
    request.encode(&mut input).expect("a Vec grows as needed");
    input
}
