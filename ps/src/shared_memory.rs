//! The same-host data path's server side: the socket workers on this host
//! connect to ([`bind`]) and the sessions they run over their regions
//! ([`accept`]), each answered by the one session loop (`crate::session`)
//! with the same admission, budget, metrics and exactly-once rules as a gRPC
//! session, and no limit on a pull's size but the memory budget. Each
//! session's region is charged to the budget; a request's tensors are
//! charged when the service takes them, as over gRPC, and one that could
//! never fit is refused before it is read.

use std::sync::Arc;

use ps_common::process::ServeError;
use ps_shm::arena::Arena;
use ps_shm::pool::{BufferPool, Hold};
use ps_shm::serving::Charger;
use ps_shm::{DataPathMode, Offers, admit, serve_link};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::service::ParameterService;
use crate::session;

/// Handshakes in progress at once; more connections are closed as they come.
const HANDSHAKES_AT_ONCE: usize = 16;

/// How long the accept loop waits after the socket fails to accept.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// The values arena the keys of `ARENA_FROM_BYTES` or more live in when
/// `config` offers shared memory, sized to twice the memory budget (its
/// pages are made only as values fill them). The budget charges a key its
/// values at least twice over (with the copy an update makes while a pull
/// holds them), but a block takes whole pages: keys of 2 KiB fill one of
/// twice their size, and twice the budget leaves room for the copies.
/// Without one (the system refused it, which is logged), workers on this
/// host still use shared memory, their pulls copied through the ring.
pub(crate) fn arena(config: &ServerConfig) -> Option<Arc<Arena>> {
    if !config.shared_memory.mode.tries_shm() {
        return None;
    }
    match Arena::create((config.memory_budget as u64).saturating_mul(2)) {
        Ok(arena) => Some(arena),
        Err(error) => {
            tracing::warn!(%error, "no values arena; shared-memory pulls are copied through the ring");
            None
        }
    }
}

/// The shared-memory socket and its offers (handing workers `arena` too),
/// when `config` asks for them: `auto` goes on without them (with a
/// warning) when the socket cannot be made, `shm` fails.
///
/// # Errors
/// [`ServeError::Config`] for `--data-path shm` when the socket cannot be made.
pub(crate) fn bind(
    config: &ServerConfig,
    arena: Option<Arc<Arena>>,
) -> Result<Option<(Arc<Offers>, UnixListener)>, ServeError> {
    let shm = &config.shared_memory;
    if !shm.mode.tries_shm() {
        return Ok(None);
    }
    match Offers::bind_with_arena(shm.ring_bytes, arena) {
        Ok((offers, listener)) => {
            tracing::info!(socket = %offers.socket(), ring_bytes = shm.ring_bytes, "offering shared memory to workers on this host");
            Ok(Some((offers, listener)))
        }
        Err(error) if shm.mode == DataPathMode::Auto => {
            tracing::warn!(%error, "no shared-memory socket; workers on this host use gRPC");
            Ok(None)
        }
        Err(error) => Err(ServeError::Config(format!(
            "--data-path shm: cannot make the shared-memory socket: {error}"
        ))),
    }
}

/// Admits workers on `listener` and serves each one's session on `service`
/// until `stopped`.
pub(crate) async fn accept(
    listener: UnixListener,
    offers: Arc<Offers>,
    service: ParameterService,
    stopped: CancellationToken,
) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_AT_ONCE));
    let pool = BufferPool::new();
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(error) => {
                    tracing::warn!(%error, "the shared-memory socket failed to accept; trying again shortly");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = stopped.cancelled() => return,
        };
        // Past the cap, a connection is closed at once: handshakes cannot
        // pile up and take this server's file descriptors.
        let Ok(handshake) = Arc::clone(&handshakes).try_acquire_owned() else {
            tracing::warn!("too many shared-memory handshakes at once; closing a connection");
            continue;
        };
        let (offers, service, stopped) = (Arc::clone(&offers), service.clone(), stopped.clone());
        let pool = pool.clone();
        tokio::spawn(async move {
            // The region is charged once the peer passed the uid and nonce
            // checks, before it is made, and for the session's life; a worker
            // refused for the budget is told why (it goes on over gRPC with
            // `auto`, and fails naming why with `shm`).
            let budget = Arc::clone(service.budget());
            let admitted = admit(&offers, socket, |bytes| {
                budget
                    .charge(bytes as usize, || {
                        format!("a worker's shared-memory region of {bytes} bytes (two rings, each no larger than --shm-ring)")
                    })
                    .map_err(|error| error.to_string())
            })
            .await;
            drop(handshake);
            match admitted {
                Ok((end, _charged)) => serve(end, service, pool, stopped).await,
                Err(error) => tracing::warn!(%error, "a shared-memory session was refused"),
            }
        });
    }
}

/// Serves one admitted session until it ends.
pub(crate) async fn serve(
    end: ps_shm::handshake::ServerEnd,
    service: ParameterService,
    pool: BufferPool,
    stopped: CancellationToken,
) {
    let peer = end.peer_pid;
    let admit = (charger(&service), service.gradient_checker());
    let link = serve_link(end, admit, pool, async move {
        stopped.cancelled().await;
    });
    tracing::info!(
        peer_pid = peer,
        "a worker on this host took a shared-memory session"
    );
    let idle = service.config().transport.idle_connection_timeout;
    let reading = session::Reading {
        largest: usize::MAX,
        scanned_from: link.checked_from,
    };
    let answers = (session::AnswerSink::Rings(link.answers), async move {
        let why = link.ended.await;
        tracing::debug!(
            peer_pid = peer,
            why,
            "a shared-memory session's socket is done"
        );
    });
    session::serve(service, link.requests, answers, idle, reading).await;
}

/// Refuses a request whose tensors could never fit `service`'s memory budget,
/// before they are read. Those it lets in are charged as a gRPC request's
/// are, by the service when it takes them (`push_grads`); charging them here
/// as well would count them twice.
fn charger(service: &ParameterService) -> Charger {
    let budget = Arc::clone(service.budget());
    Arc::new(move |bytes| {
        let limit = budget.limit() as u64;
        if bytes > limit {
            return Err(format!(
                "a shared-memory request carrying {bytes} bytes of tensors is past this server's memory budget of {limit} bytes; send fewer keys at once, spread them over more servers, or raise --memory-budget"
            ));
        }
        Ok(Arc::new(()) as Hold)
    })
}

#[cfg(test)]
#[path = "shared_memory_tests.rs"]
mod tests;
