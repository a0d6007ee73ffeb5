//! `ps-scheduler`: membership, shard placement, shard maps and barriers for candle-ps.
//!
//! - [`membership`]: registrations, heartbeats, expiry, and the versioned shard map.
//! - [`placement`]: which server owns which part of which parameter, balanced by bytes.

pub mod membership;
pub mod placement;
