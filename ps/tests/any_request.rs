//! Requests decoded from arbitrary bytes, handed to the parameter service's
//! handlers in-process (no socket): every one is answered, none panics, and the
//! keys a request did not validly change keep their values and versions.

use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use ps_proto::v1;
use ps_proto::v1::parameter_server_server::ParameterServer;
use ps_server::ServerConfig;
use ps_server::service::ParameterService;
use ps_server::store::Store;
use tokio_util::sync::CancellationToken;
use tonic::Request;

/// A service over a store holding `w` (4 elements, SGD), as a fresh server has it.
fn service() -> (ParameterService, Arc<Store>) {
    let config = ServerConfig {
        memory_budget: 64 << 20,
        ..ServerConfig::default()
    };
    let store = Arc::new(Store::new(config.store_rules(), CancellationToken::new()));
    let spec = v1::ParameterSpec {
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
    };
    let init = v1::ParameterInit {
        spec: Some(spec),
        initial: Bytes::new(),
    };
    let params = vec![ps_server::wire::param_init(&init).unwrap()];
    store.register(params, ps_proto::ids::Version(0)).unwrap();
    (
        ParameterService::new(Arc::clone(&store), config, None),
        store,
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn any_push_register_or_pull_is_answered_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        which in 0u8..3,
    ) {
        let (service, store) = service();
        let held_before = store.budget().held();
        runtime().block_on(async {
            match which {
                0 => if let Ok(request) = v1::PushRequest::decode(bytes.as_slice()) {
                    let _ = service.push(Request::new(request)).await;
                },
                1 => if let Ok(mut request) = v1::PullRequest::decode(bytes.as_slice()) {
                    request.timeout_ms = request.timeout_ms.clamp(1, 5);
                    let _ = service.pull(Request::new(request)).await;
                },
                _ => if let Ok(request) = v1::RegisterRequest::decode(bytes.as_slice()) {
                    let _ = service.register(Request::new(request)).await;
                },
            }
        });
        let stats = store.stats();
        prop_assert!(stats.keys.iter().any(|k| k.spec.key.name == "w"));
        // What a request took from the budget it gave back, except new keys.
        let new_keys = stats.keys.len() - 1;
        prop_assert!(new_keys > 0 || store.budget().held() == held_before);
    }
}
