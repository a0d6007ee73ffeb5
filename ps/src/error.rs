//! [`Error`]: everything a parameter-server request can be refused for, each
//! mapped to a precise gRPC status whose message says what to change.

use std::time::Duration;

use ps_common::size::format_size;
use ps_proto::chunk::ChunkError;
use ps_proto::codec::{CodecError, DType};
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_proto::metadata;
use tonic::{Code, Status};

/// Why a request was refused. A refused request changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request named nothing to do.
    #[error("empty request: {what}")]
    EmptyRequest {
        /// What was missing.
        what: &'static str,
    },
    /// A field of the request does not parse.
    #[error("{field}: {reason}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's dtype, shape or data length is malformed.
    #[error("{key}: {source}")]
    Codec {
        /// The tensor.
        key: ParamKey,
        /// What is wrong.
        source: CodecError,
    },
    /// A chunk stream is malformed.
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    /// A push stream carried more tensor bytes than its `ps-push-bytes` header
    /// declared (the room the server reserved for it).
    #[error(
        "the push stream carried more than the {declared} bytes its ps-push-bytes header declared; declare the sum of every chunk's data"
    )]
    PushOverDeclared {
        /// Bytes the header declared.
        declared: usize,
    },
    /// A `ps-push-bytes` header that is not a byte count.
    #[error("the ps-push-bytes header {value:?} is not a byte count")]
    BadPushBytes {
        /// The header as sent.
        value: String,
    },
    /// A stream's messages disagree about the pushing worker or step.
    #[error(
        "stream message {index} says worker {got_worker} step {got_step}, but the stream began as worker {worker} step {step}"
    )]
    MixedStream {
        /// Index of the offending message.
        index: usize,
        /// Worker of the first message.
        worker: Rank,
        /// Step of the first message.
        step: Step,
        /// Worker of this message.
        got_worker: Rank,
        /// Step of this message.
        got_step: Step,
    },
    /// The key is not registered here.
    #[error(
        "unknown key {key}: it was never registered on this server ({known} keys are); register it first or check the shard map"
    )]
    UnknownKey {
        /// The key.
        key: ParamKey,
        /// How many keys this server holds.
        known: usize,
    },
    /// A table declaration that cannot be used.
    #[error("table `{table}`: {reason}")]
    InvalidTable {
        /// The table.
        table: String,
        /// What is wrong.
        reason: String,
    },
    /// A table this server never had declared.
    #[error(
        "unknown table `{table}`: it was never declared on this server ({known} tables are); declare it (DeclareTable) first or check the shard map"
    )]
    UnknownTable {
        /// The table.
        table: String,
        /// How many tables this server holds.
        known: usize,
    },
    /// A bucket of a table this server does not hold.
    #[error(
        "bucket {} of table `{}` is not held by this server; declare it here (DeclareTable) or route by the current shard map",
        .key.part, .key.name
    )]
    UnknownBucket {
        /// The bucket, as `(table, bucket)`.
        key: ParamKey,
    },
    /// A table exists with a different spec.
    #[error("{existing} is already declared; this request declares {requested}")]
    TableConflict {
        /// The declared table.
        existing: String,
        /// The requested one.
        requested: String,
    },
    /// Row ids or row data that cannot be taken.
    #[error("bucket {} of table `{}`: {reason}", .key.part, .key.name)]
    BadRows {
        /// The bucket, as `(table, bucket)`.
        key: ParamKey,
        /// What is wrong.
        reason: String,
    },
    /// The same key appears twice in one request.
    #[error("{key} appears more than once in one request")]
    RepeatedKey {
        /// The key.
        key: ParamKey,
    },
    /// A gradient's dtype differs from the parameter's.
    #[error(
        "{key} is {expected} but the gradient is {got}; push gradients in the parameter's dtype"
    )]
    DtypeMismatch {
        /// The key.
        key: ParamKey,
        /// The parameter's dtype.
        expected: DType,
        /// The gradient's dtype.
        got: DType,
    },
    /// A gradient's shape differs from the parameter's.
    #[error("{key} has shape {expected:?} but the gradient has shape {got:?}")]
    ShapeMismatch {
        /// The key.
        key: ParamKey,
        /// The parameter's shape.
        expected: Vec<usize>,
        /// The gradient's shape.
        got: Vec<usize>,
    },
    /// A gradient or initial value is NaN or infinite.
    #[error(
        "{what} of {key} has a non-finite value {value} at element {index}; fix the model or loss scale, or start the server with --allow-non-finite"
    )]
    NonFinite {
        /// The key.
        key: ParamKey,
        /// "gradient" or "initial value".
        what: &'static str,
        /// Element index.
        index: usize,
        /// The value.
        value: f32,
    },
    /// The optimizer is missing or has an out-of-range hyper-parameter.
    #[error("optimizer of {key}: {reason}")]
    InvalidOptimizer {
        /// The key.
        key: ParamKey,
        /// What is wrong.
        reason: crate::optimizer::InvalidOptimizer,
    },
    /// A key exists with a different spec.
    #[error("{key} already exists as {existing}; this request registers it as {requested}")]
    SpecConflict {
        /// The key.
        key: ParamKey,
        /// The stored spec.
        existing: String,
        /// The requested spec.
        requested: String,
    },
    /// A worker id outside the BSP/SSP group.
    #[error(
        "worker {worker} is outside this server's group of {group} workers (ids 0..{group}); start the server with --workers N to match the job"
    )]
    WorkerOutsideGroup {
        /// The worker id.
        worker: Rank,
        /// Group size.
        group: u32,
    },
    /// A joining worker was started for another group than this server's.
    #[error(
        "this server's group has {setting} {server}, but the worker was started with {setting} {worker}; start the servers and every worker with the same --{setting}"
    )]
    GroupMismatch {
        /// The setting that differs (`workers`, `consistency`).
        setting: &'static str,
        /// The server's value.
        server: String,
        /// The worker's value.
        worker: String,
    },
    /// Every rank of the group is taken.
    #[error(
        "all {workers} ranks of this server's worker group are taken; start the server with --workers N for more workers"
    )]
    GroupFull {
        /// Group size.
        workers: u32,
    },
    /// A push's step is ahead of what the consistency model allows.
    #[error(
        "step {step} of worker {worker} is from the future for {key}: the key is at version {version} and accepts steps up to {max_step}; pull version {max_step} before pushing step {step}"
    )]
    FutureStep {
        /// The key.
        key: ParamKey,
        /// The worker.
        worker: Rank,
        /// The pushed step.
        step: Step,
        /// The key's version.
        version: Version,
        /// The largest step accepted now.
        max_step: Step,
    },
    /// Under BSP, a pull waits for a version the key cannot reach: it takes one
    /// step at a time, and the puller already pushed the steps between (to an
    /// earlier incarnation of this server, before the key was restored from an
    /// older copy).
    #[error(
        "a pull of {key} at version {wanted} cannot be answered: the key is at version {version} and completes one step at a time, so it lost steps this worker already pushed (it was restored from an older copy); offer this worker's copy and repeat the step"
    )]
    PullAhead {
        /// The key.
        key: ParamKey,
        /// The version the pull waits for.
        wanted: Version,
        /// The key's version.
        version: Version,
    },
    /// Under BSP, the step was completed without this worker.
    #[error(
        "step {step} of {key} already completed without worker {worker} (the key is at version {version}); pull the current values and push step {version}"
    )]
    StaleStep {
        /// The key.
        key: ParamKey,
        /// The worker.
        worker: Rank,
        /// The pushed step.
        step: Step,
        /// The key's version.
        version: Version,
    },
    /// A parameter larger than the server accepts.
    #[error(
        "{key} would hold {bytes} bytes, over this server's {limit}-byte limit per tensor; partition it or raise --max-tensor"
    )]
    TensorTooLarge {
        /// The key.
        key: ParamKey,
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// Holding what a request needs would pass the server's memory budget.
    #[error(
        "{what} needs {}, but this server already holds {} of its {} memory budget; free memory by spreading the keys over more servers, or raise --memory-budget",
        format_size(*bytes), format_size(*held), format_size(*limit)
    )]
    OverBudget {
        /// What needed the memory, for example "registering 3 keys".
        what: String,
        /// Bytes it needed.
        bytes: usize,
        /// Bytes held when it asked.
        held: usize,
        /// The budget.
        limit: usize,
    },
    /// A unary response would exceed the message limit.
    #[error(
        "the response would be {bytes} bytes, over the {limit}-byte message limit; use PullStream for large tensors or pull fewer keys at once"
    )]
    ResponseTooLarge {
        /// Response size.
        bytes: usize,
        /// Message limit.
        limit: usize,
    },
    /// A pull's minimum version did not arrive in time.
    #[error(
        "waited {waited:?} for {key} to reach version {wanted}, but it is at version {have}{detail}"
    )]
    PullTimeout {
        /// The key.
        key: ParamKey,
        /// The version waited for.
        wanted: Version,
        /// The version reached.
        have: Version,
        /// How long the pull waited.
        waited: Duration,
        /// Who the step is waiting for, when known.
        detail: String,
    },
    /// Receiving the request stream failed (for example a message over the size limit).
    #[error("{}", .0.message())]
    Stream(Status),
    /// The request was routed with an older shard map than this server knows.
    #[error(
        "stale shard map: the request was routed with version {requested}, but version {current} is current; fetch it from the scheduler and retry"
    )]
    StaleMap {
        /// The version the request carried.
        requested: MapVersion,
        /// The version this server knows.
        current: MapVersion,
    },
    /// The request was routed with a newer shard map than this server has applied,
    /// and it could not fetch that map in time.
    #[error(
        "this server has not applied shard map version {requested} yet (it has {current}); it is fetching it from the scheduler: retry shortly"
    )]
    MapAhead {
        /// The version the request carried.
        requested: MapVersion,
        /// The version this server has.
        current: MapVersion,
    },
    /// The server is shutting down.
    #[error("the parameter server is shutting down; retry on another server or after it restarts")]
    ShuttingDown,
    /// A stream sent nothing for the idle timeout.
    #[error(
        "the stream sent nothing for {idle:?}, so it was ended and nothing of it applied; send its chunks without pausing, or raise the server's --stream-idle-timeout"
    )]
    StreamIdle {
        /// The server's idle timeout.
        idle: Duration,
    },
}

impl Error {
    /// The gRPC status code for this error.
    pub fn code(&self) -> Code {
        match self {
            Error::UnknownKey { .. } | Error::UnknownTable { .. } | Error::UnknownBucket { .. } => {
                Code::NotFound
            }
            Error::SpecConflict { .. } | Error::TableConflict { .. } => Code::AlreadyExists,
            Error::FutureStep { .. }
            | Error::PullAhead { .. }
            | Error::StaleStep { .. }
            | Error::StaleMap { .. }
            | Error::GroupMismatch { .. } => Code::FailedPrecondition,
            Error::ResponseTooLarge { .. }
            | Error::OverBudget { .. }
            | Error::TensorTooLarge { .. }
            | Error::GroupFull { .. } => Code::ResourceExhausted,
            Error::PullTimeout { .. } | Error::StreamIdle { .. } => Code::DeadlineExceeded,
            Error::ShuttingDown | Error::MapAhead { .. } => Code::Unavailable,
            Error::Stream(status) => status.code(),
            Error::EmptyRequest { .. }
            | Error::InvalidField { .. }
            | Error::Codec { .. }
            | Error::Chunk(_)
            | Error::MixedStream { .. }
            | Error::PushOverDeclared { .. }
            | Error::BadPushBytes { .. }
            | Error::RepeatedKey { .. }
            | Error::DtypeMismatch { .. }
            | Error::ShapeMismatch { .. }
            | Error::NonFinite { .. }
            | Error::InvalidOptimizer { .. }
            | Error::InvalidTable { .. }
            | Error::BadRows { .. }
            | Error::WorkerOutsideGroup { .. } => Code::InvalidArgument,
        }
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Self {
        match error {
            Error::Stream(status) => status,
            Error::StaleMap { current, .. } => metadata::failed_precondition_with(
                error.to_string(),
                metadata::MAP_VERSION,
                current,
            ),
            Error::StaleStep { version, .. }
            | Error::FutureStep { version, .. }
            | Error::PullAhead { version, .. } => metadata::failed_precondition_with(
                error.to_string(),
                metadata::KEY_VERSION,
                version,
            ),
            other => Status::new(other.code(), other.to_string()),
        }
    }
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        Error::Stream(status)
    }
}

/// Result of a parameter-server operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
