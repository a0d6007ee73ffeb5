//! [`SchedulerConfig`]: the scheduler's settings and their validation.

use std::time::Duration;

use ps_proto::consistency::Consistency;
use ps_proto::placement::{DEFAULT_PART_BYTES, check_partition_bytes};
use ps_proto::transport::TransportConfig;

use crate::group::GroupSize;

/// Settings of the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Workers in the group: a fixed number or an elastic range.
    pub workers: GroupSize,
    /// For an elastic group: how long registrations must stay quiet (with at least
    /// the minimum registered) before the group forms.
    pub join_window: Duration,
    /// Servers that must register before the first map is published.
    pub min_servers: usize,
    /// Consistency model announced to workers.
    pub consistency: Consistency,
    /// The largest part a shard map cuts a parameter into.
    pub partition_bytes: usize,
    /// How often nodes heartbeat.
    pub heartbeat_interval: Duration,
    /// Silence after which a node is declared dead.
    pub heartbeat_timeout: Duration,
    /// How long a map or barrier wait lasts when the request names no timeout.
    pub default_wait: Duration,
    /// The longest wait a request may ask for.
    pub max_wait: Duration,
    /// Exit once every worker has left on purpose (after servers had time to hear
    /// it from their heartbeats), so a compose cluster ends with its job.
    pub exit_when_done: bool,
    /// Where to keep the state that carries the scheduler across a restart.
    pub state_file: Option<std::path::PathBuf>,
    /// HTTP/2 settings and TLS of the scheduler's server.
    pub transport: TransportConfig,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            workers: GroupSize::fixed(1),
            join_window: Duration::from_secs(2),
            min_servers: 1,
            consistency: Consistency::Bsp,
            partition_bytes: DEFAULT_PART_BYTES,
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(3),
            default_wait: Duration::from_secs(60),
            max_wait: Duration::from_secs(600),
            exit_when_done: false,
            state_file: None,
            transport: TransportConfig::default(),
        }
    }
}

impl SchedulerConfig {
    /// Checks that the settings make sense together.
    ///
    /// # Errors
    /// The setting to change, and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers.min == 0 || self.min_servers == 0 {
            return Err(ConfigError::Empty);
        }
        if self.workers.min > self.workers.max {
            return Err(ConfigError::Workers(self.workers.to_string()));
        }
        check_partition_bytes(self.partition_bytes).map_err(ConfigError::Partition)?;
        if self.heartbeat_timeout < self.heartbeat_interval * 2 {
            return Err(ConfigError::Heartbeat {
                timeout: self.heartbeat_timeout,
                interval: self.heartbeat_interval,
            });
        }
        Ok(())
    }
}

/// Scheduler settings that do not make sense together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A job with no worker or no server.
    #[error("--workers and --servers must be at least 1")]
    Empty,
    /// A worker range whose minimum is above its maximum.
    #[error("--workers {0}: the minimum is above the maximum")]
    Workers(String),
    /// A partition size outside what the planner cuts.
    #[error("--partition-bytes: {0}")]
    Partition(String),
    /// A heartbeat timeout that would declare live nodes dead.
    #[error(
        "the heartbeat timeout {timeout:?} must be at least twice the interval {interval:?}, or live nodes would be declared dead"
    )]
    Heartbeat {
        /// The timeout.
        timeout: Duration,
        /// The interval.
        interval: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_tight_timeouts_are_refused() {
        assert_eq!(SchedulerConfig::default().validate(), Ok(()));
        let tight = SchedulerConfig {
            heartbeat_timeout: Duration::from_millis(600),
            ..SchedulerConfig::default()
        };
        assert!(
            tight
                .validate()
                .unwrap_err()
                .to_string()
                .contains("twice the interval")
        );
        for bytes in [1024, 8 << 20] {
            let odd = SchedulerConfig {
                partition_bytes: bytes,
                ..SchedulerConfig::default()
            };
            let error = odd.validate().unwrap_err().to_string();
            assert!(
                error.contains("--partition-bytes") && error.contains("64KiB to 4MiB"),
                "{error}"
            );
        }
    }
}
