//! `data_parallel.rs` with the backward pass in two segments: the forward pass
//! is cut between the layers, and each segment's gradients are pushed while the
//! segment below is still being differentiated (docs/overlap.md). The
//! gradients, and so the training, are those of `data_parallel.rs`. Start
//! `ps-server --workers N`, then N copies of this example.
//!
//! cargo run --release --example segmented -- 127.0.0.1:7070

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use ps_worker::data::digits;
use ps_worker::model::Mlp;
use ps_worker::segmented::Cuts;
use ps_worker::train::accuracy;
use ps_worker::{PsTrainer, adam};

fn main() -> anyhow::Result<()> {
    // First, before any thread starts, as in `data_parallel.rs`.
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
        &[64, 32],
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
            // Two segments: layers 0 and 1 below the cut, layer 2 above it.
            let mut cuts = Cuts::default();
            let logits = model.forward_cut(&x, 2, &mut cuts)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
            opt.backward_segments(&loss, cuts).await?;
        }
    }
    println!(
        "test accuracy {:.4}",
        accuracy(&model, &data.test, &Device::Cpu)?
    );
    Ok(())
}
