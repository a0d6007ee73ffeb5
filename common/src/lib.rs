//! What candle-ps's programs share that is not the wire contract (that is
//! `ps-proto`'s).
//!
//! - [`size`]: byte sizes as people write them (`64MiB`), for every size flag.

pub mod size;
