//! A plain single-process candle training loop: an MLP on the UCI digits with
//! candle-nn's AdamW. `data_parallel.rs` is the same loop trained on candle-ps.
//!
//! cargo run --release --example single_process

use candle_core::{DType, Device, Module};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use ps_worker::data::digits;
use ps_worker::model::Mlp;
use ps_worker::train::accuracy;

fn main() -> anyhow::Result<()> {
    // First: with RAYON_NUM_THREADS unset, runs this program again with it set
    // to candle's own count, as `data_parallel.rs` does, so that candle does
    // not count the cores on every matrix product and the two loops compute
    // alike.
    ps_worker::compute_threads::pin_compute_threads();
    let data = digits::load()?;
    let varmap = VarMap::new();
    let model = Mlp::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        64,
        &[64],
        10,
    )?;
    // The parameters drawn from seed 0 (candle-nn's own distributions), so every
    // run of the three examples starts from the same model.
    model.draw_parameters(&varmap, 0)?;
    let params = ParamsAdamW {
        lr: 0.005,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut opt = AdamW::new(varmap.all_vars(), params)?;
    let train = data.train.clone();
    for _epoch in 0..30 {
        for batch in train.batches(32) {
            let (x, y) = batch.to_tensors(&Device::Cpu)?;
            let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
            opt.backward_step(&loss)?;
        }
    }
    println!(
        "test accuracy {:.4}",
        accuracy(&model, &data.test, &Device::Cpu)?
    );
    Ok(())
}
