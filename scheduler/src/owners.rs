//! [`Owners`]: which process owns each registration, by the secret its
//! registration returned. Only the owner of a server id or a worker rank may
//! heartbeat it or `Leave` for it; anyone else gets `PERMISSION_DENIED`, so a
//! client that holds the cluster token still cannot end another's membership.
//!
//! Only a SHA-256 digest of each secret is kept, and it goes into the state file
//! with its member ([`Owners::stamp`]), so a restarted scheduler still knows
//! every owner. A member without a digest (from a state file written before
//! digests were kept) is given to the first secret presented for it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ps_proto::auth::same_secret;
use ps_proto::ids::{Rank, ServerId};
use sha2::{Digest, Sha256};
use tonic::Status;

use crate::roster::Node;
use crate::state_file::{SavedMember, SavedState};

/// The digest of each node's current registration secret.
#[derive(Debug, Default)]
pub struct Owners {
    digests: Mutex<BTreeMap<Node, String>>,
}

/// The SHA-256 of `secret`, in hex.
fn digest(secret: &str) -> String {
    ps_common::certs::to_hex(&Sha256::digest(secret.as_bytes()))
}

impl Owners {
    /// The owners recorded in a state file.
    pub fn from_saved(saved: &SavedState) -> Self {
        let servers = saved.servers.iter().filter_map(|m| {
            let owner = m.owner.clone()?;
            Some((Node::Server(ServerId(m.id)), owner))
        });
        let workers = saved.workers.iter().filter_map(|m| {
            let owner = m.owner.clone()?;
            Some((Node::Worker(Rank(m.id)), owner))
        });
        Self {
            digests: Mutex::new(servers.chain(workers).collect()),
        }
    }

    /// Records each member's owner in `state`, for the state file.
    pub fn stamp(&self, state: &mut SavedState) {
        let digests = self.lock();
        let stamp = |members: &mut Vec<SavedMember>, node: fn(u32) -> Node| {
            for member in members {
                member.owner = digests.get(&node(member.id)).cloned();
            }
        };
        stamp(&mut state.servers, |id| Node::Server(ServerId(id)));
        stamp(&mut state.workers, |rank| Node::Worker(Rank(rank)));
    }

    /// Gives `node` to a new registration holding `secret`; the previous one's
    /// secret no longer counts.
    pub fn grant(&self, node: Node, secret: &str) {
        self.lock().insert(node, digest(secret));
    }

    /// Whether `presented` is the secret of `node`'s registration.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` naming the node when it is not.
    pub fn check(&self, node: Node, presented: &str, what: &str) -> Result<(), Status> {
        let mut digests = self.lock();
        if presented.is_empty() {
            return Err(Status::permission_denied(format!(
                "{what} for {node} refused: it carries no registration secret"
            )));
        }
        let presented = digest(presented);
        match digests.get(&node) {
            Some(owner) if same_secret(owner.as_bytes(), presented.as_bytes()) => Ok(()),
            Some(_) => Err(Status::permission_denied(format!(
                "{what} for {node} refused: it does not carry the secret of {node}'s registration (another process registered it, or this one registered again)"
            ))),
            None => {
                digests.insert(node, presented);
                Ok(())
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Node, String>> {
        self.digests.lock().unwrap_or_else(|p| p.into_inner())
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
        owners.grant(server, "first");
        assert!(owners.check(server, "first", "Heartbeat").is_ok());
        let foreign = owners.check(server, "guess", "Leave").unwrap_err();
        assert_eq!(foreign.code(), tonic::Code::PermissionDenied);
        assert!(
            foreign.message().contains("Leave for server 0"),
            "{}",
            foreign.message()
        );
        owners.grant(server, "second");
        assert!(owners.check(server, "first", "Heartbeat").is_err());
        assert!(owners.check(server, "second", "Heartbeat").is_ok());
    }

    #[test]
    fn owners_survive_a_restart_through_the_state_file() {
        let owners = Owners::default();
        let (server, worker) = (Node::Server(ServerId(2)), Node::Worker(Rank(0)));
        owners.grant(server, "server-secret");
        owners.grant(worker, "worker-secret");
        let member = |id| SavedMember {
            id,
            name: format!("m{id}"),
            alive: true,
            left: false,
            owner: None,
        };
        let mut state = SavedState {
            group_min: 1,
            group_max: 1,
            formed: None,
            servers: vec![member(2)],
            workers: vec![member(0)],
            params: None,
            map: None,
            version: ps_proto::ids::MapVersion(0),
            partition_bytes: None,
        };
        owners.stamp(&mut state);
        let text = serde_json::to_string(&state).unwrap();
        assert!(
            !text.contains("server-secret"),
            "only digests are saved: {text}"
        );

        let restarted = Owners::from_saved(&serde_json::from_str(&text).unwrap());
        assert!(restarted.check(server, "guess", "Heartbeat").is_err());
        assert!(restarted.check(worker, "server-secret", "Leave").is_err());
        assert!(
            restarted
                .check(server, "server-secret", "Heartbeat")
                .is_ok()
        );
        assert!(restarted.check(worker, "worker-secret", "Leave").is_ok());
    }

    #[test]
    fn a_member_saved_without_an_owner_is_given_to_the_first_secret_presented() {
        let owners = Owners::default();
        let worker = Node::Worker(Rank(1));
        assert!(owners.check(worker, "", "Heartbeat").is_err());
        assert!(owners.check(worker, "mine", "Heartbeat").is_ok());
        assert!(owners.check(worker, "theirs", "Leave").is_err());
        assert!(owners.check(worker, "mine", "Leave").is_ok());
    }
}
