//! `ps-testbed`: a cluster emulated on one machine, for the regime where the
//! network link is the limit. Each host is a Linux network namespace with one
//! veth link to a switch namespace, shaped by `tc tbf` to a rate in both
//! directions (full duplex); the real `ps-scheduler`, `ps-server` and
//! `ps-worker` binaries run inside them on addresses that exist only there.
//! A run reports each worker's steps per second and step time split, each
//! link's bytes and utilisation, and each process's CPU, and removes every
//! namespace, link and process it made, also on failure and on Ctrl-C.
//!
//! - [`rate`]: link rates as `tc` writes them (from `ps-common`, which the
//!   planner shares);
//! - [`ceiling`]: raw TCP over the same links, both ways at once;
//! - [`hosts`]: which hosts, their addresses and rates;
//! - [`netns`]: the namespaces, links and shapers, and their counters;
//! - [`process`]: a binary started inside a host's namespace;
//! - [`job`]: scheduler, servers and workers, run to the workers' end;
//! - [`report`]: what a run prints;
//! - [`plan_check`]: `ps-scheduler plan`'s predictions against runs, and
//!   [`plan_chart`], its chart of predicted against measured;
//! - [`planned`]: `run --plan FILE`, the job a plan file describes;
//! - [`calibrate`]: `ps-scheduler plan --measure-link` across a shaped link.

pub mod calibrate;
pub mod ceiling;
pub mod hosts;
pub mod job;
pub mod netns;
pub mod plan_chart;
pub mod plan_check;
pub mod planned;
pub mod process;
pub use ps_common::rate;
pub mod report;
