//! `ps-proto`: the contract between candle-ps processes.
//!
//! - [`v1`]: the code generated from `proto/ps/v1/*.proto` (messages, clients, servers).
//! - [`codec`]: tensors on the wire — dtypes, shapes, validation, zero-copy `f32` access.
//! - [`consistency`]: BSP, ASP, SSP(k) and the version to pull after a push.
//! - [`hyper`]: the optimizers' default hyper-parameters.
//! - [`metadata`]: the gRPC metadata keys on refusals a client acts on.
//! - [`refusal`]: a refused session operation's status, carried as a `SessionRefusal` and read back.
//! - [`placement`]: the one placement planner, shared by the scheduler and workers.
//! - [`rows`]: embedding tables on the wire: row buckets, their servers, ids and rows as bytes.
//! - [`key`]: [`key::ParamKey`], the name of one stored tensor.
//! - [`ids`]: named numbers — [`ids::Rank`], [`ids::Step`], [`ids::Version`], [`ids::MapVersion`], [`ids::ServerId`].
//! - [`header`]: [`header::TensorHeader`], the one description of a tensor: key, dtype, shape.
//! - [`chunk`]: splitting tensors into stream chunks and reassembling them with checks.
//! - [`transport`]: one place for HTTP/2 windows, frame sizes, message limits and keep-alive.
//! - [`dial`]: reaching a server at `host:port` over TCP or at `unix:PATH`.
//! - [`auth`]: the cluster token and the roles its secrets grant.
//! - [`tls`]: TLS settings, certificates and the preferred cipher suite.
//! - [`fuzzing`]: entry points for the fuzzers of the wire decoders.
//! - [`grpc_frames`], [`rope`], [`chunk_decode`], [`chunk_encode`],
//!   [`session_frames`]: the tensor data path's and the session's messages read
//!   out of HTTP/2 frames and written into them without copying their tensor
//!   bytes or rows.

pub mod auth;
pub mod chunk;
pub mod chunk_decode;
pub mod chunk_encode;
pub mod codec;
pub mod consistency;
pub mod dial;
pub mod fuzzing;
pub mod grpc_frames;
pub mod header;
pub mod hyper;
pub mod ids;
pub mod key;
pub mod metadata;
pub mod placement;
pub mod refusal;
pub mod rope;
pub mod rows;
pub mod session_body;
pub mod session_frames;
pub mod tls;
pub mod transport;

/// Generated code for package `ps.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("ps.v1");
}
