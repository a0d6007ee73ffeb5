//! `apply`: the server's optimizer arithmetic over one large key, against a
//! single-thread memcpy of the same bytes in the same run.
//!
//! The gradient comes as it does off the wire: little-endian `f32` bytes that
//! start one byte past an aligned address, so the apply pays for its bulk decode.
//! Bandwidth counts every byte the pass reads and writes (a memcpy moves the key
//! twice: read and write; SGD three times: gradient, and values read and written;
//! momentum five times; Adam seven), so the ratio says how close the arithmetic
//! comes to what one core can move.
//!
//! `adam-tiny` is Adam again over gradients of 5e-20 and less, as a trained
//! model's well-fitted outputs give: their squares are subnormal numbers,
//! which the server's kernel raises to 2^-100 rather than pay a microcode
//! assist for each (`ps_server::kernels`); this pass shows whether it does.

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use ps_proto::codec::{DType, TensorData};
use ps_proto::v1;
use ps_server::optimizer::{Gradient, Optimizer, OptimizerSpec};
use serde::Serialize;

use crate::report::median;
use ps_common::size::format_size;

/// What to measure.
#[derive(Debug, Clone)]
pub struct ApplyPlan {
    /// Bytes of the key (its `f32` values).
    pub size: usize,
    /// Timed repetitions of each pass (medians are reported).
    pub reps: usize,
}

/// One optimizer's apply (or the memcpy) over the key.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyRow {
    /// `memcpy`, `sgd`, `momentum`, `adam` or `adam-tiny`.
    pub pass: String,
    /// Bytes of the key.
    pub size_bytes: u64,
    /// Median seconds per pass.
    pub seconds: f64,
    /// Key bytes per second (gradient bytes applied, or bytes copied).
    pub key_bytes_per_sec: f64,
    /// Bytes read and written per second.
    pub memory_bytes_per_sec: f64,
    /// This pass's memory bandwidth over the memcpy's.
    pub ratio_to_memcpy: f64,
}

/// The passes measured, with the times each touches the key's bytes; each
/// optimizer as a worker declares it (`ps_client`'s defaults) and the server
/// reads it.
fn passes() -> [(&'static str, Option<v1::Optimizer>, u32, f32); 5] {
    [
        ("memcpy", None, 2, ORDINARY),
        ("sgd", Some(ps_client::sgd(0.01)), 3, ORDINARY),
        ("momentum", Some(ps_client::momentum(0.01)), 5, ORDINARY),
        ("adam", Some(ps_client::adam(0.001)), 7, ORDINARY),
        ("adam-tiny", Some(ps_client::adam(0.001)), 7, TINY),
    ]
}

/// The step between gradient elements of the ordinary passes (up to 0.05).
const ORDINARY: f32 = 1e-4;

/// The step of `adam-tiny`'s gradient: up to 5e-20, whose squares are subnormal.
const TINY: f32 = 1e-22;

/// A gradient of `len` elements as received, `step` apart: unaligned
/// little-endian bytes.
fn wire_gradient(len: usize, step: f32) -> TensorData {
    let mut bytes = Vec::with_capacity(len * 4 + 1);
    bytes.push(0u8);
    for i in 0..len {
        let g = ((i % 1000) as f32 - 500.0) * step;
        bytes.extend_from_slice(&g.to_le_bytes());
    }
    let unaligned = Bytes::from(bytes).slice(1..);
    TensorData::new(DType::F32, vec![len], unaligned).expect("a gradient of whole f32 elements")
}

/// Seconds of each of `reps` runs of `pass`, after one untimed run.
fn time(reps: usize, mut pass: impl FnMut()) -> f64 {
    pass();
    let mut seconds: Vec<f64> = (0..reps)
        .map(|_| {
            let started = Instant::now();
            pass();
            started.elapsed().as_secs_f64()
        })
        .collect();
    median(&mut seconds).unwrap_or(0.0)
}

/// Runs every pass over a key of `plan.size` bytes.
pub fn run(plan: &ApplyPlan) -> Vec<ApplyRow> {
    let len = (plan.size / 4).max(1);
    let size = len * 4;
    let mut values = vec![0.5f32; len];
    let mut copy = vec![0.0f32; len];
    let mut memcpy_bandwidth = 0.0;
    passes()
        .into_iter()
        .map(|(name, optimizer, touches, step)| {
            let seconds = match optimizer {
                None => time(plan.reps, || {
                    copy.copy_from_slice(black_box(&values));
                    black_box(&mut copy);
                }),
                Some(optimizer) => {
                    let spec = OptimizerSpec::from_proto(Some(&optimizer))
                        .expect("the client's optimizers are valid");
                    let mut optimizer = Optimizer::new(spec, len);
                    let gradient = wire_gradient(len, step);
                    time(plan.reps, || {
                        optimizer.apply(black_box(&mut values), Gradient::Wire(&gradient), 0.5);
                    })
                }
            };
            let memory = f64::from(touches) * size as f64 / seconds.max(1e-12);
            if name == "memcpy" {
                memcpy_bandwidth = memory;
            }
            ApplyRow {
                pass: name.to_string(),
                size_bytes: size as u64,
                seconds,
                key_bytes_per_sec: size as f64 / seconds.max(1e-12),
                memory_bytes_per_sec: memory,
                ratio_to_memcpy: memory / f64::max(memcpy_bandwidth, 1e-12),
            }
        })
        .collect()
}

/// The rows as a table.
pub fn table(rows: &[ApplyRow]) -> String {
    let mut out = format!(
        "{:<9} {:>9} {:>10} {:>12} {:>15} {:>16}\n",
        "pass", "key", "ms", "key GB/s", "memory GB/s", "ratio to memcpy"
    );
    for row in rows {
        out += &format!(
            "{:<9} {:>9} {:>10.2} {:>12.2} {:>15.2} {:>16.2}\n",
            row.pass,
            format_size(row.size_bytes as usize),
            row.seconds * 1e3,
            row.key_bytes_per_sec / 1e9,
            row.memory_bytes_per_sec / 1e9,
            row.ratio_to_memcpy
        );
    }
    out
}
