//! `Roster`: the registered members of one kind — servers by [`ServerId`],
//! workers by [`Rank`] — with who is alive, who left on purpose and when each was
//! last heard from. `Membership` holds one of each and decides what their
//! changes mean for the shard map.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ps_proto::ids::{Rank, ServerId, Step};

use crate::state_file::SavedMember;

/// A node of the cluster, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// A parameter server, by id.
    Server(ServerId),
    /// A worker, by rank.
    Worker(Rank),
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Node::Server(id) => write!(f, "server {id}"),
            Node::Worker(rank) => write!(f, "worker {rank}"),
        }
    }
}

/// What `Membership::tick` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An elastic group formed with this many workers.
    GroupFormed {
        /// Workers in the group.
        workers: u32,
    },
    /// A node missed its heartbeats.
    Dead {
        /// The node.
        node: Node,
        /// Its address or client id.
        name: String,
        /// How long it had been silent.
        silent: Duration,
    },
}

/// One registered server or worker.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) last_seen: Instant,
    pub(crate) alive: bool,
    pub(crate) left: bool,
    pub(crate) last_step: Step,
    pub(crate) load: Load,
}

/// What a server reported with its last heartbeat about the pushes it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Push requests applied since it started.
    pub pushes: u64,
    /// Gradient bytes in them.
    pub push_bytes: u64,
}

impl Member {
    fn new(name: &str, now: Instant) -> Self {
        Self {
            name: name.into(),
            last_seen: now,
            alive: true,
            left: false,
            last_step: Step(0),
            load: Load::default(),
        }
    }
}

/// A server or worker as others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView<Id> {
    /// A server's id or a worker's rank.
    pub id: Id,
    /// A server's address or a worker's client token.
    pub name: String,
    /// Heartbeating.
    pub alive: bool,
    /// Left on purpose (a clean shutdown, or a finished worker), rather than
    /// declared dead.
    pub left: bool,
    /// The last step it reported (workers).
    pub last_step: Step,
    /// Its pushes as of its last heartbeat (servers).
    pub load: Load,
    /// When it was last heard from.
    pub last_seen: Instant,
}

/// The members of one kind, by id.
#[derive(Debug, Clone)]
pub(crate) struct Roster<Id> {
    members: BTreeMap<Id, Member>,
}

impl<Id> Default for Roster<Id> {
    fn default() -> Self {
        Self {
            members: BTreeMap::new(),
        }
    }
}

impl<Id: Ord + Copy + From<u32> + Into<u32>> Roster<Id> {
    /// How many have ever registered.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The id `name` registered with, if it did.
    pub(crate) fn id_of(&self, name: &str) -> Option<Id> {
        self.members
            .iter()
            .find(|(_, m)| m.name == name)
            .map(|(&id, _)| id)
    }

    /// Registers `name` as `id`, alive and heard from `now`.
    pub(crate) fn insert(&mut self, id: Id, name: &str, now: Instant) {
        self.members.insert(id, Member::new(name, now));
    }

    /// The member with `id`, alive or not.
    pub(crate) fn get(&self, id: Id) -> Option<&Member> {
        self.members.get(&id)
    }

    /// The member with `id`, if it is alive.
    pub(crate) fn live_mut(&mut self, id: Id) -> Option<&mut Member> {
        self.members.get_mut(&id).filter(|m| m.alive)
    }

    /// The live members, by id.
    pub(crate) fn live(&self) -> impl Iterator<Item = (Id, &Member)> {
        self.members
            .iter()
            .filter(|(_, m)| m.alive)
            .map(|(&id, m)| (id, m))
    }

    /// Every member.
    pub(crate) fn all_mut(&mut self) -> impl Iterator<Item = &mut Member> {
        self.members.values_mut()
    }

    /// Declares dead every live member silent for longer than `timeout`; one
    /// event each, naming it as `node` does.
    pub(crate) fn expire(
        &mut self,
        now: Instant,
        timeout: Duration,
        node: fn(Id) -> Node,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        for (&id, member) in self.members.iter_mut().filter(|(_, m)| m.alive) {
            let silent = now.saturating_duration_since(member.last_seen);
            if silent > timeout {
                member.alive = false;
                events.push(Event::Dead {
                    node: node(id),
                    name: member.name.clone(),
                    silent,
                });
            }
        }
        events
    }

    /// Every member as others see it, by id.
    pub(crate) fn views(&self) -> Vec<MemberView<Id>> {
        self.members
            .iter()
            .map(|(&id, m)| MemberView {
                id,
                name: m.name.clone(),
                alive: m.alive,
                left: m.left,
                last_step: m.last_step,
                load: m.load,
                last_seen: m.last_seen,
            })
            .collect()
    }

    /// The members as the state file keeps them.
    pub(crate) fn saved(&self) -> Vec<SavedMember> {
        self.members
            .iter()
            .map(|(&id, m)| SavedMember {
                id: id.into(),
                name: m.name.clone(),
                alive: m.alive,
                left: m.left,
                owner: None,
            })
            .collect()
    }

    /// Members resumed from the state file at `now`: those alive when it was
    /// saved get a full heartbeat timeout to be heard from.
    pub(crate) fn from_saved(saved: Vec<SavedMember>, now: Instant) -> Self {
        let members = saved
            .into_iter()
            .map(|m| {
                let member = Member {
                    alive: m.alive,
                    left: m.left,
                    ..Member::new(&m.name, now)
                };
                (Id::from(m.id), member)
            })
            .collect();
        Self { members }
    }
}
