//! `ps-worker`: candle workers for candle-ps.
//!
//! - [`cli`]: the training flags shared by `ps-worker` and `ps-local`.
//! - [`client`]: [`client::PsClient`], the connection to every parameter server.
//! - [`placement`]: which server holds which part of which parameter.
//! - [`retry`]: bounded backoff for transient failures.
//! - [`trainer`]: [`trainer::PsTrainer`], data-parallel training of any candle `VarMap`.
//! - [`train`]: the training loop of the `ps-worker` binary and `ps-local`.
//! - [`model`]: an MLP built from candle-nn.
//! - [`optim`]: the server-side optimizers by name.
//! - [`data`]: shipped, generated and file-based data sets.
//! - [`device`]: choosing the candle device from `cpu` or `cuda:N`.

pub mod cli;
pub mod client;
pub mod data;
pub mod device;
pub mod model;
pub mod optim;
pub mod placement;
pub mod retry;
pub mod train;
pub mod trainer;

pub use client::{ClientConfig, PsClient};
pub use optim::{adam, momentum, sgd};
pub use trainer::PsTrainer;
