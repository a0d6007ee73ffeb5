//! Who may call each method of `ps.v1.ParameterServer`: the table the server's
//! [`Access`](ps_common::access::Access) layer checks every request against,
//! and records every answer by.
//!
//! Workers call the data path. `Stats` only reads counters, so any holder of
//! the cluster token may call it (`ps-throughput` does, as a worker). A
//! `Checkpoint` makes the server write to its disk now: an operator's call,
//! made with the servers' secret, which a worker's cannot.

use ps_common::access::{Allowed, Method};
use ps_proto::auth::Role;

const WORKER: Allowed = Allowed::Only(Role::Worker);

/// Every method of the service, with who may call it.
pub const METHODS: &[Method] = &[
    Method {
        name: "JoinGroup",
        allowed: WORKER,
    },
    Method {
        name: "Register",
        allowed: WORKER,
    },
    Method {
        name: "RegisterStream",
        allowed: WORKER,
    },
    Method {
        name: "Push",
        allowed: WORKER,
    },
    Method {
        name: "PushStream",
        allowed: WORKER,
    },
    Method {
        name: "Pull",
        allowed: WORKER,
    },
    Method {
        name: "PullStream",
        allowed: WORKER,
    },
    Method {
        name: "DeclareTable",
        allowed: WORKER,
    },
    Method {
        name: "PullRows",
        allowed: WORKER,
    },
    Method {
        name: "PushRows",
        allowed: WORKER,
    },
    Method {
        name: "Session",
        allowed: WORKER,
    },
    Method {
        name: "OfferSharedMemory",
        allowed: WORKER,
    },
    Method {
        name: "Stats",
        allowed: Allowed::AnyRole,
    },
    Method {
        name: "Checkpoint",
        allowed: Allowed::Only(Role::Server),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::grpc_frames::{PULL_STREAM_PATH, PUSH_STREAM_PATH};

    #[test]
    fn every_method_is_named_once_and_the_framed_paths_are_the_services() {
        for method in METHODS {
            assert_eq!(METHODS.iter().filter(|m| m.name == method.name).count(), 1);
        }
        let service = format!("/{}/", ps_proto::v1::parameter_server_server::SERVICE_NAME);
        for path in [PUSH_STREAM_PATH, PULL_STREAM_PATH] {
            let name = path.strip_prefix(&service).expect(path);
            assert!(METHODS.iter().any(|m| m.name == name), "{path}");
        }
    }
}
