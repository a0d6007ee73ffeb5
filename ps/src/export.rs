//! `ps-server export`: the servers' checkpoints turned into one model file.
//!
//! A checkpoint root holds a folder per server (or is one server's folder); each
//! holds flat partitions (`fc0.weight/1/values`) with optimizer moments beside them.
//! The export takes the newest copy of every key across the folders, puts each
//! parameter's partitions back together in `part` order (they are contiguous
//! row-major ranges of it), and writes one safetensors file of whole parameters
//! under their real names, shapes and dtypes: what candle's `VarMap::load` reads
//! into the model that was trained. With the optimizer state, each parameter's
//! moments are written as `optimizer/<name>/first` and `optimizer/<name>/second`
//! (`VarMap::load` ignores them).
//!
//! A parameter with a missing partition, or partitions that disagree on the whole
//! shape, is refused by name: an export is the model as trained or nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ps_proto::codec::{DType, element_count, encode_f32};
use ps_proto::key::ParamKey;
use safetensors::tensor::{Dtype, TensorView};

use crate::checkpoint::{self, KeyCheckpoint};

/// Marks the files this module writes.
const FORMAT: &str = "candle-ps-export-v1";

/// Why checkpoints could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// No valid checkpoint was found.
    #[error(
        "no checkpoint under {0}: pass the folder given to ps-server --checkpoint-dir (or one server's folder in it)"
    )]
    NoCheckpoints(PathBuf),
    /// A parameter cannot be put back together.
    #[error("cannot export {name}: {reason}")]
    Incomplete {
        /// The parameter.
        name: String,
        /// What is missing or inconsistent.
        reason: String,
    },
    /// The output cannot be written.
    #[error("{path}: {reason}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
}

/// What was exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    /// Parameters written.
    pub params: usize,
    /// Keys (partitions) they were assembled from.
    pub keys: usize,
    /// The oldest and newest key version among them: equal when every server
    /// checkpointed the same step (as at the end of a job).
    pub versions: (u64, u64),
    /// Bytes of tensor data written.
    pub bytes: usize,
}

/// One parameter put back together.
struct Whole {
    dtype: DType,
    shape: Vec<usize>,
    values: Vec<f32>,
    first: Vec<f32>,
    second: Vec<f32>,
}

/// Exports the newest checkpointed state under `root` to `out` (written to a
/// temporary file, then renamed over it).
///
/// # Errors
/// [`ExportError`] naming the folder, the parameter or the file.
pub fn export(root: &Path, out: &Path, optimizer_state: bool) -> Result<Exported, ExportError> {
    let keys = newest_keys(root);
    if keys.is_empty() {
        return Err(ExportError::NoCheckpoints(root.to_path_buf()));
    }
    let versions = keys.values().map(|k| k.version);
    let versions = (
        versions.clone().min().unwrap_or(0),
        versions.max().unwrap_or(0),
    );
    let key_count = keys.len();
    let mut by_name: BTreeMap<String, Vec<KeyCheckpoint>> = BTreeMap::new();
    for (_, key) in keys {
        by_name.entry(key.key.name.clone()).or_default().push(key);
    }
    let wholes = by_name
        .into_iter()
        .map(|(name, parts)| assemble(&name, parts).map(|whole| (name, whole)))
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = write(out, &wholes, optimizer_state, versions)?;
    Ok(Exported {
        params: wholes.len(),
        keys: key_count,
        versions,
        bytes,
    })
}

/// The newest copy of every dense key in the server folders under `root`, or
/// in `root` itself when it is one server's folder. Embedding tables are not
/// part of the exported model: their rows stay in the checkpoints.
fn newest_keys(root: &Path) -> HashMap<ParamKey, KeyCheckpoint> {
    let mut found = checkpoint::scan_shared(root);
    if let Some((path, own)) = checkpoint::newest(root) {
        checkpoint::keep_newer(&mut found, &path, own);
    }
    found
        .into_iter()
        .filter(|(_, (_, state))| state.rows.is_none())
        .map(|(key, (_, state))| (key, state))
        .collect()
}

/// Puts one parameter's partitions back together.
fn assemble(name: &str, mut parts: Vec<KeyCheckpoint>) -> Result<Whole, ExportError> {
    let incomplete = |reason: String| ExportError::Incomplete {
        name: name.to_string(),
        reason,
    };
    parts.sort_by_key(|p| p.key.part);
    let layouts = parts
        .iter()
        .map(|p| {
            p.layout.clone().ok_or_else(|| {
                incomplete(format!(
                    "{} was checkpointed by a version of ps-server that did not record shapes",
                    p.key
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let numbers: Vec<u32> = parts.iter().map(|p| p.key.part).collect();
    if numbers.iter().enumerate().any(|(i, &n)| n as usize != i) {
        return Err(incomplete(format!(
            "partitions {numbers:?} were found; a parameter's partitions are numbered from 0 without gaps"
        )));
    }
    let first = &layouts[0];
    let shape = if first.whole_shape.is_empty() {
        first.shape.clone()
    } else {
        first.whole_shape.clone()
    };
    if let Some(other) = layouts
        .iter()
        .find(|l| l.dtype != first.dtype || (parts.len() > 1 && l.whole_shape != shape))
    {
        return Err(incomplete(format!(
            "its partitions disagree: {} {:?} and {} {:?}",
            first.dtype, shape, other.dtype, other.whole_shape
        )));
    }
    let concat = |pick: fn(&KeyCheckpoint) -> &Vec<f32>| -> Vec<f32> {
        parts.iter().flat_map(|p| pick(p).iter().copied()).collect()
    };
    let values = concat(|p| &p.values);
    if values.len() != element_count(&shape) {
        return Err(incomplete(format!(
            "its {} partition(s) hold {} values, but its shape {shape:?} has {}; a partition is missing",
            parts.len(),
            values.len(),
            element_count(&shape)
        )));
    }
    let moments = |pick: fn(&KeyCheckpoint) -> &Vec<f32>| {
        let all = concat(pick);
        if all.len() == values.len() {
            all
        } else {
            Vec::new()
        }
    };
    Ok(Whole {
        dtype: first.dtype,
        first: moments(|p| &p.first),
        second: moments(|p| &p.second),
        shape,
        values,
    })
}

fn safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
    }
}

/// Writes the parameters (and, when asked, their moments); returns the data bytes.
fn write(
    out: &Path,
    wholes: &[(String, Whole)],
    optimizer_state: bool,
    versions: (u64, u64),
) -> Result<usize, ExportError> {
    let failed = |reason: String| ExportError::Write {
        path: out.to_path_buf(),
        reason,
    };
    let mut tensors: Vec<(String, Dtype, Vec<usize>, bytes::Bytes)> = Vec::new();
    for (name, whole) in wholes {
        let dtype = safetensors_dtype(whole.dtype);
        tensors.push((
            name.clone(),
            dtype,
            whole.shape.clone(),
            encode_f32(whole.dtype, &whole.values),
        ));
        if optimizer_state {
            for (what, moment) in [("first", &whole.first), ("second", &whole.second)] {
                if !moment.is_empty() {
                    tensors.push((
                        format!("optimizer/{name}/{what}"),
                        Dtype::F32,
                        whole.shape.clone(),
                        encode_f32(DType::F32, moment),
                    ));
                }
            }
        }
    }
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|view| (name.clone(), view))
                .map_err(|e| failed(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("oldest_version".to_string(), versions.0.to_string()),
        ("newest_version".to_string(), versions.1.to_string()),
    ]);
    let bytes = tensors.iter().map(|t| t.3.len()).sum();
    let partial = out.with_extension("safetensors.partial");
    safetensors::serialize_to_file(views, Some(metadata), &partial)
        .map_err(|e| failed(e.to_string()))?;
    std::fs::rename(&partial, out).map_err(|e| failed(e.to_string()))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use safetensors::SafeTensors;

    use super::*;
    use crate::checkpoint::Layout;

    fn part(name: &str, part: u32, values: &[f32], whole: &[usize], version: u64) -> KeyCheckpoint {
        KeyCheckpoint {
            key: ParamKey::new(name, part),
            spec: String::new(),
            layout: Some(Layout {
                dtype: DType::F32,
                shape: vec![values.len()],
                whole_shape: whole.to_vec(),
            }),
            values: values.to_vec(),
            first: values.iter().map(|v| v * 10.0).collect(),
            second: Vec::new(),
            updates: 1,
            version,
            last_step: HashMap::new(),
            rows: None,
        }
    }

    fn floats(file: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f32>) {
        let view = file.tensor(name).unwrap();
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (view.shape().to_vec(), values)
    }

    #[test]
    fn partitions_on_two_servers_come_back_as_whole_parameters() {
        let root = tempfile::tempdir().unwrap();
        // w is [2, 3]: part 0 (4 values) on server a, part 1 (2 values) on server b;
        // b also holds an older copy of part 0, which loses to a's newer one.
        checkpoint::write(
            &root.path().join("a_7070"),
            &[part("w", 0, &[1., 2., 3., 4.], &[2, 3], 5)],
        )
        .unwrap();
        let bias = part("b", 0, &[7., 8., 9.], &[], 5);
        checkpoint::write(
            &root.path().join("b_7070"),
            &[
                part("w", 1, &[5., 6.], &[2, 3], 5),
                part("w", 0, &[0.; 4], &[2, 3], 4),
                bias,
            ],
        )
        .unwrap();

        let out = root.path().join("model.safetensors");
        let exported = export(root.path(), &out, true).unwrap();
        assert_eq!((exported.params, exported.keys), (2, 3));
        assert_eq!(exported.versions, (5, 5));

        let buffer = std::fs::read(&out).unwrap();
        let file = SafeTensors::deserialize(&buffer).unwrap();
        assert_eq!(
            floats(&file, "w"),
            (vec![2, 3], vec![1., 2., 3., 4., 5., 6.])
        );
        assert_eq!(floats(&file, "b"), (vec![3], vec![7., 8., 9.]));
        assert_eq!(
            floats(&file, "optimizer/w/first").1,
            vec![10., 20., 30., 40., 50., 60.]
        );
        assert!(
            file.tensor("optimizer/w/second").is_err(),
            "no state, no tensor"
        );
    }

    #[test]
    fn a_missing_partition_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        checkpoint::write(
            &root.path().join("a_7070"),
            &[part("w", 0, &[1., 2., 3., 4.], &[2, 3], 5)],
        )
        .unwrap();
        let out = root.path().join("model.safetensors");
        let error = export(root.path(), &out, false).unwrap_err().to_string();
        assert!(
            error.contains("cannot export w") && error.contains("a partition is missing"),
            "{error}"
        );
        assert!(!out.exists(), "nothing is written");

        checkpoint::write(
            &root.path().join("b_7070"),
            &[part("w", 2, &[5., 6.], &[2, 3], 5)],
        )
        .unwrap();
        let error = export(root.path(), &out, false).unwrap_err().to_string();
        assert!(error.contains("partitions [0, 2]"), "{error}");
    }

    #[test]
    fn one_server_folder_exports_too_and_an_empty_root_is_named() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("model.safetensors");
        let error = export(root.path(), &out, false).unwrap_err().to_string();
        assert!(error.contains("no checkpoint under"), "{error}");

        let server = root.path().join("a_7070");
        checkpoint::write(&server, &[part("w", 0, &[1., 2.], &[], 3)]).unwrap();
        let exported = export(&server, &out, false).unwrap();
        assert_eq!(exported.params, 1);
    }
}
