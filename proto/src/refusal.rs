//! A refused session operation carried as data: the gRPC status a unary call
//! would have ended with, written into a `SessionRefusal` by the server and
//! read back into a `Status` by a client, with the ASCII metadata a client
//! acts on (the keys of `metadata.rs`). Binary metadata does not travel.

use std::collections::HashMap;

use tonic::metadata::{AsciiMetadataKey, KeyAndValueRef, MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::v1;

/// `status` as a session refusal.
pub fn refusal_of(status: &Status) -> v1::SessionRefusal {
    let metadata: HashMap<String, String> = status
        .metadata()
        .iter()
        .filter_map(|entry| match entry {
            KeyAndValueRef::Ascii(key, value) => value
                .to_str()
                .ok()
                .map(|value| (key.as_str().to_string(), value.to_string())),
            KeyAndValueRef::Binary(..) => None,
        })
        .collect();
    v1::SessionRefusal {
        code: status.code() as i32,
        message: status.message().to_string(),
        metadata,
    }
}

/// The status a session refusal stands for, its metadata restored (an entry
/// that is not valid ASCII metadata is left out).
pub fn status_of(refusal: v1::SessionRefusal) -> Status {
    let mut metadata = MetadataMap::new();
    for (key, value) in refusal.metadata {
        let key = key.parse::<AsciiMetadataKey>();
        let value = value.parse::<MetadataValue<_>>();
        if let (Ok(key), Ok(value)) = (key, value) {
            metadata.insert(key, value);
        }
    }
    Status::with_metadata(Code::from_i32(refusal.code), refusal.message, metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_survives_the_round_trip_with_its_metadata() {
        let mut metadata = MetadataMap::new();
        metadata.insert(crate::metadata::KEY_VERSION, 7.into());
        metadata.insert_bin(
            "ps-opaque-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x00"),
        );
        let status = Status::with_metadata(Code::FailedPrecondition, "behind", metadata);
        let back = status_of(refusal_of(&status));
        assert_eq!(back.code(), Code::FailedPrecondition);
        assert_eq!(back.message(), "behind");
        assert_eq!(
            crate::metadata::version_in(&back, crate::metadata::KEY_VERSION),
            Some(7)
        );
        assert!(
            back.metadata().get_bin("ps-opaque-bin").is_none(),
            "binary metadata stays behind"
        );
    }
}
