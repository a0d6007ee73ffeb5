//! The floors `kv` reads its shared-memory rows against, measured in the same
//! run: what one core does with the bytes and nothing else. A pull through
//! shared memory is at best one copy, so its floor is a single-thread
//! `memcpy` of the key ([`memcpy_bytes_per_sec`]); a push is at best a copy
//! into a buffer and the server's SGD over it ([`copy_apply_bytes_per_sec`],
//! the same kernel the server runs, split over the same cores).
//!
//! Both floors stay on one core, where a shared-memory path cannot: its
//! bytes are written on one core and read on another. [`ring_bytes_per_sec`]
//! measures that part alone, with the data path's own ring and nothing else
//! done with the bytes. On a virtual machine it moves with where the host
//! runs the two cores at the moment, by several times, so a row is read
//! against it too.

use std::io;
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
    /// The key carried through a shared-memory ring from one thread to
    /// another, bytes per second.
    pub ring_bytes_per_sec: f64,
}

impl Floors {
    /// The floors at `size` bytes, each run for `seconds`.
    ///
    /// # Errors
    /// The system refused the ring's region or doorbells.
    pub fn measure(size: usize, seconds: f64) -> io::Result<Self> {
        let phase = Duration::from_secs_f64(seconds);
        Ok(Self {
            memcpy_bytes_per_sec: memcpy_bytes_per_sec(size, phase),
            copy_apply_bytes_per_sec: copy_apply_bytes_per_sec(size, phase),
            ring_bytes_per_sec: ring_bytes_per_sec(size, phase)?,
        })
    }

    /// The mean of these floors and `other`'s.
    pub fn mean_with(self, other: Self) -> Self {
        let mean = |a: f64, b: f64| (a + b) / 2.0;
        Self {
            memcpy_bytes_per_sec: mean(self.memcpy_bytes_per_sec, other.memcpy_bytes_per_sec),
            copy_apply_bytes_per_sec: mean(
                self.copy_apply_bytes_per_sec,
                other.copy_apply_bytes_per_sec,
            ),
            ring_bytes_per_sec: mean(self.ring_bytes_per_sec, other.ring_bytes_per_sec),
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

/// Writes `size` bytes at a time into a shared-memory ring of the servers'
/// default size ([`ps_shm::DEFAULT_RING_BYTES`]) on one thread and reads them
/// out into a buffer on another, for `phase`: what the data path's own copies
/// in and out move between two cores, with nothing else done; bytes per
/// second.
///
/// # Errors
/// As [`Floors::measure`].
pub fn ring_bytes_per_sec(size: usize, phase: Duration) -> io::Result<f64> {
    let (mut writer, mut reader, _, _) = ps_shm::ring::in_process(ps_shm::DEFAULT_RING_BYTES)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let source = vec![0x5au8; size];
    let writing = runtime.spawn(async move {
        loop {
            if writer.write(&source).await.is_err() {
                return;
            }
            writer.flush();
            // A write that never waits (an empty key) must still see the abort.
            tokio::task::yield_now().await;
        }
    });
    let mut target = vec![0u8; size];
    let rate = runtime.block_on(async {
        let mut once = async || reader.read(&mut target).await.map_err(io::Error::other);
        once().await?;
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < phase || runs == 0 {
            once().await?;
            runs += 1;
        }
        io::Result::Ok((runs * size as u64) as f64 / start.elapsed().as_secs_f64())
    });
    // The writer waits for room that will not come: it is dropped with
    // the runtime, and the ring with it.
    writing.abort();
    runtime.shutdown_background();
    rate
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
