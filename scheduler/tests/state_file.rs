//! A scheduler started on a state file resumes an unfinished job and refuses a
//! finished one with a message that says how to start a new job, instead of
//! resuming a job with nothing left to do (which left its servers idle forever).

use std::time::{Duration, Instant};

use ps_proto::ids::{Rank, Step};
use ps_scheduler::SchedulerConfig;
use ps_scheduler::membership::{Membership, Node};
use ps_scheduler::service::SchedulerState;
use ps_scheduler::state_file::{self as state, StateError};

/// A state file of a one-worker job, saved after `left` (or not) of its worker.
fn saved_job(dir: &std::path::Path, worker_left: bool) -> std::path::PathBuf {
    let now = Instant::now();
    let mut membership = Membership::new(Duration::from_secs(3), 1, 1);
    membership.register_server("s0:7070", now).unwrap();
    membership.register_worker("w", now).expect("a rank");
    if worker_left {
        membership.leave(Node::Worker(Rank(0)), Step(0));
    }
    let path = dir.join("jobs").join("scheduler.json");
    state::save(&path, &membership.saved()).expect("write the state file");
    path
}

fn start(path: std::path::PathBuf) -> Result<SchedulerState, StateError> {
    SchedulerState::new(SchedulerConfig {
        state_file: Some(path),
        ..SchedulerConfig::default()
    })
}

#[test]
fn a_finished_job_is_refused_with_how_to_start_a_new_one() {
    let dir = tempfile::tempdir().expect("a folder");
    let path = saved_job(dir.path(), true);
    let Err(error) = start(path.clone()) else {
        panic!("a finished job is not resumed");
    };
    let message = error.to_string();
    assert!(matches!(error, StateError::Finished { .. }), "{message}");
    for words in [path.to_str().expect("utf-8"), "all finished", "PS_JOB_ID"] {
        assert!(message.contains(words), "{words:?} in {message}");
    }
}

#[test]
fn an_unfinished_job_is_resumed() {
    let dir = tempfile::tempdir().expect("a folder");
    let path = saved_job(dir.path(), false);
    start(path).expect("the job goes on");
}

#[test]
fn a_resumed_job_keeps_the_partition_size_it_was_cut_with() {
    let dir = tempfile::tempdir().expect("a folder");
    let path = dir.path().join("scheduler.json");
    let membership = Membership::new(Duration::from_secs(3), 1, 1).with_partition_bytes(256 << 10);
    state::save(&path, &membership.saved()).expect("write the state file");
    let saved = state::load(&path).expect("read").expect("a state");
    assert_eq!(saved.partition_bytes, Some(256 << 10));
    let resumed = Membership::from_saved(saved.clone(), Duration::from_secs(3), 1, Instant::now());
    assert_eq!(resumed.partition_bytes(), 256 << 10);
    // A file from before the size was saved resumes with the default.
    let mut text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    text.as_object_mut().unwrap().remove("partition_bytes");
    let older: state::SavedState = serde_json::from_value(text).expect("an older file reads");
    let resumed = Membership::from_saved(older, Duration::from_secs(3), 1, Instant::now());
    assert_eq!(
        resumed.partition_bytes(),
        ps_proto::placement::DEFAULT_PART_BYTES
    );
}
