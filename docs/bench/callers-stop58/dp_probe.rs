//! data_parallel.rs with timers: the load, the connect and the training loop
//! alone, per step. Built as an example of worker/ for the stop-58 runs (RT=current
//! or RT=N picks the runtime; SPAWN=1 runs the loop as a spawned task).
use candle_core::{DType, Device, Module};
use candle_nn::{VarBuilder, VarMap};
use ps_worker::data::digits;
use ps_worker::model::Mlp;
use ps_worker::train::accuracy;
use ps_worker::{PsTrainer, adam};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    ps_worker::compute_threads::pin_compute_threads();
    let rt = match std::env::var("RT").as_deref() {
        Ok("current") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        Ok(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n.parse()?)
            .enable_all()
            .build()?,
        Err(_) => tokio::runtime::Runtime::new()?,
    };
    if std::env::var("SPAWN").is_ok() {
        rt.block_on(async { tokio::spawn(train()).await? })
    } else {
        rt.block_on(train())
    }
}

async fn train() -> anyhow::Result<()> {
    let t0 = Instant::now();
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
    let t1 = Instant::now();
    let mut opt = PsTrainer::connect(&server, &varmap, adam(0.005)).await?;
    let t2 = Instant::now();
    let train = data.train.shard(opt.rank(), opt.workers());
    let mut steps = 0;
    for _epoch in 0..30 {
        for batch in train.batches(32) {
            let (x, y) = batch.to_tensors(&Device::Cpu)?;
            let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
            opt.backward_step(&loss).await?;
            steps += 1;
        }
    }
    let t3 = Instant::now();
    println!(
        "load {:?} connect {:?} loop {:?} steps {} per-step {:?} acc {:.4}",
        t1 - t0,
        t2 - t1,
        t3 - t2,
        steps,
        (t3 - t2) / steps,
        accuracy(&model, &data.test, &Device::Cpu)?
    );
    Ok(())
}
