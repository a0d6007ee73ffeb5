//! [`ServerConfig`]: everything a parameter-server shard can be told, with
//! defaults that suit one machine, and [`ServerConfig::validate`].

use std::time::Duration;

use ps_proto::chunk::DEFAULT_CHUNK_BYTES;
use ps_proto::transport::{DEFAULT_SERVER_STREAM_WINDOW_BYTES, TransportConfig, TransportError};
use ps_shm::DataPathMode;

use crate::budget::default_budget;
use crate::checkpointer::CheckpointConfig;
use crate::consistency::Consistency;
use crate::follower::SchedulerLink;
use crate::param::Group;
use crate::push_buffer::DEFAULT_PUSH_BUFFER_BYTES;
use crate::store::StoreRules;

/// Default largest parameter: 4 GiB of values (Adam keeps two more copies).
pub const DEFAULT_MAX_TENSOR_BYTES: usize = 4 << 30;

/// How long a push or register stream may send nothing, by default.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of one parameter-server shard.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// BSP, ASP or SSP(k).
    pub consistency: Consistency,
    /// Workers in the BSP/SSP group; gradients are scaled by `1 / workers`.
    pub workers: u32,
    /// Refuse NaN and infinite gradients and initial values.
    pub reject_non_finite: bool,
    /// Largest parameter (or partition) a client may register, in bytes of values.
    pub max_tensor_bytes: usize,
    /// Bytes this server may hold: keys (charged when registered), buffered
    /// stream data and pulls in flight.
    pub memory_budget: usize,
    /// How long a pull waits for its version when the request names no timeout.
    pub default_pull_timeout: Duration,
    /// The longest wait a pull may ask for.
    pub max_pull_timeout: Duration,
    /// Bytes per chunk of PullStream responses when the request names none.
    pub chunk_bytes: usize,
    /// How long shutdown waits for requests in flight before closing connections.
    pub shutdown_grace: Duration,
    /// A push or register stream that sends nothing for this long is ended with
    /// `DEADLINE_EXCEEDED`, and nothing of it is applied.
    pub stream_idle_timeout: Duration,
    /// Bytes of push streams read ahead of applying them; a stream that finds
    /// no room waits, unread (see [`crate::push_buffer`]).
    pub push_buffer_bytes: usize,
    /// The scheduler to follow, if any.
    pub scheduler: Option<SchedulerLink>,
    /// Checkpoints, when set.
    pub checkpoint: Option<CheckpointConfig>,
    /// HTTP/2 and message-size settings.
    pub transport: TransportConfig,
    /// Whether workers on this host are offered shared memory (`--data-path`).
    pub shared_memory: SharedMemoryConfig,
    /// Also serve gRPC on a Unix-domain socket at this path (workers on this
    /// host reach it at `unix:PATH`).
    pub unix_socket: Option<std::path::PathBuf>,
}

/// The same-host data path's settings (see `ps_shm`).
#[derive(Debug, Clone, PartialEq)]
pub struct SharedMemoryConfig {
    /// `auto` (the default): offered when the socket can be made, gRPC alone
    /// otherwise; `grpc`: never offered; `shm`: the server fails to start
    /// when it cannot offer it.
    pub mode: DataPathMode,
    /// Bytes of each of a session region's two rings.
    pub ring_bytes: u64,
}

impl Default for SharedMemoryConfig {
    fn default() -> Self {
        Self {
            mode: DataPathMode::Auto,
            ring_bytes: ps_shm::DEFAULT_RING_BYTES,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            consistency: Consistency::Bsp,
            workers: 1,
            reject_non_finite: true,
            max_tensor_bytes: DEFAULT_MAX_TENSOR_BYTES,
            memory_budget: default_budget(),
            default_pull_timeout: Duration::from_secs(60),
            max_pull_timeout: Duration::from_secs(600),
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            shutdown_grace: Duration::from_secs(5),
            push_buffer_bytes: DEFAULT_PUSH_BUFFER_BYTES,
            scheduler: None,
            checkpoint: None,
            transport: TransportConfig {
                stream_window_bytes: DEFAULT_SERVER_STREAM_WINDOW_BYTES,
                ..TransportConfig::default()
            },
            shared_memory: SharedMemoryConfig::default(),
            unix_socket: None,
        }
    }
}

/// Server settings that do not make sense together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No worker to wait for.
    #[error("--workers must be at least 1")]
    NoWorkers,
    /// Chunks that do not fit a message.
    #[error(
        "chunk size {chunk} bytes must be at least 4 and leave 1 KiB of room under the {limit}-byte message limit"
    )]
    ChunkSize {
        /// The chunk size.
        chunk: usize,
        /// The message limit.
        limit: usize,
    },
    /// A default wait longer than the cap.
    #[error("default pull timeout {default:?} exceeds the maximum {max:?}")]
    PullTimeout {
        /// The default wait.
        default: Duration,
        /// The cap.
        max: Duration,
    },
    /// A transport setting out of range.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

impl ServerConfig {
    /// Checks that the settings make sense together.
    ///
    /// # Errors
    /// The setting to change, and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        if self.chunk_bytes < 4 || self.chunk_bytes + 1024 > self.transport.max_message_bytes {
            return Err(ConfigError::ChunkSize {
                chunk: self.chunk_bytes,
                limit: self.transport.max_message_bytes,
            });
        }
        if self.default_pull_timeout > self.max_pull_timeout {
            return Err(ConfigError::PullTimeout {
                default: self.default_pull_timeout,
                max: self.max_pull_timeout,
            });
        }
        Ok(self.transport.validate()?)
    }

    /// The rules the store enforces.
    pub fn store_rules(&self) -> StoreRules {
        StoreRules {
            group: Group {
                consistency: self.consistency,
                workers: self.workers,
            },
            reject_non_finite: self.reject_non_finite,
            max_tensor_bytes: self.max_tensor_bytes,
            memory_budget: self.memory_budget,
        }
    }

    /// The wait for a pull that asked for `requested_ms` (0: the default), capped.
    pub fn pull_timeout(&self, requested_ms: u64) -> Duration {
        if requested_ms == 0 {
            self.default_pull_timeout
        } else {
            Duration::from_millis(requested_ms).min(self.max_pull_timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(ServerConfig::default().validate(), Ok(()));
    }

    #[test]
    fn zero_workers_is_refused() {
        let config = ServerConfig {
            workers: 0,
            ..ServerConfig::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--workers")
        );
    }

    #[test]
    fn chunks_must_fit_in_a_message() {
        let config = ServerConfig {
            chunk_bytes: 4 << 20,
            ..ServerConfig::default()
        };
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("message limit")
        );
    }

    #[test]
    fn pull_timeout_is_capped() {
        let config = ServerConfig::default();
        assert_eq!(config.pull_timeout(0), config.default_pull_timeout);
        assert_eq!(config.pull_timeout(5), Duration::from_millis(5));
        assert_eq!(config.pull_timeout(u64::MAX), config.max_pull_timeout);
    }
}
