//! `ps-scheduler`: membership, shard placement, shard maps and barriers for candle-ps.
//!
//! - [`roster`]: the members of one kind (servers, workers): alive, left, last heard.
//! - [`membership`]: registrations, heartbeats, expiry and elastic groups; plain
//!   state driven with the current time, tested with a fake clock.
//! - [`shard_map`]: the published map, and the pure rule for the next one.
//! - [`barrier`]: named barriers of the live workers.
//! - [`placement`]: the shared planner next to other systems' planners, and the report.
//! - [`state_file`]: the state file that carries the scheduler across a restart.
//! - [`status_table`]: the table `ps-scheduler status` prints, with rates for `--watch`.
//! - [`shared_state`]: what the handlers and the expiry ticker share.
//! - [`service`]: the gRPC layer over the shared state; waits with deadlines.
//! - [`methods`]: who may call each method (the access layer's table).
//! - [`server`]: [`server::run`], serving the scheduler with an expiry ticker.
//! - [`config`]: settings and their validation.
//! - [`group`]: fixed and elastic worker-group sizes.
//! - [`plan`]: `ps-scheduler plan`, the cost model that picks a setup.

pub mod barrier;
pub mod config;
pub mod declared;
pub mod group;
pub mod membership;
pub mod methods;
pub mod metrics;
pub mod owners;
pub mod placement;
pub mod plan;
pub mod roster;
pub mod server;
pub mod service;
pub mod shard_map;
pub mod shared_state;
pub mod state_file;
pub mod status_table;

pub use config::SchedulerConfig;
pub use group::GroupSize;
pub use server::{run, run_with_metrics};
