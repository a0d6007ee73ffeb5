//! [`Membership`]: who is in the cluster, who is alive, and the shard map that
//! follows from it. Plain state driven by calls that carry the current time, so
//! tests drive it with a fake clock; the gRPC layer is a thin shell around it.
//!
//! - Servers and workers register and then heartbeat; a node silent for longer
//!   than the heartbeat timeout is declared dead by [`Membership::tick`].
//! - Once the parameters are declared and enough servers have registered, the
//!   scheduler publishes a versioned [`ShardMap`]; every change of live servers or
//!   workers publishes a new version.
//! - The map names the live workers: under BSP, servers wait for those only, so a
//!   dead worker never stalls the others for longer than the heartbeat timeout.
//! - An elastic group ([`GroupSize`] `MIN:MAX`) forms when `MAX` workers have
//!   registered, or when at least `MIN` have and no one else registered for the join
//!   window; until then there is no map and registered workers are not expired
//!   (they wait in `RegisterWorker`, not heartbeating).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::group::GroupSize;
use ps_proto::placement::Param;

use crate::shard_map::{ShardMap, WorkerGroup, next_map};
use crate::state_file::{SavedMember, SavedState};

/// Why a membership call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// Every worker rank is taken by a live worker.
    #[error(
        "all {workers} worker ranks are taken by live workers; the group has formed, so start the scheduler with a larger --workers (or MIN:MAX) for more"
    )]
    GroupFull {
        /// Group size.
        workers: u32,
    },
    /// A heartbeat from a node the scheduler does not know (or declared dead).
    #[error("{node} is not a live member (declared dead or never registered); register again")]
    UnknownNode {
        /// The node.
        node: String,
    },
    /// The parameters were already declared differently.
    #[error(
        "the parameters were already declared differently ({existing} tensors, {existing_bytes} bytes; now {now} tensors, {now_bytes} bytes); all workers must train the same model"
    )]
    ParamsConflict {
        /// Tensors declared first.
        existing: usize,
        /// Bytes declared first.
        existing_bytes: usize,
        /// Tensors declared now.
        now: usize,
        /// Bytes declared now.
        now_bytes: usize,
    },
}

/// A node of the cluster, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// A parameter server, by id.
    Server(u32),
    /// A worker, by rank.
    Worker(u32),
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Node::Server(id) => write!(f, "server {id}"),
            Node::Worker(rank) => write!(f, "worker {rank}"),
        }
    }
}

/// What [`Membership::tick`] found.
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

#[derive(Debug, Clone)]
struct Member {
    name: String,
    last_seen: Instant,
    alive: bool,
    left: bool,
    last_step: u64,
}

/// A server or worker as others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// A server's id or a worker's rank.
    pub id: u32,
    /// A server's address or a worker's client token.
    pub name: String,
    /// Heartbeating.
    pub alive: bool,
    /// Left on purpose (a clean shutdown, or a finished worker), rather than
    /// declared dead.
    pub left: bool,
    /// The last step it reported (workers).
    pub last_step: u64,
}

impl Member {
    fn view(&self, id: u32) -> MemberView {
        MemberView {
            id,
            name: self.name.clone(),
            alive: self.alive,
            left: self.left,
            last_step: self.last_step,
        }
    }
}

/// The scheduler's view of the cluster.
#[derive(Debug)]
pub struct Membership {
    heartbeat_timeout: Duration,
    group: GroupSize,
    /// The group's size once it has formed (at once for a fixed size).
    formed: Option<u32>,
    join_window: Duration,
    last_join: Option<Instant>,
    min_servers: usize,
    servers: BTreeMap<u32, Member>,
    workers: BTreeMap<u32, Member>,
    params: Option<Vec<Param>>,
    map: Option<ShardMap>,
    version: u64,
}

impl Membership {
    /// An empty cluster expecting `group` workers and at least `min_servers`
    /// servers before it publishes a map.
    pub fn new(
        heartbeat_timeout: Duration,
        group: impl Into<GroupSize>,
        min_servers: usize,
    ) -> Self {
        let group = group.into();
        Self {
            heartbeat_timeout,
            group,
            formed: group.is_fixed().then_some(group.max),
            join_window: Duration::from_secs(2),
            last_join: None,
            min_servers: min_servers.max(1),
            servers: BTreeMap::new(),
            workers: BTreeMap::new(),
            params: None,
            map: None,
            version: 0,
        }
    }

    /// Sets how long registrations must stay quiet before an elastic group forms.
    pub fn with_join_window(mut self, window: Duration) -> Self {
        self.join_window = window;
        self
    }

    /// Registers a server at `addr` (again, after a restart: same id).
    pub fn register_server(&mut self, addr: &str, now: Instant) -> u32 {
        let existing = self
            .servers
            .iter()
            .find(|(_, m)| m.name == addr)
            .map(|(&id, _)| id);
        let id = existing.unwrap_or(self.servers.len() as u32);
        self.servers.insert(
            id,
            Member {
                name: addr.into(),
                last_seen: now,
                alive: true,
                left: false,
                last_step: 0,
            },
        );
        self.republish();
        id
    }

    /// Gives `client_id` a rank: its old one, else the lowest rank that is free or
    /// whose worker died (not one whose worker finished and left). In an elastic group that has not formed yet, the group
    /// size is known only later ([`Membership::group_size`]).
    ///
    /// # Errors
    /// [`MembershipError::GroupFull`] when every rank has a live worker.
    pub fn register_worker(
        &mut self,
        client_id: &str,
        now: Instant,
    ) -> Result<u32, MembershipError> {
        let own = self
            .workers
            .iter()
            .find(|(_, m)| m.name == client_id)
            .map(|(&r, _)| r);
        let ranks = self.formed.unwrap_or(self.group.max);
        // A rank whose worker finished (left) is done; one whose worker died is free.
        let free = (0..ranks).find(|r| self.workers.get(r).is_none_or(|m| !m.alive && !m.left));
        let rank = own
            .or(free)
            .ok_or(MembershipError::GroupFull { workers: ranks })?;
        self.workers.insert(
            rank,
            Member {
                name: client_id.into(),
                last_seen: now,
                alive: true,
                left: false,
                last_step: 0,
            },
        );
        if self.formed.is_none() {
            self.last_join = Some(now);
            if self.workers.len() as u32 >= self.group.max {
                self.form_group(now);
            }
        }
        self.republish();
        Ok(rank)
    }

    /// Fixes an elastic group at the workers registered so far; their heartbeat
    /// clocks start now (they were waiting for this, not heartbeating).
    fn form_group(&mut self, now: Instant) -> u32 {
        let workers = self.workers.len() as u32;
        for member in self.workers.values_mut() {
            member.last_seen = now;
        }
        self.formed = Some(workers);
        workers
    }

    /// True when an elastic group may form now: enough workers, and the window
    /// since the last registration has passed.
    fn ready_to_form(&self, now: Instant) -> bool {
        self.formed.is_none()
            && self.workers.len() as u32 >= self.group.min
            && self
                .last_join
                .is_some_and(|t| now.saturating_duration_since(t) >= self.join_window)
    }

    /// The member `node` names, if it is alive.
    fn live_member(&mut self, node: Node) -> Option<&mut Member> {
        let member = match node {
            Node::Server(id) => self.servers.get_mut(&id),
            Node::Worker(rank) => self.workers.get_mut(&rank),
        };
        member.filter(|m| m.alive)
    }

    /// Records a heartbeat (with a worker's current step); returns the map version.
    ///
    /// # Errors
    /// [`MembershipError::UnknownNode`] for a node not alive here.
    pub fn heartbeat(
        &mut self,
        node: Node,
        step: u64,
        now: Instant,
    ) -> Result<u64, MembershipError> {
        match self.live_member(node) {
            Some(member) => {
                member.last_seen = now;
                member.last_step = step;
                Ok(self.version)
            }
            None => Err(MembershipError::UnknownNode {
                node: node.to_string(),
            }),
        }
    }

    /// A node leaves on purpose (clean shutdown), at `step` (its last).
    pub fn leave(&mut self, node: Node, step: u64) {
        if let Some(member) = self.live_member(node) {
            member.alive = false;
            member.left = true;
            member.last_step = member.last_step.max(step);
            self.republish();
        }
    }

    /// Declares the model's parameters (the first declaration wins; a different one
    /// is refused).
    ///
    /// # Errors
    /// [`MembershipError::ParamsConflict`].
    pub fn declare_params(&mut self, params: Vec<Param>) -> Result<(), MembershipError> {
        match &self.params {
            Some(existing) if *existing != params => {
                let bytes = |p: &[Param]| p.iter().map(|p| p.elements * p.elem_size).sum();
                Err(MembershipError::ParamsConflict {
                    existing: existing.len(),
                    existing_bytes: bytes(existing),
                    now: params.len(),
                    now_bytes: bytes(&params),
                })
            }
            Some(_) => Ok(()),
            None => {
                self.params = Some(params);
                self.republish();
                Ok(())
            }
        }
    }

    /// Declares dead every node silent for longer than the heartbeat timeout.
    pub fn tick(&mut self, now: Instant) -> Vec<Event> {
        let timeout = self.heartbeat_timeout;
        let mut events = Vec::new();
        if self.ready_to_form(now) {
            let workers = self.form_group(now);
            events.push(Event::GroupFormed { workers });
        }
        // Workers of a group still forming wait in RegisterWorker: nothing to expire.
        let mut groups = vec![(&mut self.servers, Node::Server as fn(u32) -> Node)];
        if self.formed.is_some() {
            groups.push((&mut self.workers, Node::Worker as fn(u32) -> Node));
        }
        for (members, node) in groups {
            for (&id, member) in members.iter_mut().filter(|(_, m)| m.alive) {
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
        }
        if !events.is_empty() {
            self.republish();
        }
        events
    }

    fn live(members: &BTreeMap<u32, Member>) -> impl Iterator<Item = (u32, &Member)> {
        members
            .iter()
            .filter(|(_, m)| m.alive)
            .map(|(&id, m)| (id, m))
    }

    /// Recomputes the map after any change; publishes a new version when it differs.
    fn republish(&mut self) {
        let servers: Vec<(u32, String)> = Self::live(&self.servers)
            .map(|(id, m)| (id, m.name.clone()))
            .collect();
        // A rank that has not registered yet is still expected: only ranks declared
        // dead (or gone) stop being waited for.
        let Some(group_size) = self.formed else {
            return;
        };
        let gone = |rank: &u32| self.workers.get(rank).is_some_and(|m| !m.alive);
        let workers: Vec<u32> = (0..group_size).filter(|r| !gone(r)).collect();
        // Enough servers gate the first map only; afterwards any live server will do.
        let enough =
            servers.len() >= self.min_servers || (self.map.is_some() && !servers.is_empty());
        let Some(params) = self.params.clone().filter(|_| enough) else {
            return;
        };
        let group = WorkerGroup {
            size: group_size,
            expected: workers,
        };
        if let Some(next) = next_map(self.map.as_ref(), servers, &params, group) {
            self.version = next.version;
            self.map = Some(next);
        }
    }

    /// The current map, once there is one.
    pub fn map(&self) -> Option<&ShardMap> {
        self.map.as_ref()
    }

    /// What the scheduler still waits for before it can publish a map, for messages.
    pub fn missing(&self) -> String {
        let live_servers = Self::live(&self.servers).count();
        let mut missing = Vec::new();
        if live_servers < self.min_servers {
            missing.push(format!(
                "{} of {} servers registered",
                live_servers, self.min_servers
            ));
        }
        if self.formed.is_none() {
            missing.push(format!(
                "the worker group ({} workers) is forming: {} registered, it forms {:?} after the last registration",
                self.group,
                self.workers.len(),
                self.join_window
            ));
        }
        if self.params.is_none() {
            missing.push("no worker has declared the parameters yet".to_string());
        }
        missing.join("; ")
    }

    /// Live servers with their addresses.
    pub fn live_servers(&self) -> Vec<(u32, String)> {
        Self::live(&self.servers)
            .map(|(id, m)| (id, m.name.clone()))
            .collect()
    }

    /// Ranks of the live workers.
    pub fn live_workers(&self) -> Vec<u32> {
        Self::live(&self.workers).map(|(rank, _)| rank).collect()
    }

    /// Every worker, by rank.
    pub fn workers(&self) -> Vec<MemberView> {
        self.workers.iter().map(|(&rank, m)| m.view(rank)).collect()
    }

    /// Every server, by id.
    pub fn servers(&self) -> Vec<MemberView> {
        self.servers.iter().map(|(&id, m)| m.view(id)).collect()
    }

    /// True when the job is over: the group formed, every rank registered, none is
    /// alive, and at least one left on purpose (rather than all dying).
    pub fn job_done(&self) -> bool {
        let Some(size) = self.formed else {
            return false;
        };
        let ranks: Vec<&Member> = (0..size).filter_map(|r| self.workers.get(&r)).collect();
        ranks.len() == size as usize
            && ranks.iter().all(|m| !m.alive)
            && ranks.iter().any(|m| m.left)
    }

    /// What a restarted scheduler needs to go on where this one is.
    pub fn saved(&self) -> SavedState {
        let members = |all: &BTreeMap<u32, Member>| {
            all.iter()
                .map(|(&id, m)| SavedMember {
                    id,
                    name: m.name.clone(),
                    alive: m.alive,
                    left: m.left,
                })
                .collect()
        };
        SavedState {
            group_min: self.group.min,
            group_max: self.group.max,
            formed: self.formed,
            servers: members(&self.servers),
            workers: members(&self.workers),
            params: self.params.clone(),
            map: self.map.clone(),
            version: self.version,
        }
    }

    /// A membership resumed from `saved` at `now`: members alive when it was saved
    /// are alive again, with a full heartbeat timeout to be heard from.
    pub fn from_saved(
        saved: SavedState,
        heartbeat_timeout: Duration,
        min_servers: usize,
        now: Instant,
    ) -> Self {
        let members = |list: Vec<SavedMember>| {
            list.into_iter()
                .map(|m| {
                    let member = Member {
                        name: m.name,
                        last_seen: now,
                        alive: m.alive,
                        left: m.left,
                        last_step: 0,
                    };
                    (m.id, member)
                })
                .collect()
        };
        Self {
            heartbeat_timeout,
            group: GroupSize {
                min: saved.group_min,
                max: saved.group_max,
            },
            formed: saved.formed,
            join_window: Duration::from_secs(2),
            last_join: None,
            min_servers: min_servers.max(1),
            servers: members(saved.servers),
            workers: members(saved.workers),
            params: saved.params,
            map: saved.map,
            version: saved.version,
        }
    }

    /// The worker group size, once the group has formed (at once for a fixed size).
    pub fn group_size(&self) -> Option<u32> {
        self.formed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn params() -> Vec<Param> {
        vec![
            Param {
                name: "w".into(),
                elements: 1000,
                elem_size: 4,
            },
            Param {
                name: "b".into(),
                elements: 10,
                elem_size: 4,
            },
        ]
    }

    /// The ranks of workers that left on purpose.
    fn departed(m: &Membership) -> Vec<u32> {
        m.workers()
            .into_iter()
            .filter(|w| w.left)
            .map(|w| w.id)
            .collect()
    }

    fn cluster(t0: Instant) -> Membership {
        let mut m = Membership::new(TIMEOUT, 2, 2);
        m.register_server("s0:1", t0);
        m.register_server("s1:1", t0);
        m
    }

    #[test]
    fn no_map_until_params_and_servers_are_there() {
        let t0 = Instant::now();
        let mut m = Membership::new(TIMEOUT, 2, 2);
        assert!(m.map().is_none());
        m.register_server("s0:1", t0);
        assert!(m.missing().contains("1 of 2 servers"), "{}", m.missing());
        assert!(m.missing().contains("declared the parameters"));
        m.declare_params(params()).unwrap();
        assert!(m.map().is_none());
        m.register_server("s1:1", t0);
        let map = m.map().unwrap();
        assert_eq!((map.version, map.servers.len()), (1, 2));
        assert_eq!(m.missing(), "");
    }

    #[test]
    fn ranks_are_stable_for_a_client_and_reused_after_death() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        assert_eq!(m.register_worker("a", t0), Ok(0));
        assert_eq!(m.register_worker("b", t0), Ok(1));
        assert_eq!(m.register_worker("a", t0), Ok(0));
        assert_eq!(
            m.register_worker("c", t0),
            Err(MembershipError::GroupFull { workers: 2 })
        );
        for node in [Node::Worker(0), Node::Server(0), Node::Server(1)] {
            m.heartbeat(node, 3, t0 + TIMEOUT).unwrap();
        }
        let events = m.tick(t0 + TIMEOUT + Duration::from_millis(1));
        assert!(
            matches!(
                &events[..],
                [Event::Dead {
                    node: Node::Worker(1),
                    ..
                }]
            ),
            "{events:?}"
        );
        assert_eq!(
            m.register_worker("c", t0 + TIMEOUT * 2),
            Ok(1),
            "a dead worker's rank is free again"
        );
    }

    #[test]
    fn expiry_follows_the_clock_exactly() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.declare_params(params()).unwrap();
        m.register_worker("a", t0).unwrap();
        // (time since start, heartbeat from worker 0?, expect worker dead after tick?)
        let steps = [
            (4, true, false),
            (8, false, false),
            (9, false, false),
            (10, false, true),
        ];
        let mut dead = false;
        for (secs, beat, expect_dead) in steps {
            let now = t0 + Duration::from_secs(secs);
            if beat {
                m.heartbeat(Node::Worker(0), 0, now).unwrap();
            }
            m.heartbeat(Node::Server(0), 0, now).unwrap();
            m.heartbeat(Node::Server(1), 0, now).unwrap();
            dead |= m.tick(now).iter().any(|e| {
                matches!(
                    e,
                    Event::Dead {
                        node: Node::Worker(0),
                        ..
                    }
                )
            });
            assert_eq!(dead, expect_dead, "at {secs}s");
        }
        assert_eq!(
            m.heartbeat(Node::Worker(0), 0, t0),
            Err(MembershipError::UnknownNode {
                node: "worker 0".into()
            })
        );
    }

    #[test]
    fn a_dead_worker_leaves_the_map_and_bumps_the_version() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.declare_params(params()).unwrap();
        m.register_worker("a", t0).unwrap();
        m.register_worker("b", t0).unwrap();
        let before = m.map().unwrap().clone();
        assert_eq!(before.workers, vec![0, 1]);
        let later = t0 + TIMEOUT + Duration::from_secs(1);
        for node in [Node::Server(0), Node::Server(1), Node::Worker(0)] {
            m.heartbeat(node, 0, later).unwrap();
        }
        m.tick(later);
        let after = m.map().unwrap();
        assert_eq!(after.workers, vec![0]);
        assert!(after.version > before.version);
        assert_eq!(
            after.assignments, before.assignments,
            "worker changes do not move keys"
        );
    }

    #[test]
    fn a_dead_server_moves_its_keys_to_the_live_ones() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.declare_params(params()).unwrap();
        let later = t0 + TIMEOUT + Duration::from_secs(1);
        m.heartbeat(Node::Server(0), 0, later).unwrap();
        let events = m.tick(later);
        assert!(
            matches!(&events[..], [Event::Dead { node: Node::Server(1), name, .. }] if name == "s1:1")
        );
        let map = m.map().unwrap();
        assert_eq!(map.servers, vec![(0, "s0:1".to_string())]);
        assert!(map.assignments.iter().all(|a| a.server == 0));
    }

    #[test]
    fn params_conflicts_are_refused_and_identical_declarations_accepted() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.declare_params(params()).unwrap();
        m.declare_params(params()).unwrap();
        let err = m.declare_params(vec![]).unwrap_err();
        assert!(err.to_string().contains("same model"), "{err}");
    }

    #[test]
    fn ranks_not_registered_yet_are_still_waited_for() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.declare_params(params()).unwrap();
        m.register_worker("a", t0).unwrap();
        assert_eq!(
            m.map().unwrap().workers,
            vec![0, 1],
            "worker 1 has not started yet, but the group waits for it"
        );
    }

    #[test]
    fn a_clean_leave_is_immediate() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.declare_params(params()).unwrap();
        m.register_worker("a", t0).unwrap();
        m.register_worker("b", t0).unwrap();
        m.leave(Node::Worker(1), 0);
        assert_eq!(m.map().unwrap().workers, vec![0]);
        assert_eq!(departed(&m), vec![1], "it left; it was not declared dead");
    }

    fn elastic(t0: Instant) -> Membership {
        let group: GroupSize = "2:3".parse().unwrap();
        let mut m = Membership::new(TIMEOUT, group, 1).with_join_window(Duration::from_secs(2));
        m.register_server("s0:1", t0);
        m.declare_params(params()).unwrap();
        m
    }

    #[test]
    fn an_elastic_group_forms_after_the_join_window_with_whoever_registered() {
        let t0 = Instant::now();
        let mut m = elastic(t0);
        assert_eq!(m.register_worker("a", t0), Ok(0));
        m.tick(t0 + Duration::from_secs(3));
        assert_eq!(m.group_size(), None, "one worker is below the minimum of 2");
        assert!(m.map().is_none());
        assert!(
            m.missing().contains("forming: 1 registered"),
            "{}",
            m.missing()
        );
        let t1 = t0 + Duration::from_secs(4);
        assert_eq!(m.register_worker("b", t1), Ok(1));
        assert!(
            m.tick(t1 + Duration::from_secs(1)).is_empty(),
            "window still open"
        );
        // Waiting workers are not expired while the group forms, however long it takes.
        m.heartbeat(Node::Server(0), 0, t1).unwrap();
        let events = m.tick(t1 + Duration::from_secs(2));
        assert_eq!(events, vec![Event::GroupFormed { workers: 2 }]);
        assert_eq!(m.group_size(), Some(2));
        let map = m.map().unwrap();
        assert_eq!((map.group_size, map.workers.clone()), (2, vec![0, 1]));
        assert_eq!(
            m.register_worker("late", t1 + Duration::from_secs(3)),
            Err(MembershipError::GroupFull { workers: 2 }),
            "a formed group does not grow"
        );
    }

    #[test]
    fn an_elastic_group_forms_at_once_when_it_reaches_its_maximum() {
        let t0 = Instant::now();
        let mut m = elastic(t0);
        for (n, id) in ["a", "b", "c"].iter().enumerate() {
            assert_eq!(m.register_worker(id, t0), Ok(n as u32));
        }
        assert_eq!(m.group_size(), Some(3));
        assert_eq!(m.map().unwrap().workers, vec![0, 1, 2]);
    }

    #[test]
    fn a_formed_elastic_group_expires_silent_workers_from_the_moment_it_formed() {
        let t0 = Instant::now();
        let mut m = elastic(t0);
        m.register_worker("a", t0).unwrap();
        m.register_worker("b", t0).unwrap();
        let formed = t0 + Duration::from_secs(60);
        m.heartbeat(Node::Server(0), 0, formed).unwrap();
        assert_eq!(m.tick(formed), vec![Event::GroupFormed { workers: 2 }]);
        let later = formed + TIMEOUT - Duration::from_millis(1);
        m.heartbeat(Node::Server(0), 0, later).unwrap();
        assert!(
            m.tick(later).is_empty(),
            "their clocks started when it formed"
        );
        let dead = formed + TIMEOUT + Duration::from_millis(1);
        m.heartbeat(Node::Server(0), 0, dead).unwrap();
        m.heartbeat(Node::Worker(0), 5, dead).unwrap();
        assert!(matches!(
            &m.tick(dead)[..],
            [Event::Dead {
                node: Node::Worker(1),
                ..
            }]
        ));
    }

    #[test]
    fn the_job_is_done_when_every_worker_has_gone_and_one_left_on_purpose() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.register_worker("a", t0).unwrap();
        assert!(!m.job_done());
        m.leave(Node::Worker(0), 0);
        assert!(!m.job_done(), "rank 1 has not even registered");
        m.register_worker("b", t0).unwrap();
        assert!(!m.job_done());
        m.leave(Node::Worker(1), 0);
        assert!(m.job_done());
    }

    #[test]
    fn members_that_leave_are_shown_as_left_at_the_step_they_left_with() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.register_worker("a", t0).unwrap();
        m.heartbeat(Node::Worker(0), 100, t0).unwrap();
        m.leave(Node::Worker(0), 659);
        m.leave(Node::Server(1), 0);
        let worker = &m.workers()[0];
        assert_eq!(
            (worker.alive, worker.left, worker.last_step),
            (false, true, 659)
        );
        let servers = m.servers();
        assert_eq!(
            servers
                .iter()
                .map(|s| (s.id, s.alive, s.left))
                .collect::<Vec<_>>(),
            vec![(0, true, false), (1, false, true)]
        );
    }

    #[test]
    fn a_saved_membership_resumes_with_the_same_map_ids_and_ranks() {
        let t0 = Instant::now();
        let mut m = cluster(t0);
        m.declare_params(params()).unwrap();
        m.register_worker("a", t0).unwrap();
        m.register_worker("b", t0).unwrap();
        m.leave(Node::Worker(1), 0);
        let before = m.map().unwrap().clone();
        let later = t0 + Duration::from_secs(100);
        let mut resumed = Membership::from_saved(m.saved(), TIMEOUT, 2, later);
        assert_eq!(resumed.map(), Some(&before), "same version and placement");
        assert_eq!(resumed.register_server("s1:1", later), 1, "same server id");
        assert_eq!(resumed.register_worker("a", later), Ok(0), "same rank");
        assert_eq!(
            resumed.heartbeat(Node::Server(0), 0, later),
            Ok(before.version)
        );
        assert_eq!(departed(&resumed), vec![1]);
        let silent = later + TIMEOUT + Duration::from_millis(1);
        resumed.heartbeat(Node::Server(0), 0, silent).unwrap();
        resumed.heartbeat(Node::Server(1), 0, silent).unwrap();
        let events = resumed.tick(silent);
        assert!(
            matches!(
                &events[..],
                [Event::Dead {
                    node: Node::Worker(0),
                    ..
                }]
            ),
            "nodes not heard from after the restart are declared dead as usual: {events:?}"
        );
    }
}
