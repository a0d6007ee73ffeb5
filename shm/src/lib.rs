//! `ps-shm`: the same-host data path of candle-ps. A worker on its server's
//! host sends pushes and pulls through a shared-memory region instead of
//! loopback TCP: the tensors' bytes are copied once into the region and once
//! out (a large key's pulled values once, out of the server's values arena),
//! with no encoding, no socket and, while both sides are busy, no system
//! call. gRPC stays the control plane (the offer is an authenticated call) and
//! the fallback.
//!
//! - [`region`]: the sealed memfd: atomic control words and bulk copies of
//!   data (with [`arena`] and [`copy`], this crate's only `unsafe`).
//! - [`arena`]: the server's values arena for keys of 2 KiB or more, which workers map
//!   read-only and copy pulled values out of once, or read again with no
//!   request while they stay current.
//! - [`stamp`]: the arena's stamps, which say whether a block's values are
//!   still current and unchanged while a worker reads them.
//! - [`lending`]: the server's side of answers sent by their arena offset,
//!   held until the worker has copied them.
//! - [`copy`]: those copies, in AVX2 registers where present, and elements
//!   (NaN, infinity) looked for in the same pass as a copy off the ring.
//! - [`cache_size`]: the last-level cache's size, which sets when those
//!   copies bypass the cache.
//! - [`bell`]: doorbells (pipes, or in-process for a session on one runtime),
//!   rung only for a side that sleeps.
//! - [`stores`]: whether a ring writer copies a large write in with ordinary
//!   or streaming stores, by what each has cost it lately.
//! - [`ring`]: a single-producer, single-consumer ring of words with spinning,
//!   then sleeping, waits.
//! - [`message`]: session requests and answers on a ring, tensors as raw bytes,
//!   sequence-numbered.
//! - [`handshake`]: the server's socket and offers; handing a region over.
//! - [`caller`]: the worker's side of a session, its requests writing
//!   themselves onto the ring and reading answers off it themselves.
//! - [`serving`]: the server's side of a session, its requests read off the
//!   ring and its answers written onto the other by the session's own task.
//! - [`link`]: the worker's side of a session as a request channel and an
//!   answer stream.
//! - [`lent`]: an answer's large payloads lent to the request, to be copied
//!   once, straight into its own memory.
//! - [`pool`]: reused buffers for the payloads a reader copies out.
//! - [`mode`]: `--data-path auto|grpc|shm`.
//! - [`fuzzing`]: entry points for the fuzzers and property tests of the
//!   worker's reading of what its server wrote.

pub mod arena;
pub mod bell;
pub mod cache_size;
pub mod caller;
pub mod copy;
pub mod fuzzing;
pub mod handshake;
pub mod lending;
pub mod lent;
pub mod link;
pub mod message;
pub mod mode;
pub mod pool;
pub mod region;
pub mod ring;
pub mod serving;
pub mod stamp;
pub mod stores;

pub use caller::{AnswerReader, AnswerRing, Closed, Queued, RequestRing, Sent, worker_rings};
pub use handshake::{HandshakeError, Offers, SMALLEST_RING_BYTES, admit, connect, connect_asking};
pub use lent::{Answer, LentPayloads};
pub use link::{WorkerLink, worker_link};
pub use mode::DataPathMode;
pub use serving::{ServerLink, serve_link};

/// The default capacity of each of a region's two rings: 1 MiB, small enough
/// to stay in the shared cache while both sides copy through it.
pub const DEFAULT_RING_BYTES: u64 = 1 << 20;
