//! [`ParameterService`]: the thin gRPC layer. Each handler validates the request,
//! converts it with [`crate::wire`], calls the [`Store`], and maps the outcome to a
//! precise status. Building the service is separate from serving it, so tests can
//! call it without a socket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream;
use prost::Message;
use std::collections::HashSet;

use ps_proto::auth::{Role, require_role};
use ps_proto::chunk::{Assembler, ChunkError, ChunkHeader};
use ps_proto::codec::TensorData;
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_proto::metadata;
use ps_proto::v1;
use ps_proto::v1::parameter_server_server::{ParameterServer, ParameterServerServer};
use tonic::{Code, Request, Response, Status, Streaming};

use crate::budget::{Charge, Charged};
use crate::checkpointer::Checkpointer;
use crate::config::ServerConfig;
use crate::error::{Error, Result};
use crate::group::Ranks;
use crate::metrics::ServerMetrics;
use crate::param::ParamSpec;
use crate::push_buffer::{PushBuffer, Reservation};
use crate::push_source::{PushChunks, next_message};
use crate::store::{Pulled, Pushed, Store};
use crate::wire;

/// A pull's chunks, holding the charge for the values they share.
pub(crate) type PullChunks = Charged<std::vec::IntoIter<v1::PullChunk>>;
/// One message of a `PullStream` answer, as tonic sends it.
type PullAnswer = Result<v1::PullChunk, Status>;

/// Pushes carrying at least this many bytes are applied off the async threads.
const BLOCKING_APPLY_BYTES: usize = 4 << 20;

/// The `ps.v1.ParameterServer` service over one [`Store`].
#[derive(Debug, Clone)]
pub struct ParameterService {
    store: Arc<Store>,
    ranks: Arc<Ranks>,
    config: Arc<ServerConfig>,
    checkpointer: Option<Arc<Checkpointer>>,
    metrics: Option<Arc<ServerMetrics>>,
    push_buffer: PushBuffer,
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
        }
    }

    /// The same service, recording what it answers in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<ServerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The tonic server for this service, with the configured message limits.
    pub fn into_server(self) -> ParameterServerServer<Self> {
        let limit = self.config.transport.max_message_bytes;
        ParameterServerServer::new(self)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit)
    }

    /// The answer to `rpc`, which arrived at `started`: refusals are counted
    /// by the store, and every answer by the metrics.
    fn answer<T>(
        &self,
        rpc: &'static str,
        started: Instant,
        result: Result<T>,
    ) -> Result<Response<T>, Status> {
        let answer = result
            .map(Response::new)
            .map_err(|e| Status::from(self.store.reject(e)));
        if let Some(metrics) = &self.metrics {
            let code = answer.as_ref().map_or_else(Status::code, |_| Code::Ok);
            metrics.answered(rpc, code, started.elapsed());
        }
        answer
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
        let started = Instant::now();
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
        if let (Some(metrics), Ok(_)) = (&self.metrics, &pushed) {
            metrics.pushed(bytes, started.elapsed());
        }
        pushed
    }

    /// A unary push's gradients, admitted by map version, decoded and applied.
    async fn push_grads(&self, request: &v1::PushRequest) -> Result<Vec<Pushed>> {
        self.store
            .map()
            .admit(MapVersion(request.map_version))
            .await?;
        let grads = request
            .grads
            .iter()
            .map(wire::tensor)
            .collect::<Result<Vec<_>>>()?;
        let (worker, step) = (Rank(request.worker_id), Step(request.step));
        let bytes = grads.iter().map(|(_, grad)| grad.byte_len()).sum();
        let _held = self
            .store
            .budget()
            .charge(bytes, || format!("a push of {} gradients", grads.len()))?;
        self.apply_push(worker, step, grads, false).await
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
        let routed_by = MapVersion(request.map_version);
        self.store.map().admit(routed_by).await?;
        let keys: Vec<_> = request.keys.iter().map(wire::key).collect();
        let bytes = self.store.pull_bytes(&keys)?;
        if bytes > largest {
            return Err(Error::ResponseTooLarge {
                bytes,
                limit: largest,
            });
        }
        let charge = self.store.budget().charge(bytes, || match keys.len() {
            1 => "pulling 1 key".to_string(),
            n => format!("pulling {n} keys"),
        })?;
        let timeout = self.config.pull_timeout(request.timeout_ms);
        let min_version = Version(request.min_version);
        let waiting = Instant::now();
        let pulled = self
            .store
            .pull(&keys, min_version, timeout, routed_by)
            .await?;
        let waited = waiting.elapsed();
        if let Some(metrics) = &self.metrics {
            metrics.pulled(bytes);
        }
        Ok((pulled, charge, waited))
    }
}

/// The bytes a push stream declares in its `ps-push-bytes` header, if it has one.
fn declared_push_bytes<T>(request: &Request<T>) -> Result<Option<usize>> {
    let Some(value) = request.metadata().get(metadata::PUSH_BYTES) else {
        return Ok(None);
    };
    let bad = || Error::BadPushBytes {
        value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
    };
    let text = value.to_str().map_err(|_| bad())?;
    text.parse().map(Some).map_err(|_| bad())
}

/// Reads a whole `RegisterStream`, checking that every chunk of a key repeats its spec
/// and that the spec is within the server's size limit. Returns the parameters and
/// the stream's restore version.
async fn read_register_stream(
    store: &Store,
    stream: &mut Streaming<v1::RegisterChunk>,
    idle: Duration,
    buffered: &mut Charge,
) -> Result<(Vec<(ParamSpec, Option<TensorData>)>, Version)> {
    let mut assembler = Assembler::new();
    let mut specs: Vec<ParamSpec> = Vec::new();
    let mut restore_version = 0;
    while let Some(message) = next_message(stream, idle).await? {
        restore_version = restore_version.max(message.restore_version);
        let spec = message.spec.as_ref().ok_or(Error::EmptyRequest {
            what: "a RegisterChunk without a spec",
        })?;
        store.map().admit(MapVersion(message.map_version)).await?;
        let spec = wire::param_spec(spec)?;
        store.check_size(&spec)?;
        match specs.iter().find(|s| s.key == spec.key) {
            Some(first) if *first != spec => {
                let (first, now) = (first.describe(), spec.describe());
                return Err(ChunkError::HeaderChanged {
                    key: spec.key,
                    first,
                    now,
                }
                .into());
            }
            Some(_) => {}
            None => specs.push(spec.clone()),
        }
        buffered.grow(message.data.len(), || {
            format!("buffering a register stream of {}", spec.key)
        })?;
        assembler.add(wire::chunk_header(&spec), message.offset, message.data)?;
    }
    let tensors = assembler.finish()?;
    let params = specs
        .into_iter()
        .zip(tensors)
        .map(|(spec, (_, data))| (spec, Some(data)))
        .collect();
    Ok((params, Version(restore_version)))
}

/// Reads a whole `PushStream`: `(worker, step, gradients)`. The first chunk of each
/// key is checked against the store, so a bad stream is refused before it is read,
/// and each chunk is scanned for NaN and infinity as it arrives.
async fn read_push_stream(
    store: &Store,
    stream: &mut impl PushChunks,
    idle: Duration,
    buffered: &mut Charge,
    room: Option<&Reservation>,
) -> Result<(Rank, Step, Vec<(ParamKey, TensorData)>)> {
    let mut assembler = Assembler::new();
    let mut carried = 0usize;
    let mut checked = HashSet::new();
    let mut origin = None;
    let mut index = 0;
    while let Some((message, data)) = stream.next_chunk(idle).await? {
        let sender = (Rank(message.worker_id), Step(message.step));
        let (worker, step) = *origin.get_or_insert(sender);
        if sender != (worker, step) {
            let (got_worker, got_step) = sender;
            return Err(Error::MixedStream {
                index,
                worker,
                step,
                got_worker,
                got_step,
            });
        }
        let chunk = message.chunk.as_ref().ok_or(Error::EmptyRequest {
            what: "a PushChunk without a chunk",
        })?;
        store.map().admit(MapVersion(message.map_version)).await?;
        let header = ChunkHeader::from_wire(&chunk.name, chunk.part, chunk.dtype, &chunk.shape)?;
        if checked.insert(header.key.clone()) {
            store.check_gradient_header(&header)?;
        }
        let len: usize = data.iter().map(Bytes::len).sum();
        carried = carried.saturating_add(len);
        if let Some(room) = room.filter(|room| carried > room.declared) {
            return Err(Error::PushOverDeclared {
                declared: room.declared,
            });
        }
        buffered.grow(len, || {
            format!("buffering a push stream from worker {worker} for step {step}")
        })?;
        // Scanned once the assembler has taken it, so that its offset is known to
        // be whole elements inside the gradient, and so is each piece it kept.
        let mut offset = chunk.offset;
        for piece in assembler.add_pieces(header.clone(), chunk.offset, data)? {
            store.check_gradient_chunk(&header, offset, piece)?;
            offset += piece.len() as u64;
        }
        index += 1;
    }
    let (worker, step) = origin.ok_or(Error::EmptyRequest {
        what: "the push stream carried no chunks",
    })?;
    Ok((worker, step, assembler.finish()?))
}

impl ParameterService {
    /// `PushStream` over chunks from any source: tonic's stream, or the
    /// request's HTTP/2 frames read in place ([`crate::data_path`]).
    pub(crate) async fn push_chunks(
        &self,
        request: Request<impl PushChunks>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        let started = Instant::now();
        require_role(&request, Role::Worker, "PushStream")?;
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
        self.answer("PushStream", started, result.map(wire::push_response))
    }

    /// `PullStream`'s chunks, each sharing the stored values, with the metadata
    /// of the answer; the charge for the values is held by the chunks.
    pub(crate) async fn pull_chunks(
        &self,
        request: &v1::PullRequest,
    ) -> Result<Response<PullChunks>, Status> {
        let started = Instant::now();
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
        let mut answer = self.answer("PullStream", started, result)?;
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
        let started = Instant::now();
        require_role(&request, Role::Worker, "JoinGroup")?;
        let group = self.store.group();
        let result = wire::join_request(request.into_inner())
            .and_then(|join| self.ranks.join(group, &join))
            .map(|rank| v1::JoinGroupResponse {
                rank,
                workers: group.workers,
                consistency: group.consistency.to_string(),
            });
        self.answer("JoinGroup", started, result)
    }

    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        let started = Instant::now();
        require_role(&request, Role::Worker, "Register")?;
        let request = request.get_ref();
        let admitted = self
            .store
            .map()
            .admit(MapVersion(request.map_version))
            .await;
        let result = admitted
            .and_then(|()| {
                request
                    .params
                    .iter()
                    .map(wire::param_init)
                    .collect::<Result<Vec<_>>>()
            })
            .and_then(|params| {
                let bytes = params
                    .iter()
                    .filter_map(|(_, initial)| initial.as_ref().map(TensorData::byte_len))
                    .sum();
                let _held = self.store.budget().charge(bytes, || {
                    format!("the initial values of {} keys", params.len())
                })?;
                let restore_version = Version(request.restore_version);
                self.store.register(params, restore_version)
            });
        self.answer("Register", started, result.map(wire::register_response))
    }

    async fn register_stream(
        &self,
        request: Request<Streaming<v1::RegisterChunk>>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        let started = Instant::now();
        require_role(&request, Role::Worker, "RegisterStream")?;
        let idle = self.config.stream_idle_timeout;
        let mut buffered = self.store.budget().charge(0, String::new)?;
        let stream = &mut request.into_inner();
        let params = read_register_stream(&self.store, stream, idle, &mut buffered).await;
        let result = params.and_then(|(params, restore)| self.store.register(params, restore));
        self.answer(
            "RegisterStream",
            started,
            result.map(wire::register_response),
        )
    }

    async fn push(
        &self,
        request: Request<v1::PushRequest>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        let started = Instant::now();
        require_role(&request, Role::Worker, "Push")?;
        let result = self.push_grads(request.get_ref()).await;
        self.answer("Push", started, result.map(wire::push_response))
    }

    async fn push_stream(
        &self,
        request: Request<Streaming<v1::PushChunk>>,
    ) -> Result<Response<v1::PushResponse>, Status> {
        self.push_chunks(request).await
    }

    async fn pull(
        &self,
        request: Request<v1::PullRequest>,
    ) -> Result<Response<v1::PullResponse>, Status> {
        let started = Instant::now();
        let limit = self.config.transport.max_message_bytes;
        let mut waited = Duration::ZERO;
        let result =
            self.pull_values(request.get_ref(), limit)
                .await
                .and_then(|(pulled, _held, wait)| {
                    waited = wait;
                    let tensors = pulled.into_iter().map(wire::pulled_tensor).collect();
                    let response = v1::PullResponse { tensors };
                    let bytes = response.encoded_len();
                    if bytes > limit {
                        return Err(Error::ResponseTooLarge { bytes, limit });
                    }
                    Ok(response)
                });
        let mut answer = self.answer("Pull", started, result)?;
        metadata::set_pull_waited(answer.metadata_mut(), waited);
        Ok(answer)
    }

    type PullStreamStream =
        stream::Iter<std::iter::Map<PullChunks, fn(v1::PullChunk) -> PullAnswer>>;

    async fn pull_stream(
        &self,
        request: Request<v1::PullRequest>,
    ) -> Result<Response<Self::PullStreamStream>, Status> {
        let answer = self.pull_chunks(request.get_ref()).await?;
        Ok(answer.map(|chunks| stream::iter(chunks.map(Ok as fn(_) -> _))))
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
