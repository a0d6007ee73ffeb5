//! How long one step's compute (forward, loss and backward) takes on this
//! host's CPU or one of its GPUs: what `ps-local --plan auto` gives the
//! planner as the compute per step, measured instead of guessed.

use std::time::Instant;

use candle_core::{DType, Device, Module};
use candle_nn::{VarBuilder, VarMap};

use crate::data::Dataset;
use crate::model::Mlp;

/// Steps timed after one that warms up.
const TIMED_STEPS: usize = 5;

/// Mean seconds of forward, loss and backward for one batch of `batch`
/// examples of `data` through an MLP of `hidden` layers, on `device`, the
/// batch's copy onto the device included (as a training step has it). A GPU
/// runs the backward pass after `backward` returns, so each timed step waits
/// for the device; the first step (on a GPU, the driver compiling kernels) is
/// not timed.
///
/// # Errors
/// The model or a batch cannot be built or run.
pub fn step_seconds(
    data: &Dataset,
    hidden: &[usize],
    batch: usize,
    device: &Device,
) -> anyhow::Result<f64> {
    let device = device.clone();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = Mlp::new(vb, data.width(), hidden, data.classes)?;
    let batches: Vec<_> = data
        .train
        .batches(batch.max(1))
        .take(TIMED_STEPS + 1)
        .collect();
    let mut timed = 0.0;
    for (i, examples) in batches.iter().enumerate() {
        let started = Instant::now();
        let (x, y) = examples.to_tensors(&device)?;
        let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
        loss.backward()?;
        device.synchronize()?;
        if i > 0 {
            timed += started.elapsed().as_secs_f64();
        }
    }
    Ok(timed / (batches.len().saturating_sub(1)).max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_takes_some_time_and_a_larger_model_longer() {
        let data = crate::data::digits::load().unwrap();
        let small = step_seconds(&data, &[8], 32, &Device::Cpu).unwrap();
        let large = step_seconds(&data, &[1024, 1024], 32, &Device::Cpu).unwrap();
        assert!(small > 0.0 && small.is_finite());
        assert!(large > small, "{large} against {small}");
    }
}
