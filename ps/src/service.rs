//! [`ParameterService`]: the gRPC handlers. Each converts its request with
//! [`crate::wire`], passes the one admission step (`Admitted`), calls the
//! [`Store`], and maps the outcome to a precise status. Who may call each method,
//! and the metrics of every answer, are the [`Access`] layer's ([`METHODS`]), in
//! front of [`DataPath`]: [`ParameterService::into_server`] builds that one stack,
//! which `ps-server` and the in-process tests serve alike. Building the service
//! is separate from serving it, so tests and fuzzers can call a handler without
//! a socket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream;
use prost::Message;
use ps_common::access::{Access, Answers};
use ps_proto::codec::TensorData;
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_proto::metadata;
use ps_proto::v1;
use ps_proto::v1::parameter_server_server::{ParameterServer, ParameterServerServer};
use tonic::{Request, Response, Status, Streaming};

use crate::admission::Admitted;
use crate::budget::{Charge, Charged, MemoryBudget};
use crate::checkpointer::Checkpointer;
use crate::config::ServerConfig;
use crate::data_path::DataPath;
use crate::error::{Error, Result};
use crate::group::Ranks;
use crate::methods::METHODS;
use crate::metrics::ServerMetrics;
use crate::push_buffer::PushBuffer;
use crate::push_source::FramedPushChunks;
use crate::store::{Pulled, Pushed, Store};
use crate::stream_reads::{declared_push_bytes, read_push_stream, read_register_stream};
use crate::wire;
use ps_shm::Offers;

/// A pull's chunks, holding the charge for the values they share.
pub(crate) type PullChunks = Charged<std::vec::IntoIter<v1::PullChunk>>;

/// Pushes carrying at least this many bytes are applied off the async threads.
const BLOCKING_APPLY_BYTES: usize = 4 << 20;

impl ParameterService {
    /// A unary pull's answer, and how long it waited for its version: the
    /// values of every key, refused when they take more than `limit` bytes
    /// (the message limit, for an answer sent as one message).
    pub(crate) async fn pull_response(
        &self,
        request: &v1::PullRequest,
        limit: usize,
    ) -> Result<(v1::PullResponse, Duration)> {
        let (pulled, _held, waited) = self.pull_values(request, limit).await?;
        let tensors = pulled.into_iter().map(wire::pulled_tensor).collect();
        let response = v1::PullResponse { tensors };
        let bytes = response.encoded_len();
        if bytes > limit {
            return Err(Error::ResponseTooLarge { bytes, limit });
        }
        Ok((response, waited))
    }
}

/// The `ps.v1.ParameterServer` service over one [`Store`].
#[derive(Debug, Clone)]
pub struct ParameterService {
    store: Arc<Store>,
    ranks: Arc<Ranks>,
    config: Arc<ServerConfig>,
    checkpointer: Option<Arc<Checkpointer>>,
    metrics: Option<Arc<ServerMetrics>>,
    push_buffer: PushBuffer,
    /// The shared-memory offers, when this server makes them.
    shared_memory: Option<Arc<Offers>>,
}

impl ParameterService {
    /// A service over `store`.
    pub fn new(
        store: Arc<Store>,
        config: ServerConfig,
        checkpointer: Option<Arc<Checkpointer>>,
    ) -> Self {
        Self {
            store,
            checkpointer,
            ranks: Arc::default(),
            push_buffer: PushBuffer::new(config.push_buffer_bytes),
            config: Arc::new(config),
            metrics: None,
            shared_memory: None,
        }
    }

    /// The same service, offering workers on this host sessions through
    /// `offers` (served by `crate::shared_memory::accept`).
    pub fn with_shared_memory(mut self, offers: Arc<Offers>) -> Self {
        self.shared_memory = Some(offers);
        self
    }

    /// The store this service answers from.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The server's settings.
    pub(crate) fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The memory this server may hold.
    pub(crate) fn budget(&self) -> &Arc<MemoryBudget> {
        self.store.budget()
    }

    /// The same service, recording what it answers in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<ServerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The one server stack for this service: the [`Access`] layer (roles and
    /// answer metrics, by [`METHODS`]) in front of [`DataPath`] (the tensor
    /// streams served in place, every other method by tonic's generated server).
    pub fn into_server(self) -> Access<DataPath> {
        let answers = self
            .metrics
            .clone()
            .map(|metrics| metrics as Arc<dyn Answers>);
        Access::new(DataPath::new(self), METHODS, answers)
    }

    /// tonic's generated server for this service, with the configured message
    /// limits: what [`DataPath`] hands every method but the tensor streams.
    pub(crate) fn generated(self) -> ParameterServerServer<Self> {
        let transport = self.config.transport.clone();
        transport.limited(ParameterServerServer::new(self))
    }

    /// The answer to a request: a refusal is counted by the store and becomes
    /// its precise status.
    fn answer<T>(&self, result: Result<T>) -> Result<Response<T>, Status> {
        self.refusal(result).map(Response::new)
    }

    /// `result`, a refusal counted by the store and made its precise status.
    pub(crate) fn refusal<T>(&self, result: Result<T>) -> Result<T, Status> {
        result.map_err(|e| Status::from(self.store.reject(e)))
    }

    /// The server's metrics, when it keeps them.
    pub(crate) fn metrics(&self) -> Option<&ServerMetrics> {
        self.metrics.as_deref()
    }

    /// The largest message this service takes or sends.
    pub(crate) fn max_message_bytes(&self) -> usize {
        self.config.transport.max_message_bytes
    }

    fn stream_chunk_bytes(&self, requested: u64) -> usize {
        let cap = self.config.transport.payload_limit();
        match usize::try_from(requested) {
            Ok(0) => self.config.chunk_bytes,
            Ok(n) => n.min(cap),
            Err(_) => cap,
        }
    }

    /// Applies a push, scanning it for NaN and infinity first unless its chunks
    /// were scanned as they arrived (`checked`). Pushes of
    /// [`BLOCKING_APPLY_BYTES`] or more run on a blocking thread, so the async
    /// threads go on reading every connection's data while the arithmetic runs
    /// (and while it waits for a key another push holds); smaller ones run
    /// inline, where a hand-off would cost more than the work.
    async fn apply_push(
        &self,
        worker: Rank,
        step: Step,
        grads: Vec<(ParamKey, TensorData)>,
        checked: bool,
    ) -> Result<Vec<Pushed>> {
        let bytes: usize = grads.iter().map(|(_, grad)| grad.byte_len()).sum();
        let started = self.metrics.as_ref().map(|_| Instant::now());
        let push = move |store: &Store| match checked {
            true => store.push_checked(worker, step, grads),
            false => store.push(worker, step, grads),
        };
        let pushed = if bytes < BLOCKING_APPLY_BYTES {
            push(&self.store)
        } else {
            let store = Arc::clone(&self.store);
            match tokio::task::spawn_blocking(move || push(&store)).await {
                Ok(pushed) => pushed,
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(_) => Err(Error::ShuttingDown),
            }
        };
        if let (Some(metrics), Some(started), Ok(_)) = (&self.metrics, started, &pushed) {
            metrics.pushed(bytes, started.elapsed());
        }
        pushed
    }

    /// A unary `Register`'s parameters, admitted, with their initial values
    /// charged while the store takes them.
    async fn register_params(
        &self,
        request: &v1::RegisterRequest,
    ) -> Result<Vec<crate::store::Registered>> {
        let admitted = Admitted::map(&self.store, request.map_version).await?;
        let params = request
            .params
            .iter()
            .map(wire::param_init)
            .collect::<Result<Vec<_>>>()?;
        let bytes = params
            .iter()
            .filter_map(|(_, initial)| initial.as_ref().map(TensorData::byte_len))
            .sum();
        let _held = admitted.charge(bytes, || {
            format!("the initial values of {} keys", params.len())
        })?;
        self.store
            .register(params, Version(request.restore_version))
    }

    /// A push's gradients, admitted by map version, decoded and applied. With
    /// `scanned` they were already checked for NaN and infinity as they
    /// arrived (a shared-memory session's, tested in the pass that copied
    /// them off the ring, and refused through [`Self::gradient_checker`])
    /// and are not scanned again.
    pub(crate) async fn push_grads(
        &self,
        request: &v1::PushRequest,
        scanned: bool,
    ) -> Result<Vec<Pushed>> {
        let admitted = Admitted::map(&self.store, request.map_version).await?;
        let grads = request
            .grads
            .iter()
            .map(wire::tensor)
            .collect::<Result<Vec<_>>>()?;
        let (worker, step) = (Rank(request.worker_id), Step(request.step));
        let bytes = grads.iter().map(|(_, grad)| grad.byte_len()).sum();
        let _held = admitted.charge(bytes, || format!("a push of {} gradients", grads.len()))?;
        self.apply_push(worker, step, grads, scanned).await
    }

    /// Refuses a push whose gradient a shared-memory session found to hold
    /// NaN or infinity as it copied it off the ring, with the status a whole
    /// scan would give; `None` where such values are allowed, and nothing
    /// is looked for.
    pub(crate) fn gradient_checker(&self) -> Option<ps_shm::serving::Checker> {
        if !self.store.rules().reject_non_finite {
            return None;
        }
        let service = self.clone();
        Some(std::sync::Arc::new(
            move |header: &_, offset, piece: &[u8]| {
                service.refusal(service.store.check_gradient_chunk(header, offset, piece))
            },
        ))
    }

    /// A pull's values, their share of the memory budget, and how long the pull
    /// waited for its version. `largest` is the most value bytes the answer may
    /// carry (a unary answer's message limit): a pull past it is refused before
    /// any value is read.
    async fn pull_values(
        &self,
        request: &v1::PullRequest,
        largest: usize,
    ) -> Result<(Vec<Pulled>, Charge, Duration)> {
        let admitted = Admitted::map(&self.store, request.map_version).await?;
        let keys: Vec<_> = request.keys.iter().map(wire::key).collect();
        let bytes = self.store.pull_bytes(&keys)?;
        if bytes > largest {
            return Err(Error::ResponseTooLarge {
                bytes,
                limit: largest,
            });
        }
        let charge = admitted.charge(bytes, || match keys.len() {
            1 => "pulling 1 key".to_string(),
            n => format!("pulling {n} keys"),
        })?;
        let timeout = self.config.pull_timeout(request.timeout_ms);
        let min_version = Version(request.min_version);
        let waiting = Instant::now();
        let pulled = self
            .store
            .pull(&keys, min_version, timeout, MapVersion(request.map_version))
            .await?;
        let waited = waiting.elapsed();
        if let Some(metrics) = &self.metrics {
            metrics.pulled(bytes);
        }
        Ok((pulled, charge, waited))
    }
}

impl ParameterService {
    /// `PushStream`, its chunks read out of the request's HTTP/2 frames in
    /// place ([`crate::data_path`]).
    pub(crate) async fn push_chunks(
        &self,
        request: Request<FramedPushChunks>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        let idle = self.config.stream_idle_timeout;
        let result = async {
            let room = match declared_push_bytes(&request)? {
                Some(bytes) => Some(self.push_buffer.reserve(bytes).await),
                None => None,
            };
            let mut buffered = self.store.budget().charge(0, String::new)?;
            let stream = &mut request.into_inner();
            let (worker, step, grads) =
                read_push_stream(&self.store, stream, idle, &mut buffered, room.as_ref()).await?;
            self.apply_push(worker, step, grads, true).await
        }
        .await;
        self.answer(result.map(wire::push_response))
    }

    /// `PullStream`'s chunks, each sharing the stored values, with the metadata
    /// of the answer; the charge for the values is held by the chunks.
    pub(crate) async fn pull_chunks(
        &self,
        request: &v1::PullRequest,
    ) -> Result<Response<PullChunks>, Status> {
        let chunk_bytes = self.stream_chunk_bytes(request.chunk_bytes);
        let pulled = self.pull_values(request, usize::MAX).await;
        let mut waited = Duration::ZERO;
        let result = pulled.map(|(pulled, charge, wait)| {
            waited = wait;
            let chunks: Vec<_> = pulled
                .iter()
                .flat_map(|p| wire::pull_chunks(p, chunk_bytes))
                .collect();
            Charged::new(chunks.into_iter(), charge)
        });
        let mut answer = self.answer(result)?;
        metadata::set_pull_waited(answer.metadata_mut(), waited);
        Ok(answer)
    }
}

#[tonic::async_trait]
impl ParameterServer for ParameterService {
    async fn join_group(
        &self,
        request: Request<v1::JoinGroupRequest>,
    ) -> Result<Response<v1::JoinGroupResponse>, Status> {
        let group = self.store.group();
        let result = wire::join_request(request.into_inner())
            .and_then(|join| self.ranks.join(group, &join))
            .map(|rank| v1::JoinGroupResponse {
                rank,
                workers: group.workers,
                consistency: group.consistency.to_string(),
            });
        self.answer(result)
    }

    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        let result = self.register_params(request.get_ref()).await;
        self.answer(result.map(wire::register_response))
    }

    async fn register_stream(
        &self,
        request: Request<Streaming<v1::RegisterChunk>>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        let idle = self.config.stream_idle_timeout;
        let mut buffered = self.store.budget().charge(0, String::new)?;
        let stream = &mut request.into_inner();
        let params = read_register_stream(&self.store, stream, idle, &mut buffered).await;
        let result = params.and_then(|(params, restore)| self.store.register(params, restore));
        self.answer(result.map(wire::register_response))
    }

    async fn push(
        &self,
        request: Request<v1::PushRequest>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        let result = self.push_grads(request.get_ref(), false).await;
        self.answer(result.map(wire::push_response))
    }

    /// Never reached: [`DataPath`] answers `PushStream` before tonic's server
    /// sees it (`ParameterService::push_chunks`).
    async fn push_stream(
        &self,
        _request: Request<Streaming<v1::PushChunk>>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        Err(served_by_data_path("PushStream"))
    }

    async fn pull(
        &self,
        request: Request<v1::PullRequest>,
    ) -> Result<Response<v1::PullResponse>, Status> {
        let limit = self.max_message_bytes();
        let (response, waited) =
            self.refusal(self.pull_response(request.get_ref(), limit).await)?;
        let mut answer = Response::new(response);
        metadata::set_pull_waited(answer.metadata_mut(), waited);
        Ok(answer)
    }

    async fn declare_table(
        &self,
        request: Request<v1::DeclareTableRequest>,
    ) -> Result<Response<v1::DeclareTableResponse>, Status> {
        let result = self.declare_table_rows(request.get_ref()).await;
        self.answer(result)
    }

    async fn pull_rows(
        &self,
        request: Request<v1::PullRowsRequest>,
    ) -> Result<Response<v1::PullRowsResponse>, Status> {
        let limit = self.max_message_bytes();
        let result = self.pull_table_rows(request.get_ref(), limit).await;
        self.answer(result)
    }

    async fn push_rows(
        &self,
        request: Request<v1::PushRowsRequest>,
    ) -> Result<Response<v1::PushRowsResponse>, Status> {
        let result = self.push_table_rows(request.get_ref()).await;
        self.answer(result)
    }

    type SessionStream = stream::Empty<std::result::Result<v1::SessionAnswer, Status>>;

    /// Never reached: [`DataPath`] serves `Session` before tonic's server
    /// sees it (`crate::session::open`).
    async fn session(
        &self,
        _request: Request<Streaming<v1::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        Err(served_by_data_path("Session"))
    }

    async fn offer_shared_memory(
        &self,
        _request: Request<v1::SharedMemoryOfferRequest>,
    ) -> Result<Response<v1::SharedMemoryOffer>, Status> {
        let Some(offers) = &self.shared_memory else {
            return Err(Status::failed_precondition(
                "this server offers no shared memory (it runs with --data-path grpc, or could not make its socket); use gRPC",
            ));
        };
        let offer = offers
            .offer()
            .map_err(|e| Status::internal(format!("no shared-memory offer could be made: {e}")))?;
        Ok(Response::new(offer))
    }

    type PullStreamStream = stream::Empty<Result<v1::PullChunk, Status>>;

    /// Never reached: [`DataPath`] answers `PullStream` before tonic's server
    /// sees it (`ParameterService::pull_chunks`).
    async fn pull_stream(
        &self,
        _request: Request<v1::PullRequest>,
    ) -> Result<Response<Self::PullStreamStream>, Status> {
        Err(served_by_data_path("PullStream"))
    }

    async fn stats(
        &self,
        _request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        let rules = self.store.rules();
        let stats = self.store.stats();
        let response = wire::stats_response(
            &stats,
            rules.group.consistency.to_string(),
            self.store.group().workers,
        );
        Ok(Response::new(response))
    }

    async fn checkpoint(
        &self,
        _request: Request<v1::CheckpointRequest>,
    ) -> Result<Response<v1::CheckpointResponse>, Status> {
        let Some(checkpointer) = &self.checkpointer else {
            return Err(Status::failed_precondition(
                "this server runs without checkpoints; start it with --checkpoint-dir DIR",
            ));
        };
        let written = checkpointer.write_now().await.map_err(|e| {
            Status::internal(format!("checkpoint failed (the previous one is kept): {e}"))
        })?;
        Ok(Response::new(v1::CheckpointResponse {
            path: written.path.display().to_string(),
            keys: written.keys as u64,
            version: written.version.get(),
        }))
    }
}

/// The refusal of a tensor stream that reached tonic's generated server, which
/// the one server stack never lets happen.
fn served_by_data_path(method: &str) -> Status {
    Status::internal(format!(
        "{method} is answered by the server's data path; this server was built without it"
    ))
}
