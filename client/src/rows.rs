//! Embedding rows by id: a table's buckets routed to their servers
//! (`ps_proto::rows`), and pulls and pushes of rows fanned out to every server
//! at once. A batch's ids are deduplicated on the way out ([`UniqueIds`]): a
//! pull reads each row once and scatters it back, a push sends each row once
//! with the gradients of its repeats summed.
//!
//! Under BSP every bucket's step completes only when every worker pushed it,
//! so a push sends each server a block for every bucket it holds, with no
//! ids where the batch touched none.

use std::collections::BTreeMap;

use ps_proto::ids::{Rank, Step, Version};
use ps_proto::rows::{
    ID_BYTES, MAX_IDS_PER_REQUEST, bucket_of, bucket_owner, copy_rows, encode_ids, extend_rows,
};
use ps_proto::transport::message_overhead;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;

use crate::error::{ClientError, Rpc};
use crate::fan_out::all_or_first_error;
use crate::server::Server;
use crate::shards::Shards;

/// Bytes a request spends besides its ids and rows, at most, per block.
const BLOCK_OVERHEAD_BYTES: usize = 32;

/// A batch's ids without repeats, and where each input id's row is among them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UniqueIds {
    /// Each id once, in order of first appearance.
    pub ids: Vec<u64>,
    /// For each input id, the index of its row among `ids`.
    pub index: Vec<u32>,
}

impl UniqueIds {
    /// `ids` deduplicated.
    pub fn of(ids: &[u64]) -> Self {
        let mut seen = std::collections::HashMap::with_capacity(ids.len());
        let mut unique = Vec::new();
        let index = ids
            .iter()
            .map(|id| {
                *seen.entry(*id).or_insert_with(|| {
                    unique.push(*id);
                    (unique.len() - 1) as u32
                })
            })
            .collect();
        Self { ids: unique, index }
    }

    /// `rows` (one per unique id, `width` wide) scattered back to one per input id.
    pub fn scatter(&self, rows: &[f32], width: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.index.len() * width);
        for &i in &self.index {
            let start = i as usize * width;
            out.extend_from_slice(&rows[start..start + width]);
        }
        out
    }

    /// `grads` (one per input id) summed into one per unique id.
    pub fn sum(&self, grads: &[f32], width: usize) -> Vec<f32> {
        let mut sums = vec![0.0; self.ids.len() * width];
        for (grad, &i) in grads.chunks_exact(width).zip(&self.index) {
            let start = i as usize * width;
            for (s, g) in sums[start..start + width].iter_mut().zip(grad) {
                *s += g;
            }
        }
        sums
    }
}

/// The ids of one bucket in a request, and where their rows sit in the caller's order.
#[derive(Debug, Default)]
struct Block {
    ids: Vec<u64>,
    positions: Vec<usize>,
}

/// Per server, the blocks of the buckets it holds (by bucket), for `ids`:
/// every bucket a server holds when `every_bucket` (a push), else only those
/// with ids (a pull).
fn blocks_by_server(
    owners: &[usize],
    servers: usize,
    buckets: u32,
    ids: &[u64],
    every_bucket: bool,
) -> Vec<BTreeMap<u32, Block>> {
    // Each id's bucket once, then every bucket's block sized before it is filled.
    let homes: Vec<u32> = ids.iter().map(|&id| bucket_of(id, buckets)).collect();
    let mut counts = vec![0usize; buckets as usize];
    for &home in &homes {
        counts[home as usize] += 1;
    }
    let mut blocks: Vec<Block> = counts
        .iter()
        .map(|&n| Block {
            ids: Vec::with_capacity(n),
            positions: Vec::with_capacity(n),
        })
        .collect();
    for (position, (&id, &home)) in ids.iter().zip(&homes).enumerate() {
        let block = &mut blocks[home as usize];
        block.ids.push(id);
        block.positions.push(position);
    }
    let mut by_server: Vec<BTreeMap<u32, Block>> = (0..servers).map(|_| BTreeMap::new()).collect();
    for (bucket, block) in blocks.into_iter().enumerate() {
        if every_bucket || !block.ids.is_empty() {
            by_server[owners[bucket]].insert(bucket as u32, block);
        }
    }
    by_server
}

/// `blocks` cut into requests of at most `limit` bytes of ids and rows (a
/// message limit less `message_overhead`) and at most
/// [`MAX_IDS_PER_REQUEST`] ids, each bucket whole.
fn requests_within(
    blocks: BTreeMap<u32, Block>,
    row_bytes: usize,
    limit: usize,
) -> Result<Vec<Vec<(u32, Block)>>, ClientError> {
    let mut requests = Vec::new();
    let (mut request, mut bytes, mut ids) = (Vec::new(), 0, 0);
    for (bucket, block) in blocks {
        let size = block.ids.len() * (ID_BYTES + row_bytes) + BLOCK_OVERHEAD_BYTES;
        if size > limit || block.ids.len() > MAX_IDS_PER_REQUEST {
            return Err(ClientError::Usage(format!(
                "bucket {bucket} alone carries {} rows ({size} bytes), over what one message takes ({limit} bytes, {MAX_IDS_PER_REQUEST} ids); send fewer rows per request, give the table more buckets, or raise the message limit",
                block.ids.len()
            )));
        }
        let full = bytes + size > limit || ids + block.ids.len() > MAX_IDS_PER_REQUEST;
        if full && !request.is_empty() {
            requests.push(std::mem::take(&mut request));
            (bytes, ids) = (0, 0);
        }
        bytes += size;
        ids += block.ids.len();
        request.push((bucket, block));
    }
    if !request.is_empty() {
        requests.push(request);
    }
    Ok(requests)
}

/// The ids and rows one message to `server` may carry: within its message
/// limit, and within what a shared-memory session's message header holds (a
/// row operation's ids and rows travel in the header there).
fn payload_limit(server: &Server) -> usize {
    let limit = server
        .message_limit()
        .min(ps_shm::message::HEADER_LIMIT as usize);
    limit.saturating_sub(message_overhead(limit))
}

impl Shards {
    /// For each bucket of `table`, the index of the server holding it.
    pub(crate) fn bucket_owners(&self, table: &v1::TableSpec) -> Result<Vec<usize>, ClientError> {
        let addrs: Vec<&str> = self.servers.iter().map(|s| s.addr.as_str()).collect();
        (0..table.buckets)
            .map(|bucket| {
                bucket_owner(&table.name, bucket, &addrs).ok_or_else(|| {
                    ClientError::Usage("no parameter servers to hold the table".into())
                })
            })
            .collect()
    }

    /// Declares `table` on every server, each with the buckets it holds;
    /// `restore` is the step the job is at (0 when it starts).
    pub(crate) async fn declare_table(
        &self,
        table: &v1::TableSpec,
        restore: Version,
    ) -> Result<(), ClientError> {
        let owners = self.bucket_owners(table)?;
        let calls = self.servers.iter().enumerate().filter_map(|(s, server)| {
            let buckets: Vec<u32> = (0..table.buckets)
                .filter(|b| owners[*b as usize] == s)
                .collect();
            if buckets.is_empty() {
                return None;
            }
            let request = v1::DeclareTableRequest {
                table: Some(table.clone()),
                buckets,
                map_version: self.map_version.get(),
                restore_version: restore.get(),
            };
            Some(server.call(&self.retry, Rpc::DeclareTable, move |mut c| {
                let request = request.clone();
                async move { c.declare_table(request).await }
            }))
        });
        all_or_first_error(calls).await?;
        Ok(())
    }

    /// The rows of `ids` (each once), in order, once each bucket reaches `min_version`.
    pub(crate) async fn pull_rows(
        &self,
        table: &v1::TableSpec,
        ids: &[u64],
        min_version: Version,
    ) -> Result<Vec<f32>, ClientError> {
        let width = table.width as usize;
        let owners = self.bucket_owners(table)?;
        let by_server = blocks_by_server(&owners, self.servers.len(), table.buckets, ids, false);
        let mut calls = Vec::new();
        for (server, blocks) in self.servers.iter().zip(by_server) {
            for request in requests_within(blocks, width * 4, payload_limit(server))? {
                calls.push(self.pull_from(server, table, request, min_version));
            }
        }
        let mut rows = vec![0.0f32; ids.len() * width];
        let row_bytes = width * 4;
        for answered in all_or_first_error(calls).await? {
            for (positions, bytes) in answered {
                for (position, row) in positions.into_iter().zip(bytes.chunks_exact(row_bytes)) {
                    copy_rows(row, &mut rows[position * width..(position + 1) * width]);
                }
            }
        }
        Ok(rows)
    }

    /// One `PullRows` of `blocks` from `server`: per block, the positions of
    /// its ids and their rows.
    async fn pull_from(
        &self,
        server: &Server,
        table: &v1::TableSpec,
        blocks: Vec<(u32, Block)>,
        min_version: Version,
    ) -> Result<Vec<(Vec<usize>, bytes::Bytes)>, ClientError> {
        let request = v1::PullRowsRequest {
            table: table.name.clone(),
            blocks: blocks
                .iter()
                .map(|(bucket, block)| v1::RowBlock {
                    bucket: *bucket,
                    ids: encode_ids(&block.ids),
                    rows: Default::default(),
                })
                .collect(),
            min_version: min_version.get(),
            timeout_ms: self.pull_timeout_ms(),
            map_version: self.map_version.get(),
        };
        let malformed = |reason: String| ClientError::Protocol {
            what: Rpc::PullRows,
            addr: server.addr.clone(),
            reason,
        };
        let retry = self.pull_retry();
        let op = || Op::PullRows(request.clone());
        let answer = match self
            .rows_in_session(server, &retry, Rpc::PullRows, op)
            .await?
        {
            Some(Outcome::PullRows(answer)) => answer,
            Some(_) => return Err(malformed("a row pull answered with another outcome".into())),
            None => {
                server
                    .call(&retry, Rpc::PullRows, |mut c| {
                        let request = request.clone();
                        async move { c.pull_rows(request).await }
                    })
                    .await?
            }
        };
        if answer.blocks.len() != blocks.len() {
            return Err(malformed(format!(
                "{} blocks for {} requested",
                answer.blocks.len(),
                blocks.len()
            )));
        }
        let row_bytes = table.width as usize * 4;
        let ids: usize = blocks.iter().map(|(_, block)| block.ids.len()).sum();
        if answer.rows.len() != ids * row_bytes {
            return Err(malformed(format!(
                "{} bytes of rows for {ids} ids of {row_bytes} bytes",
                answer.rows.len()
            )));
        }
        let mut start = 0;
        blocks
            .into_iter()
            .zip(answer.blocks)
            .map(|((bucket, block), pulled)| {
                if pulled.bucket != bucket {
                    return Err(malformed(format!(
                        "bucket {} answered for bucket {bucket}",
                        pulled.bucket
                    )));
                }
                let end = start + block.ids.len() * row_bytes;
                let rows = answer.rows.slice(start..end);
                start = end;
                Ok((block.positions, rows))
            })
            .collect()
    }

    /// Pushes the row gradients of `ids` (each once; `grads` one row per id)
    /// for `(worker, step)` to every server holding a bucket of `table`.
    /// Returns how many buckets took them (the rest were retries already taken).
    pub(crate) async fn push_rows(
        &self,
        table: &v1::TableSpec,
        (worker, step): (Rank, Step),
        ids: &[u64],
        grads: &[f32],
    ) -> Result<usize, ClientError> {
        let width = table.width as usize;
        if grads.len() != ids.len() * width {
            return Err(ClientError::Usage(format!(
                "{} gradient elements for {} ids of width {width}",
                grads.len(),
                ids.len()
            )));
        }
        let owners = self.bucket_owners(table)?;
        let by_server = blocks_by_server(&owners, self.servers.len(), table.buckets, ids, true);
        let mut calls = Vec::new();
        for (server, blocks) in self.servers.iter().zip(by_server) {
            for request in requests_within(blocks, width * 4, payload_limit(server))? {
                let blocks = request
                    .into_iter()
                    .map(|(bucket, block)| {
                        let mut rows = Vec::with_capacity(block.ids.len() * width * 4);
                        for p in &block.positions {
                            extend_rows(&mut rows, &grads[p * width..(p + 1) * width]);
                        }
                        v1::RowBlock {
                            bucket,
                            ids: encode_ids(&block.ids),
                            rows: rows.into(),
                        }
                    })
                    .collect();
                let request = v1::PushRowsRequest {
                    table: table.name.clone(),
                    worker_id: worker.get(),
                    step: step.get(),
                    blocks,
                    map_version: self.map_version.get(),
                };
                calls.push(self.push_rows_to(server, request));
            }
        }
        let answers = all_or_first_error(calls).await?;
        Ok(answers
            .iter()
            .flat_map(|a| &a.buckets)
            .filter(|b| b.accepted)
            .count())
    }

    /// One `PushRows` to `server`: on its session stream when it has one.
    async fn push_rows_to(
        &self,
        server: &Server,
        request: v1::PushRowsRequest,
    ) -> Result<v1::PushRowsResponse, ClientError> {
        let op = || Op::PushRows(request.clone());
        match self
            .rows_in_session(server, &self.retry, Rpc::PushRows, op)
            .await?
        {
            Some(Outcome::PushRows(answer)) => Ok(answer),
            Some(_) => Err(ClientError::Protocol {
                what: Rpc::PushRows,
                addr: server.addr.clone(),
                reason: "a row push answered with another outcome".to_string(),
            }),
            None => {
                server
                    .call(&self.retry, Rpc::PushRows, |mut c| {
                        let request = request.clone();
                        async move { c.push_rows(request).await }
                    })
                    .await
            }
        }
    }

    /// A row operation on `server`'s session stream (gRPC or shared memory),
    /// as the dense pushes and pulls go; `None` when sessions are off or the
    /// server offers none, and the caller makes a unary call. Row requests
    /// are cut to fit one message of either kind (`payload_limit`), so any
    /// session carries them.
    async fn rows_in_session(
        &self,
        server: &Server,
        retry: &crate::retry::RetryPolicy,
        what: Rpc,
        op: impl Fn() -> Op,
    ) -> Result<Option<Outcome>, ClientError> {
        if !self.session {
            return Ok(None);
        }
        let answered = server.in_session(retry, what, op, true).await?;
        Ok(answered.map(|(outcome, _)| outcome))
    }

    fn pull_timeout_ms(&self) -> u64 {
        u64::try_from(self.pull_timeout.as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_pulled_once_and_their_gradients_summed() {
        let unique = UniqueIds::of(&[5, 9, 5, 5, 2]);
        assert_eq!(unique.ids, [5, 9, 2]);
        assert_eq!(unique.index, [0, 1, 0, 0, 2]);
        let rows = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5];
        assert_eq!(
            unique.scatter(&rows, 2),
            [1.0, 1.5, 2.0, 2.5, 1.0, 1.5, 1.0, 1.5, 3.0, 3.5]
        );
        let grads = [1.0, 0.0, 0.5, 0.5, 2.0, 0.0, 4.0, 1.0, 9.0, 9.0];
        assert_eq!(unique.sum(&grads, 2), [7.0, 1.0, 0.5, 0.5, 9.0, 9.0]);
    }

    #[test]
    fn a_push_names_every_bucket_a_server_holds_and_requests_keep_buckets_whole() {
        let owners = [0, 1, 0, 1];
        let ids: Vec<u64> = (0..40).collect();
        let pushed = blocks_by_server(&owners, 2, 4, &ids, true);
        assert_eq!(pushed[0].keys().copied().collect::<Vec<_>>(), [0, 2]);
        assert_eq!(pushed[1].keys().copied().collect::<Vec<_>>(), [1, 3]);
        let pulled = blocks_by_server(&owners, 2, 4, &[3], false);
        let bucket = bucket_of(3, 4);
        assert_eq!(pulled.iter().map(BTreeMap::len).sum::<usize>(), 1);
        assert!(pulled[owners[bucket as usize]].contains_key(&bucket));
        let total: usize = pushed
            .iter()
            .flat_map(|s| s.values())
            .map(|b| b.ids.len())
            .sum();
        assert_eq!(total, 40);
        let server0 = pushed.into_iter().next().unwrap();
        let ids0: usize = server0.values().map(|b| b.ids.len()).sum();
        let one = requests_within(server0, 16, usize::MAX).unwrap();
        assert_eq!(one.len(), 1);
        let small = blocks_by_server(&owners, 2, 4, &ids, true).remove(0);
        let largest = small.values().map(|b| b.ids.len()).max().unwrap();
        let limit = largest * 24 + BLOCK_OVERHEAD_BYTES;
        let split = requests_within(small, 16, limit).unwrap();
        assert_eq!(
            split.len(),
            2,
            "two buckets that do not fit one request together"
        );
        let split_ids: usize = split.iter().flatten().map(|(_, b)| b.ids.len()).sum();
        assert_eq!(split_ids, ids0);
        let too_small = blocks_by_server(&owners, 2, 4, &ids, true).remove(0);
        assert!(requests_within(too_small, 16, 40).is_err());
    }
}
