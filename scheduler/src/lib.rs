//! `ps-scheduler`: membership, shard placement, shard maps and barriers for candle-ps.
//!
//! - [`placement`]: which server owns which part of which parameter, balanced by bytes.

pub mod placement;
