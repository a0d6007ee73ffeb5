//! Where a key's state comes from when a server does not hold it: the checkpoints
//! it can read, a worker's copy, or the initial values — and which wins.
//!
//! A server that takes over keys (its peer died, or it restarted) gets them from
//! the workers: each re-registers every key with the values it last pulled and
//! their version (`restore_version`). The server then looks in the checkpoints
//! under its checkpoint root (its own folder and, on a shared volume, every other
//! server's) and takes
//! - the checkpoint, when it is at least as new as the worker's copy: values,
//!   optimizer state, version and per-worker steps, nothing lost;
//! - else the worker's values and version with the checkpoint's optimizer state,
//!   which is then that many steps older;
//! - else the worker's values with a fresh optimizer state (reset).
//!
//! The log says which, per key. A worker copy newer than a key the server holds
//! replaces it too (the key came back to a server that had an old copy).

use ps_proto::ids::Version;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ps_proto::key::ParamKey;
use ps_shm::arena::Arena;

use crate::checkpoint::{self, KeyCheckpoint};
use crate::param::{KeyState, ParamSpec};
use crate::values::Values;

/// The checkpoints a server can read: loaded at start, read again on demand.
#[derive(Debug)]
pub struct Archive {
    root: PathBuf,
    scanned: Mutex<HashMap<ParamKey, (PathBuf, KeyCheckpoint)>>,
}

impl Archive {
    /// The checkpoints under `root`, read now: each folder's newest valid
    /// checkpoint (corrupt or truncated ones are logged and skipped), with a
    /// summary of what a restarted server will resume from as keys register.
    pub fn load(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let found = checkpoint::scan_shared(&root);
        let newest = found.values().map(|(_, key)| key.version).max();
        match newest {
            Some(version) => {
                tracing::info!(root = %root.display(), keys = found.len(), newest_version = version, "checkpoints loaded; keys resume from them as workers register");
            }
            None => tracing::info!(root = %root.display(), "no checkpoint to resume from"),
        }
        Self {
            root,
            scanned: Mutex::new(found),
        }
    }

    /// The checkpoint root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads the folders again (a peer may have written since the last scan).
    pub fn rescan(&self) {
        let found = checkpoint::scan_shared(&self.root);
        *self.scanned.lock().unwrap_or_else(|p| p.into_inner()) = found;
    }

    /// The newest checkpointed state of `key`; `rescan` reads the folders again
    /// (a peer may have written since the last scan).
    pub fn lookup(&self, key: &ParamKey, rescan: bool) -> Option<(PathBuf, KeyCheckpoint)> {
        let mut scanned = self.scanned.lock().unwrap_or_else(|p| p.into_inner());
        if rescan {
            *scanned = checkpoint::scan_shared(&self.root);
        }
        scanned.get(key).cloned()
    }
}

/// What a worker sent for a key it registers.
#[derive(Debug, Clone, Copy)]
pub struct Offered<'a> {
    /// Its values (initial values, or its last pulled copy).
    pub values: Option<&'a [f32]>,
    /// The version of those values; 0 for initial values.
    pub version: Version,
    /// Ranks of the worker group, for the steps a restored version implies.
    pub ranks: u32,
}

/// A key this server lacks, built from the best source; logs the choice.
/// A worker's values go straight into `arena` when the key belongs there.
pub fn new_key(
    spec: &ParamSpec,
    offered: Offered<'_>,
    (archive, arena): (Option<&Archive>, Option<&Arc<Arena>>),
) -> KeyState {
    let values = || match offered.values {
        Some(values) => Values::copied_into(values, spec.arena_for(arena)),
        None => Values::new(vec![0.0; spec.len()]),
    };
    let saved = archive.and_then(|a| a.lookup(&spec.header.key, offered.version > Version(0)));
    let resumed = saved.and_then(|(path, saved)| {
        let state = KeyState::from_checkpoint(spec, &saved);
        if state.is_none() {
            tracing::warn!(key = %spec.header.key, path = %path.display(), saved = saved.spec, now = spec.describe(), "checkpoint holds this key with another spec; not used");
        }
        state.map(|state| (path, state))
    });
    match resumed {
        Some((path, state)) if state.version() >= offered.version => {
            tracing::info!(key = %spec.header.key, version = %state.version(), path = %path.display(), "restored from checkpoint: values and optimizer state");
            state
        }
        Some((path, mut state)) => {
            let behind = offered.version.get() - state.version().get();
            tracing::warn!(key = %spec.header.key, version = %offered.version, path = %path.display(), optimizer_steps_behind = behind, "restored values from a worker's copy; optimizer state from an older checkpoint");
            state.restore(values(), offered.version, offered.ranks);
            state
        }
        None => {
            let mut state = KeyState::new(spec, values());
            if offered.version > Version(0) {
                tracing::warn!(key = %spec.header.key, version = %offered.version, "restored values from a worker's copy; no checkpoint holds this key, so its optimizer state is reset");
                state.restore(values(), offered.version, offered.ranks);
            }
            state
        }
    }
}

/// A key this server holds, offered again: a worker's newer copy replaces it.
/// Returns whether it did.
pub fn refresh_key(
    spec: &ParamSpec,
    state: &mut KeyState,
    offered: Offered<'_>,
    arena: Option<&Arc<Arena>>,
) -> bool {
    let Some(values) = offered.values.filter(|_| offered.version > state.version()) else {
        return false;
    };
    tracing::warn!(key = %spec.header.key, had = %state.version(), version = %offered.version, "a worker holds a newer copy of this key; taking its values (optimizer state kept)");
    state.restore(
        Values::copied_into(values, spec.arena_for(arena)),
        offered.version,
        offered.ranks,
    );
    true
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use ps_proto::codec::DType;
    use ps_proto::header::TensorHeader;

    use super::*;
    use crate::checkpoint;
    use crate::optimizer::OptimizerSpec;

    fn spec(lr: f64) -> ParamSpec {
        ParamSpec {
            header: TensorHeader::new(ParamKey::new("w", 0), DType::F32, vec![2]),
            whole_shape: Vec::new(),
            optimizer: OptimizerSpec::Momentum {
                lr,
                momentum: 0.9,
                weight_decay: 0.0,
                nesterov: false,
            },
        }
    }

    /// An archive holding `w` at `version`, saved with `spec`.
    fn archive_at(version: u64, spec: &ParamSpec) -> (tempfile::TempDir, Archive) {
        let root = tempfile::tempdir().unwrap();
        let saved = KeyCheckpoint {
            key: spec.header.key.clone(),
            spec: spec.describe(),
            layout: Some(spec.layout()),
            values: vec![1.0, 2.0],
            first: vec![0.5, -0.5],
            second: Vec::new(),
            updates: version,
            version,
            last_step: HashMap::from([(0, version - 1), (1, version - 1)]),
            rows: None,
        };
        checkpoint::write(&root.path().join("server-a"), &[saved]).unwrap();
        let archive = Archive::load(root.path());
        (root, archive)
    }

    fn offered(values: &[f32], version: u64) -> Offered<'_> {
        Offered {
            values: Some(values),
            version: Version(version),
            ranks: 2,
        }
    }

    #[test]
    fn a_checkpoint_as_new_as_the_copy_wins_whole() {
        let (_root, archive) = archive_at(5, &spec(0.1));
        let state = new_key(&spec(0.1), offered(&[9.0, 9.0], 5), (Some(&archive), None));
        let restored = state.checkpoint(&spec(0.1));
        assert_eq!((restored.values, restored.version), (vec![1.0, 2.0], 5));
        assert_eq!((restored.first, restored.updates), (vec![0.5, -0.5], 5));
    }

    #[test]
    fn a_newer_copy_brings_values_and_the_older_checkpoint_the_optimizer_state() {
        let (_root, archive) = archive_at(3, &spec(0.1));
        let state = new_key(&spec(0.1), offered(&[9.0, 8.0], 5), (Some(&archive), None));
        let restored = state.checkpoint(&spec(0.1));
        assert_eq!((restored.values, restored.version), (vec![9.0, 8.0], 5));
        assert_eq!(restored.first, vec![0.5, -0.5]);
        // Every step before the copy's version counts as pushed by both ranks.
        assert_eq!(restored.last_step, HashMap::from([(0, 4), (1, 4)]));
    }

    #[test]
    fn without_a_usable_checkpoint_the_copy_comes_with_a_fresh_optimizer() {
        // Saved under another learning rate: not the same spec, so not used.
        let (_root, archive) = archive_at(3, &spec(0.5));
        for archive in [None, Some(&archive)] {
            let state = new_key(&spec(0.1), offered(&[9.0, 8.0], 5), (archive, None));
            let restored = state.checkpoint(&spec(0.1));
            assert_eq!((restored.values, restored.version), (vec![9.0, 8.0], 5));
            assert_eq!((restored.first, restored.updates), (vec![0.0, 0.0], 0));
        }
    }

    #[test]
    fn only_a_newer_copy_replaces_a_key_held() {
        let mut state = new_key(&spec(0.1), offered(&[1.0, 1.0], 4), (None, None));
        assert!(!refresh_key(
            &spec(0.1),
            &mut state,
            offered(&[7.0, 7.0], 4),
            None
        ));
        assert!(refresh_key(
            &spec(0.1),
            &mut state,
            offered(&[7.0, 7.0], 6),
            None
        ));
        let held = state.checkpoint(&spec(0.1));
        assert_eq!((held.values, held.version), (vec![7.0, 7.0], 6));
    }
}
