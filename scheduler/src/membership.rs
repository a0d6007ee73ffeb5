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

use std::time::{Duration, Instant};

use ps_proto::ids::{MapVersion, Rank, ServerId, Step};
use ps_proto::placement::{DEFAULT_PART_BYTES, Param};

use crate::group::GroupSize;
pub use crate::roster::{Event, MemberView, Node};
use crate::roster::{Load, Member, Roster};
use crate::shard_map::{ShardMap, WorkerGroup, next_map};
use crate::state_file::SavedState;

/// The most server addresses one scheduler keeps: a bound on what registrations
/// can make it hold (each stays in the roster, dead or alive, so that a server
/// restarted at its address gets its id back).
pub const MAX_SERVERS: usize = 1024;

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
    /// Registering one more server address would pass [`MAX_SERVERS`].
    #[error(
        "the scheduler already knows {limit} server addresses, its limit; a cluster this large needs more than one job, and a flood of registrations needs the cluster token (PS_TOKEN)"
    )]
    TooManyServers {
        /// The limit.
        limit: usize,
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

/// The scheduler's view of the cluster.
#[derive(Debug)]
pub struct Membership {
    heartbeat_timeout: Duration,
    group: GroupSize,
    /// The group's size once it has formed (at once for a fixed size).
    formed: Option<u32>,
    join_window: Duration,
    partition_bytes: usize,
    last_join: Option<Instant>,
    min_servers: usize,
    servers: Roster<ServerId>,
    workers: Roster<Rank>,
    params: Option<Vec<Param>>,
    map: Option<ShardMap>,
    version: MapVersion,
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
            partition_bytes: DEFAULT_PART_BYTES,
            last_join: None,
            min_servers: min_servers.max(1),
            servers: Roster::default(),
            workers: Roster::default(),
            params: None,
            map: None,
            version: MapVersion(0),
        }
    }

    /// Sets how long registrations must stay quiet before an elastic group forms.
    pub fn with_join_window(mut self, window: Duration) -> Self {
        self.join_window = window;
        self
    }

    /// Sets the largest part a map cuts a parameter into (`--partition-bytes`).
    pub fn with_partition_bytes(mut self, bytes: usize) -> Self {
        self.partition_bytes = bytes;
        self
    }

    /// The largest part a map cuts a parameter into.
    pub fn partition_bytes(&self) -> usize {
        self.partition_bytes
    }

    /// Registers a server at `addr` (again, after a restart: same id).
    ///
    /// # Errors
    /// [`MembershipError::TooManyServers`] for a new address past [`MAX_SERVERS`].
    pub fn register_server(
        &mut self,
        addr: &str,
        now: Instant,
    ) -> Result<ServerId, MembershipError> {
        let id = match self.servers.id_of(addr) {
            Some(id) => id,
            None if self.servers.len() >= MAX_SERVERS => {
                return Err(MembershipError::TooManyServers { limit: MAX_SERVERS });
            }
            None => ServerId(self.servers.len() as u32),
        };
        self.servers.insert(id, addr, now);
        self.republish();
        Ok(id)
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
    ) -> Result<Rank, MembershipError> {
        let own = self.workers.id_of(client_id);
        let ranks = self.formed.unwrap_or(self.group.max);
        // A rank whose worker finished (left) is done; one whose worker died is free.
        let free = (0..ranks)
            .map(Rank)
            .find(|&r| self.workers.get(r).is_none_or(|m| !m.alive && !m.left));
        let rank = own
            .or(free)
            .ok_or(MembershipError::GroupFull { workers: ranks })?;
        self.workers.insert(rank, client_id, now);
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
        for member in self.workers.all_mut() {
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
        match node {
            Node::Server(id) => self.servers.live_mut(id),
            Node::Worker(rank) => self.workers.live_mut(rank),
        }
    }

    /// Records a heartbeat (with a worker's current step); returns the map version.
    ///
    /// # Errors
    /// [`MembershipError::UnknownNode`] for a node not alive here.
    pub fn heartbeat(
        &mut self,
        node: Node,
        step: Step,
        now: Instant,
    ) -> Result<MapVersion, MembershipError> {
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

    /// Records the pushes a live server reported with its heartbeat.
    pub fn record_load(&mut self, node: Node, load: Load) {
        if let Some(member) = self.live_member(node) {
            member.load = load;
        }
    }

    /// A node leaves on purpose (clean shutdown), at `step` (its last).
    pub fn leave(&mut self, node: Node, step: Step) {
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
        events.extend(self.servers.expire(now, timeout, Node::Server));
        // Workers of a group still forming wait in RegisterWorker: nothing to expire.
        if self.formed.is_some() {
            events.extend(self.workers.expire(now, timeout, Node::Worker));
        }
        if !events.is_empty() {
            self.republish();
        }
        events
    }

    /// Recomputes the map after any change; publishes a new version when it differs.
    fn republish(&mut self) {
        let servers = self.live_servers();
        // A rank that has not registered yet is still expected: only ranks declared
        // dead (or gone) stop being waited for.
        let Some(group_size) = self.formed else {
            return;
        };
        let gone = |rank: Rank| self.workers.get(rank).is_some_and(|m| !m.alive);
        let workers: Vec<Rank> = (0..group_size).map(Rank).filter(|&r| !gone(r)).collect();
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
        if let Some(next) = next_map(
            self.map.as_ref(),
            servers,
            &params,
            group,
            self.partition_bytes,
        ) {
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
        let live_servers = self.servers.live().count();
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

    /// The servers a map is planned over now, or will be once enough register.
    pub fn planning_servers(&self) -> usize {
        self.servers.live().count().max(self.min_servers)
    }

    /// Live servers with their addresses.
    pub fn live_servers(&self) -> Vec<(ServerId, String)> {
        (self.servers.live())
            .map(|(id, m)| (id, m.name.clone()))
            .collect()
    }

    /// Ranks of the live workers.
    pub fn live_workers(&self) -> Vec<Rank> {
        self.workers.live().map(|(rank, _)| rank).collect()
    }

    /// Every worker, by rank.
    pub fn workers(&self) -> Vec<MemberView<Rank>> {
        self.workers.views()
    }

    /// Every server, by id.
    pub fn servers(&self) -> Vec<MemberView<ServerId>> {
        self.servers.views()
    }

    /// True when the job is over: the group formed, every rank registered, none is
    /// alive, and at least one left on purpose (rather than all dying).
    pub fn job_done(&self) -> bool {
        let Some(size) = self.formed else {
            return false;
        };
        let ranks: Vec<&Member> = (0..size)
            .filter_map(|r| self.workers.get(Rank(r)))
            .collect();
        ranks.len() == size as usize
            && ranks.iter().all(|m| !m.alive)
            && ranks.iter().any(|m| m.left)
    }

    /// What a restarted scheduler needs to go on where this one is.
    pub fn saved(&self) -> SavedState {
        SavedState {
            group_min: self.group.min,
            group_max: self.group.max,
            formed: self.formed,
            servers: self.servers.saved(),
            workers: self.workers.saved(),
            params: self.params.clone(),
            map: self.map.clone(),
            version: self.version,
            partition_bytes: Some(self.partition_bytes),
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
        Self {
            heartbeat_timeout,
            group: GroupSize {
                min: saved.group_min,
                max: saved.group_max,
            },
            formed: saved.formed,
            join_window: Duration::from_secs(2),
            partition_bytes: saved.partition_bytes.unwrap_or(DEFAULT_PART_BYTES),
            last_join: None,
            min_servers: min_servers.max(1),
            servers: Roster::from_saved(saved.servers, now),
            workers: Roster::from_saved(saved.workers, now),
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
#[path = "membership_tests.rs"]
mod tests;
