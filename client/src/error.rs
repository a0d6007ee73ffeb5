//! [`ClientError`]: why a call to the cluster failed, and [`Recovery`]: the one
//! classifier that says what a worker does about it ([`Repair`] for what a
//! placement repair fixes).

use ps_common::rendezvous::RendezvousError;
use ps_proto::ids::{MapVersion, Step, Version};
use ps_proto::metadata;
use tonic::Status;

use crate::retry::is_transient;

/// The calls a client makes to the cluster, as its errors name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    /// A server's `JoinGroup`.
    JoinGroup,
    /// A server's `Register`.
    Register,
    /// A server's `RegisterStream`.
    RegisterStream,
    /// A server's `Push`.
    Push,
    /// A server's `PushStream`.
    PushStream,
    /// A server's `Pull`.
    Pull,
    /// A server's `PullStream`.
    PullStream,
    /// A push and then a pull as one operation on a server's `Session`.
    PushPull,
    /// A server's `DeclareTable`.
    DeclareTable,
    /// A server's `PullRows`.
    PullRows,
    /// A server's `PushRows`.
    PushRows,
    /// The scheduler's `RegisterWorker`.
    RegisterWorker,
    /// The scheduler's `DeclareParams`.
    DeclareParams,
    /// The scheduler's `GetShardMap`.
    GetShardMap,
}

impl Rpc {
    /// The method's name in `ps.v1` (for `PushPull`, the session operation's).
    pub fn name(self) -> &'static str {
        match self {
            Rpc::JoinGroup => "JoinGroup",
            Rpc::Register => "Register",
            Rpc::RegisterStream => "RegisterStream",
            Rpc::Push => "Push",
            Rpc::PushStream => "PushStream",
            Rpc::Pull => "Pull",
            Rpc::PullStream => "PullStream",
            Rpc::PushPull => "PushPull",
            Rpc::DeclareTable => "DeclareTable",
            Rpc::PullRows => "PullRows",
            Rpc::PushRows => "PushRows",
            Rpc::RegisterWorker => "RegisterWorker",
            Rpc::DeclareParams => "DeclareParams",
            Rpc::GetShardMap => "GetShardMap",
        }
    }
}

impl std::fmt::Display for Rpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a parameter-server call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made.
    #[error("cannot connect to parameter server {addr}: {source}; is it running and reachable?")]
    Connect {
        /// The server's address.
        addr: String,
        /// The transport error.
        source: tonic::transport::Error,
    },
    /// A server refused or failed a request.
    #[error("{what} on {addr} failed: {code:?}: {message}", code = status.code(), message = status.message())]
    Rpc {
        /// The call.
        what: Rpc,
        /// The server's address.
        addr: String,
        /// Its answer.
        status: Status,
    },
    /// A peer never came up, or is not what it should be.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// A server answered with something that does not fit the request.
    #[error("{addr} answered {what} with an unexpected response: {reason}")]
    Protocol {
        /// The call.
        what: Rpc,
        /// The server's address.
        addr: String,
        /// What does not fit.
        reason: String,
    },
    /// The client was given no servers, or a parameter it has not placed.
    #[error("{0}")]
    Usage(String),
}

/// What a worker at some step does about a failed call. Each error has exactly
/// one answer, so callers never depend on the order of their checks; the
/// [`Recovering`](crate::recovery::Recovering) machine acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The group completed this worker's step without it (it was declared dead
    /// while it stalled, or rejoined as the step closed): load the values at
    /// this step and go on from there.
    Rejoin {
        /// The group's step.
        step: Step,
    },
    /// Placement can be repaired, and the call repeated.
    Repair(Repair),
    /// Nothing placement can repair: the request or the job is wrong.
    Fatal,
}

/// A failure a placement repair fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// A server routes by a newer shard map: fetch it, then register this
    /// worker's copy of the keys.
    StaleMap {
        /// The newer map's version.
        version: MapVersion,
    },
    /// A server holds a key at an older version than this worker's copy (it
    /// restored it from an older copy): offer this worker's copy.
    KeyBehind {
        /// The key's version.
        version: Version,
    },
    /// A server answered but lacks keys it was sent (it restarted empty at the
    /// same address, or just took them over): register them again.
    KeysMissing,
    /// A server is unreachable after the retries: wait for a map without it, or
    /// its return at its address, then register the keys again.
    ServerLost,
}

impl ClientError {
    /// What a worker that pushed (or is about to push) `step` does about this error.
    pub fn recovery(&self, step: Step) -> Recovery {
        if let Some(key_version) = self.key_version() {
            return if key_version.get() > step.get() {
                Recovery::Rejoin {
                    step: key_version.next_step(),
                }
            } else {
                Recovery::Repair(Repair::KeyBehind {
                    version: key_version,
                })
            };
        }
        if let Some(version) = self.stale_map() {
            return Recovery::Repair(Repair::StaleMap { version });
        }
        self.server_fault()
            .map_or(Recovery::Fatal, Recovery::Repair)
    }

    /// A server that lacks keys or cannot be reached, as its status alone
    /// tells (no version named).
    fn server_fault(&self) -> Option<Repair> {
        match self {
            ClientError::Rpc { status, .. } if status.code() == tonic::Code::NotFound => {
                Some(Repair::KeysMissing)
            }
            ClientError::Rpc { status, .. } if is_transient(status) => Some(Repair::ServerLost),
            ClientError::Connect { .. } => Some(Repair::ServerLost),
            _ => None,
        }
    }

    /// True while a server that was lost still looks lost: unreachable, or
    /// not yet holding the keys, whatever step the worker is at.
    pub(crate) fn still_lost(&self) -> bool {
        self.key_version().is_none() && self.stale_map().is_none() && self.server_fault().is_some()
    }

    /// The newer shard-map version a server named when it refused this client's map.
    pub fn stale_map(&self) -> Option<MapVersion> {
        self.status_version(metadata::MAP_VERSION).map(MapVersion)
    }

    /// The version a key was at when a server refused this worker's push of a
    /// step the key cannot take: above the step when the group completed it
    /// without this worker, at or below it when the key is behind this worker
    /// (restored from an older copy).
    pub fn key_version(&self) -> Option<Version> {
        self.status_version(metadata::KEY_VERSION).map(Version)
    }

    fn status_version(&self, key: &'static str) -> Option<u64> {
        match self {
            ClientError::Rpc { status, .. } => metadata::version_in(status, key),
            _ => None,
        }
    }

    /// True when the scheduler had no newer shard map within the wait.
    pub(crate) fn no_newer_map(&self) -> bool {
        matches!(self, ClientError::Rpc { what: Rpc::GetShardMap, status, .. } if status.code() == tonic::Code::DeadlineExceeded)
    }
}

/// The values of calls that all ran to their end, or the error to act on: the
/// highest key version a refused step named when any server named one (a step
/// completed without this worker wins over a key behind it), otherwise the
/// first error.
pub(crate) fn settled<T>(outcomes: Vec<Result<T, ClientError>>) -> Result<Vec<T>, ClientError> {
    let mut values = Vec::with_capacity(outcomes.len());
    let mut chosen: Option<ClientError> = None;
    for outcome in outcomes {
        match outcome {
            Ok(value) => values.push(value),
            Err(error) => {
                let newer = |c: &ClientError| error.key_version() > c.key_version();
                if chosen.as_ref().is_none_or(newer) {
                    chosen = Some(error);
                }
            }
        }
    }
    chosen.map_or(Ok(values), Err)
}

#[cfg(test)]
mod tests {
    use tonic::Code;
    use tonic::metadata::MetadataValue;

    use super::*;

    fn rpc(code: Code, versions: &[(&'static str, u64)]) -> ClientError {
        let mut status = Status::new(code, "refused");
        for (key, version) in versions {
            let value = MetadataValue::try_from(version.to_string()).unwrap();
            status.metadata_mut().insert(*key, value);
        }
        ClientError::Rpc {
            what: Rpc::Push,
            addr: "s0:1".into(),
            status,
        }
    }

    #[test]
    fn every_error_has_one_recovery() {
        let step = Step(10);
        let cases = [
            (
                rpc(Code::FailedPrecondition, &[(metadata::KEY_VERSION, 12)]),
                Recovery::Rejoin { step: Step(12) },
            ),
            (
                rpc(Code::FailedPrecondition, &[(metadata::KEY_VERSION, 10)]),
                Recovery::Repair(Repair::KeyBehind {
                    version: Version(10),
                }),
            ),
            (
                rpc(Code::FailedPrecondition, &[(metadata::KEY_VERSION, 3)]),
                Recovery::Repair(Repair::KeyBehind {
                    version: Version(3),
                }),
            ),
            (
                rpc(Code::FailedPrecondition, &[(metadata::MAP_VERSION, 4)]),
                Recovery::Repair(Repair::StaleMap {
                    version: MapVersion(4),
                }),
            ),
            (
                rpc(Code::NotFound, &[]),
                Recovery::Repair(Repair::KeysMissing),
            ),
            (
                rpc(Code::Unavailable, &[]),
                Recovery::Repair(Repair::ServerLost),
            ),
            (
                rpc(Code::Cancelled, &[]),
                Recovery::Repair(Repair::ServerLost),
            ),
            (rpc(Code::InvalidArgument, &[]), Recovery::Fatal),
            (rpc(Code::FailedPrecondition, &[]), Recovery::Fatal),
            (rpc(Code::DeadlineExceeded, &[]), Recovery::Fatal),
            (ClientError::Usage("no servers".into()), Recovery::Fatal),
        ];
        for (error, expected) in cases {
            assert_eq!(error.recovery(step), expected, "{error}");
            let lost = matches!(
                expected,
                Recovery::Repair(Repair::KeysMissing | Repair::ServerLost)
            );
            assert_eq!(error.still_lost(), lost, "{error}");
        }
    }

    #[test]
    fn a_step_completed_without_the_worker_wins_over_other_refusals() {
        let outcomes: Vec<Result<usize, ClientError>> = vec![
            Ok(3),
            Err(rpc(Code::FailedPrecondition, &[(metadata::KEY_VERSION, 5)])),
            Err(rpc(Code::FailedPrecondition, &[(metadata::KEY_VERSION, 9)])),
            Err(rpc(Code::Unavailable, &[])),
        ];
        let chosen = settled(outcomes).unwrap_err();
        assert_eq!(chosen.recovery(Step(7)), Recovery::Rejoin { step: Step(9) });
        assert_eq!(
            settled(vec![Ok::<_, ClientError>(1), Ok(2)]).unwrap(),
            vec![1, 2]
        );
    }
}
