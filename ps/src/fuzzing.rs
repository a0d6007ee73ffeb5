//! Entry points for the fuzzers (`fuzz/`) and the property tests: each takes
//! arbitrary bytes and drives the server's real code with them. A malformed
//! input must be refused, never panic; each says whether its input was taken
//! (or how many answers it got), so tests can tell that well-formed inputs
//! reach the code under test.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use ps_proto::ids::Version;
use ps_proto::v1;
use ps_proto::v1::parameter_server_server::ParameterServer;
use tokio_util::sync::CancellationToken;
use tonic::Request;

use crate::config::ServerConfig;
use crate::service::ParameterService;
use crate::store::Store;

/// A checkpoint file's bytes, read: refused, or keys. True when read.
pub fn checkpoint(data: &[u8]) -> bool {
    crate::checkpoint::decode(data).is_ok()
}

/// The requests [`request`] sends, by its input's first byte.
const KINDS: u8 = 5;

/// A request decoded from `data` (its first byte picks Push, Pull, Register,
/// JoinGroup or Stats), answered by a fresh server's handlers in-process. The
/// server holds one key, `w`, which no request may lose, and whatever a request
/// charged to the memory budget it gives back unless it made new keys. True
/// when the request was answered OK.
pub fn request(data: &[u8]) -> bool {
    let Some((&kind, message)) = data.split_first() else {
        return false;
    };
    let (service, store) = one_key_service();
    let held_before = store.budget().held();
    let answered = runtime().block_on(async {
        match kind % KINDS {
            0 => match v1::PushRequest::decode(message) {
                Ok(r) => service.push(Request::new(r)).await.is_ok(),
                Err(_) => false,
            },
            1 => match v1::PullRequest::decode(message) {
                Ok(mut r) => {
                    r.timeout_ms = r.timeout_ms.clamp(1, 5);
                    service.pull(Request::new(r)).await.is_ok()
                }
                Err(_) => false,
            },
            2 => match v1::RegisterRequest::decode(message) {
                Ok(r) => service.register(Request::new(r)).await.is_ok(),
                Err(_) => false,
            },
            3 => match v1::JoinGroupRequest::decode(message) {
                Ok(r) => service.join_group(Request::new(r)).await.is_ok(),
                Err(_) => false,
            },
            _ => match v1::StatsRequest::decode(message) {
                Ok(r) => service.stats(Request::new(r)).await.is_ok(),
                Err(_) => false,
            },
        }
    });
    assert_keeps_w(&store);
    let new_keys = store.stats().keys.len() - 1;
    assert!(
        new_keys > 0 || store.budget().held() == held_before,
        "a request gave back what it charged"
    );
    answered
}

/// Panics unless `store` still holds `w`, which no request may lose.
fn assert_keeps_w(store: &Store) {
    let stats = store.stats();
    assert!(
        stats.keys.iter().any(|k| k.spec.header.key.name == "w"),
        "w is kept"
    );
}

/// The row requests [`rows`] sends, by its input's first byte.
const ROW_KINDS: u8 = 3;

/// A row request decoded from `data` (its first byte picks PushRows, PullRows
/// or DeclareTable), answered by a fresh server holding table `emb` (width 4,
/// 2 buckets, ids below 1,000). A refused request changes nothing: the memory
/// held (the rows stored) is what it was. True when the request was answered OK.
pub fn rows(data: &[u8]) -> bool {
    let Some((&kind, message)) = data.split_first() else {
        return false;
    };
    let (service, store) = one_key_service();
    let declare = v1::DeclareTableRequest {
        table: Some(emb_spec()),
        buckets: vec![0, 1],
        ..Default::default()
    };
    let runtime = runtime();
    runtime
        .block_on(service.declare_table(Request::new(declare)))
        .expect("a fresh server takes emb");
    let held_before = store.budget().held();
    let answered = runtime.block_on(async {
        match kind % ROW_KINDS {
            0 => match v1::PushRowsRequest::decode(message) {
                Ok(r) => service.push_rows(Request::new(r)).await.is_ok(),
                Err(_) => false,
            },
            1 => match v1::PullRowsRequest::decode(message) {
                Ok(mut r) => {
                    r.timeout_ms = r.timeout_ms.clamp(1, 5);
                    service.pull_rows(Request::new(r)).await.is_ok()
                }
                Err(_) => false,
            },
            _ => match v1::DeclareTableRequest::decode(message) {
                Ok(r) => service.declare_table(Request::new(r)).await.is_ok(),
                Err(_) => false,
            },
        }
    });
    let held = store.budget().held();
    assert!(
        answered || held == held_before,
        "a refused request changed what the server holds"
    );
    assert!(held <= store.budget().limit(), "within the memory budget");
    answered
}

/// The table [`rows`] declares: `emb`, width 4, 2 buckets, ids below 1,000, SGD.
pub fn emb_spec() -> v1::TableSpec {
    v1::TableSpec {
        name: "emb".into(),
        width: 4,
        dtype: v1::DType::DtypeF32 as i32,
        optimizer: Some(v1::RowOptimizer {
            kind: Some(v1::row_optimizer::Kind::Sgd(v1::Sgd {
                lr: 0.1,
                weight_decay: 0.0,
            })),
        }),
        max_rows: 1000,
        buckets: 2,
        ..Default::default()
    }
}

/// A service over a store holding `w` (4 elements, SGD), as a fresh server has it.
pub(crate) fn one_key_service() -> (ParameterService, Arc<Store>) {
    w_service(4, ServerConfig::default())
}

/// A service over a store holding `w` of `elements` f32 elements (SGD, lr
/// 0.1), as a fresh server of `config` with a 64 MiB budget has it.
pub(crate) fn w_service(elements: u64, config: ServerConfig) -> (ParameterService, Arc<Store>) {
    let config = ServerConfig {
        memory_budget: 64 << 20,
        ..config
    };
    let store = Arc::new(Store::new(config.store_rules(), CancellationToken::new()));
    let spec = v1::ParameterSpec {
        shape: vec![elements],
        ..w_spec()
    };
    let init = v1::ParameterInit {
        spec: Some(spec),
        initial: Bytes::new(),
    };
    let params = vec![crate::wire::param_init(&init).expect("w's spec is valid")];
    store
        .register(params, Version(0))
        .expect("a fresh store takes w");
    let service = ParameterService::new(Arc::clone(&store), config, None);
    (service, store)
}

/// The spec of `w`: 4 f32 elements, SGD.
pub fn w_spec() -> v1::ParameterSpec {
    v1::ParameterSpec {
        name: "w".into(),
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![4],
        optimizer: Some(v1::Optimizer {
            kind: Some(v1::optimizer::Kind::Sgd(v1::Sgd {
                lr: 0.1,
                weight_decay: 0.0,
            })),
        }),
        ..Default::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

#[path = "fuzzing_shared_memory.rs"]
mod shared_memory;
pub use shared_memory::{shared_memory_push, shared_memory_session};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_push_over_shared_memory_is_answered_and_words_that_are_no_message_are_not() {
        assert_eq!(shared_memory_session(&shared_memory_push([0.5; 4])), 1);
        // A sizes word claiming a header of 4 GiB, then its sequence number.
        let mut lying = vec![0u8];
        lying.extend_from_slice(&u64::from(u32::MAX).to_le_bytes());
        lying.extend_from_slice(&1u64.to_le_bytes());
        assert_eq!(shared_memory_session(&lying), 0);
        // A message out of sequence: an empty header, numbered 2.
        let mut skipped = vec![0u8];
        skipped.extend_from_slice(&0u64.to_le_bytes());
        skipped.extend_from_slice(&2u64.to_le_bytes());
        assert_eq!(shared_memory_session(&skipped), 0);
    }

    #[test]
    fn well_formed_row_requests_are_answered_and_garbage_is_refused() {
        let ids = [0u64, 1, 2, 3, 4, 5];
        let bucket = ps_proto::rows::bucket_of(ids[0], 2);
        let mine: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| ps_proto::rows::bucket_of(*id, 2) == bucket)
            .collect();
        let push = v1::PushRowsRequest {
            table: "emb".into(),
            blocks: vec![v1::RowBlock {
                bucket,
                ids: ps_proto::rows::encode_ids(&mine),
                rows: ps_proto::rows::encode_rows(&vec![0.5; mine.len() * 4]),
            }],
            ..Default::default()
        };
        assert!(rows(&with_kind(0, push)));
        let pull = v1::PullRowsRequest {
            table: "emb".into(),
            blocks: vec![v1::RowBlock {
                bucket,
                ids: ps_proto::rows::encode_ids(&mine),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(rows(&with_kind(1, pull)));
        let declare = v1::DeclareTableRequest {
            table: Some(emb_spec()),
            buckets: vec![1],
            ..Default::default()
        };
        assert!(rows(&with_kind(2, declare)));
        assert!(!rows(&[0, 0xff, 0xff]));
        assert!(!rows(&[]));
    }

    fn with_kind(kind: u8, message: impl Message) -> Vec<u8> {
        let mut data = vec![kind];
        data.extend(message.encode_to_vec());
        data
    }

    #[test]
    fn well_formed_requests_are_answered_and_garbage_is_refused() {
        let push = v1::PushRequest {
            grads: vec![v1::Tensor {
                name: "w".into(),
                dtype: v1::DType::DtypeF32 as i32,
                shape: vec![4],
                data: Bytes::from(1.0f32.to_le_bytes().repeat(4)),
                ..v1::Tensor::default()
            }],
            ..v1::PushRequest::default()
        };
        assert!(request(&with_kind(0, push)));
        let pull = v1::PullRequest {
            keys: vec![v1::KeyRef {
                name: "w".into(),
                part: 0,
            }],
            ..v1::PullRequest::default()
        };
        assert!(request(&with_kind(1, pull)));
        assert!(request(&with_kind(4, v1::StatsRequest {})));
        assert!(!request(&[0, 0x0a, 0xff]), "a cut-off push is refused");
        assert!(!request(&[]));
    }

    #[test]
    fn only_a_real_checkpoint_is_read() {
        let key = crate::checkpoint::KeyCheckpoint {
            key: ps_proto::key::ParamKey::new("w", 0),
            spec: "f32 [2] with sgd".into(),
            layout: None,
            values: vec![1.0, 2.0],
            first: Vec::new(),
            second: Vec::new(),
            updates: 1,
            version: 1,
            last_step: std::collections::HashMap::new(),
            rows: None,
        };
        let bytes = crate::checkpoint::encode(&[key]).unwrap();
        assert!(checkpoint(&bytes));
        assert!(!checkpoint(&bytes[..bytes.len() - 1]));
        assert!(!checkpoint(b"not a checkpoint"));
    }
}
