//! What candle-ps's programs share that is not the wire contract (that is
//! `ps-proto`'s): how a program starts, finds its peers and is stopped.
//!
//! - [`size`]: byte sizes as people write them (`64MiB`), for every size flag.
//! - [`flag`]: on/off flags whose `PS_*` variables take `1`, `yes` and `on` as well as `true`.
//! - [`process`]: logging set-up, the shutdown signal and `ServeError`, shared by the binaries.
//! - [`rendezvous`]: waiting for a peer to come up, and naming a peer that is not what was asked for.
//! - [`health`]: the client side of the gRPC health service, for `health` subcommands.
//! - [`processes`]: real `ps-server` and `ps-scheduler` processes on loopback ports.
//! - [`fixtures`]: parameter shapes of ResNet-50 and BERT-base.
//! - [`rng`]: a small deterministic random generator for data and payloads.
//! - [`zipf`]: Zipf-distributed ranks (ids of a synthetic embedding workload).
//! - [`runtime`]: the tokio runtime of each program, half a thread per core by default.
//! - [`connections`]: a server's connections, at most `--max-connections` at once, idle ones closed.
//! - [`idle`]: each connection's requests in flight, counted by a layer every server runs.
//! - [`certs`]: a cluster's CA and node certificate, for `ps-scheduler certs` and `ps-local --tls`.
//! - [`access`]: which role may call each gRPC method, and every answer's metrics, in one layer.
//! - [`security_args`]: the `--tls-*` flags and cluster token every program takes.
//! - [`plot_style`]: the font and palette of every chart.
//! - [`rate`]: link rates as `tc` writes them (the testbed and the planner).
//! - [`metrics`]: the Prometheus endpoint and build information of every program,
//!   and [`text_format`], its classic text format for scrapers that do not ask for OpenMetrics.

pub mod access;
pub mod certs;
pub mod connections;
pub mod fixtures;
pub mod flag;
pub mod health;
pub mod idle;
pub mod metrics;
pub mod plot_style;
pub mod process;
pub mod processes;
pub mod rate;
pub mod rendezvous;
pub mod rng;
pub mod runtime;
pub mod security_args;
pub mod size;
pub mod text_format;
pub mod zipf;
