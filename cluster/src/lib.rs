//! `ps-cluster`: a whole candle-ps cluster inside one process.
//!
//! - [`servers`]: [`servers::LocalServers`], parameter servers on loopback ports, and
//!   [`test_cluster`], the helper the tests use.
//! - [`local`]: [`local::run_local`], servers and workers training together; the
//!   library face of the `ps-local` binary.
//! - [`metrics_ports`]: each part's own metrics listener (`ps-local --metrics-listen`).
//! - [`planned`]: `ps-local --plan auto|FILE`, a plan's setup applied to a run.

pub mod local;
pub mod metrics_ports;
pub mod planned;
pub mod servers;

pub use servers::{LocalServers, test_cluster};
