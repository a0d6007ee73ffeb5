//! `ps-cluster`: a whole candle-ps cluster inside one process.
//!
//! - [`servers`]: [`servers::LocalServers`], parameter servers on loopback ports, and
//!   [`test_cluster`], the helper the tests use.
//! - [`local`]: [`local::run_local`], servers and workers training together; the
//!   library face of the `ps-local` binary.

pub mod local;
pub mod servers;

pub use servers::{LocalServers, test_cluster};
