//! `single_process.rs` made data-parallel on candle-ps: the optimizer becomes a
//! `PsTrainer`, each worker takes its slice of the data by rank, and the step is
//! awaited. Start `ps-server --workers N`, then N copies of this example.
//!
//! cargo run --release --example data_parallel -- 127.0.0.1:7070

use candle_core::{DType, Device, Module};
use candle_nn::{VarBuilder, VarMap};
use ps_worker::data::digits;
use ps_worker::model::Mlp;
use ps_worker::train::accuracy;
use ps_worker::{PsTrainer, adam};

fn main() -> anyhow::Result<()> {
    // First, before any thread starts: candle counts the host's cores on every
    // matrix product unless RAYON_NUM_THREADS is set (see `compute_threads`).
    ps_worker::compute_threads::pin_compute_threads();
    tokio::runtime::Runtime::new()?.block_on(train())
}

async fn train() -> anyhow::Result<()> {
    let server = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7070".into());
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
    let mut opt = PsTrainer::connect(&server, &varmap, adam(0.005)).await?;
    let train = data.train.shard(opt.rank(), opt.workers());
    for _epoch in 0..30 {
        for batch in train.batches(32) {
            let (x, y) = batch.to_tensors(&Device::Cpu)?;
            let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
            opt.backward_step(&loss).await?;
        }
    }
    println!(
        "test accuracy {:.4}",
        accuracy(&model, &data.test, &Device::Cpu)?
    );
    Ok(())
}
