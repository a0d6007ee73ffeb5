//! Asking a candle-ps process whether it serves: a client of the standard gRPC
//! health service (`grpc.health.v1.Health`). Container health checks run it through
//! each binary's `health` subcommand, because the images have no shell or curl.

use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use ps_proto::dial::Dialer;
use ps_proto::transport::TransportConfig;

use crate::rendezvous::error_chain;

/// Why a process is not healthy.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The address is not usable as a URI.
    #[error("bad address {addr}: {reason}")]
    Address {
        /// The address.
        addr: String,
        /// What is wrong.
        reason: String,
    },
    /// Nothing answered in time.
    #[error("{addr} did not answer the health check within {timeout:?}")]
    Timeout {
        /// The address.
        addr: String,
        /// How long it waited.
        timeout: Duration,
    },
    /// The connection or the call failed.
    #[error("{addr} is unreachable or refused the health check: {reason}")]
    Unreachable {
        /// The address.
        addr: String,
        /// The transport error or gRPC status.
        reason: String,
    },
    /// It answered, but not SERVING.
    #[error("{addr} answers but is {status:?} (for example shutting down)")]
    NotServing {
        /// The address.
        addr: String,
        /// What it reported.
        status: ServingStatus,
    },
}

/// Checks that the process at `addr` reports SERVING for `service` (`""` is the
/// whole server), within `timeout`.
///
/// # Errors
/// A [`HealthError`] saying what failed.
pub async fn check(
    addr: &str,
    service: &str,
    transport: &TransportConfig,
    timeout: Duration,
) -> Result<(), HealthError> {
    let ask = async {
        let dialer = Dialer::new(transport, addr).map_err(|e| HealthError::Address {
            addr: addr.into(),
            reason: e.to_string(),
        })?;
        let unreachable = |reason: String| HealthError::Unreachable {
            addr: addr.into(),
            reason,
        };
        let channel = dialer
            .connect()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        let request = HealthCheckRequest {
            service: service.into(),
        };
        let response = HealthClient::new(channel)
            .check(request)
            .await
            .map_err(|s| unreachable(format!("{:?}: {}", s.code(), s.message())))?;
        match ServingStatus::try_from(response.into_inner().status) {
            Ok(ServingStatus::Serving) => Ok(()),
            other => Err(HealthError::NotServing {
                addr: addr.into(),
                status: other.unwrap_or(ServingStatus::Unknown),
            }),
        }
    };
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| HealthError::Timeout {
            addr: addr.into(),
            timeout,
        })?
}

/// What a binary's `health` subcommand does: checks `addr` (over `transport`,
/// so with TLS when the process was given it) within 3 seconds, prints
/// `healthy: ...` to stdout or `unhealthy: <why>` to stderr, and returns the
/// exit code for the process (0 healthy, 1 not).
pub async fn report(addr: &str, transport: &TransportConfig) -> i32 {
    match check(addr, "", transport, Duration::from_secs(3)).await {
        Ok(()) => {
            println!("healthy: {addr} is serving");
            0
        }
        Err(error) => {
            eprintln!("unhealthy: {error}");
            1
        }
    }
}
