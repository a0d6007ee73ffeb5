//! A training step's push and pull, pipelined: each server's share of the
//! gradients is cut into groups of at least `pipeline_group_bytes` (1 MiB by
//! default; a part on its own when it is that large), and each group's pull
//! is sent as soon as its push is answered, while later groups are still
//! being pushed. A push travels worker → server and a pull server → worker,
//! the two directions of a full-duplex link, so on a link-bound step the
//! exchange takes about the push's time plus one group's pull instead of the
//! push's plus the pull's.
//!
//! The gradients may come in segments, as a segmented backward pass produces
//! them (the top of the model first): each segment's groups start while the
//! next segment is still being computed. A whole step is one segment.
//!
//! Within a segment, each server's groups go out one after another in the
//! order of the gradients (the model's order, first layer first), so the
//! values the next forward needs first arrive first (ByteScheduler's priority
//! rule); the servers' lanes run side by side, so every server link stays busy
//! and each carries one push from each worker at a time.
//!
//! Every push runs to its end, as [`Shards::push`]'s do; a group whose push
//! failed is not pulled, and after a failure no further segment's groups
//! start (those already started still push). Once all have ended, the error
//! to act on is returned (`settled`'s choice), and the whole may be repeated:
//! a push is applied once however often it arrives. A parameter given in two
//! segments of one step is refused: its second push would be taken as a
//! repeat.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, Stream, StreamExt};
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::key::ParamKey;
use tokio::sync::watch;

use crate::error::{ClientError, settled};
use crate::shards::{Shards, runs_of_at_least, set_versions};
use crate::wire::{
    ParamBytes, PartData, PartGrad, PartSink, PulledParam, cut_into_parts, part_grad,
};

/// One group: its server, the gradients it pushes and the parts it then pulls.
struct Group<'a> {
    server: usize,
    grads: Vec<PartGrad>,
    sinks: Vec<PartSink<'a>>,
}

/// The sinks of the parts no group has taken yet, by key, with their server.
type Sinks<'a> = HashMap<ParamKey, (usize, PartSink<'a>)>;

/// A server's lane: how many of this step's groups have ended their push on
/// it. A group's push waits for the server's earlier groups' pushes, so each
/// server has one push from this worker in flight at a time.
type Lane = (watch::Sender<usize>, watch::Receiver<usize>);

/// What one group answered: keys that took its push, its pull's versions and
/// waiting time.
type Answer = (usize, (Vec<(ParamKey, Version)>, Duration));

impl Shards {
    /// Pushes `grads` as `worker`'s `step` and pulls every placed parameter at
    /// `min_version` into `into`, group by group (see the module's
    /// documentation): how many keys took the push, and the longest time a
    /// server held a pull waiting.
    pub(crate) async fn pipelined_push_pull(
        &self,
        step: (Rank, Step),
        grads: &[ParamBytes],
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<(usize, Duration), ClientError> {
        let one_segment = futures::stream::iter([grads]);
        self.streamed_push_pull(step, one_segment, min_version, into)
            .await
    }

    /// [`Shards::pipelined_push_pull`] with the gradients coming in segments:
    /// each segment's groups start as it arrives; when `segments` ends, the
    /// parts no segment pushed are pulled too.
    pub(crate) async fn streamed_push_pull<G: AsRef<[ParamBytes]>>(
        &self,
        step: (Rank, Step),
        segments: impl Stream<Item = G>,
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<(usize, Duration), ClientError> {
        let outcomes = self.run_groups(step, segments, min_version, into).await;
        let mut taken = 0;
        let mut answers = Vec::new();
        for (accepted, answer) in settled(outcomes)? {
            taken += accepted;
            answers.push(answer);
        }
        Ok((taken, set_versions(into, answers)))
    }

    /// Starts each segment's groups as it arrives (none after a failure) and
    /// returns every started group's outcome once all have ended.
    async fn run_groups<G: AsRef<[ParamBytes]>>(
        &self,
        (worker, step): (Rank, Step),
        segments: impl Stream<Item = G>,
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Vec<Result<Answer, ClientError>> {
        let mut sinks: Sinks<'_> = cut_into_parts(&self.placement, into)
            .into_iter()
            .map(|(server, sink)| (sink.key().clone(), (server, sink)))
            .collect();
        let lanes: Vec<Lane> = self.servers.iter().map(|_| watch::channel(0)).collect();
        let mut turns = vec![0usize; self.servers.len()];
        let started = Instant::now();
        let mut running = FuturesUnordered::new();
        let mut segments = std::pin::pin!(segments);
        let mut outcomes = Vec::new();
        let mut open = true;
        loop {
            let failed = outcomes.iter().any(Result::is_err);
            tokio::select! {
                segment = segments.next(), if open && !failed => {
                    open = segment.is_some();
                    match self.next_groups(segment.as_ref().map(AsRef::as_ref), &mut sinks) {
                        Ok(groups) => {
                            tracing::debug!(groups = groups.len(), %step, "pipelined segment");
                            for group in groups {
                                let turn = turns[group.server];
                                turns[group.server] += 1;
                                let lane = &lanes[group.server];
                                let at = (turn, lane, started);
                                running.push(self.run_group(group, (worker, step), at, min_version));
                            }
                        }
                        Err(error) => outcomes.push(Err(error)),
                    }
                }
                Some(outcome) = running.next(), if !running.is_empty() => outcomes.push(outcome),
                else => break,
            }
        }
        outcomes
    }

    /// The groups of the next segment, or (`None`: the segments ended) the
    /// pull-only groups of the parts no segment pushed.
    fn next_groups<'a>(
        &self,
        segment: Option<&[ParamBytes]>,
        sinks: &mut Sinks<'a>,
    ) -> Result<Vec<Group<'a>>, ClientError> {
        match segment {
            Some(grads) => self.segment_groups(grads, sinks),
            None => Ok(unpushed_groups(std::mem::take(sinks))),
        }
    }

    /// One group: its push once the server's earlier groups' pushes ended
    /// (it is turn `turn` on `lane`), then its pull. Keys that took the push,
    /// the pull's versions and wait.
    async fn run_group(
        &self,
        group: Group<'_>,
        (worker, step): (Rank, Step),
        (turn, (pushed, pushes_done), started): (usize, &Lane, Instant),
        min_version: Version,
    ) -> Result<Answer, ClientError> {
        let server = &self.servers[group.server];
        let _ = pushes_done.clone().wait_for(|done| *done >= turn).await;
        let taken = if group.grads.is_empty() {
            Ok(0)
        } else {
            self.push_on(server, worker, step, group.grads).await
        };
        pushed.send_modify(|done| *done += 1);
        let taken = taken?;
        tracing::trace!(server = group.server, at = ?started.elapsed(), "pushed");
        let (versions, waited) = self.pull_on(server, group.sinks, min_version).await?;
        tracing::trace!(server = group.server, at = ?started.elapsed(), ?waited, "pulled");
        Ok((taken, (versions, waited)))
    }

    /// The groups of one segment, in the order they are pushed: each server's
    /// parts in the order of `grads`, cut into runs of at least
    /// [`Shards::pipeline_group_bytes`], each run with the sinks (taken
    /// from `sinks`) of the parts it pushes. Groups of different servers
    /// interleave by where their first part is in `grads`.
    fn segment_groups<'a>(
        &self,
        grads: &[ParamBytes],
        sinks: &mut Sinks<'a>,
    ) -> Result<Vec<Group<'a>>, ClientError> {
        let order: HashMap<&str, usize> = grads
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.as_str(), i))
            .collect();
        let group_bytes = self.pipeline_group_bytes();
        let mut groups = Vec::new();
        for (server, parts) in self.parts_by_server(grads)?.iter().enumerate() {
            let mut parts: Vec<_> = parts.iter().collect();
            parts.sort_by_key(|(placed, part, _)| (order[placed.info.name.as_str()], part.start));
            let bytes = |(_, _, data): &&PartData<'_>| data.len();
            for run in runs_of_at_least(parts, bytes, group_bytes) {
                let first_grad = order[run[0].0.info.name.as_str()];
                let grads: Vec<PartGrad> = run.into_iter().map(part_grad).collect();
                let sinks = grads
                    .iter()
                    .map(|(header, _)| take_sink(sinks, &header.key))
                    .collect::<Result<_, _>>()?;
                groups.push((
                    first_grad,
                    Group {
                        server,
                        grads,
                        sinks,
                    },
                ));
            }
        }
        // Stable: a server's groups keep their order among equals.
        groups.sort_by_key(|(first_grad, _)| *first_grad);
        Ok(groups.into_iter().map(|(_, group)| group).collect())
    }
}

/// The sink of the part `key`, which no earlier segment may have pushed: a
/// second push of the same step would be taken as a repeat of the first, and
/// its gradient lost.
fn take_sink<'a>(sinks: &mut Sinks<'a>, key: &ParamKey) -> Result<PartSink<'a>, ClientError> {
    sinks.remove(key).map(|(_, sink)| sink).ok_or_else(|| {
        ClientError::Usage(format!(
            "{} is in two segments of one step's gradients; give each parameter's gradient in one segment",
            key.name
        ))
    })
}

/// The parts no segment pushed, one pull-only group per server.
fn unpushed_groups(sinks: Sinks<'_>) -> Vec<Group<'_>> {
    let mut by_server: BTreeMap<usize, Vec<PartSink<'_>>> = BTreeMap::new();
    for (server, sink) in sinks.into_values() {
        by_server.entry(server).or_default().push(sink);
    }
    by_server
        .into_iter()
        .map(|(server, sinks)| Group {
            server,
            grads: Vec::new(),
            sinks,
        })
        .collect()
}
