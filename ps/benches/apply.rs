#![allow(missing_docs)] // criterion_group! writes an undocumented public function.
//! The server's per-byte work on a pushed gradient, in GB/s of gradient: the
//! non-finite scan that runs as chunks arrive, and each optimizer's apply pass.
//!
//! A gradient read from HTTP/2 frames lies at any byte offset, so each case runs
//! on a 4-byte-aligned tensor and on one that starts one byte in.
//! `cargo bench -p ps-server --bench apply`.

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ps_proto::codec::{DType, TensorData, first_non_finite};
use ps_server::optimizer::{Gradient, Optimizer, OptimizerSpec};

/// Elements of the benchmarked key: 16 MiB of f32, as `ps-microbench kv`'s largest.
const ELEMENTS: usize = 4 << 20;

/// A gradient of `ELEMENTS` finite f32 values whose data starts `offset` bytes
/// into its buffer.
fn gradient(offset: usize) -> TensorData {
    let mut raw = vec![0u8; offset];
    raw.extend((0..ELEMENTS).flat_map(|i| ((i % 1000) as f32 * 1e-3 - 0.5).to_le_bytes()));
    let data = Bytes::from(raw).slice(offset..);
    TensorData::new(DType::F32, vec![ELEMENTS], data).expect("a valid gradient")
}

fn placements() -> [(&'static str, TensorData); 2] {
    [("aligned", gradient(0)), ("unaligned", gradient(1))]
}

fn non_finite_scan(c: &mut Criterion) {
    let mut group = c.benchmark_group("non_finite_scan");
    group.throughput(Throughput::Bytes((ELEMENTS * 4) as u64));
    for (placement, tensor) in placements() {
        let bytes = tensor.to_contiguous();
        group.bench_function(placement, |b| {
            b.iter(|| first_non_finite(DType::F32, &bytes));
        });
    }
    group.finish();
}

fn apply(c: &mut Criterion) {
    let specs = [
        OptimizerSpec::Sgd {
            lr: 0.01,
            weight_decay: 1e-4,
        },
        OptimizerSpec::Momentum {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 1e-4,
            nesterov: false,
        },
        OptimizerSpec::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
    ];
    let mut group = c.benchmark_group("apply");
    group.throughput(Throughput::Bytes((ELEMENTS * 4) as u64));
    for spec in specs {
        let name = spec.to_string();
        let name = name.split('(').next().unwrap_or("optimizer").to_string();
        for (placement, tensor) in placements() {
            let mut optimizer = Optimizer::new(spec.clone(), ELEMENTS);
            let mut values = vec![0.25f32; ELEMENTS];
            group.bench_function(BenchmarkId::new(name.clone(), placement), |b| {
                b.iter(|| optimizer.apply(&mut values, Gradient::Wire(&tensor), 0.5));
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = non_finite_scan, apply
}
criterion_main!(benches);
