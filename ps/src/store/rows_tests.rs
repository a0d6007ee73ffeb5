//! Unit tests of the store's table operations without sockets: BSP averaging
//! over the group, exactly once, bad input refused with nothing changed, the
//! memory budget, waiting pulls and a shrinking group.

use std::collections::BTreeSet;
use std::time::Duration;

use ps_proto::ids::{MapVersion, Rank, Step, Version};
use ps_proto::rows::bucket_of;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::consistency::Consistency;
use crate::param::Group;
use crate::store::StoreRules;
use crate::table::{RowInit, RowOptimizer};

const WIDTH: usize = 4;
const BUCKETS: u32 = 2;

fn store(consistency: Consistency, workers: u32, budget: usize) -> Store {
    let rules = StoreRules {
        group: Group {
            consistency,
            workers,
        },
        reject_non_finite: true,
        max_tensor_bytes: 1 << 20,
        memory_budget: budget,
    };
    let store = Store::new(rules, CancellationToken::new());
    store.declare_table(table(), &[0, 1], Version(0)).unwrap();
    store
}

fn table() -> TableSpec {
    TableSpec {
        name: "emb".into(),
        width: WIDTH,
        init: RowInit::Uniform {
            low: -1.0,
            high: 1.0,
        },
        seed: 3,
        optimizer: RowOptimizer::Sgd {
            lr: 1.0,
            weight_decay: 0.0,
        },
        max_rows: Some(1000),
        buckets: BUCKETS,
    }
}

/// Ids below 1000 of `bucket`.
fn ids_of(bucket: u32, count: usize) -> Vec<u64> {
    (0..1000)
        .filter(|id| bucket_of(*id, BUCKETS) == bucket)
        .take(count)
        .collect()
}

fn push_block(bucket: u32, ids: &[u64], value: f32) -> RowBlock {
    RowBlock {
        bucket,
        ids: ids.to_vec(),
        rows: vec![value; ids.len() * WIDTH],
    }
}

fn pull_block(bucket: u32, ids: &[u64]) -> RowBlock {
    RowBlock {
        bucket,
        ids: ids.to_vec(),
        rows: Vec::new(),
    }
}

async fn rows(store: &Store, blocks: &[RowBlock]) -> Vec<PulledRows> {
    let timeout = Duration::from_secs(5);
    store
        .pull_rows("emb", blocks, Version(0), timeout, MapVersion(0))
        .await
        .unwrap()
        .blocks
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    ps_proto::rows::decode_rows(bytes).unwrap()
}

#[tokio::test]
async fn bsp_applies_each_row_once_averaged_over_the_group() {
    let store = store(Consistency::Bsp, 2, 1 << 30);
    let ids = ids_of(0, 3);
    let before = floats(&rows(&store, &[pull_block(0, &ids)]).await[0].rows);
    // Worker 0 touches ids 0 and 1, worker 1 ids 1 and 2; both push bucket 1 empty.
    let push0 = [push_block(0, &ids[..2], 2.0), push_block(1, &[], 0.0)];
    let push1 = [push_block(0, &ids[1..], 4.0), push_block(1, &[], 0.0)];
    let first = store.push_rows("emb", Rank(0), Step(0), &push0).unwrap();
    assert!(first.iter().all(|p| p.accepted && p.version == Version(0)));
    let second = store.push_rows("emb", Rank(1), Step(0), &push1).unwrap();
    assert!(second.iter().all(|p| p.accepted && p.version == Version(1)));
    let after = floats(&rows(&store, &[pull_block(0, &ids)]).await[0].rows);
    // SGD with lr 1: each row moves by its summed gradient over 2 workers.
    let moved = [1.0, 3.0, 2.0];
    for (row, want) in moved.iter().enumerate() {
        for e in 0..WIDTH {
            let i = row * WIDTH + e;
            assert!((before[i] - after[i] - want).abs() < 1e-6, "row {row}");
        }
    }
}

#[tokio::test]
async fn a_pull_of_several_blocks_reads_their_rows_into_one_buffer_in_block_order() {
    let store = store(Consistency::Asp, 1, 1 << 30);
    let (first, second) = (ids_of(1, 3), ids_of(0, 2));
    let blocks = [pull_block(1, &first), pull_block(0, &second)];
    let pulled = store
        .pull_rows(
            "emb",
            &blocks,
            Version(0),
            Duration::from_secs(5),
            MapVersion(0),
        )
        .await
        .unwrap();
    let alone = [
        rows(&store, &[pull_block(1, &first)]).await.remove(0),
        rows(&store, &[pull_block(0, &second)]).await.remove(0),
    ];
    assert_eq!(pulled.blocks, alone, "each block as pulled alone, in order");
    let joined = [&alone[0].rows[..], &alone[1].rows[..]].concat();
    assert_eq!(&pulled.rows[..], &joined[..]);
    assert_eq!(
        pulled.blocks[1].rows.as_ptr(),
        pulled.rows[(3 * WIDTH * 4)..].as_ptr(),
        "a block's rows are a slice of the one buffer"
    );
}

#[tokio::test]
async fn a_repeated_push_is_acknowledged_and_not_applied_again() {
    let store = store(Consistency::Asp, 1, 1 << 30);
    let ids = ids_of(1, 2);
    let push = [push_block(1, &ids, 1.0)];
    assert!(store.push_rows("emb", Rank(0), Step(0), &push).unwrap()[0].accepted);
    let once = rows(&store, &[pull_block(1, &ids)]).await;
    let again = store.push_rows("emb", Rank(0), Step(0), &push).unwrap();
    assert!(!again[0].accepted);
    assert_eq!(again[0].version, Version(1));
    assert_eq!(rows(&store, &[pull_block(1, &ids)]).await, once);
    assert_eq!(store.stats().duplicate_pushes, 1);
}

#[tokio::test]
async fn bad_row_pushes_are_refused_and_change_nothing() {
    let store = store(Consistency::Asp, 1, 1 << 30);
    let ids = ids_of(0, 2);
    let other = ids_of(1, 1);
    let before = rows(&store, &[pull_block(0, &ids)]).await;
    let held = store.budget().held();
    let mut nan = push_block(0, &ids, 1.0);
    nan.rows[5] = f32::NAN;
    let mut short = push_block(0, &ids, 1.0);
    short.rows.pop();
    let cases: Vec<(Vec<RowBlock>, &str)> = vec![
        (vec![push_block(0, &[ids[0], ids[0]], 1.0)], "appears twice"),
        (vec![push_block(0, &[5000], 1.0)], "out of range"),
        (vec![push_block(0, &other, 1.0)], "belongs to bucket 1"),
        (vec![short], "gradient elements"),
        (vec![nan], "non-finite"),
        (
            vec![push_block(0, &ids, 1.0), push_block(0, &ids, 1.0)],
            "more than once",
        ),
        (vec![push_block(7, &[], 1.0)], "only 2 buckets"),
        (vec![], "no row blocks"),
    ];
    for (blocks, expected) in cases {
        let error = store
            .push_rows("emb", Rank(0), Step(0), &blocks)
            .unwrap_err();
        assert_eq!(
            tonic::Status::from(error).code(),
            tonic::Code::InvalidArgument
        );
        let error = store
            .push_rows("emb", Rank(0), Step(0), &blocks)
            .unwrap_err();
        assert!(error.to_string().contains(expected), "{error}");
    }
    let unknown = store.push_rows("nope", Rank(0), Step(0), &[push_block(0, &ids, 1.0)]);
    assert!(matches!(unknown, Err(Error::UnknownTable { .. })));
    assert_eq!(rows(&store, &[pull_block(0, &ids)]).await, before);
    assert_eq!(store.budget().held(), held);
}

#[tokio::test]
async fn rows_past_the_memory_budget_are_refused_whole() {
    let row_bytes = table().row_bytes();
    let store = store(Consistency::Asp, 1, 3 * row_bytes);
    let ids = ids_of(0, 4);
    let too_many = [push_block(0, &ids, 1.0)];
    // Four new rows do not fit a budget of three; nothing is made.
    let error = store
        .push_rows("emb", Rank(0), Step(0), &too_many)
        .unwrap_err();
    assert!(matches!(error, Error::OverBudget { .. }), "{error}");
    assert_eq!(store.budget().held(), 0);
    let fits = [push_block(0, &ids[..2], 1.0)];
    store.push_rows("emb", Rank(0), Step(0), &fits).unwrap();
    assert_eq!(store.budget().held(), 2 * row_bytes);
}

#[tokio::test]
async fn a_row_never_pushed_reads_as_it_starts_and_pulls_wait_for_the_step() {
    let store = std::sync::Arc::new(store(Consistency::Bsp, 1, 1 << 30));
    let ids = ids_of(0, 1);
    let mut start = vec![0.0; WIDTH];
    crate::table::init::initial_row(&table(), ids[0], &mut start);
    assert_eq!(
        floats(&rows(&store, &[pull_block(0, &ids)]).await[0].rows),
        start
    );
    let waiting = {
        let store = std::sync::Arc::clone(&store);
        let ids = ids.clone();
        tokio::spawn(async move {
            let timeout = Duration::from_secs(10);
            let block = [pull_block(0, &ids)];
            store
                .pull_rows("emb", &block, Version(1), timeout, MapVersion(0))
                .await
        })
    };
    store
        .push_rows("emb", Rank(0), Step(0), &[push_block(0, &ids, 0.5)])
        .unwrap();
    let pulled = waiting.await.unwrap().unwrap().blocks;
    assert_eq!(pulled[0].version, Version(1));
    let want: Vec<f32> = start.iter().map(|v| v - 0.5).collect();
    assert_eq!(floats(&pulled[0].rows), want);
    let ahead = store
        .pull_rows(
            "emb",
            &[pull_block(0, &ids)],
            Version(3),
            Duration::from_secs(1),
            MapVersion(0),
        )
        .await;
    assert!(matches!(ahead, Err(Error::PullAhead { .. })));
    let late = store
        .pull_rows(
            "emb",
            &[pull_block(0, &ids)],
            Version(2),
            Duration::from_millis(20),
            MapVersion(0),
        )
        .await;
    assert!(
        matches!(
            late,
            Err(Error::PullTimeout {
                wanted: Version(2),
                have: Version(1),
                ..
            })
        ),
        "{late:?}"
    );
}

#[tokio::test]
async fn a_shrinking_group_completes_the_bucket_step() {
    let store = store(Consistency::Bsp, 2, 1 << 30);
    let ids = ids_of(0, 1);
    store
        .push_rows("emb", Rank(0), Step(0), &[push_block(0, &ids, 1.0)])
        .unwrap();
    assert_eq!(
        rows(&store, &[pull_block(0, &ids)]).await[0].version,
        Version(0)
    );
    let advanced = store.set_live_workers(BTreeSet::from([Rank(0)]));
    assert_eq!(advanced, 1);
    assert_eq!(
        rows(&store, &[pull_block(0, &ids)]).await[0].version,
        Version(1)
    );
}

#[test]
fn a_table_declared_twice_differently_is_refused() {
    let store = store(Consistency::Bsp, 1, 1 << 30);
    let again = store.declare_table(table(), &[0], Version(0)).unwrap();
    assert!(!again[0].created);
    let mut wider = table();
    wider.width = 8;
    let error = store.declare_table(wider, &[0], Version(0)).unwrap_err();
    assert!(matches!(error, Error::TableConflict { .. }), "{error}");
    let past = store.declare_table(table(), &[2], Version(0)).unwrap_err();
    assert!(
        past.to_string().contains("past the table's 2 buckets"),
        "{past}"
    );
}

#[tokio::test]
async fn a_bucket_comes_back_from_its_checkpoint_and_moves_forward_to_the_job() {
    let root = tempfile::tempdir().unwrap();
    let first = store(Consistency::Bsp, 1, 1 << 30);
    let ids = ids_of(0, 3);
    for step in 0..3 {
        let push = [push_block(0, &ids, 0.25), push_block(1, &[], 0.0)];
        first.push_rows("emb", Rank(0), Step(step), &push).unwrap();
    }
    let saved = rows(&first, &[pull_block(0, &ids)]).await;
    assert_eq!(saved[0].version, Version(3));
    crate::checkpoint::write(&root.path().join("server-a"), &first.checkpoint_keys()).unwrap();
    // A step the checkpoint does not hold.
    first
        .push_rows("emb", Rank(0), Step(3), &[push_block(0, &ids, 0.25)])
        .unwrap();

    let rules = first.rules();
    let resumed = Store::new(rules, CancellationToken::new()).with_archive(root.path());
    let declared = resumed.declare_table(table(), &[0, 1], Version(0)).unwrap();
    assert!(
        declared
            .iter()
            .all(|d| d.created && d.version == Version(3))
    );
    assert_eq!(declared[0].rows, 3);
    assert_eq!(rows(&resumed, &[pull_block(0, &ids)]).await, saved);
    assert_eq!(resumed.budget().held(), 3 * table().row_bytes());

    // Declared again by a job at step 4: the bucket moves forward, step 3 is
    // taken as done, step 4 is taken.
    let behind = Store::new(rules, CancellationToken::new()).with_archive(root.path());
    let declared = behind.declare_table(table(), &[0, 1], Version(4)).unwrap();
    assert!(declared.iter().all(|d| d.version == Version(4)));
    let repeat = behind.push_rows("emb", Rank(0), Step(3), &[push_block(0, &ids, 1.0)]);
    assert!(!repeat.unwrap()[0].accepted);
    let next = behind.push_rows("emb", Rank(0), Step(4), &[push_block(0, &ids, 1.0)]);
    assert!(next.unwrap()[0].accepted);
    let after = floats(&rows(&behind, &[pull_block(0, &ids)]).await[0].rows);
    let want: Vec<f32> = floats(&saved[0].rows).iter().map(|v| v - 1.0).collect();
    assert_eq!(after, want);

    // A server whose budget cannot hold the checkpoint's rows refuses the
    // declaration and declares nothing.
    let small = StoreRules {
        memory_budget: 2 * table().row_bytes(),
        ..rules
    };
    let refused = Store::new(small, CancellationToken::new()).with_archive(root.path());
    let error = refused
        .declare_table(table(), &[0, 1], Version(4))
        .unwrap_err();
    assert!(matches!(error, Error::OverBudget { .. }), "{error}");
    assert_eq!(refused.budget().held(), 0);
    assert_eq!(refused.tables.len(), 0);

    // Workers declaring at once, after a server loss, with a budget that
    // holds the checkpoint's rows once: each bucket is restored once, and
    // every declaration succeeds.
    let exact = StoreRules {
        memory_budget: 3 * table().row_bytes(),
        ..rules
    };
    let shared = Arc::new(Store::new(exact, CancellationToken::new()).with_archive(root.path()));
    let start = Arc::new(std::sync::Barrier::new(4));
    let declarers: Vec<_> = (0..4)
        .map(|_| {
            let (store, start) = (Arc::clone(&shared), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                store.declare_table(table(), &[0, 1], Version(4))
            })
        })
        .collect();
    for declarer in declarers {
        declarer.join().unwrap().expect("every declaration fits");
    }
    assert_eq!(shared.budget().held(), 3 * table().row_bytes());
}

#[test]
fn a_bsp_step_dropped_by_a_fast_forward_gives_back_the_rows_it_reserved() {
    let store = store(Consistency::Bsp, 2, 1 << 30);
    let ids = ids_of(0, 3);
    store
        .push_rows("emb", Rank(0), Step(0), &[push_block(0, &ids, 1.0)])
        .unwrap();
    assert!(store.budget().held() >= 3 * table().row_bytes());
    // Declared again by a job already at step 2: the half-pushed step 0 is
    // dropped, no row is made, nothing stays charged.
    let declared = store.declare_table(table(), &[0, 1], Version(2)).unwrap();
    assert!(
        declared
            .iter()
            .all(|d| d.version == Version(2) && d.rows == 0)
    );
    assert_eq!(store.budget().held(), 0);
    let next = [push_block(0, &ids, 1.0)];
    assert!(store.push_rows("emb", Rank(0), Step(2), &next).unwrap()[0].accepted);
}
