//! [`ClientConfig`]: how a client reaches the cluster, with its defaults.

use std::time::Duration;

use ps_proto::chunk::DEFAULT_CHUNK_BYTES;
use ps_proto::transport::TransportConfig;

use crate::placement::DEFAULT_PARTITION_BYTES;
use crate::retry::RetryPolicy;

/// How long a client waits for its peers to come up, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Requests a push or pull keeps in flight to one server, by default.
pub const DEFAULT_REQUESTS_PER_SERVER: usize = 4;

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
        }
    }
}
