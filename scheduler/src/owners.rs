//! [`Owners`]: which process owns each registration, by the secret its
//! registration returned. Only the owner of a server id or a worker rank may
//! heartbeat it or `Leave` for it; anyone else gets `PERMISSION_DENIED`, so a
//! client that holds the cluster token still cannot end another's membership.
//!
//! The secrets live in memory only. After a scheduler restart the first secret
//! presented for a node is taken as its owner's (the live process heartbeats
//! within one interval), and held from then on.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ps_proto::auth::same_secret;
use tonic::Status;

use crate::roster::Node;

/// The secret of each node's current registration.
#[derive(Debug, Default)]
pub struct Owners {
    secrets: Mutex<BTreeMap<Node, String>>,
}

impl Owners {
    /// Gives `node` to a new registration holding `secret`; the previous one's
    /// secret no longer counts.
    pub fn grant(&self, node: Node, secret: String) {
        self.lock().insert(node, secret);
    }

    /// Whether `presented` is the secret of `node`'s registration.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` naming the node when it is not.
    pub fn check(&self, node: Node, presented: &str, what: &str) -> Result<(), Status> {
        let mut secrets = self.lock();
        match secrets.get(&node) {
            Some(secret) if same_secret(secret.as_bytes(), presented.as_bytes()) => Ok(()),
            Some(_) => Err(Status::permission_denied(format!(
                "{what} for {node} refused: it does not carry the secret of {node}'s registration (another process registered it, or this one registered again)"
            ))),
            None if presented.is_empty() => Err(Status::permission_denied(format!(
                "{what} for {node} refused: it carries no registration secret"
            ))),
            None => {
                secrets.insert(node, presented.to_string());
                Ok(())
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Node, String>> {
        self.secrets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::ids::{Rank, ServerId};

    #[test]
    fn only_the_latest_registration_may_speak_for_a_node() {
        let owners = Owners::default();
        let server = Node::Server(ServerId(0));
        owners.grant(server, "first".into());
        assert!(owners.check(server, "first", "Heartbeat").is_ok());
        let foreign = owners.check(server, "guess", "Leave").unwrap_err();
        assert_eq!(foreign.code(), tonic::Code::PermissionDenied);
        assert!(
            foreign.message().contains("Leave for server 0"),
            "{}",
            foreign.message()
        );
        owners.grant(server, "second".into());
        assert!(owners.check(server, "first", "Heartbeat").is_err());
        assert!(owners.check(server, "second", "Heartbeat").is_ok());
    }

    #[test]
    fn after_a_restart_the_first_secret_presented_is_held() {
        let owners = Owners::default();
        let worker = Node::Worker(Rank(1));
        assert!(owners.check(worker, "", "Heartbeat").is_err());
        assert!(owners.check(worker, "mine", "Heartbeat").is_ok());
        assert!(owners.check(worker, "theirs", "Leave").is_err());
        assert!(owners.check(worker, "mine", "Leave").is_ok());
    }
}
