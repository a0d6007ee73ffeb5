//! Unit tests of [`Store`] without sockets: admission under each consistency
//! model, all-or-nothing requests, group shrink, and pulls that wait.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ps_proto::codec::{DType, TensorData};
use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::key::ParamKey;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::consistency::Consistency;
use crate::error::Error;
use crate::optimizer::OptimizerSpec;
use crate::param::{Group, ParamSpec};

const SGD_1: OptimizerSpec = OptimizerSpec::Sgd {
    lr: 1.0,
    weight_decay: 0.0,
};

fn store(consistency: Consistency, workers: u32) -> Store {
    let rules = StoreRules {
        group: Group {
            consistency,
            workers,
        },
        reject_non_finite: true,
        max_tensor_bytes: 1 << 20,
        memory_budget: 1 << 30,
    };
    Store::new(rules, CancellationToken::new())
}

fn spec(name: &str, len: usize) -> ParamSpec {
    ParamSpec {
        header: TensorHeader::new(ParamKey::new(name, 0), DType::F32, vec![len]),
        whole_shape: Vec::new(),
        optimizer: SGD_1,
    }
}

fn tensor(values: &[f32]) -> TensorData {
    TensorData::from_f32(DType::F32, vec![values.len()], values)
}

fn ranks(ranks: &[u32]) -> BTreeSet<Rank> {
    ranks.iter().copied().map(Rank).collect()
}

fn key(name: &str) -> ParamKey {
    ParamKey::new(name, 0)
}

/// A store with keys `w` and `b` registered at `[1, 1]`.
fn with_keys(consistency: Consistency, workers: u32) -> Store {
    let store = store(consistency, workers);
    let params = ["w", "b"]
        .iter()
        .map(|name| (spec(name, 2), Some(tensor(&[1.0, 1.0]))))
        .collect();
    store.register(params, Version(0)).expect("register");
    store
}

fn push(store: &Store, worker: u32, step: u64, grad: f32) -> Result<Vec<Pushed>> {
    store.push(
        Rank(worker),
        Step(step),
        vec![(key("w"), tensor(&[grad, grad]))],
    )
}

/// `name`'s values as a pull of version 0 gets them.
async fn pulled(store: &Store, name: &str) -> crate::entry::Pulled {
    let keys = [key(name)];
    store
        .pull(&keys, Version(0), Duration::from_secs(1), MapVersion(0))
        .await
        .expect("pull")
        .remove(0)
}

async fn values(store: &Store, name: &str) -> (Vec<f32>, u64) {
    let pulled = pulled(store, name).await;
    let data =
        TensorData::new(pulled.header.dtype, pulled.header.shape, pulled.data).expect("decode");
    (data.to_f32_vec(), pulled.version.get())
}

#[tokio::test]
async fn bsp_applies_the_average_once_every_worker_pushed() {
    let store = with_keys(Consistency::Bsp, 2);
    push(&store, 0, 0, 2.0).unwrap();
    assert_eq!(
        values(&store, "w").await,
        (vec![1.0, 1.0], 0),
        "waits for worker 1"
    );
    push(&store, 1, 0, 4.0).unwrap();
    assert_eq!(
        values(&store, "w").await,
        (vec![-2.0, -2.0], 1),
        "1 - mean(2, 4)"
    );
}

#[tokio::test]
async fn a_repeated_push_is_acknowledged_and_not_applied_again() {
    let store = with_keys(Consistency::Asp, 1);
    assert!(push(&store, 0, 0, 1.0).unwrap()[0].accepted);
    let again = push(&store, 0, 0, 1.0).unwrap();
    assert!(!again[0].accepted);
    assert_eq!(values(&store, "w").await, (vec![0.0, 0.0], 1));
    assert_eq!(store.stats().duplicate_pushes, 1);
}

#[tokio::test]
async fn admission_refuses_steps_the_model_does_not_allow() {
    let bsp = with_keys(Consistency::Bsp, 1);
    assert!(matches!(
        push(&bsp, 0, 1, 1.0),
        Err(Error::FutureStep { .. })
    ));
    push(&bsp, 0, 0, 1.0).unwrap();
    push(&bsp, 0, 1, 1.0).unwrap();
    let ssp = with_keys(Consistency::Ssp { staleness: 2 }, 2);
    for step in 0..=2 {
        push(&ssp, 0, step, 0.0).unwrap();
    }
    assert!(
        matches!(push(&ssp, 0, 3, 0.0), Err(Error::FutureStep { .. })),
        "worker 0 may run 2 steps ahead of worker 1, not 3"
    );
    assert!(matches!(
        push(&bsp, 5, 2, 1.0),
        Err(Error::WorkerOutsideGroup {
            worker: Rank(5),
            group: 1
        })
    ));
}

#[tokio::test]
async fn a_step_completed_without_a_worker_is_refused_as_stale() {
    let store = with_keys(Consistency::Bsp, 2);
    push(&store, 0, 0, 1.0).unwrap();
    store.set_live_workers(ranks(&[0]));
    assert!(matches!(
        push(&store, 1, 0, 1.0),
        Err(Error::StaleStep { .. })
    ));
}

#[tokio::test]
async fn a_request_with_one_bad_key_changes_no_key() {
    let store = with_keys(Consistency::Asp, 1);
    let grads = vec![
        (key("w"), tensor(&[1.0, 1.0])),
        (key("b"), tensor(&[1.0, f32::NAN])),
    ];
    assert!(matches!(
        store.push(Rank(0), Step(0), grads),
        Err(Error::NonFinite { .. })
    ));
    let unknown = vec![(key("w"), tensor(&[1.0, 1.0])), (key("x"), tensor(&[1.0]))];
    assert!(matches!(
        store.push(Rank(0), Step(0), unknown),
        Err(Error::UnknownKey { .. })
    ));
    let shape = vec![(key("w"), tensor(&[1.0, 1.0])), (key("b"), tensor(&[1.0]))];
    assert!(matches!(
        store.push(Rank(0), Step(0), shape),
        Err(Error::ShapeMismatch { .. })
    ));
    assert_eq!(values(&store, "w").await, (vec![1.0, 1.0], 0));
    assert_eq!(values(&store, "b").await, (vec![1.0, 1.0], 0));
    let conflict = vec![(spec("w", 2), None), (spec("b", 3), None)];
    assert!(matches!(
        store.register(conflict, Version(0)),
        Err(Error::SpecConflict { .. })
    ));
    let new_and_conflict = vec![(spec("c", 2), None), (spec("b", 3), None)];
    assert!(store.register(new_and_conflict, Version(0)).is_err());
    assert_eq!(store.stats().keys.len(), 2, "c was not created");
}

#[tokio::test]
async fn group_shrink_completes_a_step_waiting_only_for_the_dead_worker() {
    let store = with_keys(Consistency::Bsp, 3);
    push(&store, 0, 0, 3.0).unwrap();
    push(&store, 1, 0, 6.0).unwrap();
    assert_eq!(values(&store, "w").await.1, 0);
    let advanced = store.set_group(3, ranks(&[0, 1]));
    assert_eq!(advanced, 1, "w advanced; b had no pushes to complete");
    let (w, version) = values(&store, "w").await;
    assert_eq!(version, 1);
    assert_eq!(
        w,
        vec![1.0 - 4.5; 2],
        "the mean of the two gradients that came"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pull_waits_for_its_version_and_times_out_naming_the_missing_workers() {
    let store = Arc::new(with_keys(Consistency::Bsp, 2));
    let keys = [key("w")];
    let waiting = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store
                .pull(
                    &[key("w")],
                    Version(1),
                    Duration::from_secs(5),
                    MapVersion(0),
                )
                .await
        })
    };
    tokio::task::yield_now().await;
    push(&store, 0, 0, 1.0).unwrap();
    push(&store, 1, 0, 1.0).unwrap();
    let pulled = waiting.await.unwrap().expect("released by the step");
    assert_eq!(pulled[0].version, Version(1));
    push(&store, 0, 1, 1.0).unwrap();
    let error = store
        .pull(&keys, Version(2), Duration::from_secs(5), MapVersion(0))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("workers [1]"),
        "names the missing worker: {error}"
    );
}

#[tokio::test]
async fn a_pull_ends_when_the_store_shuts_down() {
    let shutdown = CancellationToken::new();
    let rules = store(Consistency::Bsp, 1).rules();
    let store = Store::new(rules, shutdown.clone());
    store
        .register(vec![(spec("w", 2), None)], Version(0))
        .unwrap();
    let keys = [key("w")];
    let pull = store.pull(&keys, Version(5), Duration::from_secs(60), MapVersion(0));
    shutdown.cancel();
    assert!(matches!(pull.await, Err(Error::ShuttingDown)));
}

#[test]
fn a_key_given_twice_is_named_among_few_keys_and_among_many() {
    for count in [1, 2, super::COMPARED_UP_TO, super::COMPARED_UP_TO + 1, 100] {
        let keys: Vec<ParamKey> = (0..count).map(|i| key(&format!("k{i}"))).collect();
        assert!(check_unique(keys.iter()).is_ok(), "{count} distinct keys");
        let mut repeated = keys.clone();
        repeated.push(keys[count / 2].clone());
        match check_unique(repeated.iter()) {
            Err(Error::RepeatedKey { key }) => assert_eq!(key, keys[count / 2]),
            other => panic!("{count} keys and one again: {other:?}"),
        }
    }
}

/// Only keys pulled in `f32` take the arena's pages: a bf16 key's pulls are
/// snapshots on the heap, so its values stay there too, and an `f32` key
/// registered after it finds the arena's one page free.
#[tokio::test]
async fn a_half_precision_key_leaves_the_arena_to_f32_keys() {
    let arena = ps_shm::arena::Arena::create(ps_shm::arena::PAGE).unwrap();
    let store = store(Consistency::Asp, 1).with_arena(Some(Arc::clone(&arena)));
    let len = ps_shm::arena::ARENA_FROM_BYTES / 4;
    let half = ParamSpec {
        header: TensorHeader::new(key("half"), DType::BF16, vec![len]),
        ..spec("half", len)
    };
    let values = TensorData::from_f32(DType::BF16, vec![len], &vec![1.0; len]);
    store
        .register(vec![(half, Some(values))], Version(0))
        .expect("register");
    let full = vec![(spec("full", len), Some(tensor(&vec![1.0; len])))];
    store.register(full, Version(0)).expect("register");
    let full = pulled(&store, "full").await;
    assert!(arena.offset_of(&full.data).is_some(), "the page was free");
}

/// A store keeping keys in a values arena: a key of `ARENA_FROM_BYTES` or
/// more is pulled from the arena (its bytes lie in it), a smaller one from the heap,
/// and a push under a pull that holds the old values leaves that pull's
/// version as it was.
#[tokio::test]
async fn large_keys_live_in_the_arena_and_a_held_pull_keeps_its_version() {
    let arena = ps_shm::arena::Arena::create(4 << 20).unwrap();
    let store = store(Consistency::Asp, 1).with_arena(Some(Arc::clone(&arena)));
    let large = ps_shm::arena::ARENA_FROM_BYTES / 4;
    let params = vec![
        (spec("big", large), Some(tensor(&vec![1.0; large]))),
        (spec("small", 4), Some(tensor(&[1.0; 4]))),
    ];
    store.register(params, Version(0)).expect("register");
    let held = pulled(&store, "big").await;
    assert!(
        arena.offset_of(&held.data).is_some(),
        "pulled from the arena"
    );
    assert!(
        arena
            .offset_of(&pulled(&store, "small").await.data)
            .is_none()
    );
    let grad = vec![0.5; large];
    store
        .push(Rank(0), Step(0), vec![(key("big"), tensor(&grad))])
        .unwrap();
    assert_eq!(&held.data[..4], 1.0f32.to_le_bytes(), "the held version");
    let after = pulled(&store, "big").await;
    assert!(
        arena.offset_of(&after.data).is_some(),
        "the copy is in the arena"
    );
    assert_eq!(&after.data[..4], 0.5f32.to_le_bytes(), "1 - 1.0 * 0.5");
}
