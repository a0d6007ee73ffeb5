//! `ps-worker`: candle workers for candle-ps — the candle glue over `ps-client`,
//! the training loop and its CLI, models and data sets.
//!
//! - [`trainer`]: [`trainer::PsTrainer`], data-parallel training of any candle `VarMap`.
//! - [`train`]: the training loop of the `ps-worker` binary and `ps-local`.
//! - [`cli`]: the training flags shared by `ps-worker` and `ps-local`.
//! - [`model`]: an MLP built from candle-nn.
//! - [`embedding`]: [`embedding::PsEmbedding`], an embedding table on the servers as a candle layer.
//! - [`ctr`]: the click-through model: an embedding table and an MLP, on the click data set.
//! - [`data`]: shipped, generated and file-based data sets.
//! - [`host_copy`]: moving a step's tensors between the device and host buffers.
//! - [`device`]: choosing the candle device from `cpu` or `cuda:N`.
//! - [`compute_probe`]: one step's compute timed on this host, for `ps-local --plan auto`.
//! - [`step_time`]: where the training time goes (compute, gather, push, wait, pull, apply).
//! - [`metrics`]: the Prometheus metrics a worker serves on `--metrics-listen`.
//! - [`report`]: the CSV files and charts `--out DIR` writes.
//! - [`segmented`]: a forward pass cut at boundaries, for a backward pass one segment at a time.
//! - [`share_cores`]: a worker on its servers' host lowering its priority so that they run first.

pub mod cli;
pub mod compute_probe;
pub mod compute_threads;
pub mod ctr;
pub mod data;
pub mod device;
pub mod embedding;
pub mod host_copy;
pub mod metrics;
pub mod model;
pub mod report;
pub mod segmented;
pub mod share_cores;
pub mod step_time;
pub mod train;
pub mod trainer;

pub use embedding::PsEmbedding;
pub use ps_client::{adam, momentum, sgd};
pub use trainer::PsTrainer;
