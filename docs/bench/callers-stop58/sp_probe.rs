//! single_process.rs with timers: the load and the training loop alone.
//! Built as an example of worker/ for the stop-58 runs.

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
    let t0 = std::time::Instant::now();
    let data = digits::load()?;
    let varmap = VarMap::new();
    let model = Mlp::new(
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        64,
        &[64],
        10,
    )?;
    let params = ParamsAdamW {
        lr: 0.005,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut opt = AdamW::new(varmap.all_vars(), params)?;
    let train = data.train.clone();
    let t2 = std::time::Instant::now();
    for _epoch in 0..30 {
        for batch in train.batches(32) {
            let (x, y) = batch.to_tensors(&Device::Cpu)?;
            let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
            opt.backward_step(&loss)?;
        }
    }
    println!("load {:?} loop {:?}", t2 - t0, t2.elapsed());
    println!(
        "test accuracy {:.4}",
        accuracy(&model, &data.test, &Device::Cpu)?
    );
    Ok(())
}
