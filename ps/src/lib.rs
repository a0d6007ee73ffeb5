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
//! - [`entry`]: one stored key; a push applied to its keys, all or nothing.
//! - [`store`]: all keys; all-or-nothing register and push, waiting pulls.
//! - [`step_waits`]: how long BSP steps waited, and for whom.
//! - [`wire`]: `ps.v1` messages to and from the domain types.
//! - [`service`]: the gRPC handlers.
//! - [`data_path`]: `PushStream` and `PullStream` served from and into HTTP/2 frames in place.
//! - `push_source`: where a push stream's chunks come from.
//! - [`server`]: [`server::run`], serving a shard with health and clean shutdown.
//! - [`error`]: why a request is refused, as precise gRPC statuses.

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
pub mod metrics;
pub mod optimizer;
pub mod parallel;
pub mod param;
pub mod push_buffer;
mod push_source;
pub mod restore;
pub mod server;
pub mod service;
pub mod step_waits;
pub mod store;
pub mod values;
pub mod wire;

pub use config::ServerConfig;
pub use consistency::Consistency;
pub use server::{run, run_with_metrics};
