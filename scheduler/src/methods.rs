//! Who may call each method of `ps.v1.Scheduler`: the table the scheduler's
//! [`Access`](ps_common::access::Access) layer checks every request against.
//!
//! Only a server registers a server, and only a worker takes a worker's place,
//! declares parameters or waits at a barrier. Heartbeats and `Leave` come from
//! both, each checked against its own registration's secret by the handler;
//! servers and workers both follow the shard map, and `Status` only reads.

use ps_common::access::{Allowed, Method};
use ps_proto::auth::Role;

macro_rules! method {
    ($name:literal, $allowed:expr) => {
        Method {
            name: $name,
            path: concat!("/ps.v1.Scheduler/", $name),
            allowed: $allowed,
        }
    };
}

const SERVER: Allowed = Allowed::Only(Role::Server);
const WORKER: Allowed = Allowed::Only(Role::Worker);

/// Every method of the service, with who may call it.
pub const METHODS: &[Method] = &[
    method!("RegisterServer", SERVER),
    method!("RegisterWorker", WORKER),
    method!("Heartbeat", Allowed::AnyRole),
    method!("Leave", Allowed::AnyRole),
    method!("DeclareParams", WORKER),
    method!("GetShardMap", Allowed::AnyRole),
    method!("Barrier", WORKER),
    method!("Status", Allowed::AnyRole),
];
