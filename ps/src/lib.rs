//! `ps-server`: one parameter-server shard of candle-ps.
//!
//! A shard holds keys (parameters or partitions of them) with their values,
//! server-side optimizer state and versions; workers push gradients tagged
//! `(worker, step)` and pull values, optionally waiting for a version.
//!
//! - [`config`]: settings and their validation.
//! - [`checkpoint`]: checkpoints in safetensors, written atomically, read with checks.
//! - [`checkpointer`]: when checkpoints are written.
//! - [`export`]: checkpoints put back together as one model file.
//! - [`consistency`]: BSP, ASP, SSP(k) and the rule that admits a push exactly once.
//! - [`optimizer`]: SGD, momentum, Adam(W).
//! - `kernels`: the optimizers' vectorised arithmetic over one block.
//! - [`follower`]: following the scheduler (registration, heartbeats, live workers).
//! - [`applied_map`]: the applied shard-map version; stale and newer maps.
//! - [`group`]: worker ranks handed out by `JoinGroup`.
//! - [`param`]: one key's state.
//! - [`restore`]: a key's state from checkpoints or a worker's copy.
//! - `announced`: the version a key or bucket announced, which pulls wait on.
//! - [`entry`]: one stored key; a push applied to its keys, all or nothing.
//! - [`store`]: all keys; all-or-nothing register and push, waiting pulls; the same for table rows.
//! - [`table`]: embedding tables: specs, row initialisers, row optimizers, buckets.
//! - `table_service`: the table methods (`DeclareTable`, `PullRows`, `PushRows`) through the admission step.
//! - [`table_wire`]: the table messages to and from the store's row types.
//! - [`step_waits`]: how long BSP steps waited, and for whom.
//! - [`wire`]: `ps.v1` messages to and from the domain types.
//! - [`service`]: the gRPC handlers, and [`service::ParameterService::into_server`], the one server stack.
//! - `session`: the `Session` stream, pushes and pulls as tagged messages on one long-lived stream.
//! - `shared_memory`: the same sessions for workers on this host, through a shared-memory region (`ps_shm`).
//! - `admission`: the one admission step (map version, then memory budget) of data-carrying requests.
//! - `stream_reads`: reading a whole register or push stream, message by message.
//! - [`methods`]: who may call each method (the access layer's table).
//! - [`data_path`]: `PushStream` and `PullStream` served from and into HTTP/2 frames in place.
//! - `push_source`: a push stream's chunks cut out of its HTTP/2 frames.
//! - [`server`]: [`server::run`], serving a shard with health and clean shutdown.
//! - `unix_socket`: the same gRPC on a Unix-domain socket (`--listen-unix`).
//! - [`error`]: why a request is refused, as precise gRPC statuses.
//! - [`budget`]: the memory budget, and the charges requests and keys hold against it.
//! - [`push_buffer`]: how many bytes of push streams a server reads ahead of applying them.
//! - [`values`]: a key's values, shared copy-on-write with the pulls sending them.
//! - [`parallel`]: splitting an update of a large key over cores.
//! - [`metrics`]: the Prometheus metrics a server serves on `--metrics-listen`.
//! - [`fuzzing`]: entry points for the fuzzers and property tests.

mod admission;
mod announced;
pub mod applied_map;
pub mod budget;
pub mod checkpoint;
pub mod checkpointer;
pub mod config;
pub mod consistency;
pub mod data_path;
pub mod entry;
pub mod error;
pub mod export;
pub mod follower;
pub mod fuzzing;
pub mod group;
mod kernels;
pub mod methods;
pub mod metrics;
pub mod optimizer;
pub mod parallel;
pub mod param;
pub mod push_buffer;
mod push_source;
pub mod restore;
pub mod server;
pub mod service;
mod session;
mod shared_memory;
pub mod step_waits;
pub mod store;
mod stream_reads;
pub mod table;
mod table_service;
pub mod table_wire;
mod unix_socket;
pub mod values;
pub mod wire;

pub use config::ServerConfig;
pub use consistency::Consistency;
pub use server::{run, run_with_metrics};
