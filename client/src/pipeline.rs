//! A training step's push and pull, pipelined: each server's share of the
//! gradients is cut into groups of at least `pipeline_group_bytes` (1 MiB by
//! default; a part on its own when it is that large), and each group's pull is sent as soon as its push is
//! answered, while later groups are still being pushed. A push travels
//! worker → server and a pull server → worker, the two directions of a
//! full-duplex link, so on a link-bound step the exchange takes about the
//! push's time plus one group's pull instead of the push's plus the pull's.
//!
//! Each server's groups go out one after another in the order of `grads`
//! (the model's order, first layer first), so the values the next forward
//! needs first arrive first (ByteScheduler's priority rule); the servers'
//! lanes run side by side, so every server link stays busy and each carries
//! one push from each worker at a time.
//!
//! Every push runs to its end, as [`Shards::push`]'s do; a group whose push
//! failed is not pulled. The first error is returned once all have ended,
//! and the whole may be repeated: a push is applied once however often it
//! arrives.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ps_proto::ids::{Rank, Step, Version};
use ps_proto::key::ParamKey;
use tokio::sync::watch;

use crate::error::{ClientError, settled};
use crate::shards::{Shards, runs_of_at_least, set_versions};
use crate::wire::{
    ParamBytes, PartData, PartGrad, PartSink, PulledParam, cut_into_parts, part_grad,
};

/// One group: its server, where its first part's parameter is in the step's
/// gradients (the order groups go out in), the gradients it pushes and the
/// parts it then pulls.
struct Group<'a> {
    server: usize,
    first_grad: usize,
    grads: Vec<PartGrad>,
    sinks: Vec<PartSink<'a>>,
}

impl Shards {
    /// Pushes `grads` as `worker`'s `step` and pulls every placed parameter at
    /// `min_version` into `into`, group by group (see the module's
    /// documentation): how many keys took the push, and the longest time a
    /// server held a pull waiting.
    pub(crate) async fn pipelined_push_pull(
        &self,
        (worker, step): (Rank, Step),
        grads: &[ParamBytes],
        min_version: Version,
        into: &mut BTreeMap<String, PulledParam>,
    ) -> Result<(usize, Duration), ClientError> {
        let groups = self.pipeline_groups(grads, into)?;
        // Fields are computed only when the event is enabled.
        tracing::debug!(
            groups = groups.len(),
            pushed_bytes = groups
                .iter()
                .flat_map(|g| g.grads.iter().map(|(_, data)| data.len()))
                .sum::<usize>(),
            %step,
            "pipelined step"
        );
        // One lane per server: a group's push waits for the server's earlier
        // groups' pushes, so each server has one push from this worker in
        // flight at a time.
        let lanes: Vec<_> = self
            .servers
            .iter()
            .map(|_| watch::channel(0usize))
            .collect();
        let mut turns = vec![0usize; self.servers.len()];
        let started = std::time::Instant::now();
        let started = &started;
        let runs = groups.into_iter().map(|group| {
            let turn = turns[group.server];
            turns[group.server] += 1;
            let (pushed, pushes_done) = &lanes[group.server];
            let mut pushes_done = pushes_done.clone();
            async move {
                let server = &self.servers[group.server];
                let _ = pushes_done.wait_for(|done| *done >= turn).await;
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
                Ok::<_, ClientError>((taken, (versions, waited)))
            }
        });
        let outcomes = futures::future::join_all(runs).await;
        let mut taken = 0;
        let mut answers = Vec::new();
        for (accepted, answer) in settled(outcomes)? {
            taken += accepted;
            answers.push(answer);
        }
        Ok((taken, set_versions(into, answers)))
    }

    /// The groups of a pipelined step, in the order they are pushed: each
    /// server's parts in the order of `grads`, cut into runs of at least
    /// `ClientConfig::pipeline_group_bytes`, each run with the sinks of the
    /// parts it pushes; parts with no gradient in `grads` are pulled in a last
    /// group of their server. Groups of different servers interleave by where
    /// their first part is in `grads`.
    fn pipeline_groups<'a>(
        &'a self,
        grads: &[ParamBytes],
        into: &'a mut BTreeMap<String, PulledParam>,
    ) -> Result<Vec<Group<'a>>, ClientError> {
        let order: HashMap<&str, usize> = grads
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.as_str(), i))
            .collect();
        let mut sinks: HashMap<ParamKey, (usize, PartSink<'a>)> =
            cut_into_parts(&self.placement, into)
                .into_iter()
                .map(|(server, sink)| (sink.key().clone(), (server, sink)))
                .collect();
        let mut groups = Vec::new();
        for (server, parts) in self.parts_by_server(grads)?.iter().enumerate() {
            let mut parts: Vec<_> = parts.iter().collect();
            parts.sort_by_key(|(placed, part, _)| (order[placed.info.name.as_str()], part.start));
            let bytes = |(_, _, data): &&PartData<'_>| data.len();
            for run in runs_of_at_least(parts, bytes, self.pipeline_group_bytes) {
                let first_grad = order[run[0].0.info.name.as_str()];
                let grads: Vec<PartGrad> = run.into_iter().map(part_grad).collect();
                let sinks = grads
                    .iter()
                    .filter_map(|(header, _)| sinks.remove(&header.key).map(|(_, sink)| sink))
                    .collect();
                groups.push(Group {
                    server,
                    first_grad,
                    grads,
                    sinks,
                });
            }
        }
        let mut unpushed: BTreeMap<usize, Vec<PartSink<'a>>> = BTreeMap::new();
        for (server, sink) in sinks.into_values() {
            unpushed.entry(server).or_default().push(sink);
        }
        for (server, sinks) in unpushed {
            groups.push(Group {
                server,
                first_grad: usize::MAX,
                grads: Vec::new(),
                sinks,
            });
        }
        // Stable: a server's groups keep their order among equals.
        groups.sort_by_key(|g| g.first_grad);
        Ok(groups)
    }
}
