//! Checkpoints: a server's keys written to disk atomically, in the safetensors
//! format, and read back with every corruption detected.
//!
//! One checkpoint is one file `checkpoint-<seq>.safetensors` in the server's own
//! folder. Each key contributes `<name>/<part>/values` and, when its optimizer
//! keeps state, `<name>/<part>/first` and `<name>/<part>/second` (all `F32`). The
//! safetensors metadata holds `format` (`candle-ps-checkpoint-v2`), `keys` (JSON:
//! each key's spec, version, optimizer update count and the last step each worker
//! pushed) and a `crc32` of the key list and of every tensor's name, dtype, shape
//! and data, so a truncated or altered file is refused as a whole rather than
//! half-loaded or misread. (`v1` files, whose checksum covered the tensor data
//! only, are still read.)
//!
//! Writing goes to `.tmp`, is fsynced, renamed over nothing (a new sequence
//! number) and the folder fsynced; a crash at any point leaves the previous
//! checkpoint intact. The newest [`KEEP`] checkpoints are kept.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use ps_proto::codec::DType;
use ps_proto::key::ParamKey;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

/// Checkpoints kept per server; older ones are deleted after a successful write.
pub const KEEP: usize = 2;

const FORMAT: &str = "candle-ps-checkpoint-v2";
/// The first format, whose checksum covered the tensor data only; still read.
const FORMAT_V1: &str = "candle-ps-checkpoint-v1";
const PREFIX: &str = "checkpoint-";
const SUFFIX: &str = ".safetensors";

/// One key as a checkpoint holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyCheckpoint {
    /// The key.
    pub key: ParamKey,
    /// The spec's one-line description; a key is restored only into the same spec.
    pub spec: String,
    /// Dtype and shapes, for tools that read checkpoints (`ps-server export`);
    /// `None` in checkpoints written before they were recorded.
    pub layout: Option<Layout>,
    /// Values.
    pub values: Vec<f32>,
    /// Optimizer state: momentum or Adam's first moment (empty when none).
    pub first: Vec<f32>,
    /// Adam's second moment (empty when none).
    pub second: Vec<f32>,
    /// Optimizer updates applied.
    pub updates: u64,
    /// Version.
    pub version: u64,
    /// The last step each worker pushed.
    pub last_step: HashMap<u32, u64>,
    /// For a bucket of an embedding table (named by [`bucket_key`]): the ids of
    /// its rows, in the order `values` holds them, `width` elements each.
    /// `None` for a dense key.
    pub rows: Option<Vec<u64>>,
}

/// What a table bucket's name starts with in a checkpoint, keeping tables and
/// dense keys of the same name apart.
pub const TABLE_PREFIX: &str = "rows:";

/// The name a checkpoint gives bucket `bucket` of table `table`.
pub fn bucket_key(table: &str, bucket: u32) -> ParamKey {
    ParamKey::new(format!("{TABLE_PREFIX}{table}"), bucket)
}

/// What a key's values are: its dtype, its shape and, for a partition, the whole
/// parameter's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The parameter's wire dtype (the checkpoint holds `F32` values).
    pub dtype: DType,
    /// The key's shape.
    pub shape: Vec<usize>,
    /// The whole parameter's shape for a partition; empty for a whole parameter.
    pub whole_shape: Vec<usize>,
}

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file-system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The file is not a complete, unaltered checkpoint.
    #[error("{path} is not a valid checkpoint: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct KeyMeta {
    name: String,
    part: u32,
    spec: String,
    version: u64,
    updates: u64,
    last_step: Vec<(u32, u64)>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    dtype: String,
    #[serde(default)]
    shape: Vec<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    whole_shape: Vec<usize>,
    /// A table bucket, whose row ids are the tensor `<name>/<part>/ids`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    table: bool,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn tensor_name(key: &ParamKey, what: &str) -> String {
    format!("{}/{}/{what}", key.name, key.part)
}

fn f32_bytes(values: &[f32]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// Serializes `keys` into one safetensors buffer.
pub(crate) fn encode(keys: &[KeyCheckpoint]) -> Result<Vec<u8>, String> {
    let mut tensors = Vec::new();
    for k in keys {
        for (what, data) in [
            ("values", &k.values),
            ("first", &k.first),
            ("second", &k.second),
        ] {
            if what == "values" || !data.is_empty() {
                let view = TensorView::new(Dtype::F32, vec![data.len()], f32_bytes(data))
                    .map_err(|e| e.to_string())?;
                tensors.push((tensor_name(&k.key, what), view));
            }
        }
        if let Some(ids) = &k.rows {
            let bytes: &[u8] = bytemuck::cast_slice(ids);
            let view =
                TensorView::new(Dtype::U64, vec![ids.len()], bytes).map_err(|e| e.to_string())?;
            tensors.push((tensor_name(&k.key, "ids"), view));
        }
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let metas: Vec<KeyMeta> = keys
        .iter()
        .map(|k| {
            let mut last_step: Vec<(u32, u64)> =
                k.last_step.iter().map(|(&w, &s)| (w, s)).collect();
            last_step.sort_unstable();
            let (dtype, shape, whole_shape) = match &k.layout {
                Some(l) => (l.dtype.to_string(), l.shape.clone(), l.whole_shape.clone()),
                None => Default::default(),
            };
            KeyMeta {
                name: k.key.name.clone(),
                part: k.key.part,
                spec: k.spec.clone(),
                version: k.version,
                updates: k.updates,
                last_step,
                dtype,
                shape,
                whole_shape,
                table: k.rows.is_some(),
            }
        })
        .collect();
    let keys_json = serde_json::to_string(&metas).map_err(|e| e.to_string())?;
    let crc = checksum(
        &keys_json,
        tensors.iter().map(|(name, view)| (name.as_str(), view)),
    );
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("keys".to_string(), keys_json),
        ("crc32".to_string(), crc.to_string()),
    ]);
    safetensors::serialize(tensors, Some(metadata)).map_err(|e| e.to_string())
}

fn dtype_named(name: &str) -> Option<DType> {
    [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .find(|d| d.to_string() == name)
}

/// The checksum of a checkpoint: the key list, then each tensor's name, dtype,
/// shape and data in name order, so that no byte of what is restored (values,
/// versions, the steps each worker pushed) can change unnoticed.
fn checksum<'a>(
    keys_json: &str,
    tensors: impl Iterator<Item = (&'a str, &'a TensorView<'a>)>,
) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(keys_json.as_bytes());
    for (name, view) in tensors {
        hasher.update(name.as_bytes());
        hasher.update(format!("{:?}{:?}", view.dtype(), view.shape()).as_bytes());
        hasher.update(view.data());
    }
    hasher.finalize()
}

/// The checksum of a first-format checkpoint: the tensor data only.
fn checksum_v1<'a>(tensors: impl Iterator<Item = &'a TensorView<'a>>) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for view in tensors {
        hasher.update(view.data());
    }
    hasher.finalize()
}

/// Parses and verifies one checkpoint buffer (the bytes of a file [`read`]
/// takes).
///
/// # Errors
/// Why the buffer is not a complete, unaltered checkpoint.
pub fn decode(buffer: &[u8]) -> Result<Vec<KeyCheckpoint>, String> {
    let tensors = SafeTensors::deserialize(buffer).map_err(|e| format!("safetensors: {e}"))?;
    let (_, header) = SafeTensors::read_metadata(buffer).map_err(|e| e.to_string())?;
    let meta = header.metadata().as_ref().ok_or("no candle-ps metadata")?;
    let format = meta.get("format").map(String::as_str);
    if format != Some(FORMAT) && format != Some(FORMAT_V1) {
        return Err(format!("format is {format:?}, not {FORMAT}"));
    }
    let keys_json = meta.get("keys").ok_or("no key list in the metadata")?;
    let mut names = tensors.names();
    names.sort_unstable();
    let views = names
        .iter()
        .map(|name| tensors.tensor(name).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let crc = match format {
        Some(FORMAT_V1) => checksum_v1(views.iter()),
        _ => checksum(keys_json, names.iter().copied().zip(&views)),
    };
    let expected: u32 = meta
        .get("crc32")
        .and_then(|c| c.parse().ok())
        .ok_or("no crc32 in the metadata")?;
    if crc != expected {
        return Err("the checkpoint does not match its crc32 (altered or torn write)".into());
    }
    let metas: Vec<KeyMeta> =
        serde_json::from_str(keys_json).map_err(|e| format!("key list: {e}"))?;
    let read = |key: &ParamKey, what: &str| -> Result<Vec<f32>, String> {
        match tensors.tensor(&tensor_name(key, what)) {
            Ok(view) if view.dtype() == Dtype::F32 => Ok(view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()),
            Ok(view) => Err(format!("{key} {what} is {:?}, not F32", view.dtype())),
            Err(_) if what != "values" => Ok(Vec::new()),
            Err(e) => Err(format!("{key}: {e}")),
        }
    };
    let read_ids = |key: &ParamKey| -> Result<Vec<u64>, String> {
        match tensors.tensor(&tensor_name(key, "ids")) {
            Ok(view) if view.dtype() == Dtype::U64 => Ok(view
                .data()
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
                .collect()),
            Ok(view) => Err(format!("{key} ids are {:?}, not U64", view.dtype())),
            Err(e) => Err(format!("{key}: {e}")),
        }
    };
    metas
        .into_iter()
        .map(|m| {
            let key = ParamKey::new(m.name, m.part);
            let rows = match m.table {
                true => Some(read_ids(&key)?),
                false => None,
            };
            let layout = match m.dtype.as_str() {
                "" => None,
                name => Some(Layout {
                    dtype: dtype_named(name)
                        .ok_or_else(|| format!("{key}: unknown dtype {name}"))?,
                    shape: m.shape,
                    whole_shape: m.whole_shape,
                }),
            };
            Ok(KeyCheckpoint {
                layout,
                values: read(&key, "values")?,
                first: read(&key, "first")?,
                second: read(&key, "second")?,
                key,
                spec: m.spec,
                updates: m.updates,
                version: m.version,
                last_step: m.last_step.into_iter().collect(),
                rows,
            })
        })
        .collect()
}

/// The checkpoint files in `dir`, newest first, with their sequence numbers.
fn checkpoints_in(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let seq = name
                .strip_prefix(PREFIX)?
                .strip_suffix(SUFFIX)?
                .parse()
                .ok()?;
            Some((seq, e.path()))
        })
        .collect();
    found.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    found
}

/// Writes `keys` as the next checkpoint in `dir` (created if needed), atomically,
/// then deletes all but the newest [`KEEP`]. Returns the new file's path.
///
/// # Errors
/// [`CheckpointError`] when encoding or any file-system step fails; the previous
/// checkpoints are then untouched.
pub fn write(dir: &Path, keys: &[KeyCheckpoint]) -> Result<PathBuf, CheckpointError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    let existing = checkpoints_in(dir);
    let seq = existing.first().map_or(1, |(s, _)| s + 1);
    let path = dir.join(format!("{PREFIX}{seq:012}{SUFFIX}"));
    let temporary = dir.join(format!("{PREFIX}{seq:012}{SUFFIX}.tmp"));
    let bytes = encode(keys).map_err(|reason| CheckpointError::Corrupt {
        path: path.clone(),
        reason,
    })?;
    let mut file = File::create(&temporary).map_err(io(&temporary))?;
    file.write_all(&bytes).map_err(io(&temporary))?;
    file.sync_all().map_err(io(&temporary))?;
    drop(file);
    fs::rename(&temporary, &path).map_err(io(&path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    for (_, old) in checkpoints_in(dir).into_iter().skip(KEEP) {
        let _ = fs::remove_file(old);
    }
    Ok(path)
}

/// Reads one checkpoint file.
///
/// # Errors
/// [`CheckpointError::Corrupt`] for anything but a complete, unaltered checkpoint.
pub fn read(path: &Path) -> Result<Vec<KeyCheckpoint>, CheckpointError> {
    let buffer = fs::read(path).map_err(io(path))?;
    decode(&buffer).map_err(|reason| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        reason,
    })
}

/// The newest valid checkpoint in `dir`, skipping (and logging) corrupt ones.
pub fn newest(dir: &Path) -> Option<(PathBuf, Vec<KeyCheckpoint>)> {
    for (_, path) in checkpoints_in(dir) {
        match read(&path) {
            Ok(keys) => return Some((path, keys)),
            Err(error) => {
                tracing::warn!(%error, "skipping a checkpoint that cannot be used");
            }
        }
    }
    None
}

/// Every key found in the newest valid checkpoint of each server folder under
/// `root` (a volume the servers share), keeping the highest version of each key.
pub fn scan_shared(root: &Path) -> HashMap<ParamKey, (PathBuf, KeyCheckpoint)> {
    let mut found: HashMap<ParamKey, (PathBuf, KeyCheckpoint)> = HashMap::new();
    let Ok(folders) = fs::read_dir(root) else {
        return found;
    };
    for folder in folders.filter_map(Result::ok).map(|e| e.path()) {
        if let Some((path, keys)) = newest(&folder) {
            keep_newer(&mut found, &path, keys);
        }
    }
    found
}

/// Adds the keys of the checkpoint at `path` to `found`, each where it is newer
/// than the copy there.
pub fn keep_newer(
    found: &mut HashMap<ParamKey, (PathBuf, KeyCheckpoint)>,
    path: &Path,
    keys: Vec<KeyCheckpoint>,
) {
    for key in keys {
        let newer = found
            .get(&key.key)
            .is_none_or(|(_, have)| key.version > have.version);
        if newer {
            found.insert(key.key.clone(), (path.to_path_buf(), key));
        }
    }
}

/// A folder name for a server, from its address (`host:port` -> `host_port`).
pub fn folder_name(server: &str) -> String {
    server
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, version: u64) -> KeyCheckpoint {
        KeyCheckpoint {
            key: ParamKey::new(name, 0),
            spec: "f32 [3] with sgd".into(),
            layout: Some(Layout {
                dtype: DType::F32,
                shape: vec![3],
                whole_shape: Vec::new(),
            }),
            values: vec![1.0, -2.5, version as f32],
            first: vec![0.5; 3],
            second: Vec::new(),
            updates: version,
            version,
            last_step: HashMap::from([(0, version.saturating_sub(1)), (1, 7)]),
            rows: None,
        }
    }

    #[test]
    fn a_checkpoint_reads_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let keys = vec![key("w", 3), key("b", 3)];
        let path = write(dir.path(), &keys).unwrap();
        assert_eq!(read(&path).unwrap(), keys);
        let (newest_path, newest_keys) = newest(dir.path()).unwrap();
        assert_eq!((newest_path, newest_keys), (path, keys));
    }

    #[test]
    fn a_table_bucket_reads_back_with_its_row_ids_beside_a_dense_key_of_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = KeyCheckpoint {
            key: bucket_key("w", 0),
            layout: None,
            rows: Some(vec![7, 0, u64::MAX]),
            ..key("w", 2)
        };
        let empty = KeyCheckpoint {
            key: bucket_key("w", 1),
            values: Vec::new(),
            first: Vec::new(),
            rows: Some(Vec::new()),
            ..bucket.clone()
        };
        let keys = vec![key("w", 3), bucket, empty];
        let path = write(dir.path(), &keys).unwrap();
        let mut back = read(&path).unwrap();
        back.sort_by(|a, b| a.key.cmp(&b.key));
        let mut want = keys;
        want.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(back, want);
    }

    #[test]
    fn only_the_newest_checkpoints_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        for version in 1..=4 {
            write(dir.path(), &[key("w", version)]).unwrap();
        }
        let files = checkpoints_in(dir.path());
        assert_eq!(files.len(), KEEP);
        assert_eq!(newest(dir.path()).unwrap().1[0].version, 4);
    }

    #[test]
    fn a_truncated_checkpoint_is_detected_and_the_previous_one_used() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &[key("w", 1)]).unwrap();
        let broken = write(dir.path(), &[key("w", 2)]).unwrap();
        let bytes = fs::read(&broken).unwrap();
        for cut in [bytes.len() - 1, bytes.len() / 2, 9, 0] {
            fs::write(&broken, &bytes[..cut]).unwrap();
            let error = read(&broken).unwrap_err();
            assert!(
                matches!(error, CheckpointError::Corrupt { .. }),
                "cut at {cut}: {error}"
            );
            let (path, keys) = newest(dir.path()).unwrap();
            assert_ne!(path, broken);
            assert_eq!(keys[0].version, 1, "the previous checkpoint, whole");
        }
    }

    #[test]
    fn a_crash_mid_write_leaves_the_previous_checkpoint_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let previous = write(dir.path(), &[key("w", 1)]).unwrap();
        // What a crash between create and rename leaves: part of the next file,
        // under its temporary name.
        let whole = encode(&[key("w", 2)]).unwrap();
        let temporary = dir.path().join(format!("{PREFIX}{:012}{SUFFIX}.tmp", 2));
        fs::write(&temporary, &whole[..whole.len() / 2]).unwrap();
        assert_eq!(newest(dir.path()).unwrap(), (previous, vec![key("w", 1)]));
        // The next write takes that name over and completes.
        let next = write(dir.path(), &[key("w", 3)]).unwrap();
        assert_eq!(newest(dir.path()).unwrap(), (next, vec![key("w", 3)]));
        assert!(!temporary.exists());
    }

    #[test]
    fn a_flipped_data_byte_is_detected_by_the_crc() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &[key("w", 5)]).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        fs::write(&path, &bytes).unwrap();
        let error = read(&path).unwrap_err().to_string();
        assert!(error.contains("crc32"), "{error}");
        assert!(newest(dir.path()).is_none());
    }

    #[test]
    fn the_shared_scan_takes_the_newest_version_of_each_key() {
        let root = tempfile::tempdir().unwrap();
        write(&root.path().join("a_7070"), &[key("w", 4), key("b", 9)]).unwrap();
        write(&root.path().join("b_7070"), &[key("w", 6)]).unwrap();
        let found = scan_shared(root.path());
        assert_eq!(found[&ParamKey::new("w", 0)].1.version, 6);
        assert_eq!(found[&ParamKey::new("b", 0)].1.version, 9);
    }

    #[test]
    fn folder_names_are_plain() {
        assert_eq!(folder_name("10.0.0.2:7070"), "10.0.0.2_7070");
        assert_eq!(folder_name("[::1]:7070"), "___1__7070");
    }

    #[test]
    fn a_first_format_checkpoint_is_still_read() {
        let keys = vec![key("w", 3)];
        let v2 = encode(&keys).unwrap();
        let (_, header) = SafeTensors::read_metadata(&v2).unwrap();
        let mut meta = header.metadata().clone().unwrap();
        let parsed = SafeTensors::deserialize(&v2).unwrap();
        let mut tensors: Vec<_> = parsed.tensors();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let crc = checksum_v1(tensors.iter().map(|(_, view)| view));
        meta.insert("format".into(), FORMAT_V1.into());
        meta.insert("crc32".into(), crc.to_string());
        let v1 = safetensors::serialize(tensors, Some(meta)).unwrap();
        assert_eq!(decode(&v1).unwrap(), keys);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any bytes: the reader refuses them or reads keys, never panics.
        #[test]
        fn any_bytes_are_read_or_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        /// A real checkpoint with one byte changed or cut short anywhere is
        /// refused (the checksum covers every value and the key list), never
        /// misread. The one change that reads back the same keys is one the
        /// format ignores: a space of the header's padding turned into other
        /// JSON whitespace (a tab, a newline or a carriage return).
        #[test]
        fn a_damaged_checkpoint_is_refused(at in proptest::prelude::any::<proptest::sample::Index>(), flip in 1u8..=255, cut: bool) {
            let keys = vec![key("w", 3), key("b", 4)];
            let mut bytes = encode(&keys).unwrap();
            let at = at.index(bytes.len());
            let was = bytes[at];
            if cut {
                bytes.truncate(at);
            } else {
                bytes[at] ^= flip;
            }
            if let Ok(read) = decode(&bytes) {
                let whitespace = [b' ', b'\t', b'\n', b'\r'];
                proptest::prop_assert!(
                    !cut && was == b' ' && whitespace.contains(&bytes[at]) && read == keys,
                    "byte {at} changed from {was:#x} to {:#x} and still read",
                    bytes[at]
                );
            }
        }
    }
}
