//! `ps-scheduler`: membership, shard placement, shard maps and barriers for candle-ps.
//!
//! - [`membership`]: registrations, heartbeats, expiry, and the versioned shard map;
//!   plain state driven with the current time, tested with a fake clock.
//! - [`placement`]: which server owns which part of which parameter, balanced by bytes.
//! - [`service`]: the gRPC layer over the membership; waits with deadlines.
//! - [`server`]: [`server::run`], serving the scheduler with an expiry ticker.
//! - [`config`]: settings and their validation.
//! - [`group`]: fixed and elastic worker-group sizes.
//! - [`state`]: the state file that carries the scheduler across a restart.

pub mod config;
pub mod group;
pub mod membership;
pub mod placement;
pub mod server;
pub mod service;
pub mod state;

pub use config::SchedulerConfig;
pub use group::GroupSize;
pub use server::run;
