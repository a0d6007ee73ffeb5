//! The smallest model a trainer test needs: one variable `w = [1; 4]` whose
//! loss is `sum(w)`, so every gradient is exactly 1 and SGD at lr 0.5 moves each
//! element by exactly 0.5 per applied step.

use candle_core::{DType, Device, Tensor};
use candle_nn::{Init, VarMap};
use ps_client::optim::OptimizerChoice;
use ps_client::{GroupInfo, PsClient};
use ps_worker::trainer::PsTrainer;

/// A trainer for `w` through `client` as `group` says, with SGD at lr 0.5.
///
/// # Panics
/// When the servers refuse the trainer.
pub async fn trainer(client: PsClient, group: GroupInfo) -> (PsTrainer, VarMap) {
    trainer_on_wire(client, group, 1.0, ps_proto::codec::DType::F32).await
}

/// [`trainer`], with `w` starting at `initial` and its values sent and
/// received as `wire`.
///
/// # Panics
/// When the servers refuse the trainer.
pub async fn trainer_on_wire(
    client: PsClient,
    group: GroupInfo,
    initial: f64,
    wire: ps_proto::codec::DType,
) -> (PsTrainer, VarMap) {
    let varmap = VarMap::new();
    varmap
        .get(4, "w", Init::Const(initial), DType::F32, &Device::Cpu)
        .expect("a variable");
    let sgd = OptimizerChoice::Sgd.with_lr(0.5);
    let trainer = PsTrainer::new_on_wire(client, group, &varmap, sgd, wire)
        .await
        .expect("a trainer");
    (trainer, varmap)
}

/// One step with the loss `sum(w)`.
///
/// # Panics
/// When the step fails.
pub async fn step(trainer: &mut PsTrainer, varmap: &VarMap) {
    let w = varmap.all_vars().remove(0);
    let loss = w.as_tensor().sum_all().expect("sum");
    trainer.backward_step(&loss).await.expect("a step");
}

/// The values of `w` the trainer loaded.
///
/// # Panics
/// When `w` cannot be read.
pub fn values(varmap: &VarMap) -> Vec<f32> {
    let w: Tensor = varmap.all_vars().remove(0).as_tensor().clone();
    w.to_vec1().expect("values")
}
