//! The scheduler's state file: what it must not forget across a restart — the
//! group, who registered under which id or rank, the declared parameters and the
//! current shard map. Written atomically (temporary file, fsync, rename) whenever
//! it changes; read at start, so a restarted scheduler goes on with the same map
//! version and placement, and the servers' and workers' heartbeats are simply
//! accepted again. Nodes silent for a heartbeat timeout after the restart are then
//! declared dead as usual.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use ps_proto::ids::MapVersion;
use ps_proto::placement::Param;

use crate::shard_map::ShardMap;

/// A registered server or worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedMember {
    /// Server id or worker rank.
    pub id: u32,
    /// Address (servers) or client id (workers).
    pub name: String,
    /// Alive when saved.
    pub alive: bool,
    /// Left on purpose.
    pub left: bool,
    /// SHA-256 (hex) of its registration secret; absent in files written before
    /// these were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// Everything the scheduler keeps across a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedState {
    /// Fewest workers of the group.
    pub group_min: u32,
    /// Most workers of the group.
    pub group_max: u32,
    /// The group's size, once formed.
    pub formed: Option<u32>,
    /// Servers.
    pub servers: Vec<SavedMember>,
    /// Workers.
    pub workers: Vec<SavedMember>,
    /// The declared parameters.
    pub params: Option<Vec<Param>>,
    /// The current map.
    pub map: Option<ShardMap>,
    /// The last map version published.
    pub version: MapVersion,
    /// The largest part the job's maps cut a parameter into (absent from
    /// files written before it was settable: the default then).
    #[serde(default)]
    pub partition_bytes: Option<usize>,
}

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The file holds a job whose workers have all finished: nothing to resume.
    #[error(
        "state file {path} holds a job whose workers have all finished, so there is nothing to resume; to train again start a new job: a new PS_JOB_ID (scripts/cluster.sh up makes one), another --state-file, or remove this file"
    )]
    Finished {
        /// The file.
        path: String,
    },
    /// The file is not a state file of this version.
    #[error("state file {path} is unreadable ({reason}); move it away to start afresh")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Writes `state` to `path` atomically, creating its folder when missing.
///
/// # Errors
/// [`StateError::Io`]; the previous file is then intact.
pub fn save(path: &Path, state: &SavedState) -> Result<(), StateError> {
    let io = |source| StateError::Io {
        path: path.display().to_string(),
        source,
    };
    let json = serde_json::to_vec_pretty(state).map_err(|e| io(std::io::Error::other(e)))?;
    if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(folder).map_err(io)?;
    }
    let temporary = path.with_extension("tmp");
    let mut file = File::create(&temporary).map_err(io)?;
    file.write_all(&json).map_err(io)?;
    file.sync_all().map_err(io)?;
    fs::rename(&temporary, path).map_err(io)?;
    Ok(())
}

/// Reads the state at `path`; `None` when there is no file yet.
///
/// # Errors
/// [`StateError`] when it exists but cannot be read or parsed.
pub fn load(path: &Path) -> Result<Option<SavedState>, StateError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Io {
                path: path.display().to_string(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StateError::Corrupt {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
}
