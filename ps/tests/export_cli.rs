//! `ps-server export` as a user runs it: a checkpoint root in, a model file out, and
//! a message that names the folder when there is nothing to export.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use ps_proto::codec::DType;
use ps_proto::key::ParamKey;
use ps_server::checkpoint::{self, KeyCheckpoint, Layout};

/// Runs `ps-server export --checkpoint-dir ROOT --out OUT`.
fn export(root: &Path, out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .arg("export")
        .arg("--checkpoint-dir")
        .arg(root)
        .arg("--out")
        .arg(out)
        .env_remove("PS_CHECKPOINT_DIR")
        .output()
        .expect("run ps-server export")
}

fn partition(part: u32, values: Vec<f32>) -> KeyCheckpoint {
    KeyCheckpoint {
        key: ParamKey::new("fc0.weight", part),
        spec: String::new(),
        layout: Some(Layout {
            dtype: DType::F32,
            shape: vec![values.len()],
            whole_shape: vec![3, 2],
        }),
        values,
        first: Vec::new(),
        second: Vec::new(),
        updates: 9,
        version: 9,
        last_step: HashMap::new(),
        rows: None,
    }
}

#[test]
fn export_writes_whole_parameters_and_says_what_it_wrote() {
    let root = tempfile::tempdir().unwrap();
    checkpoint::write(&root.path().join("s0"), &[partition(0, vec![1., 2., 3.])]).unwrap();
    checkpoint::write(&root.path().join("s1"), &[partition(1, vec![4., 5., 6.])]).unwrap();
    let out = root.path().join("model.safetensors");
    let output = export(root.path(), &out);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("1 parameters from 2 checkpointed keys at version 9"),
        "{stdout}"
    );
    let buffer = std::fs::read(&out).unwrap();
    let file = safetensors::SafeTensors::deserialize(&buffer).unwrap();
    let weight = file.tensor("fc0.weight").unwrap();
    assert_eq!(weight.shape(), [3, 2]);
    let values: Vec<f32> = weight
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(values, [1., 2., 3., 4., 5., 6.]);
}

#[test]
fn export_of_an_empty_folder_fails_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("model.safetensors");
    let output = export(root.path(), &out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("no checkpoint under") && stderr.contains("--checkpoint-dir"),
        "{stderr}"
    );
    assert!(!out.exists());
}
