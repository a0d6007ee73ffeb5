//! [`PsClient`]: a worker's connection to a candle-ps job — its `Directory`
//! (ranks, heartbeats, shard maps) and its `Shards` (servers, placement, and
//! the fan-out of register, push and pull). A retried push keeps its
//! `(worker_id, step)`, so the server applies it exactly once.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::Stream;
use ps_common::rendezvous::{Peer, rendezvous};
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::v1;
use tonic::transport::Channel;

use crate::config::ClientConfig;
use crate::control::{Directory, Expected, GroupInfo, SchedulerLink, join_group};
use crate::error::{ClientError, Rpc};
use crate::fan_out::all_or_first_error;
use crate::placement::{ParamInfo, Part, Placement};
use crate::retry::RetryTally;
use crate::server::Server;
use crate::shards::Shards;
use crate::wire::{ParamBytes, PulledParam};

/// A worker's connection to every parameter server.
pub struct PsClient {
    config: ClientConfig,
    directory: Directory,
    shards: Shards,
    /// The embedding tables declared through this client, by name.
    tables: BTreeMap<String, v1::TableSpec>,
}

impl PsClient {
    /// Connects to every server in `config` (or to its scheduler), waiting up to
    /// `config.connect_timeout` for each to come up. A lone server address that
    /// turns out to be a scheduler is used as one.
    ///
    /// # Errors
    /// [`ClientError::Rendezvous`] naming a peer that never came up or is not a
    /// parameter server; [`ClientError::Usage`] for no servers.
    pub async fn connect(mut config: ClientConfig) -> Result<Self, ClientError> {
        let (transport, wait) = (config.transport.clone(), config.connect_timeout);
        let mut directory = Directory::Fixed;
        let mut servers = Vec::new();
        match (&config.scheduler, config.servers.as_slice()) {
            (Some(addr), _) => {
                let (_, channel) = rendezvous(addr, &[Peer::Scheduler], &transport, wait).await?;
                directory =
                    Directory::Scheduler(Box::new(SchedulerLink::new(addr, channel, &transport)));
            }
            (None, []) => {
                return Err(ClientError::Usage(
                    "no parameter servers given; pass --server ADDR".into(),
                ));
            }
            (None, [addr]) => {
                let either = [Peer::ParameterServer, Peer::Scheduler];
                match rendezvous(addr, &either, &transport, wait).await? {
                    (Peer::Scheduler, channel) => {
                        tracing::info!(
                            addr,
                            "the address is a scheduler; taking rank and shard map from it"
                        );
                        directory = Directory::Scheduler(Box::new(SchedulerLink::new(
                            addr, channel, &transport,
                        )));
                        config.scheduler = Some(addr.clone());
                    }
                    (_, channel) => {
                        servers.push(Server::new(addr, channel, &transport, config.data_path))
                    }
                }
            }
            (None, addrs) => {
                let up = addrs.iter().map(|addr| async {
                    let (_, channel) =
                        rendezvous(addr, &[Peer::ParameterServer], &transport, wait).await?;
                    Ok::<_, ClientError>(Server::new(addr, channel, &transport, config.data_path))
                });
                servers = all_or_first_error(up).await?;
            }
        }
        Ok(Self::assemble(config, directory, servers))
    }

    /// A client of fixed servers reached over channels the caller opened (an
    /// in-process transport, for example), named by `(address, channel)`.
    pub fn over_channels(config: ClientConfig, channels: Vec<(String, Channel)>) -> Self {
        let servers = channels
            .into_iter()
            .map(|(addr, channel)| Server::new(&addr, channel, &config.transport, config.data_path))
            .collect();
        Self::assemble(config, Directory::Fixed, servers)
    }

    fn assemble(config: ClientConfig, directory: Directory, servers: Vec<Server>) -> Self {
        let shards = Shards::new(servers, &config);
        Self {
            config,
            directory,
            shards,
            tables: BTreeMap::new(),
        }
    }

    /// True when ranks, placement and servers come from a scheduler.
    pub fn has_scheduler(&self) -> bool {
        matches!(self.directory, Directory::Scheduler(_))
    }

    /// How long a pull waits for its version; also the bound on waiting for a
    /// repaired placement.
    pub fn pull_timeout(&self) -> Duration {
        self.config.pull_timeout
    }

    /// The server addresses.
    pub fn servers(&self) -> Vec<String> {
        self.shards.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// How many servers this client reaches through shared memory, which
    /// means they run on this host and share its cores (opening each
    /// server's session when none is open; a server whose session cannot
    /// be opened counts as not shared). None with sessions off
    /// (`ClientConfig::session`): every operation is then a unary gRPC call.
    pub async fn servers_on_this_host(&self) -> usize {
        if !self.shards.session {
            return 0;
        }
        let mut shared = 0;
        for server in &self.shards.servers {
            if server.carries_any_size().await {
                shared += 1;
            }
        }
        shared
    }

    /// The current placement.
    pub fn placement(&self) -> &Placement {
        &self.shards.placement
    }

    /// Requests one push (or one pull) of every placed parameter makes: a few
    /// per server holding a part (see `ClientConfig::requests_per_server`).
    pub fn requests_per_operation(&self) -> usize {
        self.shards.requests_per_operation()
    }

    /// The shard-map version this client routes with (0: no scheduler).
    pub fn map_version(&self) -> MapVersion {
        self.shards.map_version
    }

    /// A newer shard-map version the scheduler announced than the one in use, if any.
    pub fn newer_map(&self) -> Option<MapVersion> {
        match &self.directory {
            Directory::Scheduler(link) => link.newer_than(self.shards.map_version),
            Directory::Fixed => None,
        }
    }

    /// Asks for a rank in the worker group (the first server's, or the scheduler's).
    ///
    /// # Errors
    /// [`ClientError::Rpc`], for example when the group is full.
    pub async fn join(&mut self, client_id: &str) -> Result<GroupInfo, ClientError> {
        self.join_expecting(client_id, Expected::default()).await
    }

    /// [`PsClient::join`] for a worker started with a rank, group size or
    /// consistency model: the server (or scheduler) refuses a group that differs.
    ///
    /// # Errors
    /// As [`PsClient::join`]; [`ClientError::Rpc`] with `FAILED_PRECONDITION` or
    /// [`ClientError::Usage`] naming the setting that differs.
    pub async fn join_expecting(
        &mut self,
        client_id: &str,
        expected: Expected,
    ) -> Result<GroupInfo, ClientError> {
        let (retry, wait) = (&self.config.retry, self.config.pull_timeout);
        match &mut self.directory {
            Directory::Scheduler(link) => {
                let group = link.register(retry, client_id, wait).await?;
                expected.check(&group, &format!("scheduler {}", link.addr))?;
                Ok(group)
            }
            Directory::Fixed => {
                let first = self
                    .shards
                    .servers
                    .first()
                    .ok_or_else(|| ClientError::Usage("no parameter servers to join".into()))?;
                join_group(first, retry, client_id, expected).await
            }
        }
    }

    /// Tells the scheduler this worker is done, so the group stops waiting for it at
    /// once rather than after the heartbeat timeout. Best effort; nothing to do
    /// without a scheduler.
    pub async fn leave(&mut self) {
        if let Directory::Scheduler(link) = &mut self.directory {
            link.leave().await;
        }
    }

    /// Decides where `params` live: from the scheduler's shard map (declaring the
    /// parameters first, then waiting for the map up to the pull timeout), or, with
    /// fixed servers, by the same plan on every worker.
    ///
    /// # Errors
    /// [`ClientError`] when the scheduler refuses the parameters, no map comes in
    /// time (the message names what the scheduler still waits for), or a server in
    /// the map cannot be reached.
    pub async fn place(&mut self, params: &[ParamInfo]) -> Result<(), ClientError> {
        let retry = &self.config.retry;
        match &mut self.directory {
            Directory::Scheduler(link) => {
                link.declare(retry, params).await?;
                // The first map's servers may still be starting: an orchestrator
                // publishes a container's name only once it is healthy.
                let (map_wait, server_wait) =
                    (self.config.pull_timeout, self.config.connect_timeout);
                self.route_by_map(MapVersion(1), map_wait, server_wait)
                    .await
            }
            Directory::Fixed => {
                let (servers, bytes) = (self.shards.servers.len(), self.config.partition_bytes);
                self.shards.place(Placement::plan(params, servers, bytes));
                Ok(())
            }
        }
    }

    /// Fetches the scheduler's shard map at `min_version` or later and routes by it
    /// from now on (after a server answered that the map in use is stale).
    ///
    /// # Errors
    /// [`ClientError`] when no such map comes within the pull timeout or a server in
    /// it cannot be reached.
    pub async fn refresh(&mut self, min_version: MapVersion) -> Result<(), ClientError> {
        self.refresh_within(min_version, self.config.pull_timeout)
            .await
    }

    /// [`PsClient::refresh`], waiting at most `wait` for the map.
    ///
    /// # Errors
    /// As [`PsClient::refresh`]; `DEADLINE_EXCEEDED` from the scheduler when no
    /// such map came within `wait`.
    pub async fn refresh_within(
        &mut self,
        min_version: MapVersion,
        wait: Duration,
    ) -> Result<(), ClientError> {
        self.route_by_map(min_version, wait, Duration::ZERO).await
    }

    /// Fetches the shard map at `min_version` or later (waiting at most
    /// `map_wait`) and routes by it, waiting up to `server_wait` for each of its
    /// servers to come up (zero: a server in a map that replaced another is
    /// expected up, and one that is not is repaired as lost).
    async fn route_by_map(
        &mut self,
        min_version: MapVersion,
        map_wait: Duration,
        server_wait: Duration,
    ) -> Result<(), ClientError> {
        let Directory::Scheduler(link) = &self.directory else {
            return Err(ClientError::Usage(
                "there is no scheduler to refresh the shard map from".into(),
            ));
        };
        let map = link
            .shard_map(&self.config.retry, min_version, map_wait)
            .await?;
        let transport = &self.config.transport;
        let servers = all_or_first_error(
            map.servers
                .iter()
                .map(|s| Server::connect(transport, &s.addr, server_wait, self.config.data_path)),
        )
        .await?;
        let parts: Vec<(String, Part)> = map
            .parts
            .iter()
            .map(|p| {
                let part = Part {
                    part: p.part,
                    server: p.server as usize,
                    start: p.start as usize,
                    len: p.len as usize,
                };
                (p.name.clone(), part)
            })
            .collect();
        let placement =
            Placement::from_map(&link.params, &parts, servers.len()).map_err(|reason| {
                ClientError::Protocol {
                    what: Rpc::GetShardMap,
                    addr: link.addr.clone(),
                    reason: reason.to_string(),
                }
            })?;
        self.shards.servers = servers;
        self.shards.place(placement);
        self.shards.map_version = MapVersion(map.version);
        tracing::info!(version = map.version, servers = ?self.servers(), "placement from the scheduler's shard map");
        Ok(())
    }

    /// Where this client's retries are counted (its config's retry policy's
    /// tally), for a worker's metrics to show.
    pub fn retry_tally(&self) -> RetryTally {
        self.config.retry.tally.clone()
    }

    /// Registers every placed parameter with its initial values in `values` (by name)
    /// and `optimizer`. Returns true when this call created every key (this worker's
    /// values won), false when they existed already.
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn register(
        &self,
        values: &[ParamBytes],
        optimizer: &v1::Optimizer,
    ) -> Result<bool, ClientError> {
        self.register_copy(values, optimizer, Version(0)).await
    }

    /// Registers every placed parameter again with this worker's copy of its values
    /// at `version` (0: initial values), so a server that lost or newly owns a key
    /// restores it (from its checkpoints, or from this copy when that is newer).
    /// Returns true when every key took these values.
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn register_copy(
        &self,
        values: &[ParamBytes],
        optimizer: &v1::Optimizer,
        version: Version,
    ) -> Result<bool, ClientError> {
        self.shards.register(values, optimizer, version).await
    }

    /// Pushes the gradients of `step` (by parameter name) to every server concurrently.
    /// Returns how many keys took them (the rest were retries already taken).
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn push(
        &self,
        worker: Rank,
        step: Step,
        grads: &[ParamBytes],
    ) -> Result<usize, ClientError> {
        self.record_step(step);
        self.shards.push(worker, step, grads).await
    }

    /// Pushes the gradients of `step` and then pulls every placed parameter at
    /// `min_version` into `into`, as a training step does: in one round trip
    /// per server (a `PushPull` on each session stream) when every server's
    /// share of both fits one message; otherwise pipelined, each group of keys
    /// pulled as soon as its push is answered while later groups are still
    /// pushed (`ClientConfig::pipeline`, the default), or as
    /// [`PsClient::push`] and then [`PsClient::pull_into`]. Returns how many
    /// keys took the push and how long a server held a pull waiting.
    ///
    /// # Errors
    /// [`ClientError`] from any server; the push may have been applied (repeat
    /// the whole with the same `step`: it is applied once).
    pub async fn push_then_pull_into(
        &self,
        (worker, step): (Rank, Step),
        grads: &[ParamBytes],
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<(usize, Duration), ClientError> {
        self.record_step(step);
        let exchanged = self
            .shards
            .push_pull_into((worker, step), grads, min_version, into)
            .await?;
        if let Some(done) = exchanged {
            return Ok(done);
        }
        if self.shards.pipeline {
            return self
                .shards
                .pipelined_push_pull((worker, step), grads, min_version, into)
                .await;
        }
        let taken = self.shards.push(worker, step, grads).await?;
        let waited = self.shards.pull_into(min_version, into).await?;
        Ok((taken, waited))
    }

    /// [`PsClient::push_then_pull_into`] with the gradients coming in segments,
    /// as a segmented backward pass produces them: each segment's keys are
    /// pushed, group by group, as soon as it arrives, and each group pulled as
    /// soon as its push is answered, while later segments are still being
    /// computed. When `segments` ends, every placed parameter not pushed is
    /// pulled too. Always pipelined, whatever `ClientConfig::pipeline` says.
    ///
    /// Drop the future to give up the step (for example when the backward pass
    /// failed): a push already sent may have been applied, and repeating the
    /// step applies it once.
    ///
    /// # Errors
    /// As [`PsClient::push_then_pull_into`]; after the first failure no further
    /// segment is pushed, and the error comes once the pushes started have ended.
    pub async fn push_then_pull_streamed<G: AsRef<[ParamBytes]>>(
        &self,
        (worker, step): (Rank, Step),
        segments: impl Stream<Item = G>,
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<(usize, Duration), ClientError> {
        self.record_step(step);
        self.shards
            .streamed_push_pull((worker, step), segments, min_version, into)
            .await
    }

    /// Tells the scheduler link (when there is one) the step being pushed, for
    /// its heartbeats.
    fn record_step(&self, step: Step) {
        if let Directory::Scheduler(link) = &self.directory {
            link.record_step(step);
        }
    }

    /// Pulls every placed parameter once each of its parts reaches `min_version`.
    ///
    /// # Errors
    /// [`ClientError`] from any server, for example `DEADLINE_EXCEEDED` naming the
    /// workers a BSP step still waits for.
    pub async fn pull(
        &self,
        min_version: Version,
    ) -> Result<BTreeMap<String, PulledParam>, ClientError> {
        Ok(self.pull_waiting(min_version).await?.0)
    }

    /// [`PsClient::pull`], with the longest time a server held the pull waiting
    /// for `min_version` (under BSP, for the step's other pushes): the rest of
    /// the pull's time is the transfer.
    ///
    /// # Errors
    /// As [`PsClient::pull`].
    pub async fn pull_waiting(
        &self,
        min_version: Version,
    ) -> Result<(BTreeMap<String, PulledParam>, Duration), ClientError> {
        let mut pulled = BTreeMap::new();
        let waited = self.shards.pull_into(min_version, &mut pulled).await?;
        Ok((pulled, waited))
    }

    /// [`PsClient::pull`] into `into`, reusing its buffers: a training loop that
    /// keeps one map pulls every step without allocating. Afterwards `into` holds
    /// exactly the placed parameters.
    ///
    /// Returns how long a server held the pull waiting, as
    /// [`PsClient::pull_waiting`] does.
    ///
    /// # Errors
    /// As [`PsClient::pull`]; `into` then holds partly written values.
    pub async fn pull_into(
        &self,
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<Duration, ClientError> {
        self.shards.pull_into(min_version, into).await
    }
}

/// Embedding tables (`crate::rows`).
impl PsClient {
    /// Declares the embedding table `table` on every server, each with the
    /// buckets it holds (a table with no bucket count gets
    /// [`ps_proto::rows::DEFAULT_BUCKETS`]). Idempotent: every worker of a job
    /// declares the same table.
    ///
    /// # Errors
    /// [`ClientError`] from any server, for example `ALREADY_EXISTS` for a
    /// table declared with another spec.
    pub async fn declare_table(&mut self, mut table: v1::TableSpec) -> Result<(), ClientError> {
        if table.buckets == 0 {
            table.buckets = ps_proto::rows::DEFAULT_BUCKETS;
        }
        self.shards.declare_table(&table, Version(0)).await?;
        self.shards.moves_rows();
        self.tables.insert(table.name.clone(), table);
        Ok(())
    }

    /// Declares every table again, for a job at `version` (the version of the
    /// worker's dense copy), after a server was lost or the shard map changed: each
    /// bucket's server takes it from the newest checkpoint it can read (or
    /// makes it empty), moved forward to `version`. A table too large to copy
    /// has no worker copy to offer; the updates since its checkpoint are lost.
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn redeclare_tables(&self, version: Version) -> Result<(), ClientError> {
        for table in self.tables.values() {
            self.shards.declare_table(table, version).await?;
        }
        Ok(())
    }

    /// The declared table `name`.
    ///
    /// # Errors
    /// [`ClientError::Usage`] for a table this client never declared.
    pub fn table(&self, name: &str) -> Result<&v1::TableSpec, ClientError> {
        self.tables.get(name).ok_or_else(|| {
            ClientError::Usage(format!(
                "table {name} was never declared; call declare_table() first"
            ))
        })
    }

    /// The rows of `ids` of table `table` (`width` elements each, one row per
    /// id, repeats included), once every bucket they come from reaches
    /// `min_version`. Each distinct id is read once.
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn pull_rows(
        &self,
        table: &str,
        ids: &[u64],
        min_version: Version,
    ) -> Result<Vec<f32>, ClientError> {
        let unique = crate::rows::UniqueIds::of(ids);
        let spec = self.table(table)?;
        let rows = self
            .shards
            .pull_rows(spec, &unique.ids, min_version)
            .await?;
        Ok(unique.scatter(&rows, spec.width as usize))
    }

    /// The rows of `unique.ids` (each once, in that order); for a caller that
    /// gathers the batch's rows itself (an embedding layer does).
    ///
    /// # Errors
    /// As [`PsClient::pull_rows`].
    pub async fn pull_unique_rows(
        &self,
        table: &str,
        unique: &crate::rows::UniqueIds,
        min_version: Version,
    ) -> Result<Vec<f32>, ClientError> {
        let spec = self.table(table)?;
        self.shards.pull_rows(spec, &unique.ids, min_version).await
    }

    /// Pushes the row gradients of `step` for `ids` (one `width`-element row
    /// per id, repeats included: their gradients are summed) to every server
    /// holding a bucket of `table`, every bucket included so that BSP steps
    /// complete. Returns how many buckets took the push (the rest had taken
    /// it before: a repeated push is applied once).
    ///
    /// # Errors
    /// [`ClientError`] from any server; the push may have been applied on some
    /// (repeat it with the same step: it is applied once).
    pub async fn push_rows(
        &self,
        table: &str,
        (worker, step): (Rank, Step),
        ids: &[u64],
        grads: &[f32],
    ) -> Result<usize, ClientError> {
        let unique = crate::rows::UniqueIds::of(ids);
        let spec = self.table(table)?;
        let width = spec.width as usize;
        if grads.len() != ids.len() * width {
            return Err(ClientError::Usage(format!(
                "{} gradient elements for {} ids of width {width}",
                grads.len(),
                ids.len()
            )));
        }
        let sums = unique.sum(grads, width);
        self.push_unique_rows(table, (worker, step), &unique.ids, &sums)
            .await
    }

    /// [`PsClient::push_rows`] of ids that hold no repeats (`grads` one row per id).
    ///
    /// # Errors
    /// As [`PsClient::push_rows`]; a repeated id is refused by its server.
    pub async fn push_unique_rows(
        &self,
        table: &str,
        (worker, step): (Rank, Step),
        ids: &[u64],
        grads: &[f32],
    ) -> Result<usize, ClientError> {
        self.record_step(step);
        let spec = self.table(table)?;
        self.shards
            .push_rows(spec, (worker, step), ids, grads)
            .await
    }
}
