//! The gRPC metadata keys a parameter server adds to a refusal, so that a client
//! can act on it without parsing the message: defined once, here, for the server
//! that writes them and every client that reads them.

use tonic::{Code, Status};

/// On a `FAILED_PRECONDITION` for a stale shard map: the map version the server knows.
pub const MAP_VERSION: &str = "ps-shard-map-version";

/// On a `FAILED_PRECONDITION` for a push whose step the key cannot take: the
/// version the key is at. Above the pushed step, the group completed that step
/// without the worker (it joins at this version); at or below it, the key is
/// behind the worker (its server restored it from an older copy than the
/// worker's, which the worker then offers).
pub const KEY_VERSION: &str = "ps-key-version";

/// On a `PushStream` request: the bytes of tensor data its chunks carry in all,
/// so that the server can wait for room in its push buffer before reading any
/// of them. A stream that carries more than it declared is refused.
pub const PUSH_BYTES: &str = "ps-push-bytes";

/// On a `Pull` or `PullStream` answer: the microseconds the server held the
/// pull waiting for the version it asked for (under BSP, for the other
/// workers' pushes of the step), so that a worker can tell that wait from the
/// transfer.
pub const PULL_WAITED_US: &str = "ps-pull-waited-us";

/// Reads the microseconds a pull waited from `metadata` (zero when absent).
pub fn pull_waited(metadata: &tonic::metadata::MetadataMap) -> std::time::Duration {
    let micros = metadata
        .get(PULL_WAITED_US)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    std::time::Duration::from_micros(micros)
}

/// Writes `waited` into `metadata` as [`PULL_WAITED_US`].
pub fn set_pull_waited(metadata: &mut tonic::metadata::MetadataMap, waited: std::time::Duration) {
    if let Ok(value) = waited.as_micros().to_string().parse() {
        metadata.insert(PULL_WAITED_US, value);
    }
}

/// A `FAILED_PRECONDITION` status carrying `version` under `key`.
pub fn failed_precondition_with(
    message: String,
    key: &'static str,
    version: impl Into<u64>,
) -> Status {
    let mut status = Status::new(Code::FailedPrecondition, message);
    if let Ok(value) = version.into().to_string().parse() {
        status.metadata_mut().insert(key, value);
    }
    status
}

/// The version a `FAILED_PRECONDITION` status carries under `key`, if any.
pub fn version_in(status: &Status, key: &'static str) -> Option<u64> {
    if status.code() != Code::FailedPrecondition {
        return None;
    }
    status.metadata().get(key)?.to_str().ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_written_is_read_back_under_its_own_key_only() {
        let status = failed_precondition_with("stale".into(), KEY_VERSION, 318_u64);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(version_in(&status, KEY_VERSION), Some(318));
        assert_eq!(version_in(&status, MAP_VERSION), None);
    }

    #[test]
    fn other_codes_and_garbage_carry_no_version() {
        let mut status = Status::new(Code::NotFound, "gone");
        status
            .metadata_mut()
            .insert(KEY_VERSION, "7".parse().expect("ascii"));
        assert_eq!(version_in(&status, KEY_VERSION), None);
        let mut status = Status::new(Code::FailedPrecondition, "odd");
        status
            .metadata_mut()
            .insert(KEY_VERSION, "seven".parse().expect("ascii"));
        assert_eq!(version_in(&status, KEY_VERSION), None);
    }
}
