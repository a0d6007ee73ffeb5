//! Waiting for a peer to come up, as torchrun and ps-lite do: a process started
//! before the one it needs waits, with bounded backoff and up to a deadline, and
//! says once what it waits for. A peer that answers but is not what was asked for
//! (an HTTP server, another gRPC service, the scheduler where a parameter server
//! was meant) is named as such at once instead of failing on the first request.
//!
//! What a peer is comes from the standard gRPC health service, which every
//! candle-ps process serves with the name of its own service.

use std::time::{Duration, Instant};

use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use ps_proto::dial::Dialer;
use ps_proto::transport::TransportConfig;

/// The kinds of candle-ps process a peer can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A `ps-server`.
    ParameterServer,
    /// A `ps-scheduler`.
    Scheduler,
    /// A `ps-microbench` server.
    Bench,
}

impl Peer {
    const ALL: [Peer; 3] = [Peer::ParameterServer, Peer::Scheduler, Peer::Bench];

    /// The gRPC service it serves, as its health service names it.
    pub const fn grpc_service(self) -> &'static str {
        match self {
            Peer::ParameterServer => "ps.v1.ParameterServer",
            Peer::Scheduler => "ps.v1.Scheduler",
            Peer::Bench => "ps.v1.Bench",
        }
    }

    /// What a person calls it.
    pub const fn describe(self) -> &'static str {
        match self {
            Peer::ParameterServer => "a candle-ps parameter server (ps-server)",
            Peer::Scheduler => "a candle-ps scheduler (ps-scheduler)",
            Peer::Bench => "a candle-ps benchmark server (ps-microbench serve)",
        }
    }
}

/// Why no usable peer was found.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    /// The address does not make a URI.
    #[error("bad address {addr}: {reason}")]
    Address {
        /// The address.
        addr: String,
        /// What is wrong.
        reason: String,
    },
    /// Nothing usable answered before the deadline.
    #[error(
        "waited {waited:.1?} for {wanted} at {addr}, but it never came up (last: {last}); is it running, and is the address right? (--connect-timeout sets how long to wait)"
    )]
    TimedOut {
        /// The address.
        addr: String,
        /// What was waited for.
        wanted: String,
        /// How long.
        waited: Duration,
        /// The last failure.
        last: String,
    },
    /// The TLS handshake failed in a way that waiting cannot mend.
    #[error("TLS with {addr} failed: {reason}; {hint}")]
    Tls {
        /// The address.
        addr: String,
        /// What the handshake said.
        reason: String,
        /// What to check.
        hint: &'static str,
    },
    /// Something answered that is not what was asked for.
    #[error("{addr} answers, but it is {found}, not {wanted}; check the address")]
    WrongPeer {
        /// The address.
        addr: String,
        /// What was asked for.
        wanted: String,
        /// What answered.
        found: String,
    },
}

/// What one look at the address found.
enum Probe {
    Ready(Peer),
    NotYet(String),
    Wrong(String),
}

/// Waits until the process at `addr` serves one of `wanted`, for at most
/// `timeout`; returns which one, and the open channel to it.
///
/// # Errors
/// [`RendezvousError::WrongPeer`] at once when something else answers;
/// [`RendezvousError::TimedOut`] naming the last failure.
pub async fn rendezvous(
    addr: &str,
    wanted: &[Peer],
    transport: &TransportConfig,
    timeout: Duration,
) -> Result<(Peer, Channel), RendezvousError> {
    let wanted_text = wanted
        .iter()
        .map(|p| p.describe())
        .collect::<Vec<_>>()
        .join(" or ");
    let dialer = Dialer::new(transport, addr).map_err(|e| RendezvousError::Address {
        addr: addr.into(),
        reason: e.to_string(),
    })?;
    let started = Instant::now();
    let mut backoff = Duration::from_millis(50);
    let mut said_waiting = false;
    loop {
        let last = match dialer.connect().await {
            Err(error) => {
                let reason = error_chain(&error);
                if let Some(hint) = tls_mismatch(&reason) {
                    return Err(RendezvousError::Tls {
                        addr: addr.into(),
                        reason,
                        hint,
                    });
                }
                reason
            }
            Ok(channel) => match probe(addr, channel.clone(), wanted).await {
                Probe::Ready(peer) => {
                    if said_waiting {
                        tracing::info!(addr, after = ?started.elapsed(), "{} is up", peer.describe());
                    }
                    return Ok((peer, channel));
                }
                Probe::NotYet(why) => why,
                Probe::Wrong(found) => {
                    return Err(RendezvousError::WrongPeer {
                        addr: addr.into(),
                        wanted: wanted_text,
                        found,
                    });
                }
            },
        };
        let waited = started.elapsed();
        if waited + backoff > timeout {
            return Err(RendezvousError::TimedOut {
                addr: addr.into(),
                wanted: wanted_text,
                waited,
                last,
            });
        }
        if !said_waiting {
            tracing::info!(addr, ?timeout, reason = %last, "waiting for {wanted_text} to come up");
            said_waiting = true;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// What to check when a connection failed for a TLS reason that retrying will not
/// change; `None` for any other failure.
pub fn tls_mismatch(reason: &str) -> Option<&'static str> {
    if reason.contains("invalid peer certificate") {
        Some(
            "its certificate is not signed by the CA given as --tls-ca, has expired, or lacks the name --tls-server-name",
        )
    } else if reason.contains("corrupt message") {
        Some("it does not speak TLS: start it with --tls-* too, or connect without --tls-ca")
    } else {
        None
    }
}

/// Asks the health service which candle-ps service the peer serves.
async fn probe(addr: &str, channel: Channel, wanted: &[Peer]) -> Probe {
    let mut health = HealthClient::new(channel);
    let mut found = None;
    // What was asked for first, then the others, to name what answered instead.
    let order = wanted
        .iter()
        .chain(Peer::ALL.iter().filter(|p| !wanted.contains(p)));
    for &peer in order {
        let request = HealthCheckRequest {
            service: peer.grpc_service().into(),
        };
        match health.check(request).await {
            Ok(response) if wanted.contains(&peer) => {
                return match ServingStatus::try_from(response.into_inner().status) {
                    Ok(ServingStatus::Serving) => Probe::Ready(peer),
                    _ => Probe::NotYet(format!("{} is not serving yet", peer.describe())),
                };
            }
            Ok(_) => {
                found.get_or_insert(peer);
            }
            Err(status) if status.code() == Code::NotFound => {}
            Err(status) if status.code() == Code::Unimplemented => {
                return Probe::Wrong(
                    "a gRPC server without the health service, so not a candle-ps process".into(),
                );
            }
            Err(status) => {
                let failure = format!("{:?}: {}", status.code(), error_chain(&status));
                return match sniff(addr).await {
                    Some(found) => Probe::Wrong(found),
                    None => Probe::NotYet(failure),
                };
            }
        }
    }
    Probe::Wrong(found.map_or_else(
        || "a gRPC server that serves none of candle-ps's services".into(),
        |peer| peer.describe().into(),
    ))
}

/// After a gRPC call failed below gRPC: opens a plain connection, says the
/// HTTP/2 client preface and an empty SETTINGS frame, and reads the first bytes
/// back. An HTTP/2 server answers with a SETTINGS frame (`None`: gRPC may work
/// once it is up); anything else is named.
async fn sniff(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    const SETTINGS: u8 = 0x4;
    let look = async {
        let mut socket = tokio::net::TcpStream::connect(addr).await.ok()?;
        socket.write_all(PREFACE).await.ok()?;
        let mut head = [0u8; 9];
        let read = socket.read(&mut head).await.ok()?;
        Some(head[..read].to_vec())
    };
    let head = tokio::time::timeout(Duration::from_secs(2), look)
        .await
        .ok()??;
    if head.is_empty() || (head.len() >= 4 && head[3] == SETTINGS) {
        None
    } else if head.starts_with(b"HTTP/") {
        Some("an HTTP/1 server, which cannot carry gRPC (gRPC needs HTTP/2)".into())
    } else {
        Some("a server that does not speak gRPC over HTTP/2".into())
    }
}

/// An error and its sources, each said once (transport errors repeat their
/// source's words in their own message).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}
