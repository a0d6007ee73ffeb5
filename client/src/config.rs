//! [`ClientConfig`]: how a client reaches the cluster, with its defaults.

use std::time::Duration;

use ps_shm::DataPathMode;

use ps_proto::chunk::DEFAULT_CHUNK_BYTES;
use ps_proto::transport::TransportConfig;

use crate::placement::DEFAULT_PARTITION_BYTES;
use crate::retry::RetryPolicy;

/// How long a client waits for its peers to come up, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Requests a push or pull keeps in flight to one server, by default.
pub const DEFAULT_REQUESTS_PER_SERVER: usize = 4;

/// Pushes and pulls of this many bytes or more go to `PushStream` and
/// `PullStream` in chunks; smaller ones to the unary `Push` and `Pull`, whose
/// fixed cost is lower. Both are sent framed, their tensor bytes never copied
/// on the way (`framed.rs`).
pub(crate) const FRAMED_FROM_BYTES: usize = 64 << 10;

/// The smallest group of keys sent as a request of its own: below this, a
/// request's fixed cost outweighs what overlapping it with another saves.
pub(crate) const MIN_GROUP_BYTES: usize = 1 << 20;

/// When a request goes as one unary message and when as a stream of chunks:
/// the client's size rules in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SizeRules {
    /// The most tensor bytes one message may carry (the transport's limit, less
    /// the message's own overhead).
    payload_limit: usize,
}

impl SizeRules {
    /// The rules for `config`'s transport.
    pub(crate) fn of(config: &ClientConfig) -> Self {
        Self {
            payload_limit: config.transport.payload_limit(),
        }
    }

    /// A registration goes unary whenever one message can carry it: it is
    /// made once, so only the message limit matters.
    pub(crate) fn register_is_unary(self, bytes: usize) -> bool {
        bytes <= self.payload_limit
    }

    /// A push or pull goes unary below [`FRAMED_FROM_BYTES`], when one message
    /// can carry it.
    pub(crate) fn transfer_is_unary(self, bytes: usize) -> bool {
        bytes < FRAMED_FROM_BYTES && bytes <= self.payload_limit
    }
}

/// How a client reaches the parameter servers.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server addresses (`host:port` or URIs); parameters are spread over all of them.
    pub servers: Vec<String>,
    /// HTTP/2 and message-size settings.
    pub transport: TransportConfig,
    /// No part of a parameter is larger than this.
    pub partition_bytes: usize,
    /// Chunk size of streamed requests.
    pub chunk_bytes: usize,
    /// Requests a push or pull keeps in flight to one server at once: its keys
    /// are cut into this many groups of similar bytes (none under 1 MiB), so
    /// the server applies or encodes one group while the next is on the wire.
    pub requests_per_server: usize,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
    /// How long a pull waits for its version (and a start-up wait for the shard map).
    pub pull_timeout: Duration,
    /// How long [`crate::PsClient::connect`] waits for the servers (or the
    /// scheduler) to come up.
    pub connect_timeout: Duration,
    /// A scheduler to take ranks, placement and servers from (instead of `servers`).
    pub scheduler: Option<String>,
    /// Send pushes and pulls that fit one message on one long-lived `Session`
    /// stream per server (a unary call each where a server does not offer
    /// sessions); false: a unary call each.
    pub session: bool,
    /// In a training step's push-then-pull, pull each group of keys as soon as
    /// its push is answered, while later groups are still being pushed (both
    /// directions of each link at once); false: push everything, then pull.
    pub pipeline: bool,
    /// Least bytes of one pipelined group (a part larger than this is a group
    /// on its own): smaller groups start the pulls sooner and leave less of
    /// the step with one direction idle, at one request each. `None` (the
    /// default): 1 MiB. On a slow link, cut the map finer as well (the
    /// scheduler's `--partition-bytes`): a part is never split.
    pub pipeline_group_bytes: Option<usize>,
    /// Sessions with a server on this host go through shared memory (`auto`,
    /// the default, falling back to gRPC; `shm`, failing without it), or
    /// always over gRPC (`grpc`).
    pub data_path: DataPathMode,
}

impl ClientConfig {
    /// Defaults for `servers`.
    pub fn new(servers: Vec<String>) -> Self {
        Self {
            servers,
            transport: TransportConfig::default(),
            partition_bytes: DEFAULT_PARTITION_BYTES,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            requests_per_server: DEFAULT_REQUESTS_PER_SERVER,
            retry: RetryPolicy::default(),
            pull_timeout: Duration::from_secs(60),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            scheduler: None,
            session: true,
            pipeline: true,
            pipeline_group_bytes: None,
            data_path: DataPathMode::Auto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_is_unary_up_to_the_payload_limit_and_a_transfer_below_64_kib() {
        let small = SizeRules {
            payload_limit: 1000,
        };
        assert!(small.register_is_unary(1000) && !small.register_is_unary(1001));
        assert!(small.transfer_is_unary(1000) && !small.transfer_is_unary(1001));
        let large = SizeRules::of(&ClientConfig::new(Vec::new()));
        assert!(large.register_is_unary(FRAMED_FROM_BYTES));
        assert!(large.transfer_is_unary(FRAMED_FROM_BYTES - 1));
        assert!(!large.transfer_is_unary(FRAMED_FROM_BYTES));
    }
}
