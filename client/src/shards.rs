//! [`Shards`]: the parameter servers a client routes to, where each parameter's
//! parts live on them, and the shard-map version it routes by; with the fan-out
//! of register, push, pull and push-then-pull to every server at once. Each
//! request is one message (on the server's session when it has one) or
//! streamed in chunks, by the size rules of `config.rs` ([`SizeRules`]); a
//! session through shared memory takes every request as one message. A
//! push or pull sends each server's keys as a few concurrent requests of
//! similar size, so that no stage waits for the whole of the one before.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use ps_proto::chunk_decode::decode_pull_chunk;
use ps_proto::chunk_encode::{framed_message, framed_push_chunk};
use ps_proto::grpc_frames::{PULL_PATH, PULL_STREAM_PATH, PUSH_PATH, PUSH_STREAM_PATH};
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_proto::metadata;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use ps_shm::arena::ARENA_FROM_BYTES;
use tonic::metadata::MetadataMap;

use crate::config::{ClientConfig, MIN_GROUP_BYTES, SizeRules};
use crate::error::{ClientError, Rpc, settled};
use crate::fan_out::all_or_first_error;

use crate::placement::{Placed, Placement};
use crate::retry::RetryPolicy;
use crate::server::Server;
use crate::wire::{
    MalformedReply, ParamBytes, PartData, PartGrad, PartInit, PartSink, PulledError, PulledParam,
    cut_into_parts, grad_chunks, part_grad, write_pull_chunk, write_pulled,
};

/// `items`, in order, cut into runs of at least `total / groups` bytes (and at
/// least [`MIN_GROUP_BYTES`], but for the last run): about `groups` runs, one
/// for small or few items. Nothing for no items.
fn in_groups<T>(items: Vec<T>, bytes: impl Fn(&T) -> usize, groups: usize) -> Vec<Vec<T>> {
    let total: usize = items.iter().map(&bytes).sum();
    let target = (total / groups.max(1)).max(MIN_GROUP_BYTES);
    runs_of_at_least(items, bytes, target)
}

/// `items`, in order, cut into runs of at least `target` bytes (but for the
/// last run). Nothing for no items.
pub(crate) fn runs_of_at_least<T>(
    items: Vec<T>,
    bytes: impl Fn(&T) -> usize,
    target: usize,
) -> Vec<Vec<T>> {
    let mut runs = Vec::new();
    let (mut run, mut run_bytes) = (Vec::new(), 0);
    for item in items {
        run_bytes += bytes(&item);
        run.push(item);
        if run_bytes >= target {
            runs.push(std::mem::take(&mut run));
            run_bytes = 0;
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

/// The servers, the placement over them, and how requests to them are made.
pub(crate) struct Shards {
    pub(crate) servers: Vec<Server>,
    pub(crate) placement: Placement,
    pub(crate) map_version: MapVersion,
    pub(crate) retry: RetryPolicy,
    pub(crate) session: bool,
    pub(crate) pipeline: bool,
    pipeline_group_bytes: Option<usize>,
    chunk_bytes: usize,
    requests_per_server: usize,
    sizes: SizeRules,
    pub(crate) pull_timeout: Duration,
    /// Whether embedding tables were declared through this client.
    moves_rows: bool,
}

impl Shards {
    /// Routes by `placement` from now on, and has each server's next
    /// shared-memory session sized for what is placed on it.
    pub(crate) fn place(&mut self, placement: Placement) {
        self.placement = placement;
        self.size_rings();
    }

    /// Notes that this client moves embedding rows: their messages (up to
    /// 16 MiB of ids and rows in a header) are not counted in the
    /// placement, so each server's next session gets the server's own rings.
    pub(crate) fn moves_rows(&mut self) {
        self.moves_rows = true;
        self.size_rings();
    }

    /// Has each server's next shared-memory session sized for what is placed
    /// on it (nothing placed, or rows moving too: the server's own rings).
    fn size_rings(&self) {
        let placed = self.placement.bytes_per_server();
        for (i, server) in self.servers.iter().enumerate() {
            let bytes = placed.get(i).copied().unwrap_or(0);
            server.ask_for_rings(if self.moves_rows { 0 } else { bytes });
        }
    }

    /// `servers`, with nothing placed yet.
    pub(crate) fn new(servers: Vec<Server>, config: &ClientConfig) -> Self {
        Self {
            servers,
            placement: Placement::default(),
            map_version: MapVersion::UNROUTED,
            retry: config.retry.clone(),
            session: config.session,
            pipeline: config.pipeline,
            pipeline_group_bytes: config.pipeline_group_bytes,
            chunk_bytes: config.chunk_bytes,
            requests_per_server: config.requests_per_server,
            sizes: SizeRules::of(config),
            pull_timeout: config.pull_timeout,
            moves_rows: false,
        }
    }

    /// Least bytes of one pipelined group: as configured (at least one), or
    /// [`MIN_GROUP_BYTES`].
    pub(crate) fn pipeline_group_bytes(&self) -> usize {
        self.pipeline_group_bytes.unwrap_or(MIN_GROUP_BYTES).max(1)
    }

    /// The retries of a pull: none. A pull is never retried by itself: when its
    /// connection broke, the server may have restarted and lost this worker's
    /// push of the step (another worker may even have restored the key since),
    /// so the pull would wait for a push that is never repeated. The trainer
    /// repeats the whole step instead, push included; a repeated push is applied
    /// once.
    pub(crate) fn pull_retry(&self) -> RetryPolicy {
        RetryPolicy {
            attempts: 1,
            ..self.retry.clone()
        }
    }

    /// The parts each server holds, with the bytes of each part cut from `data`.
    pub(crate) fn parts_by_server<'a>(
        &'a self,
        data: &'a [ParamBytes],
    ) -> Result<Vec<Vec<PartData<'a>>>, ClientError> {
        let mut by_server = vec![Vec::new(); self.servers.len()];
        for ParamBytes { name, data: bytes } in data {
            let placed = self.placed(name)?;
            let size = placed.info.dtype.size();
            if bytes.len() != placed.info.len() * size {
                let reason = format!(
                    "{name} has {} bytes, but its shape {:?} needs {}",
                    bytes.len(),
                    placed.info.shape,
                    placed.info.len() * size
                );
                return Err(ClientError::Usage(reason));
            }
            for part in &placed.parts {
                let slice = bytes.slice(part.start * size..(part.start + part.len) * size);
                by_server[part.server].push((placed, *part, slice));
            }
        }
        Ok(by_server)
    }

    /// Requests one push (or one pull) of every placed parameter makes: the
    /// groups each server's parts are cut into.
    pub(crate) fn requests_per_operation(&self) -> usize {
        let mut by_server = vec![Vec::new(); self.servers.len()];
        for placed in self.placement.params() {
            for part in &placed.parts {
                by_server[part.server].push(part.len * placed.info.dtype.size());
            }
        }
        by_server
            .into_iter()
            .map(|parts| in_groups(parts, |b| *b, self.requests_per_server).len())
            .sum()
    }

    fn placed(&self, name: &str) -> Result<&Placed, ClientError> {
        self.placement.get(name).ok_or_else(|| {
            ClientError::Usage(format!(
                "parameter {name} was never placed; call place() first"
            ))
        })
    }

    /// Registers every part of `values` on its server with `optimizer`, to be
    /// restored from `restore_version` (0: initial values). True when every key
    /// took these values.
    pub(crate) async fn register(
        &self,
        values: &[ParamBytes],
        optimizer: &v1::Optimizer,
        restore_version: Version,
    ) -> Result<bool, ClientError> {
        let by_server = self.parts_by_server(values)?;
        let calls = by_server
            .iter()
            .enumerate()
            .filter(|(_, parts)| !parts.is_empty())
            .map(|(s, parts)| {
                let inits = parts
                    .iter()
                    .map(|(placed, part, data)| {
                        PartInit::new(placed, part, optimizer, data.clone())
                    })
                    .collect();
                self.register_on(&self.servers[s], inits, restore_version)
            });
        let created = all_or_first_error(calls).await?;
        Ok(created.into_iter().all(|c| c))
    }

    async fn register_on(
        &self,
        server: &Server,
        inits: Vec<PartInit>,
        restore_version: Version,
    ) -> Result<bool, ClientError> {
        let bytes: usize = inits.iter().map(PartInit::byte_len).sum();
        let response = if self.sizes.register_is_unary(bytes) {
            let params = inits.iter().map(PartInit::message).collect();
            let request = v1::RegisterRequest {
                params,
                map_version: self.map_version.get(),
                restore_version: restore_version.get(),
            };
            server
                .call(&self.retry, Rpc::Register, |mut c| {
                    let request = request.clone();
                    async move { c.register(request).await }
                })
                .await?
        } else {
            let versions = (self.map_version, restore_version);
            let chunks: Vec<v1::RegisterChunk> = inits
                .iter()
                .flat_map(|init| init.chunks(self.chunk_bytes, versions))
                .collect();
            server
                .call(&self.retry, Rpc::RegisterStream, |mut c| {
                    let chunks = chunks.clone();
                    async move { c.register_stream(tokio_stream::iter(chunks)).await }
                })
                .await?
        };
        Ok(response.keys.iter().all(|k| k.created))
    }

    /// Pushes the gradients of `step` to every server concurrently; how many
    /// keys took them (the rest were retries already taken).
    pub(crate) async fn push(
        &self,
        worker: Rank,
        step: Step,
        grads: &[ParamBytes],
    ) -> Result<usize, ClientError> {
        let by_server = self.parts_by_server(grads)?;
        // Collected first: `join_all` given a length joins a few requests in
        // one allocation, where an iterator of unknown length (a `flat_map`)
        // goes through `FuturesOrdered`, several allocations a push (8 % of
        // a kv worker's samples at 4 KiB pushes to two servers). Each
        // request's future (2.9 KiB in a test build) is boxed where it is
        // made: unboxed, collecting and joining moved it whole three times,
        // 12 % of a kv worker's samples in `memmove` at 4 KiB pushes to two
        // servers (4.6 % boxed).
        let calls: Vec<_> = by_server
            .iter()
            .enumerate()
            .flat_map(|(s, parts)| {
                let grads: Vec<PartGrad> = parts.iter().map(part_grad).collect();
                let groups = in_groups(grads, |(_, data)| data.len(), self.requests_per_server);
                groups
                    .into_iter()
                    .map(move |group| Box::pin(self.push_on(&self.servers[s], worker, step, group)))
            })
            .collect();
        // Every request runs to its end, so that when one refuses a step the group
        // completed without this worker, the others have taken theirs (or refused
        // too) before the worker joins at the newer step. Each request is one
        // group of one server's keys: admission is per key, so a group is
        // all-or-nothing exactly as a whole server's request was.
        let outcomes = futures::future::join_all(calls).await;
        Ok(settled(outcomes)?.into_iter().sum())
    }

    pub(crate) async fn push_on(
        &self,
        server: &Server,
        worker: Rank,
        step: Step,
        grads: Vec<PartGrad>,
    ) -> Result<usize, ClientError> {
        let bytes: usize = grads.iter().map(|(_, data)| data.len()).sum();
        // A push goes as one message on the session when it fits one there
        // (any size through shared memory). Otherwise small pushes are one
        // unary message and larger ones stream their chunks, the server
        // reserving room for `bytes` before it reads any; both go out as
        // HTTP/2 frames written here, the last marked as the end.
        if self.in_one_message(server, bytes).await {
            let request = self.push_request(worker, step, grads.iter().cloned());
            if let Some(taken) = self.push_in_session(server, &request, bytes).await? {
                return Ok(taken);
            }
        }
        let (what, path, metadata, pieces) = if self.sizes.transfer_is_unary(bytes) {
            let request = self.push_request(worker, step, grads.into_iter());
            let pieces = vec![framed_message(&request)];
            (Rpc::Push, PUSH_PATH, MetadataMap::new(), pieces)
        } else {
            let pieces: Vec<Bytes> = grads
                .iter()
                .flat_map(|grad| grad_chunks(grad, self.chunk_bytes))
                .flat_map(|chunk| {
                    framed_push_chunk(v1::PushChunk {
                        map_version: self.map_version.get(),
                        worker_id: worker.get(),
                        step: step.get(),
                        chunk: Some(chunk),
                    })
                })
                .collect();
            let mut metadata = MetadataMap::new();
            metadata.insert(metadata::PUSH_BYTES, (bytes as u64).into());
            (Rpc::PushStream, PUSH_STREAM_PATH, metadata, pieces)
        };
        let mut answer = server
            .start_framed(&self.retry, what, path, metadata, pieces)
            .await?;
        let failed = |status| server.failed(what, status);
        let message = answer.next_message().await.map_err(failed)?;
        let malformed = |reason: String| ClientError::Protocol {
            what,
            addr: server.addr.clone(),
            reason,
        };
        let message = message.ok_or_else(|| malformed("no answer".to_string()))?;
        let response =
            v1::PushResponse::decode(message.into_bytes()).map_err(|e| malformed(e.to_string()))?;
        if answer.next_message().await.map_err(failed)?.is_some() {
            return Err(malformed("more than one answer".to_string()));
        }
        Ok(response.keys.iter().filter(|k| k.accepted).count())
    }

    /// Whether a push or pull of `bytes` to `server` goes as one message:
    /// when it is small enough, or through shared memory
    /// (`Server::carries_any_size`).
    async fn in_one_message(&self, server: &Server, bytes: usize) -> bool {
        self.sizes.transfer_is_unary(bytes) || (self.session && server.carries_any_size().await)
    }

    /// A push on `server`'s session stream: how many keys took it; `None` when
    /// sessions are off or the server offers none.
    async fn push_in_session(
        &self,
        server: &Server,
        request: &v1::PushRequest,
        bytes: usize,
    ) -> Result<Option<usize>, ClientError> {
        if !self.session {
            return Ok(None);
        }
        let op = || Op::Push(request.clone());
        let fits_grpc = self.sizes.transfer_is_unary(bytes);
        let answered = server.in_session(&self.retry, Rpc::Push, op, fits_grpc);
        let Some((outcome, _)) = answered.await? else {
            return Ok(None);
        };
        match outcome {
            Outcome::Push(response) => {
                Ok(Some(response.keys.iter().filter(|k| k.accepted).count()))
            }
            _ => Err(ClientError::Protocol {
                what: Rpc::Push,
                addr: server.addr.clone(),
                reason: "a push answered with another operation's outcome".to_string(),
            }),
        }
    }

    /// Pulls every placed parameter once each of its parts reaches `min_version`,
    /// into `into`: one entry per placed parameter, whose buffer is reused when
    /// it is already there. Each server's reply is written into the buffers
    /// chunk by chunk as it arrives. Returns the longest time a server held one
    /// of the requests waiting for its version.
    pub(crate) async fn pull_into(
        &self,
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<Duration, ClientError> {
        let mut by_server: Vec<Vec<PartSink<'_>>> =
            self.servers.iter().map(|_| Vec::new()).collect();
        for (server, sink) in cut_into_parts(&self.placement, into) {
            by_server[server].push(sink);
        }
        let calls = by_server.into_iter().enumerate().flat_map(|(s, sinks)| {
            let groups = in_groups(sinks, PartSink::byte_len, self.requests_per_server);
            groups
                .into_iter()
                .map(move |group| self.pull_on(&self.servers[s], group, min_version))
        });
        let answers = all_or_first_error(calls).await?;
        Ok(set_versions(into, answers))
    }

    /// Pushes `grads` as `worker`'s `step` and pulls every placed parameter at
    /// `min_version` into `into`, each server's share as one `PushPull` on its
    /// session stream: one round trip per server instead of two. `None` when
    /// that cannot be (the caller pushes, then pulls): sessions are off, or a
    /// server's push or pull does not fit one message (nothing sent), or a
    /// server's session could not carry its share when it was sent (other
    /// servers' pushes may have been applied, and are acknowledged, not
    /// applied, when pushed again).
    /// Otherwise how many keys took the push, and the longest time a server
    /// held the pull waiting. The whole is retried on failure: the push is
    /// applied once however often it arrives.
    pub(crate) async fn push_pull_into(
        &self,
        (worker, step): (Rank, Step),
        grads: &[ParamBytes],
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<Option<(usize, Duration)>, ClientError> {
        // A server's pull carries every part it holds, and its push at most
        // those: when the one fits a message, so does the other. Decided from
        // the placement alone, before anything is cut.
        let bytes = self.placement.bytes_per_server();
        if !self.session {
            return Ok(None);
        }
        for (server, &bytes) in self.servers.iter().zip(&bytes) {
            if !self.in_one_message(server, bytes).await {
                return Ok(None);
            }
        }
        let pushes = self.parts_by_server(grads)?;
        let mut pulls: Vec<Vec<PartSink<'_>>> = self.servers.iter().map(|_| Vec::new()).collect();
        for (server, sink) in cut_into_parts(&self.placement, into) {
            pulls[server].push(sink);
        }
        let calls = pushes
            .iter()
            .zip(pulls)
            .enumerate()
            .filter(|(_, (push, pull))| !push.is_empty() || !pull.is_empty())
            .map(|(s, (push, sinks))| {
                let request = v1::PushPull {
                    push: Some(self.push_request(worker, step, push.iter().map(part_grad))),
                    pull: Some(self.pull_request(&sinks, min_version)),
                };
                let fits_grpc = self.sizes.transfer_is_unary(bytes[s]);
                self.push_pull_on(&self.servers[s], request, sinks, fits_grpc)
            });
        let mut taken = 0;
        let mut answers = Vec::new();
        for answered in all_or_first_error(calls).await? {
            // A server whose session could not carry its share (shared memory
            // lost since, the share too large for one gRPC message): the
            // caller pushes, then pulls; pushes that went through already are
            // acknowledged again, not applied twice.
            let Some((accepted, versions, waited)) = answered else {
                return Ok(None);
            };
            taken += accepted;
            answers.push((versions, waited));
        }
        Ok(Some((taken, set_versions(into, answers))))
    }

    /// One server's `PushPull`: the keys that took the push, the version of
    /// each part pulled into `sinks`, and how long the pull waited; `None`
    /// when its session cannot carry the request (`Server::in_session`), or
    /// broke while the pulled values were read off its ring (the push was
    /// taken, so the caller pushes again, taken once, then pulls).
    async fn push_pull_on(
        &self,
        server: &Server,
        request: v1::PushPull,
        mut sinks: Vec<PartSink<'_>>,
        fits_grpc: bool,
    ) -> Result<Option<(usize, Vec<(ParamKey, Version)>, Duration)>, ClientError> {
        let protocol = |reason: String| ClientError::Protocol {
            what: Rpc::PushPull,
            addr: server.addr.clone(),
            reason,
        };
        let op = || Op::PushPull(request.clone());
        let answer = server.in_session_lending(&self.retry, Rpc::PushPull, op, fits_grpc, true);
        let Some((outcome, waited_us, lent)) = answer.await? else {
            return Ok(None);
        };
        let Outcome::PushPull(response) = outcome else {
            return Err(protocol(
                "a push_pull answered with another outcome".to_string(),
            ));
        };
        let (Some(pushed), Some(pulled)) = (response.push, response.pull) else {
            return Err(protocol(
                "a push_pull answer without its push or its pull".to_string(),
            ));
        };
        match write_pulled(&mut sinks, pulled.tensors, lent).await {
            Ok(()) => {}
            // The session broke while the pulled values were read off its
            // ring: the push was taken, so the caller pushes again (taken
            // once) and pulls.
            Err(PulledError::Ring(status)) => {
                tracing::debug!(server = %server.addr, %status, "a push_pull's values were cut off; pushing, then pulling");
                return Ok(None);
            }
            Err(PulledError::Malformed(e)) => return Err(protocol(e.to_string())),
        }
        let versions = finished(&sinks).map_err(|e| protocol(e.to_string()))?;
        let accepted = pushed.keys.iter().filter(|k| k.accepted).count();
        Ok(Some((accepted, versions, Duration::from_micros(waited_us))))
    }

    /// A push request of `grads` as `worker`'s `step`.
    fn push_request(
        &self,
        worker: Rank,
        step: Step,
        grads: impl Iterator<Item = PartGrad>,
    ) -> v1::PushRequest {
        v1::PushRequest {
            map_version: self.map_version.get(),
            worker_id: worker.get(),
            step: step.get(),
            grads: grads
                .map(|(header, data)| header.into_tensor(data))
                .collect(),
        }
    }

    /// A pull request of the parts `sinks` stand for, at `min_version`.
    fn pull_request(&self, sinks: &[PartSink<'_>], min_version: Version) -> v1::PullRequest {
        v1::PullRequest {
            map_version: self.map_version.get(),
            keys: sinks
                .iter()
                .map(|sink| v1::KeyRef {
                    name: sink.key().name.clone(),
                    part: sink.key().part,
                })
                .collect(),
            min_version: min_version.get(),
            timeout_ms: self.pull_timeout.as_millis() as u64,
            chunk_bytes: self.chunk_bytes as u64,
        }
    }

    /// Pulls the parts `sinks` stand for from `server`, writing each into its
    /// sink; the version of each part, and how long the server held the pull
    /// waiting for `min_version`. Parts that can be read straight from the
    /// server's values arena are ([`PartSink::read_direct`]); only the rest
    /// are asked for.
    pub(crate) async fn pull_on(
        &self,
        server: &Server,
        sinks: Vec<PartSink<'_>>,
        min_version: Version,
    ) -> Result<(Vec<(ParamKey, Version)>, Duration), ClientError> {
        let wanted = (min_version, self.map_version);
        let (read, sinks) = read_direct(server, sinks, wanted).await;
        let direct = finished(&read).map_err(|malformed| ClientError::Protocol {
            what: Rpc::Pull,
            addr: server.addr.clone(),
            reason: malformed.to_string(),
        })?;
        if sinks.is_empty() {
            return Ok((direct, Duration::ZERO));
        }
        let (mut versions, waited) = self.pull_asked(server, sinks, min_version).await?;
        versions.extend(direct);
        Ok((versions, waited))
    }

    /// Pulls the parts `sinks` stand for from `server` with a request (as
    /// [`Shards::pull_on`]).
    async fn pull_asked(
        &self,
        server: &Server,
        mut sinks: Vec<PartSink<'_>>,
        min_version: Version,
    ) -> Result<(Vec<(ParamKey, Version)>, Duration), ClientError> {
        let request = self.pull_request(&sinks, min_version);
        let bytes: usize = sinks.iter().map(PartSink::byte_len).sum();
        let protocol = |what, malformed: MalformedReply| ClientError::Protocol {
            what,
            addr: server.addr.clone(),
            reason: malformed.to_string(),
        };
        // Small pulls are answered in one message (on the session stream when
        // there is one); larger ones as a stream of chunks, each written into
        // its sink as it arrives.
        let unary = self.sizes.transfer_is_unary(bytes);
        if self.session && self.in_one_message(server, bytes).await {
            let op = || Op::Pull(request.clone());
            let retry = self.pull_retry();
            let answered = server.in_session_lending(&retry, Rpc::Pull, op, unary, true);
            if let Some(answer) = answered.await? {
                let (Outcome::Pull(response), waited_us, lent) = answer else {
                    let reason = MalformedReply::Missing("a pull answered with another outcome");
                    return Err(protocol(Rpc::Pull, reason));
                };
                let written = write_pulled(&mut sinks, response.tensors, lent).await;
                written.map_err(|e| pulled_failed(server, Rpc::Pull, e))?;
                let versions = finished(&sinks).map_err(|e| protocol(Rpc::Pull, e))?;
                return Ok((versions, Duration::from_micros(waited_us)));
            }
        }
        let (what, path) = if unary {
            (Rpc::Pull, PULL_PATH)
        } else {
            (Rpc::PullStream, PULL_STREAM_PATH)
        };
        let mut answer = server
            .start_framed(
                &self.pull_retry(),
                what,
                path,
                MetadataMap::new(),
                vec![framed_message(&request)],
            )
            .await?;
        let waited = metadata::pull_waited(answer.metadata());
        let failed = |status| server.failed(what, status);
        while let Some(message) = answer.next_message().await.map_err(failed)? {
            if unary {
                let response = v1::PullResponse::decode(message.into_bytes())
                    .map_err(|e| protocol(what, e.into()))?;
                let written = write_pulled(&mut sinks, response.tensors, None).await;
                written.map_err(|e| pulled_failed(server, what, e))?;
            } else {
                let (chunk, data) =
                    decode_pull_chunk(message).map_err(|e| protocol(what, e.into()))?;
                write_pull_chunk(&mut sinks, chunk, data).map_err(|e| protocol(what, e))?;
            }
        }
        let versions = finished(&sinks).map_err(|e| protocol(Rpc::Pull, e))?;
        Ok((versions, waited))
    }
}

/// Reads each of `sinks` that it can straight from `server`'s values arena,
/// at `min_version` or later, routed by shard map `routed_by`
/// ([`PartSink::read_direct`]): those read, and those left to pull. Only a
/// session open through shared memory with an arena has any, and only parts
/// of [`ARENA_FROM_BYTES`] or more whose place an earlier pull's answer said.
async fn read_direct<'a>(
    server: &Server,
    sinks: Vec<PartSink<'a>>,
    wanted: (Version, MapVersion),
) -> (Vec<PartSink<'a>>, Vec<PartSink<'a>>) {
    let in_arena = |sink: &PartSink<'_>| sink.byte_len() >= ARENA_FROM_BYTES;
    let arena = match sinks.iter().any(in_arena) {
        true => server.values_arena().await,
        false => None,
    };
    let Some(arena) = arena else {
        return (Vec::new(), sinks);
    };
    let (mut read, mut left) = (Vec::new(), Vec::new());
    for mut sink in sinks {
        match in_arena(&sink) && sink.read_direct(&arena, wanted) {
            true => read.push(sink),
            false => left.push(sink),
        }
    }
    (read, left)
}

/// Sets each parameter in `into` to its lowest part's version among `answers`
/// (each server's part versions and wait; 0 for a parameter with no parts);
/// the longest wait.
pub(crate) fn set_versions(
    into: &mut BTreeMap<String, PulledParam>,
    answers: Vec<(Vec<(ParamKey, Version)>, Duration)>,
) -> Duration {
    let mut lowest: BTreeMap<String, Version> = BTreeMap::new();
    let mut waited = Duration::ZERO;
    for (versions, wait) in answers {
        waited = waited.max(wait);
        for (key, version) in versions {
            lowest
                .entry(key.name)
                .and_modify(|v| *v = (*v).min(version))
                .or_insert(version);
        }
    }
    for (name, param) in into.iter_mut() {
        param.version = lowest.get(name).copied().unwrap_or(Version(0));
    }
    waited
}

/// Each part's key and version, once every part's bytes arrived.
fn finished(sinks: &[PartSink<'_>]) -> Result<Vec<(ParamKey, Version)>, MalformedReply> {
    sinks
        .iter()
        .map(|sink| Ok((sink.key().clone(), sink.finish()?)))
        .collect()
}

/// A pull whose tensors could not be written: a protocol error when the
/// answer does not fit what was asked, the ring's status when the
/// shared-memory session broke while they were read.
fn pulled_failed(server: &Server, what: Rpc, error: PulledError) -> ClientError {
    match error {
        PulledError::Malformed(malformed) => ClientError::Protocol {
            what,
            addr: server.addr.clone(),
            reason: malformed.to_string(),
        },
        PulledError::Ring(status) => server.failed(what, status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_cut_into_about_the_asked_groups_in_order() {
        let mib = 1 << 20;
        let sizes = vec![4 * mib; 4];
        let groups = in_groups(sizes.clone(), |b| *b, 4);
        assert_eq!(groups, vec![vec![4 * mib]; 4]);
        assert_eq!(in_groups(sizes, |b| *b, 1), vec![vec![4 * mib; 4]]);
        // Small keys stay together: no group under 1 MiB but the last.
        let small: Vec<usize> = (1..=10).map(|i| i * 1000).collect();
        assert_eq!(in_groups(small.clone(), |b| *b, 4), vec![small]);
        let mixed = vec![3 * mib, 100, 200, 2 * mib, 300];
        let groups = in_groups(mixed.clone(), |b| *b, 2);
        assert_eq!(groups.concat(), mixed, "every key once, in order");
        assert_eq!(groups.len(), 2);
        assert!(in_groups(Vec::<usize>::new(), |b| *b, 4).is_empty());
    }

    /// Each server's next session asks for rings of eight steps of what is
    /// placed on it, whichever way the placement came; once rows move, the
    /// server's own (0).
    #[tokio::test]
    async fn each_server_is_asked_for_rings_sized_to_its_placed_bytes() {
        use ps_proto::codec::DType;
        use ps_proto::transport::TransportConfig;
        let server = || {
            let channel =
                tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
            Server::new(
                "127.0.0.1:1",
                channel,
                &TransportConfig::default(),
                ps_shm::DataPathMode::Auto,
            )
        };
        let config = ClientConfig::new(Vec::new());
        let mut shards = Shards::new(vec![server(), server()], &config);
        assert_eq!(
            shards
                .servers
                .iter()
                .map(Server::rings_asked)
                .collect::<Vec<_>>(),
            [0, 0]
        );
        let params =
            [("a", 3000), ("b", 1000), ("c", 10)].map(|(name, len)| crate::placement::ParamInfo {
                name: name.into(),
                shape: vec![len],
                dtype: DType::F32,
            });
        let placement = Placement::plan(&params, 2, crate::placement::DEFAULT_PARTITION_BYTES);
        let placed = placement.bytes_per_server();
        assert!(placed.iter().all(|&bytes| bytes > 0), "{placed:?}");
        shards.place(placement);
        let asked: Vec<u64> = shards.servers.iter().map(Server::rings_asked).collect();
        let expected: Vec<u64> = placed.iter().map(|&bytes| 8 * bytes as u64).collect();
        assert_eq!(asked, expected);
        shards.moves_rows();
        assert_eq!(
            shards
                .servers
                .iter()
                .map(Server::rings_asked)
                .collect::<Vec<_>>(),
            [0, 0]
        );
    }

    #[test]
    fn a_pipelined_group_is_1_mib_unless_configured() {
        let config = |bytes| ClientConfig {
            pipeline_group_bytes: bytes,
            ..ClientConfig::new(Vec::new())
        };
        let floor = |bytes| Shards::new(Vec::new(), &config(bytes)).pipeline_group_bytes();
        assert_eq!(floor(None), MIN_GROUP_BYTES);
        assert_eq!(floor(Some(128 << 10)), 128 << 10);
        assert_eq!(floor(Some(0)), 1, "never empty");
    }
}
