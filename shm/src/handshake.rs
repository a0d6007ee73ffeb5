//! Handing a region to a worker: the server's [`Offers`] (an abstract
//! Unix-domain socket, and the one-time nonces it gave out over authenticated
//! gRPC), [`admit`] on the server's side and [`connect`] on the worker's.
//!
//! The socket is abstract (Linux): it has no file, so a server killed with
//! `kill -9` leaves nothing behind, and it lives in the server's network
//! namespace, so a worker in another one (another container, or another
//! emulated host of `ps-testbed`) cannot reach it and stays on gRPC. Anyone in
//! the namespace may connect; only the server's uid holding a nonce gets a
//! region.
//!
//! 1. The worker asks for an offer over its gRPC channel (`OfferSharedMemory`,
//!    which the server's access layer admits only with a worker's token) and
//!    gets the socket's name, a 32-byte nonce, the server's boot id and uid.
//! 2. A worker whose boot id differs is on another host; one that cannot
//!    reach the socket is in another network namespace. Either stays on gRPC
//!    ([`HandshakeError::is_elsewhere`]).
//! 3. Otherwise it connects and sends the nonce. The server checks the peer's
//!    uid (`SO_PEERCRED`) against its own and takes the nonce (each is good
//!    for one connection, for [`OFFER_LIFETIME`]); then it creates a new
//!    region and four doorbells and sends their file descriptors
//!    (`SCM_RIGHTS`). Nothing of the region has a name in any file system.
//! 4. The socket stays open for as long as the session: each side learns of
//!    the other's end (a crash included) when it closes.
//!
//! A worker in the server's own process and on its own async runtime (as
//! `ps-local` runs them) is told so in the welcome: the hello names the
//! worker's runtime, and the server compares it, and the socket's peer
//! process, with its own. Such a session's doorbells are in-process
//! (`crate::bell`): a ring wakes the waiting task directly. The server leaves
//! the worker's side in this process under the hello's nonce before it sends
//! the welcome, and the worker takes it up from there. A wait on either
//! side's ring ends, when a task of that runtime polls it, takes its turns
//! among the tasks it waits for (`crate::ring`).

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use ps_proto::v1;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

use crate::arena::{Arena, ArenaView};
use crate::bell::{Bell, Ringer, doorbell, in_process_doorbell};
use crate::region::{OpenError, Region};
use crate::ring::{
    Direction, RingError, RingReader, RingWriter, peer_on_this_runtime, read_header, region_bytes,
    write_header,
};

/// How long an offer's nonce stays good.
pub const OFFER_LIFETIME: Duration = Duration::from_secs(30);

/// How long either side waits for the other's handshake message.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest handshake message either side reads.
const HANDSHAKE_LIMIT: u32 = 4096;

/// The smallest rings a server gives a worker that asks for less: room for
/// many small operations in flight at once (64 KiB rings cost 4 KiB pushes
/// with eight in flight a tenth of their rate), and for any answer the
/// worker reads only once it is whole (below [`crate::lent::LEND_AT_BYTES`])
/// with its head, so that such a read never waits and is never cut off.
pub const SMALLEST_RING_BYTES: u64 = 2 * crate::lent::LEND_AT_BYTES;

/// Why no region changed hands.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The server runs on another host.
    #[error("the server is on another host (its boot id {theirs}, this host's {ours})")]
    OtherHost {
        /// This host's boot id.
        ours: String,
        /// The server's.
        theirs: String,
    },
    /// The server runs as another user.
    #[error(
        "the server runs as uid {theirs} and this process as uid {ours}; only the same user gets a region"
    )]
    OtherUser {
        /// This process's uid.
        ours: u32,
        /// The server's.
        theirs: u32,
    },
    /// The server's socket cannot be reached from here.
    #[error(
        "cannot open the server's shared-memory socket {path} (another container or mount namespace?): {source}"
    )]
    NoSocket {
        /// The socket's name.
        path: String,
        /// Why.
        source: io::Error,
    },
    /// The server refused the handshake.
    #[error("the server refused a shared-memory session: {0}")]
    Refused(String),
    /// The other side broke the handshake's protocol.
    #[error("the shared-memory handshake failed: {0}")]
    Protocol(String),
    /// The region handed over cannot be used.
    #[error(transparent)]
    Region(#[from] OpenError),
    /// The region's header is not this version's.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// A socket or system call failed.
    #[error("the shared-memory handshake failed: {0}")]
    Io(#[from] io::Error),
}

/// Runs `make` on the blocking pool: making or mapping a region fills
/// every page of it (`crate::region`), which for rings of gigabytes takes
/// long enough to hold up the runtime's other tasks.
async fn off_runtime<T: Send + 'static>(
    make: impl FnOnce() -> T + Send + 'static,
) -> Result<T, HandshakeError> {
    tokio::task::spawn_blocking(make)
        .await
        .map_err(|error| HandshakeError::Io(io::Error::other(error)))
}

impl HandshakeError {
    /// Whether the server is simply out of reach of shared memory (another
    /// host, user or namespace): `--data-path auto` then stays on gRPC
    /// without a warning.
    pub fn is_elsewhere(&self) -> bool {
        matches!(
            self,
            Self::OtherHost { .. } | Self::OtherUser { .. } | Self::NoSocket { .. }
        )
    }
}

/// The four doorbells of a region, each a `(read end, write end)` pair: for
/// each ring, the reader's ("words written") and the writer's ("room made").
#[derive(Debug)]
pub(crate) struct Bells {
    requests_written: (OwnedFd, OwnedFd),
    request_room: (OwnedFd, OwnedFd),
    answers_written: (OwnedFd, OwnedFd),
    answer_room: (OwnedFd, OwnedFd),
}

/// One side's doorbells for each ring it holds an end of: the one it sleeps
/// on and the one it rings.
pub(crate) struct SideBells {
    pub(crate) requests: (Bell, Ringer),
    pub(crate) answers: (Bell, Ringer),
}

/// The worker sides' doorbells of sessions admitted by a server of this
/// process on its own runtime, by their hello's nonce, until the worker takes
/// them up.
static IN_PROCESS_BELLS: Mutex<Vec<(Vec<u8>, SideBells)>> = Mutex::new(Vec::new());

impl SideBells {
    /// In-process doorbells for a session whose worker and server share a
    /// runtime: `(the server's side, the worker's side)`.
    fn in_process() -> (Self, Self) {
        let (requests_written, ring_requests_written) = in_process_doorbell();
        let (request_room, ring_request_room) = in_process_doorbell();
        let (answers_written, ring_answers_written) = in_process_doorbell();
        let (answer_room, ring_answer_room) = in_process_doorbell();
        let server = SideBells {
            requests: (requests_written, ring_request_room),
            answers: (answer_room, ring_answers_written),
        };
        let worker = SideBells {
            requests: (request_room, ring_requests_written),
            answers: (answers_written, ring_answer_room),
        };
        (server, worker)
    }

    /// In-process doorbells for the session of the hello that carried
    /// `nonce`: the worker's side is left in this process for
    /// [`SideBells::take_for`], and the server's returned.
    fn left_for(nonce: &[u8]) -> Self {
        let (server, worker) = Self::in_process();
        let mut left = IN_PROCESS_BELLS.lock().unwrap_or_else(|e| e.into_inner());
        // A side never taken up, its server's end since dropped, goes.
        left.retain(|(_, side)| !side.requests.0.hung_up());
        left.push((nonce.to_vec(), worker));
        server
    }

    /// Takes up the worker's side left for `nonce`.
    fn take_for(nonce: &[u8]) -> Option<SideBells> {
        let mut left = IN_PROCESS_BELLS.lock().unwrap_or_else(|e| e.into_inner());
        let at = left.iter().position(|(of, _)| of == nonce)?;
        Some(left.swap_remove(at).1)
    }
}

impl Bells {
    pub(crate) fn create() -> io::Result<Self> {
        Ok(Self {
            requests_written: doorbell()?,
            request_room: doorbell()?,
            answers_written: doorbell()?,
            answer_room: doorbell()?,
        })
    }

    /// The ends the worker gets: it sleeps on request room and answers
    /// written, and rings requests written and answer room.
    fn worker_ends(&self) -> [BorrowedFd<'_>; 4] {
        [
            self.request_room.0.as_fd(),
            self.requests_written.1.as_fd(),
            self.answers_written.0.as_fd(),
            self.answer_room.1.as_fd(),
        ]
    }

    /// The worker's doorbells, from the four ends [`Bells::worker_ends`] sent.
    fn worker_side_of(fds: Vec<OwnedFd>) -> io::Result<SideBells> {
        let [request_room, requests_written, answers_written, answer_room] =
            <[OwnedFd; 4]>::try_from(fds).map_err(|fds| {
                io::Error::other(format!("{} doorbell ends where 4 were due", fds.len()))
            })?;
        Ok(SideBells {
            requests: (Bell::new(request_room)?, Ringer::new(requests_written)?),
            answers: (Bell::new(answers_written)?, Ringer::new(answer_room)?),
        })
    }

    /// The worker's doorbells in this process (for tests).
    pub(crate) fn worker_side(&self) -> io::Result<SideBells> {
        let owned = self
            .worker_ends()
            .iter()
            .map(|fd| fd.try_clone_to_owned())
            .collect::<io::Result<Vec<_>>>()?;
        Self::worker_side_of(owned)
    }

    /// The server's doorbells: it sleeps on requests written and answer room,
    /// and rings request room and answers written.
    pub(crate) fn server_side(self) -> io::Result<SideBells> {
        Ok(SideBells {
            requests: (
                Bell::new(self.requests_written.0)?,
                Ringer::new(self.request_room.1)?,
            ),
            answers: (
                Bell::new(self.answer_room.0)?,
                Ringer::new(self.answers_written.1)?,
            ),
        })
    }
}

/// The server's end of an admitted session.
#[derive(Debug)]
pub struct ServerEnd {
    /// The requests the worker writes.
    pub requests: RingReader,
    /// The answers this server writes.
    pub answers: RingWriter,
    /// The socket, open for as long as the session.
    pub socket: UnixStream,
    /// The peer's process id, for logs (none when it runs in a process
    /// namespace this server cannot see into).
    pub peer_pid: Option<i32>,
    /// The values arena the worker was handed, which answers may send
    /// payloads from by their offset.
    pub arena: Option<Arc<Arena>>,
}

/// The worker's end of a session.
#[derive(Debug)]
pub struct WorkerEnd {
    /// The requests this worker writes.
    pub requests: RingWriter,
    /// The answers the server writes.
    pub answers: RingReader,
    /// The socket, open for as long as the session.
    pub socket: UnixStream,
    /// The server's values arena, mapped read-only, when it handed one over.
    pub arena: Option<Arc<ArenaView>>,
}

/// This host's boot id, which differs from one host (and boot) to the next.
///
/// # Errors
/// The file cannot be read (not Linux, or no `/proc`).
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string())
}

/// The server's socket and the nonces it handed out.
#[derive(Debug)]
pub struct Offers {
    /// The abstract socket's name, `@` first as tools print it.
    socket: String,
    boot_id: String,
    uid: u32,
    ring_bytes: u64,
    arena: Option<Arc<Arena>>,
    pending: Mutex<HashMap<[u8; 32], Instant>>,
}

impl Offers {
    /// Binds the server's abstract socket under a new random name; each
    /// session's region has rings of `ring_bytes`.
    ///
    /// # Errors
    /// The socket cannot be bound, or there is no boot id.
    pub fn bind(ring_bytes: u64) -> io::Result<(Arc<Self>, UnixListener)> {
        Self::bind_with_arena(ring_bytes, None)
    }

    /// [`Offers::bind`], handing each worker `arena` (read-only) as well.
    ///
    /// # Errors
    /// As [`Offers::bind`].
    pub fn bind_with_arena(
        ring_bytes: u64,
        arena: Option<Arc<Arena>>,
    ) -> io::Result<(Arc<Self>, UnixListener)> {
        if ring_bytes < 4096 || !ring_bytes.is_multiple_of(8) || ring_bytes > 1 << 32 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "rings of {ring_bytes} bytes: they must be whole words between 4 KiB and 4 GiB"
                ),
            ));
        }
        let tag: [u8; 8] = random()?;
        let name = format!("candle-ps-shm-{}-{}", std::process::id(), hex(&tag));
        let address = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = std::os::unix::net::UnixListener::bind_addr(&address)?;
        listener.set_nonblocking(true)?;
        let offers = Self {
            socket: format!("@{name}"),
            boot_id: boot_id()?,
            uid: rustix::process::geteuid().as_raw(),
            ring_bytes,
            arena,
            pending: Mutex::default(),
        };
        Ok((Arc::new(offers), UnixListener::from_std(listener)?))
    }

    /// The socket's name (`@` and the abstract name).
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// The size in bytes of a region for a worker that asks for the
    /// server's own rings.
    pub fn region_bytes(&self) -> u64 {
        region_bytes(self.ring_bytes)
    }

    /// The capacity of each ring given to a worker that asks for `wish`
    /// bytes: the server's own when it asks for that or more (or for 0,
    /// nothing in particular); otherwise `wish` rounded up to a power of
    /// two, and no less than [`SMALLEST_RING_BYTES`]. A small model's region
    /// is made and mapped in a fraction of the time of a large one's, and
    /// charges the memory budget only what it holds.
    pub fn rings_for(&self, wish: u64) -> u64 {
        if wish == 0 || wish >= self.ring_bytes {
            return self.ring_bytes;
        }
        let rounded = wish.next_power_of_two().max(SMALLEST_RING_BYTES);
        rounded.min(self.ring_bytes)
    }

    /// A new offer, good for one connection within [`OFFER_LIFETIME`].
    ///
    /// # Errors
    /// No random bytes could be had.
    pub fn offer(&self) -> io::Result<v1::SharedMemoryOffer> {
        let nonce: [u8; 32] = random()?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|_, given| given.elapsed() < OFFER_LIFETIME);
        pending.insert(nonce, Instant::now());
        Ok(v1::SharedMemoryOffer {
            socket_path: self.socket.clone(),
            nonce: nonce.to_vec().into(),
            boot_id: self.boot_id.clone(),
            uid: self.uid,
            expires_ms: OFFER_LIFETIME.as_millis() as u64,
        })
    }

    /// Takes `nonce`: true when it was handed out, unused and unexpired.
    fn take(&self, nonce: &[u8]) -> bool {
        let Ok(nonce) = <[u8; 32]>::try_from(nonce) else {
            return false;
        };
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending
            .remove(&nonce)
            .is_some_and(|given| given.elapsed() < OFFER_LIFETIME)
    }
}

/// Connects to the socket an offer names: `@name` is abstract, anything else
/// a path.
async fn reach(socket: &str) -> io::Result<UnixStream> {
    let target = socket.to_string();
    let connect = tokio::task::spawn_blocking(move || {
        let stream = match target.strip_prefix('@') {
            Some(name) => {
                let address = SocketAddr::from_abstract_name(name.as_bytes())?;
                std::os::unix::net::UnixStream::connect_addr(&address)?
            }
            None => std::os::unix::net::UnixStream::connect(&target)?,
        };
        stream.set_nonblocking(true)?;
        Ok::<_, io::Error>(stream)
    });
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, connect)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the socket did not accept in time"))?
        .map_err(io::Error::other)??;
    UnixStream::from_std(stream)
}

/// Admits the connection `socket`: checks its user and nonce, then charges
/// the region's bytes with `charge` (only then: a process that cannot pass
/// both checks holds nothing of the server's memory) and hands it a new
/// region, its rings as large as the worker asked ([`Offers::rings_for`]).
/// A refused peer is told why before the socket closes.
///
/// # Errors
/// Why it was refused (its user, its nonce, or `charge`'s reason), or what
/// failed.
pub async fn admit<C>(
    offers: &Offers,
    mut socket: UnixStream,
    charge: impl FnOnce(u64) -> Result<C, String>,
) -> Result<(ServerEnd, C), HandshakeError> {
    let peer = socket.peer_cred()?;
    if peer.uid() != offers.uid {
        // Closed before anything is read: another user holds nothing here.
        return Err(HandshakeError::Refused(format!(
            "the connecting process runs as uid {}, not as this server's uid {}",
            peer.uid(),
            offers.uid
        )));
    }
    let hello: v1::SharedMemoryHello = read_framed(&mut socket).await?;
    let ring_bytes = offers.rings_for(hello.ring_bytes);
    let charged = match charge_for(offers, &hello, ring_bytes, charge) {
        Ok(charged) => charged,
        Err(refusal) => {
            let welcome = v1::SharedMemoryWelcome {
                refusal: refusal.clone(),
                ..Default::default()
            };
            send_with_fds(&socket, &welcome, &[]).await?;
            return Err(HandshakeError::Refused(refusal));
        }
    };
    let end = hand_region(offers, socket, peer.pid(), &hello, ring_bytes).await?;
    Ok((end, charged))
}

/// Takes the nonce `hello` carries, then charges a region with rings of
/// `ring_bytes` with `charge`: only a peer holding a good nonce is charged.
///
/// # Errors
/// Why the peer is refused, to be told it.
fn charge_for<C>(
    offers: &Offers,
    hello: &v1::SharedMemoryHello,
    ring_bytes: u64,
    charge: impl FnOnce(u64) -> Result<C, String>,
) -> Result<C, String> {
    if !offers.take(&hello.nonce) {
        return Err("the nonce is not one this server offered, was used already, or expired; ask for a new offer".to_string());
    }
    charge(region_bytes(ring_bytes))
}

/// Creates a region with rings of `ring_bytes` and doorbells for the peer
/// `pid` that sent `hello`, and sends them (and the values arena, when the
/// hello takes it) in the welcome.
///
/// # Errors
/// The system refused the region, a doorbell or the send.
async fn hand_region(
    offers: &Offers,
    socket: UnixStream,
    pid: Option<i32>,
    hello: &v1::SharedMemoryHello,
    ring_bytes: u64,
) -> Result<ServerEnd, HandshakeError> {
    let bytes = region_bytes(ring_bytes) as usize;
    let region = Arc::new(off_runtime(move || Region::create(bytes)).await??);
    write_header(&region, ring_bytes);
    let bells = Bells::create()?;
    let arena = offers.arena.clone().filter(|_| hello.takes_arena);
    let same_runtime =
        is_this_process(pid) && !hello.runtime.is_empty() && hello.runtime == this_runtime();
    let welcome = v1::SharedMemoryWelcome {
        refusal: String::new(),
        ring_bytes,
        arena_bytes: arena.as_ref().map_or(0, |arena| arena.bytes()),
        arena_stamped: arena.is_some(),
        same_runtime,
    };
    let [a, b, c, d] = bells.worker_ends();
    let mut fds = vec![region.file(), a, b, c, d];
    fds.extend(arena.as_ref().map(|arena| arena.file()));
    // A worker on this runtime takes its doorbells up from this process as
    // soon as it has the welcome, so they are left before it is sent. The
    // pipes' ends go with it all the same: a welcome's files keep one layout.
    let in_process = same_runtime.then(|| SideBells::left_for(&hello.nonce));
    send_with_fds(&socket, &welcome, &fds).await?;
    let side = match in_process {
        Some(side) => side,
        None => bells.server_side()?,
    };
    let capacity = (ring_bytes / 8) as usize;
    let mut end = ServerEnd {
        requests: RingReader::new(
            Arc::clone(&region),
            Direction::Requests,
            capacity,
            side.requests,
        ),
        answers: RingWriter::new(region, Direction::Answers, capacity, side.answers),
        socket,
        peer_pid: pid,
        arena,
    };
    if same_runtime {
        peer_on_this_runtime(&mut end.requests, &mut end.answers);
    }
    Ok(end)
}

/// Both ends of a session admitted through a socket of this process, its
/// rings holding `ring_bytes` each, and the offer it took (spent): what a
/// test of anything that runs over a session starts from.
///
/// # Errors
/// The system refused the socket, the region or a doorbell.
///
/// # Panics
/// Outside a runtime.
pub async fn in_process_ends(
    ring_bytes: u64,
) -> Result<(ServerEnd, WorkerEnd, v1::SharedMemoryOffer), HandshakeError> {
    in_process_ends_with(ring_bytes, None).await
}

/// [`in_process_ends`], the server handing the worker `arena`.
///
/// # Errors
/// As [`in_process_ends`].
///
/// # Panics
/// Outside a runtime.
pub async fn in_process_ends_with(
    ring_bytes: u64,
    arena: Option<Arc<Arena>>,
) -> Result<(ServerEnd, WorkerEnd, v1::SharedMemoryOffer), HandshakeError> {
    in_process_ends_naming(ring_bytes, arena, this_runtime()).await
}

/// [`in_process_ends`], the worker's hello naming no runtime, as a worker in
/// another process does: the session sleeps on pipes, as between processes.
///
/// # Errors
/// As [`in_process_ends`].
///
/// # Panics
/// Outside a runtime.
pub async fn in_process_ends_over_pipes(
    ring_bytes: u64,
) -> Result<(ServerEnd, WorkerEnd, v1::SharedMemoryOffer), HandshakeError> {
    in_process_ends_naming(ring_bytes, None, String::new()).await
}

/// [`in_process_ends_with`], the worker's hello naming `runtime`.
async fn in_process_ends_naming(
    ring_bytes: u64,
    arena: Option<Arc<Arena>>,
    runtime: String,
) -> Result<(ServerEnd, WorkerEnd, v1::SharedMemoryOffer), HandshakeError> {
    let (offers, listener) = Offers::bind_with_arena(ring_bytes, arena)?;
    let offer = offers.offer()?;
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await?;
        admit(&offers, socket, |_| Ok::<_, String>(())).await
    });
    let worker = connect_naming(&offer, 0, runtime).await?;
    let joined = server.await.map_err(io::Error::other)?;
    let (server, ()) = joined?;
    Ok((server, worker, offer))
}

/// Takes up `offer`: checks it was made on this host to this user, connects
/// and receives the region, its rings the server's own size.
///
/// # Errors
/// [`HandshakeError`]; [`HandshakeError::is_elsewhere`] when the server is
/// simply out of reach of shared memory.
pub async fn connect(offer: &v1::SharedMemoryOffer) -> Result<WorkerEnd, HandshakeError> {
    connect_asking(offer, 0).await
}

/// [`connect`], asking for rings of `ring_bytes` each (0: the server's
/// own); the server gives what [`Offers::rings_for`] says.
///
/// # Errors
/// As [`connect`].
pub async fn connect_asking(
    offer: &v1::SharedMemoryOffer,
    ring_bytes: u64,
) -> Result<WorkerEnd, HandshakeError> {
    connect_naming(offer, ring_bytes, this_runtime()).await
}

/// [`connect_asking`], the hello naming `runtime` as the worker's.
async fn connect_naming(
    offer: &v1::SharedMemoryOffer,
    ring_bytes: u64,
    runtime: String,
) -> Result<WorkerEnd, HandshakeError> {
    check_host_and_user(offer)?;
    let mut socket =
        reach(&offer.socket_path)
            .await
            .map_err(|source| HandshakeError::NoSocket {
                path: offer.socket_path.clone(),
                source,
            })?;
    let hello = v1::SharedMemoryHello {
        nonce: offer.nonce.clone(),
        takes_arena: true,
        ring_bytes,
        runtime,
    };
    write_framed(&mut socket, &hello).await?;
    let (welcome, fds): (v1::SharedMemoryWelcome, _) = receive_with_fds(&socket).await?;
    if !welcome.refusal.is_empty() {
        return Err(HandshakeError::Refused(welcome.refusal));
    }
    let mut handed = Handed::sort(&welcome, fds)?;
    if welcome.same_runtime {
        // Found only when the server is in this process: it left them.
        handed.bells = SideBells::take_for(&offer.nonce).ok_or_else(|| {
            HandshakeError::Protocol(
                "the welcome says the server shares this runtime, but no server of this process left doorbells for the session".to_string(),
            )
        })?;
    }
    let bytes = region_bytes(welcome.ring_bytes);
    let region = Arc::new(off_runtime(move || Region::open(handed.region, bytes)).await??);
    let capacity = read_header(&region, welcome.ring_bytes)?;
    let arena = match handed.arena {
        None => None,
        Some(file) => Some(open_arena(file, welcome.arena_bytes, welcome.arena_stamped).await?),
    };
    let mut end = WorkerEnd {
        requests: RingWriter::new(
            Arc::clone(&region),
            Direction::Requests,
            capacity,
            handed.bells.requests,
        ),
        answers: RingReader::new(region, Direction::Answers, capacity, handed.bells.answers),
        socket,
        arena,
    };
    if welcome.same_runtime {
        peer_on_this_runtime(&mut end.answers, &mut end.requests);
    }
    Ok(end)
}

/// Checks that `offer` was made on this host (its boot id) to this user: a
/// worker anywhere else stays on gRPC.
fn check_host_and_user(offer: &v1::SharedMemoryOffer) -> Result<(), HandshakeError> {
    let ours = boot_id()?;
    if ours != offer.boot_id {
        return Err(HandshakeError::OtherHost {
            ours,
            theirs: offer.boot_id.clone(),
        });
    }
    let uid = rustix::process::geteuid().as_raw();
    if uid != offer.uid {
        return Err(HandshakeError::OtherUser {
            ours: uid,
            theirs: offer.uid,
        });
    }
    Ok(())
}

/// What a welcome's file descriptors are, checked against what it says.
struct Handed {
    region: OwnedFd,
    bells: SideBells,
    arena: Option<OwnedFd>,
}

impl Handed {
    /// Sorts `fds` (the region, four doorbell ends, and the values arena
    /// when `welcome` announces one) and checks the rings' size.
    ///
    /// # Errors
    /// A descriptor missing, or rings no server makes.
    fn sort(welcome: &v1::SharedMemoryWelcome, fds: Vec<OwnedFd>) -> Result<Self, HandshakeError> {
        let mut fds = fds.into_iter();
        let arena = match welcome.arena_bytes {
            0 => None,
            _ => Some(fds.next_back().ok_or_else(|| {
                HandshakeError::Protocol(
                    "the welcome announced a values arena and carried none".to_string(),
                )
            })?),
        };
        let Some(region) = fds.next() else {
            return Err(HandshakeError::Protocol(
                "the welcome carried no region".to_string(),
            ));
        };
        let bells = Bells::worker_side_of(fds.collect())
            .map_err(|e| HandshakeError::Protocol(format!("the welcome's doorbells: {e}")))?;
        let ring_bytes = welcome.ring_bytes;
        if ring_bytes < 4096 || !ring_bytes.is_multiple_of(8) || ring_bytes > 1 << 32 {
            return Err(HandshakeError::Protocol(format!(
                "rings of {ring_bytes} bytes are not whole words between 4 KiB and 4 GiB"
            )));
        }
        Ok(Self {
            region,
            bells,
            arena,
        })
    }
}

/// Maps the values arena `file` of `bytes`, read-only, with stamps or not.
async fn open_arena(
    file: OwnedFd,
    bytes: u64,
    stamped: bool,
) -> Result<Arc<ArenaView>, HandshakeError> {
    let view = off_runtime(move || ArenaView::open(file, bytes, stamped)).await?;
    Ok(Arc::new(
        view.map_err(|e| HandshakeError::Protocol(e.to_string()))?,
    ))
}

/// Whether `pid`, a socket peer's process id (none when it is out of this
/// process's sight), is this process.
fn is_this_process(pid: Option<i32>) -> bool {
    pid == Some(std::process::id() as i32)
}

/// This thread's async runtime as this process names it, or empty off any:
/// a hello carries it, so that a server in the same process can tell a
/// worker on its own runtime from one on another.
fn this_runtime() -> String {
    tokio::runtime::Handle::try_current()
        .map(|runtime| runtime.id().to_string())
        .unwrap_or_default()
}

/// `N` random bytes from the system.
fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    let mut filled = 0;
    while filled < N {
        filled +=
            rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `message` behind its length (4 bytes, little-endian).
async fn write_framed(socket: &mut UnixStream, message: &impl Message) -> io::Result<()> {
    let body = message.encode_to_vec();
    socket.write_all(&(body.len() as u32).to_le_bytes()).await?;
    socket.write_all(&body).await
}

/// Reads one message written by [`write_framed`], within the handshake's
/// time and size limits.
async fn read_framed<M: Message + Default>(socket: &mut UnixStream) -> Result<M, HandshakeError> {
    let read = async {
        let mut len = [0u8; 4];
        socket.read_exact(&mut len).await?;
        let len = u32::from_le_bytes(len);
        if len > HANDSHAKE_LIMIT {
            return Err(HandshakeError::Protocol(format!(
                "a handshake message of {len} bytes"
            )));
        }
        let mut body = vec![0u8; len as usize];
        socket.read_exact(&mut body).await?;
        M::decode(body.as_slice()).map_err(|e| {
            HandshakeError::Protocol(format!("a handshake message does not decode: {e}"))
        })
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, read)
        .await
        .map_err(|_| {
            HandshakeError::Protocol(format!("no handshake message within {HANDSHAKE_TIMEOUT:?}"))
        })?
}

/// Sends `message` (framed as [`write_framed`] does) with `fds` attached.
async fn send_with_fds(
    socket: &UnixStream,
    message: &impl Message,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let body = message.encode_to_vec();
    let len = (body.len() as u32).to_le_bytes();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(6))];
    loop {
        socket.writable().await?;
        let sent = socket.try_io(Interest::WRITABLE, || {
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(io::Error::other(
                    "the doorbells do not fit a control message",
                ));
            }
            let iov = [IoSlice::new(&len), IoSlice::new(&body)];
            Ok(rustix::net::sendmsg(
                socket,
                &iov,
                &mut control,
                SendFlags::NOSIGNAL,
            )?)
        });
        match sent {
            Ok(n) if n == len.len() + body.len() => return Ok(()),
            Ok(n) => {
                return Err(io::Error::other(format!(
                    "the handshake sent {n} of {} bytes",
                    len.len() + body.len()
                )));
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Receives a message sent by [`send_with_fds`], with its file descriptors.
async fn receive_with_fds<M: Message + Default>(
    socket: &UnixStream,
) -> Result<(M, Vec<OwnedFd>), HandshakeError> {
    let receive = async {
        let mut buffer = vec![0u8; HANDSHAKE_LIMIT as usize + 4];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(6))];
        let mut fds = Vec::new();
        let mut filled = 0;
        loop {
            socket.readable().await?;
            let received = socket.try_io(Interest::READABLE, || {
                let mut control = RecvAncillaryBuffer::new(&mut space);
                let mut iov = [IoSliceMut::new(&mut buffer[filled..])];
                let got =
                    rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
                for message in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(received) = message {
                        fds.extend(received);
                    }
                }
                Ok(got.bytes)
            });
            match received {
                Ok(0) => {
                    return Err(HandshakeError::Protocol(
                        "the server closed the socket before its welcome".to_string(),
                    ));
                }
                Ok(n) => filled += n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error.into()),
            }
            if filled >= 4 {
                let len = u32::from_le_bytes(buffer[..4].try_into().unwrap_or_default()) as usize;
                if len > HANDSHAKE_LIMIT as usize {
                    return Err(HandshakeError::Protocol(format!(
                        "a welcome of {len} bytes"
                    )));
                }
                if filled >= 4 + len {
                    let message = M::decode(&buffer[4..4 + len]).map_err(|e| {
                        HandshakeError::Protocol(format!("the welcome does not decode: {e}"))
                    })?;
                    return Ok((message, fds));
                }
            }
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, receive)
        .await
        .map_err(|_| HandshakeError::Protocol(format!("no welcome within {HANDSHAKE_TIMEOUT:?}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Says hello to a new server of this runtime (`takes_arena` and
    /// `runtime` as given) and returns the welcome and how many files came
    /// with it.
    async fn welcomed_naming(
        takes_arena: bool,
        runtime: String,
    ) -> (v1::SharedMemoryWelcome, usize) {
        let arena = Arena::create(1 << 20).unwrap();
        let (offers, listener) = Offers::bind_with_arena(1 << 16, Some(arena)).unwrap();
        let offer = offers.offer().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            admit(&offers, socket, |_| Ok::<_, String>(()))
                .await
                .map(|_| ())
        });
        let mut socket = reach(&offer.socket_path).await.unwrap();
        let hello = v1::SharedMemoryHello {
            nonce: offer.nonce.clone(),
            takes_arena,
            ring_bytes: 0,
            runtime,
        };
        write_framed(&mut socket, &hello).await.unwrap();
        let (welcome, fds): (v1::SharedMemoryWelcome, Vec<OwnedFd>) =
            receive_with_fds(&socket).await.unwrap();
        server.await.unwrap().unwrap();
        (welcome, fds.len())
    }

    /// [`welcomed_naming`] from a hello that names no runtime.
    async fn welcomed(takes_arena: bool) -> (v1::SharedMemoryWelcome, usize) {
        welcomed_naming(takes_arena, String::new()).await
    }

    /// A welcome whose files fall short of what it says, or whose rings no
    /// server makes, is a protocol error naming what is wrong.
    #[tokio::test]
    async fn a_welcome_short_of_what_it_says_is_refused() {
        // The region's place, four doorbell ends (read, write, read, write),
        // the arena's place: the first `count` of them.
        let files = |count: usize| -> Vec<OwnedFd> {
            let [(r1, w1), (r2, w2), (r3, w3)] = [(); 3].map(|()| doorbell().unwrap());
            [w3, r1, w1, r2, w2, r3].into_iter().take(count).collect()
        };
        let welcome = |ring_bytes, arena_bytes| v1::SharedMemoryWelcome {
            ring_bytes,
            arena_bytes,
            ..Default::default()
        };
        let refusal =
            |welcome: &v1::SharedMemoryWelcome, count| match Handed::sort(welcome, files(count)) {
                Err(HandshakeError::Protocol(why)) => why,
                Err(other) => panic!("{other:?}"),
                Ok(_) => panic!("{welcome:?} with {count} files was taken"),
            };
        assert!(Handed::sort(&welcome(1 << 16, 0), files(5)).is_ok());
        assert!(Handed::sort(&welcome(1 << 16, 1 << 20), files(6)).is_ok());
        let why = refusal(&welcome(1 << 16, 0), 0);
        assert!(why.contains("no region"), "{why}");
        let why = refusal(&welcome(1 << 16, 1 << 20), 0);
        assert!(why.contains("announced a values arena"), "{why}");
        let why = refusal(&welcome(1 << 16, 0), 4);
        assert!(why.contains("3 doorbell ends where 4"), "{why}");
        for ring_bytes in [0, 4095, (1 << 16) + 4, (1 << 32) + 8] {
            let why = refusal(&welcome(ring_bytes, 0), 5);
            assert!(why.contains("not whole words"), "{ring_bytes}: {why}");
        }
    }

    /// A welcome that says "same runtime" from a server that left this
    /// process no doorbells (one in another process, say) is a protocol
    /// error, not a session whose two sides sleep on different bells.
    #[tokio::test]
    async fn a_welcome_claiming_this_runtime_without_doorbells_left_is_refused() {
        let (offers, listener) = Offers::bind(1 << 16).unwrap();
        let offer = offers.offer().unwrap();
        let claiming = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let _: v1::SharedMemoryHello = read_framed(&mut socket).await.unwrap();
            let region = Region::create(region_bytes(1 << 16) as usize).unwrap();
            write_header(&region, 1 << 16);
            let bells = Bells::create().unwrap();
            let welcome = v1::SharedMemoryWelcome {
                ring_bytes: 1 << 16,
                same_runtime: true,
                ..Default::default()
            };
            let [a, b, c, d] = bells.worker_ends();
            let fds = [region.file(), a, b, c, d];
            send_with_fds(&socket, &welcome, &fds).await.unwrap();
            socket
        });
        let refused = connect(&offer).await.unwrap_err();
        let HandshakeError::Protocol(why) = &refused else {
            panic!("a protocol error: {refused:?}");
        };
        assert!(why.contains("left doorbells"), "{why}");
        drop(claiming.await.unwrap());
    }

    /// A worker's in-process doorbells are taken up once, by the nonce they
    /// were left for; ones never taken up go once their server's end has.
    #[test]
    fn in_process_doorbells_are_taken_up_once_or_go_with_their_server() {
        let server = SideBells::left_for(b"taken up");
        assert!(SideBells::take_for(b"taken up").is_some());
        assert!(SideBells::take_for(b"taken up").is_none(), "taken up twice");
        drop(server);
        let abandoned = SideBells::left_for(b"never taken up");
        drop(abandoned);
        let server = SideBells::left_for(b"left after it");
        assert!(SideBells::take_for(b"never taken up").is_none());
        assert!(SideBells::take_for(b"left after it").is_some());
        drop(server);
    }

    /// The welcome says "same runtime" only to a hello from this process
    /// that names the server's own runtime.
    #[tokio::test]
    async fn only_a_hello_naming_the_servers_own_runtime_is_told_it_shares_it() {
        let (welcome, _) = welcomed_naming(true, this_runtime()).await;
        assert!(welcome.same_runtime);
        for other in [String::new(), format!("{}0", this_runtime())] {
            let (welcome, _) = welcomed_naming(true, other.clone()).await;
            assert!(!welcome.same_runtime, "{other:?}");
        }
    }

    /// A worker on the server's own runtime gets ends that know it and sleep
    /// on in-process doorbells, and so does the server; a worker on another
    /// runtime of the same process gets ends that do neither, as one in
    /// another process does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ends_know_a_peer_on_their_own_runtime_and_only_that() {
        let (server, worker, _) = in_process_ends(1 << 16).await.unwrap();
        let known = |server: &ServerEnd, worker: &WorkerEnd| {
            let [a, b] = crate::ring::peer_known(&server.requests, &server.answers);
            let [c, d] = crate::ring::peer_known(&worker.answers, &worker.requests);
            [a, b, c, d]
        };
        let peers = |server: &ServerEnd, worker: &WorkerEnd| known(server, worker).map(|k| k.0);
        let in_process =
            |server: &ServerEnd, worker: &WorkerEnd| known(server, worker).map(|k| k.1);
        let here = Some(tokio::runtime::Handle::current().id());
        assert_eq!(peers(&server, &worker), [here; 4]);
        assert_eq!(in_process(&server, &worker), [true; 4]);
        let (server, worker, _) = in_process_ends_over_pipes(1 << 16).await.unwrap();
        assert_eq!(peers(&server, &worker), [None; 4]);
        assert_eq!(in_process(&server, &worker), [false; 4]);

        let elsewhere = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (offers, listener) = elsewhere
            .spawn(async { Offers::bind(1 << 16) })
            .await
            .unwrap()
            .unwrap();
        let offer = offers.offer().unwrap();
        let admitted = elsewhere.spawn(async move {
            let (socket, _) = listener.accept().await?;
            admit(&offers, socket, |_| Ok::<_, String>(())).await
        });
        let worker = connect(&offer).await.unwrap();
        let (server, ()) = admitted.await.unwrap().unwrap();
        assert_eq!(peers(&server, &worker), [None; 4]);
        assert_eq!(in_process(&server, &worker), [false; 4]);
        drop((server, worker));
        elsewhere.shutdown_background();
    }

    /// A worker that does not say it reads a values arena (one built before
    /// it) is handed none, and its pulls go through the ring.
    #[tokio::test]
    async fn the_arena_goes_only_to_a_worker_that_takes_it() {
        let (welcome, files) = welcomed(false).await;
        assert_eq!(
            (welcome.arena_bytes, welcome.arena_stamped, files),
            (0, false, 5)
        );
        let (welcome, files) = welcomed(true).await;
        // 259 pages' stamps, its own three pages' among them.
        let bytes = (1 << 20) + 3 * crate::arena::PAGE;
        assert_eq!(
            (welcome.arena_bytes, welcome.arena_stamped, files),
            (bytes, true, 6)
        );
    }

    /// A worker gets the rings it asks for, rounded up to a power of two,
    /// between the smallest and the server's own.
    #[test]
    fn rings_follow_the_wish_between_the_smallest_and_the_servers_own() {
        let (offers, _listener) = {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async { Offers::bind(1 << 20).unwrap() })
        };
        let cases = [
            (0, 1 << 20),
            (1, SMALLEST_RING_BYTES),
            (SMALLEST_RING_BYTES, SMALLEST_RING_BYTES),
            (SMALLEST_RING_BYTES + 1, 2 * SMALLEST_RING_BYTES),
            ((1 << 20) - 1, 1 << 20),
            (1 << 20, 1 << 20),
            (5 << 20, 1 << 20),
            (u64::MAX, 1 << 20),
        ];
        for (wish, given) in cases {
            assert_eq!(offers.rings_for(wish), given, "a wish of {wish} bytes");
        }
    }

    /// A server whose own rings are smaller than the smallest gives its own.
    #[tokio::test]
    async fn a_server_with_small_rings_never_gives_more_than_its_own() {
        let (offers, _listener) = Offers::bind(4096).unwrap();
        assert_eq!(offers.rings_for(1), 4096);
        assert_eq!(offers.rings_for(1 << 30), 4096);
        // Nor, when its own is not a power of two, the next one up.
        let (offers, _listener) = Offers::bind(1536 << 10).unwrap();
        assert_eq!(offers.rings_for((1 << 20) + 1), 1536 << 10);
        assert_eq!(offers.rings_for(1 << 20), 1 << 20);
    }

    /// The region charged, the welcome and the worker's rings all have the
    /// size the worker asked for, not the server's own.
    #[tokio::test]
    async fn the_region_charged_and_handed_over_is_the_size_asked_for() {
        let (offers, listener) = Offers::bind(1 << 20).unwrap();
        let offer = offers.offer().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let (end, charged) = admit(&offers, socket, Ok::<_, String>).await.unwrap();
            (end.requests.capacity(), charged)
        });
        let worker = connect_asking(&offer, 3 << 17).await.unwrap();
        let (server_capacity, charged) = server.await.unwrap();
        let given = 512 << 10;
        assert_eq!(charged, region_bytes(given));
        assert!(charged < region_bytes(1 << 20) * 6 / 10);
        assert_eq!(
            server_capacity,
            given / 8,
            "words in the server's request ring"
        );
        assert_eq!(
            worker.answers.capacity(),
            given / 8,
            "words in the worker's answer ring"
        );
    }
}
