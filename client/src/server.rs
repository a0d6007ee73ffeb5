//! [`Server`]: one parameter server as a client reaches it: its channel, the
//! generated client over it, the calls written as frames ([`crate::framed`]),
//! and its session ([`SessionLink`]), opened on first use and again after it
//! ends: through shared memory when the server is on this host and the data
//! path allows it (`ps_shm`), on a gRPC `Session` stream otherwise.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use ps_common::rendezvous::{Peer, rendezvous};
use ps_proto::auth::AuthChannel;
use ps_proto::dial::Dialer;
use ps_proto::transport::TransportConfig;
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use ps_shm::DataPathMode;
use ps_shm::arena::ArenaView;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::error::{ClientError, Rpc};
use crate::framed::{FramedAnswer, start_framed};
use crate::retry::RetryPolicy;
use crate::session::{CallError, SessionLink};

/// What came of a request on a session: its outcome, how long a pull waited
/// (µs), and any large payloads still lent on a shared-memory ring.
pub(crate) type Answered = (Outcome, u64, Option<ps_shm::LentPayloads>);

/// One parameter server.
#[derive(Clone)]
pub(crate) struct Server {
    pub(crate) addr: String,
    client: ParameterServerClient<AuthChannel>,
    /// The same channel, for the calls written as frames ([`crate::framed`]).
    channel: AuthChannel,
    limit: usize,
    /// The session stream to it: opened on first use, again after it ends.
    session: Arc<tokio::sync::Mutex<SessionState>>,
    /// Whether sessions are tried through shared memory first.
    data_path: DataPathMode,
    /// Set once shared memory proved out of reach (another host, user or
    /// namespace, or not offered): later sessions go straight to gRPC.
    shm_out_of_reach: Arc<AtomicBool>,
    /// The ring capacity asked for when a shared-memory session opens
    /// ([`Server::ask_for_rings`]); 0 asks for the server's own.
    ring_wish: Arc<AtomicU64>,
}

/// How many steps of what a worker moves to a server its shared-memory rings
/// hold: room for a pipelined step's requests, or several small operations,
/// in flight at once.
const STEPS_A_RING_HOLDS: u64 = 8;

/// Where a server's session stream stands.
enum SessionState {
    /// None opened yet, or the last one ended.
    Closed,
    /// Open.
    Open(Arc<SessionLink>),
    /// The server answered `UNIMPLEMENTED`: unary calls only.
    NotOffered,
}

impl Server {
    /// The parameter server at `addr` over `channel`, with the configured message limits.
    pub(crate) fn new(
        addr: &str,
        channel: Channel,
        transport: &TransportConfig,
        data_path: DataPathMode,
    ) -> Self {
        let channel = transport.authed(channel);
        let client = transport.limited(ParameterServerClient::new(channel.clone()));
        Server {
            addr: addr.to_string(),
            client,
            channel,
            limit: transport.max_message_bytes,
            session: Arc::new(tokio::sync::Mutex::new(SessionState::Closed)),
            data_path,
            shm_out_of_reach: Arc::default(),
            ring_wish: Arc::default(),
        }
    }

    /// Sizes the rings of the next shared-memory session opened to this
    /// server for `placed_bytes` of parameters placed on it: a few steps'
    /// worth ([`STEPS_A_RING_HOLDS`]), so a small model's region is made and
    /// mapped in a fraction of the time of the server's default one, and
    /// holds less of its memory budget. Nothing placed asks for the
    /// server's own. A session already open keeps its rings.
    pub(crate) fn ask_for_rings(&self, placed_bytes: usize) {
        let wish = (placed_bytes as u64).saturating_mul(STEPS_A_RING_HOLDS);
        self.ring_wish.store(wish, Ordering::Relaxed);
    }

    /// The ring capacity the next shared-memory session asks for.
    #[cfg(test)]
    pub(crate) fn rings_asked(&self) -> u64 {
        self.ring_wish.load(Ordering::Relaxed)
    }

    /// Connects to the parameter server at `addr`, waiting up to `wait` for it
    /// to come up; with no wait, it must be up now.
    pub(crate) async fn connect(
        transport: &TransportConfig,
        addr: &str,
        wait: Duration,
        data_path: DataPathMode,
    ) -> Result<Self, ClientError> {
        if !wait.is_zero() {
            let (_, channel) = rendezvous(addr, &[Peer::ParameterServer], transport, wait).await?;
            return Ok(Self::new(addr, channel, transport, data_path));
        }
        let connect_error = |source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        };
        let channel = Dialer::new(transport, addr)
            .map_err(connect_error)?
            .connect()
            .await
            .map_err(connect_error)?;
        Ok(Self::new(addr, channel, transport, data_path))
    }

    /// The largest message this client sends to or takes from the server.
    pub(crate) fn message_limit(&self) -> usize {
        self.limit
    }

    /// Runs `call` with `retry`, naming this server and `what` on failure.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        retry: &RetryPolicy,
        what: Rpc,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(ParameterServerClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.answer(retry, what, call)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Starts `path` with the framed request `pieces`, retried by `retry`
    /// until the server answers (refusals named by `what`); the answer is then
    /// read message by message.
    pub(crate) async fn start_framed(
        &self,
        retry: &RetryPolicy,
        what: Rpc,
        path: &'static str,
        metadata: MetadataMap,
        pieces: Vec<Bytes>,
    ) -> Result<FramedAnswer, ClientError> {
        retry
            .run(what.name(), || {
                start_framed(
                    self.channel.clone(),
                    path,
                    metadata.clone(),
                    pieces.clone(),
                    self.limit,
                )
            })
            .await
            .map_err(|status| self.failed(what, status))
    }

    /// The open session stream, opened when there is none; `None` when the
    /// server does not offer sessions.
    async fn session(&self) -> Result<Option<Arc<SessionLink>>, Status> {
        let mut state = self.session.lock().await;
        match &*state {
            SessionState::Open(link) if !link.has_ended() => return Ok(Some(Arc::clone(link))),
            SessionState::NotOffered => return Ok(None),
            SessionState::Open(_) | SessionState::Closed => {}
        }
        if let Some(link) = self.open_shared_memory().await? {
            let link = Arc::new(link);
            *state = SessionState::Open(Arc::clone(&link));
            return Ok(Some(link));
        }
        match SessionLink::open(self.channel.clone(), self.limit).await? {
            Some(link) => {
                let link = Arc::new(link);
                *state = SessionState::Open(Arc::clone(&link));
                Ok(Some(link))
            }
            None => {
                tracing::info!(server = %self.addr, "the server offers no session stream; unary calls instead");
                *state = SessionState::NotOffered;
                Ok(None)
            }
        }
    }

    /// The values arena of the session open now, when it is open through
    /// shared memory with one (no session is opened for it).
    pub(crate) async fn values_arena(&self) -> Option<Arc<ArenaView>> {
        match &*self.session.lock().await {
            SessionState::Open(link) => link.values_arena().cloned(),
            SessionState::Closed | SessionState::NotOffered => None,
        }
    }

    /// Whether pushes and pulls of any size go as one message through shared
    /// memory (opening the session when none is open; false when it cannot
    /// be opened).
    pub(crate) async fn carries_any_size(&self) -> bool {
        if !self.data_path.tries_shm() || self.shm_out_of_reach.load(Ordering::Relaxed) {
            return false;
        }
        matches!(self.session().await, Ok(Some(link)) if link.is_shared_memory())
    }

    /// A session through shared memory, when the data path allows one and
    /// the server offers it to this process; `None` to use gRPC instead.
    ///
    /// # Errors
    /// With `--data-path shm`, `FAILED_PRECONDITION` saying why there is none.
    async fn open_shared_memory(&self) -> Result<Option<SessionLink>, Status> {
        if !self.data_path.tries_shm() || self.shm_out_of_reach.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let required = self.data_path == DataPathMode::Shm;
        let out_of_reach = |why: String| {
            if required {
                return Err(Status::failed_precondition(format!(
                    "--data-path shm: no shared memory with the server at {}: {why}",
                    self.addr
                )));
            }
            tracing::info!(server = %self.addr, %why, "no shared memory with this server; gRPC instead");
            self.shm_out_of_reach.store(true, Ordering::Relaxed);
            Ok(None)
        };
        let offer = match self
            .client
            .clone()
            .offer_shared_memory(v1::SharedMemoryOfferRequest {})
            .await
        {
            Ok(offer) => offer.into_inner(),
            Err(status)
                if matches!(
                    status.code(),
                    Code::Unimplemented | Code::FailedPrecondition
                ) =>
            {
                return out_of_reach(format!("the server offers none ({})", status.message()));
            }
            Err(status) => return Err(status),
        };
        let wish = self.ring_wish.load(Ordering::Relaxed);
        match ps_shm::connect_asking(&offer, wish).await {
            Ok(end) => {
                let ring_bytes = end.answers.capacity_bytes();
                tracing::info!(server = %self.addr, ring_bytes, "pushes and pulls go through shared memory");
                Ok(Some(SessionLink::over_shared_memory(end)))
            }
            Err(error) if error.is_elsewhere() => out_of_reach(error.to_string()),
            Err(error) if required => Err(Status::failed_precondition(format!(
                "--data-path shm: the server at {} did not hand over shared memory: {error}",
                self.addr
            ))),
            Err(error) => {
                tracing::warn!(server = %self.addr, %error, "shared memory failed; this session uses gRPC");
                Ok(None)
            }
        }
    }

    /// Runs the operation `op` makes on the session stream, retried by `retry`
    /// (each attempt on the stream then open); `None` when the server offers
    /// no sessions.
    pub(crate) async fn in_session(
        &self,
        retry: &RetryPolicy,
        what: Rpc,
        op: impl Fn() -> Op,
        fits_grpc: bool,
    ) -> Result<Option<(Outcome, u64)>, ClientError> {
        let answered = self.in_session_lending(retry, what, op, fits_grpc, false);
        Ok(answered
            .await?
            .map(|(outcome, waited_us, _)| (outcome, waited_us)))
    }

    /// [`Server::in_session`]; when `lend`, an answer's large payloads may
    /// come still on a shared-memory ring (`Some`), for the caller to read
    /// straight into its own memory.
    pub(crate) async fn in_session_lending(
        &self,
        retry: &RetryPolicy,
        what: Rpc,
        op: impl Fn() -> Op,
        fits_grpc: bool,
        lend: bool,
    ) -> Result<Option<Answered>, ClientError> {
        retry
            .run(what.name(), || self.sent_on_session(&op, fits_grpc, lend))
            .await
            .map_err(|status| self.failed(what, status))
    }

    /// One attempt of [`Server::in_session_lending`]. A session can end
    /// between being found open and taking the request (the server closed it
    /// when it had been idle, or the connection went): the request, which
    /// never went out, is then sent on a new session, whatever its retry
    /// policy (a pull is never retried otherwise).
    async fn sent_on_session(
        &self,
        op: &impl Fn() -> Op,
        fits_grpc: bool,
        lend: bool,
    ) -> Result<Option<Answered>, Status> {
        let mut sent_again = false;
        loop {
            // A message only shared memory carries is not sent on a gRPC
            // session (shared memory lost since it was cut): `None`, and the
            // caller streams it instead.
            let link = match self.session().await? {
                Some(link) if fits_grpc || link.is_shared_memory() => link,
                _ => return Ok(None),
            };
            let answered = if lend {
                link.call_lending(op()).await
            } else {
                let answered = link.call(op()).await;
                answered.map(|(outcome, waited_us)| (outcome, waited_us, None))
            };
            match answered {
                Ok(answered) => return Ok(Some(answered)),
                Err(CallError::NotSent(status)) if !sent_again => {
                    tracing::debug!(server = %self.addr, %status, "the session ended before the request went out; sending it on a new one");
                    sent_again = true;
                }
                Err(error) => return Err(error.into_status()),
            }
        }
    }

    pub(crate) fn failed(&self, what: Rpc, status: Status) -> ClientError {
        ClientError::Rpc {
            what,
            addr: self.addr.clone(),
            status,
        }
    }

    /// [`Server::call`], keeping the answer's metadata.
    pub(crate) async fn answer<T, F, Fut>(
        &self,
        retry: &RetryPolicy,
        what: Rpc,
        call: F,
    ) -> Result<tonic::Response<T>, ClientError>
    where
        F: Fn(ParameterServerClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        retry
            .run(what.name(), || call(self.client.clone()))
            .await
            .map_err(|status| self.failed(what, status))
    }
}

#[cfg(test)]
mod tests {
    use ps_proto::v1;
    use tokio::net::TcpListener;
    use tonic::Code;

    use super::*;

    /// A `Server` for a ps-server started in this process.
    async fn started() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let config = ps_server::ServerConfig::default();
        tokio::spawn(ps_server::run(listener, config, std::future::pending()));
        let transport = TransportConfig::default();
        Server::connect(
            &transport,
            &addr,
            Duration::from_secs(10),
            DataPathMode::Grpc,
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_pull_meeting_a_session_that_ended_unnoticed_goes_out_on_a_new_one() {
        let server = started().await;
        let ended = Arc::new(SessionLink::ended_unnoticed());
        *server.session.lock().await = SessionState::Open(Arc::clone(&ended));
        // A pull is never retried; a key the server does not hold is refused
        // with NOT_FOUND, which only a session that reached it can bring.
        let pull = || {
            Op::Pull(v1::PullRequest {
                keys: vec![v1::KeyRef {
                    name: "never.registered".to_string(),
                    part: 0,
                }],
                ..Default::default()
            })
        };
        let once = RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        };
        let refused = server.in_session(&once, Rpc::Pull, pull, true).await;
        match refused {
            Err(ClientError::Rpc { status, .. }) => {
                assert_eq!(status.code(), Code::NotFound, "{status:?}");
            }
            other => panic!("the pull did not reach the server: {other:?}"),
        }
        assert!(ended.has_ended());
        let state = server.session.lock().await;
        assert!(
            matches!(&*state, SessionState::Open(link) if !Arc::ptr_eq(link, &ended)),
            "a new session is open"
        );
    }
}
