//! `ps-microbench`: how fast tensors move over candle-ps's RPC layer, always next
//! to raw TCP measured in the same run.
//!
//! - [`server`]: the `ps.v1.Bench` service and the TCP baseline, served together.
//! - [`peer`]: the server under test, remote or a local child process.
//! - [`latency`], [`bandwidth`], [`throughput`]: the transport and model benchmarks;
//!   [`kv`]: one key per size pushed and pulled by worker processes, along
//!   each of the [`kv_path`]s;
//!   [`rows`]: embedding rows by id, beside a hash-map key-value floor ([`rows_floor`]);
//!   [`rows_cli`]: its command lines.
//! - [`apply`]: the server's optimizer arithmetic against a memcpy.
//! - [`payload`]: TF-gRPC-Bench payload schemes and the two encodings.
//! - [`tcp`]: the raw TCP baseline protocol; [`plain`] and [`tcp_check`]: the
//!   plainest send-and-ack loop it is checked against (`tcp-check`).
//! - [`tuning`]: HTTP/2 and chunking knobs.
//! - [`report`], [`plot`]: tables, JSON lines, CSV and SVG charts.
//! - [`cpu`]: process CPU time.
//! - [`progress`]: a progress bar for long runs.

pub mod apply;
pub mod bandwidth;
pub mod cpu;
pub mod floors;
pub mod kv;
pub mod kv_path;
pub mod latency;
pub mod payload;
pub mod peer;
pub mod plain;
pub mod plot;
pub mod progress;
pub mod report;
pub mod rows;
pub mod rows_cli;
pub mod rows_floor;
pub mod server;
pub mod stdout;
pub mod tcp;
pub mod tcp_check;
pub mod throughput;
pub mod tls_files;
pub mod tuning;
