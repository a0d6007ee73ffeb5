//! Who may call each method of `ps.v1.Scheduler`: the table the scheduler's
//! [`Access`](ps_common::access::Access) layer checks every request against.
//!
//! Only a server registers a server, and only a worker takes a worker's place,
//! declares parameters or waits at a barrier. Heartbeats and `Leave` come from
//! both, each checked against its own registration's secret by the handler;
//! servers and workers both follow the shard map, and `Status` only reads.

use ps_common::access::{Allowed, Method};
use ps_proto::auth::Role;

const SERVER: Allowed = Allowed::Only(Role::Server);
const WORKER: Allowed = Allowed::Only(Role::Worker);

/// Every method of the service, with who may call it.
pub const METHODS: &[Method] = &[
    Method {
        name: "RegisterServer",
        allowed: SERVER,
    },
    Method {
        name: "RegisterWorker",
        allowed: WORKER,
    },
    Method {
        name: "Heartbeat",
        allowed: Allowed::AnyRole,
    },
    Method {
        name: "Leave",
        allowed: Allowed::AnyRole,
    },
    Method {
        name: "DeclareParams",
        allowed: WORKER,
    },
    Method {
        name: "GetShardMap",
        allowed: Allowed::AnyRole,
    },
    Method {
        name: "Barrier",
        allowed: WORKER,
    },
    Method {
        name: "Status",
        allowed: Allowed::AnyRole,
    },
];
