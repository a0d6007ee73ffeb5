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

macro_rules! method {
    ($name:literal, $allowed:expr) => {
        Method {
            name: $name,
            path: concat!("/ps.v1.ParameterServer/", $name),
            allowed: $allowed,
        }
    };
}

const WORKER: Allowed = Allowed::Only(Role::Worker);

/// Every method of the service, with who may call it.
pub const METHODS: &[Method] = &[
    method!("JoinGroup", WORKER),
    method!("Register", WORKER),
    method!("RegisterStream", WORKER),
    method!("Push", WORKER),
    method!("PushStream", WORKER),
    method!("Pull", WORKER),
    method!("PullStream", WORKER),
    method!("Stats", Allowed::AnyRole),
    method!("Checkpoint", Allowed::Only(Role::Server)),
];

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::grpc_frames::{PULL_STREAM_PATH, PUSH_STREAM_PATH};

    #[test]
    fn every_path_names_its_method_once() {
        for method in METHODS {
            assert!(method.path.ends_with(&format!("/{}", method.name)));
            assert_eq!(METHODS.iter().filter(|m| m.path == method.path).count(), 1);
        }
        for path in [PUSH_STREAM_PATH, PULL_STREAM_PATH] {
            assert!(METHODS.iter().any(|m| m.path == path), "{path}");
        }
    }
}
