//! `ps-client`: the candle-ps client library. It depends on the contract
//! (`ps-proto`) and nothing of candle, so any training loop (and the
//! microbenchmarks) can use it; `ps-worker` adds the candle glue.
//!
//! - [`connection`]: [`PsClient`], a worker's connection to a job.
//! - [`control`]: the control plane — ranks, heartbeats, leaving, shard maps.
//! - `shards`: servers and placement, with the fan-out of register, push and pull.
//! - `fan_out`: requests to several servers at once, failing at the first error.
//! - `pipeline`: a training step's push and pull, pipelined group by group.
//! - `framed`: push and pull streams written and read as HTTP/2 frames, without copying tensors.
//! - [`wire`]: the messages and chunk streams for placed parameter parts.
//! - [`placement`]: which server holds which part of which parameter.
//! - [`table_spec`]: embedding tables as a worker declares them, row optimizers by name.
//! - [`rows`]: embedding rows by id: buckets routed to servers, deduplicated pulls and pushes.
//! - [`repair`]: repairing placement after a stale map or a lost server.
//! - [`recovery`]: [`Recovering`], the state machine that decides between attempts, repairs and giving up.
//! - [`error`]: [`ClientError`], and [`Recovery`], what to do about one.
//! - [`retry`]: bounded backoff for transient failures.
//! - [`config`]: [`ClientConfig`] and its defaults.
//! - [`optim`]: the server-side optimizers by name.

pub mod config;
pub mod connection;
pub mod control;
pub mod error;
pub(crate) mod fan_out;
pub(crate) mod framed;
pub mod optim;
mod pipeline;
pub mod placement;
pub mod recovery;
pub mod repair;
pub mod retry;
pub mod rows;
mod server;
mod session;
pub(crate) mod shards;
pub mod table_spec;
pub mod wire;

pub use config::{ClientConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUESTS_PER_SERVER};
pub use connection::PsClient;
pub use control::{Expected, GroupInfo};
pub use error::{ClientError, Recovery, Repair, Rpc};
pub use optim::{adam, momentum, sgd};
pub use recovery::{Action, Outcome, Recovering};
pub use repair::{LocalCopy, RepairBudget};
pub use rows::UniqueIds;
pub use table_spec::RowOptimizerChoice;
pub use wire::{ParamBytes, PulledParam};
