//! The floors `kv` reads its shared-memory rows against, measured in the same
//! run: what one core does with the bytes and nothing else. A pull through
//! shared memory is at best one copy, so its floor is a single-thread
//! `memcpy` of the key ([`memcpy_bytes_per_sec`]); a push is at best a copy
//! into a buffer and the server's SGD over it ([`copy_apply_bytes_per_sec`],
//! the same kernel the server runs, split over the same cores).

use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_proto::codec::{DType, TensorData};
use ps_server::optimizer::{Gradient, Optimizer, OptimizerSpec};

/// The floors at one key size.
#[derive(Debug, Clone, Copy)]
pub struct Floors {
    /// Single-thread copies of the key, bytes per second.
    pub memcpy_bytes_per_sec: f64,
    /// A copy into a buffer and SGD over it, bytes per second.
    pub copy_apply_bytes_per_sec: f64,
}

impl Floors {
    /// Both floors at `size` bytes, each run for `seconds`.
    pub fn measure(size: usize, seconds: f64) -> Self {
        let phase = Duration::from_secs_f64(seconds);
        Self {
            memcpy_bytes_per_sec: memcpy_bytes_per_sec(size, phase),
            copy_apply_bytes_per_sec: copy_apply_bytes_per_sec(size, phase),
        }
    }
}

/// Copies `size` bytes from one buffer to another (both touched first) for
/// `phase`, on this thread; bytes per second.
pub fn memcpy_bytes_per_sec(size: usize, phase: Duration) -> f64 {
    let source = vec![0x5au8; size];
    let mut target = vec![0u8; size];
    rate(size, phase, || {
        target.copy_from_slice(std::hint::black_box(&source));
        std::hint::black_box(&mut target);
    })
}

/// Copies a gradient of `size` bytes into a buffer and applies it to the
/// values with SGD at 0.01, for `phase`; bytes per second.
pub fn copy_apply_bytes_per_sec(size: usize, phase: Duration) -> f64 {
    let elements = (size / 4).max(1);
    let gradient: Vec<u8> = (0..elements)
        .flat_map(|i| (((i % 97) as f32 - 48.0) * 1e-6).to_le_bytes())
        .collect();
    let spec = OptimizerSpec::from_proto(Some(&ps_client::sgd(0.01))).expect("SGD is an optimizer");
    let mut optimizer = Optimizer::new(spec, elements);
    let mut values = vec![0.5f32; elements];
    let mut buffer = vec![0u8; gradient.len()];
    rate(gradient.len(), phase, || {
        buffer.copy_from_slice(&gradient);
        let bytes = Bytes::from(std::mem::take(&mut buffer));
        let data = TensorData::new(DType::F32, vec![elements], bytes.clone())
            .expect("a gradient of whole elements");
        optimizer.apply(&mut values, Gradient::Wire(&data), 1.0);
        drop(data);
        buffer = bytes.try_into_mut().map(Vec::from).unwrap_or_default();
    })
}

/// Runs `once` (which moves `size` bytes) repeatedly for `phase`; bytes per second.
fn rate(size: usize, phase: Duration, mut once: impl FnMut()) -> f64 {
    once();
    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < phase || runs == 0 {
        once();
        runs += 1;
    }
    (runs * size as u64) as f64 / start.elapsed().as_secs_f64()
}
