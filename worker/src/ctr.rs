//! The click-through model on the click data set (`data::clicks`): each
//! example's ids looked up in a [`PsEmbedding`] (its rows on the servers,
//! spread over them by row), the rows concatenated into an MLP whose
//! parameters go through [`PsTrainer`]. A step pulls the batch's rows,
//! computes, pushes the row gradients, then pushes the MLP's gradients and
//! pulls its values, as `train::train` does for a dense model.

use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};
use candle_nn::{Module, VarBuilder, VarMap};
use ps_client::GroupInfo;
use ps_client::PsClient;
use ps_client::table_spec::{RowOptimizerChoice, table, uniform_rows};
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::v1;

use crate::data::{Dataset, Split};
use crate::embedding::PsEmbedding;
use crate::model::Mlp;
use crate::train::{
    TrainConfig, TrainError, TrainSummary, batch_of, progress_bar, steps_per_epoch,
};
use crate::trainer::{PsTrainer, TrainerError};

/// Repairs of placement one step's row pull and push may make between them.
const MAX_REPAIRS: usize = 5;

/// The table name the click model declares.
pub const TABLE: &str = "clicks";

/// How the click model's embedding table is held.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbeddingConfig {
    /// Elements per row.
    pub width: usize,
    /// The server-side row optimizer.
    pub optimizer: RowOptimizerChoice,
    /// Its learning rate.
    pub lr: f64,
    /// Hold the table as one dense parameter of the MLP's instead (every
    /// step pushes and pulls all of it): the baseline rows are measured against.
    pub dense: bool,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        Self {
            width: 8,
            optimizer: RowOptimizerChoice::Adagrad,
            lr: 0.2,
            dense: false,
        }
    }
}

impl EmbeddingConfig {
    /// The table: rows start uniform in ±1/sqrt(width), as candle-nn's
    /// embeddings are scaled, drawn with the run's seed.
    pub fn table(&self, seed: u64) -> v1::TableSpec {
        let bound = 1.0 / (self.width as f64).sqrt();
        table(
            TABLE,
            self.width as u32,
            uniform_rows(bound, seed),
            self.optimizer.with_lr(self.lr),
        )
    }
}

/// The MLP over the concatenated rows of an example and, for a dense
/// table, the table as one of its parameters.
fn head(
    data: &Dataset,
    embedding: &EmbeddingConfig,
    config: &TrainConfig,
) -> Result<(VarMap, Mlp, Option<Tensor>), TrainError> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &config.device);
    let input = data.train.fields * embedding.width;
    let model = Mlp::new(vb.clone(), input, &config.hidden, data.classes)?;
    model.draw_parameters(&varmap, config.seed)?;
    let dense = match embedding.dense {
        true => {
            let ids = data.train.ids.iter().chain(&data.test.ids);
            let rows = ids.max().map_or(1, |m| m + 1) as usize;
            let bound = 1.0 / (embedding.width as f64).sqrt();
            let init = candle_nn::Init::Uniform {
                lo: -bound,
                up: bound,
            };
            Some(vb.get_with_hints((rows, embedding.width), "embedding", init)?)
        }
        false => None,
    };
    Ok((varmap, model, dense))
}

/// Where the click model's rows come from: the servers' table, or a dense
/// parameter of the model.
enum Rows {
    Table(PsEmbedding),
    Dense(Tensor),
}

impl Rows {
    /// An example batch's input: its rows, concatenated per example.
    async fn inputs(
        &mut self,
        client: &PsClient,
        batch: &Split,
        version: Version,
        width: usize,
    ) -> Result<Tensor, TrainerError> {
        match self {
            Rows::Table(table) => inputs(table, client, batch, version).await,
            Rows::Dense(rows) => {
                let index: Vec<u32> = batch.ids.iter().map(|&id| id as u32).collect();
                let index = Tensor::from_vec(index, batch.ids.len(), rows.device())?;
                let looked_up = rows.index_select(&index, 0)?;
                Ok(looked_up.reshape((batch.len(), batch.fields * width))?)
            }
        }
    }

    /// A batch's input with the rows as they are now, without waiting for a
    /// version (evaluation).
    async fn current(
        &mut self,
        client: &PsClient,
        batch: &Split,
        width: usize,
    ) -> Result<Tensor, TrainerError> {
        match self {
            Rows::Table(table) => Ok(table
                .read(client, &batch.ids, &[batch.len(), batch.fields])
                .await?
                .reshape((batch.len(), batch.fields * width))?),
            Rows::Dense(_) => self.inputs(client, batch, Version(0), width).await,
        }
    }

    /// Pushes a table's row gradients (a dense table goes with the MLP's).
    async fn push(
        &self,
        client: &PsClient,
        grads: &GradStore,
        at: (Rank, Step),
    ) -> Result<(), TrainerError> {
        if let Rows::Table(table) = self {
            table.push_gradients(client, grads, at).await?;
        }
        Ok(())
    }
}

/// An example batch's input: its rows, concatenated per example.
async fn inputs(
    embedding: &mut PsEmbedding,
    client: &PsClient,
    batch: &Split,
    version: Version,
) -> Result<Tensor, TrainerError> {
    let rows = embedding
        .lookup(client, &batch.ids, &[batch.len(), batch.fields], version)
        .await?;
    Ok(rows.reshape((batch.len(), batch.fields * embedding.width()))?)
}

/// Trains the click model on `data` as worker `group.rank`, then evaluates it.
///
/// # Errors
/// [`TrainError`] from the servers, candle, or settings that do not fit the data.
pub async fn train(
    client: PsClient,
    group: GroupInfo,
    data: &Dataset,
    config: &TrainConfig,
    embedding: &EmbeddingConfig,
) -> Result<TrainSummary, TrainError> {
    if data.train.fields == 0 {
        return Err(TrainError::Config(format!(
            "the click model reads categorical ids, and data set {} has none; use --dataset clicks",
            data.name
        )));
    }
    let (rank, workers) = (group.rank.get() as usize, group.workers as usize);
    let per_epoch = steps_per_epoch(data.train.len(), workers, config.batch_size)?;
    let total_steps = per_epoch * config.epochs as u64;
    let shard = data.train.shard(rank, workers);
    let (varmap, model, dense) = head(data, embedding, config)?;
    let mut trainer = PsTrainer::new_on_wire(
        client,
        group,
        &varmap,
        config.optimizer.with_lr(config.lr),
        config.wire,
    )
    .await?;
    let mut rows = match dense {
        Some(rows) => Rows::Dense(rows),
        None => {
            let table = embedding.table(config.seed);
            Rows::Table(PsEmbedding::declare(trainer.client_mut(), table, &config.device).await?)
        }
    };
    crate::share_cores::when_servers_share_this_host(trainer.client(), config.yield_to_servers)
        .await;
    tracing::info!(
        rank,
        workers,
        examples = shard.len(),
        steps = total_steps,
        table = TABLE,
        "training the click model"
    );

    let bar = progress_bar(config.progress, total_steps, rank);
    let started = Instant::now();
    let mut losses = Vec::new();
    while trainer.step().get() < total_steps {
        let (epoch, index) = (
            trainer.step().get() / per_epoch,
            trainer.step().get() % per_epoch,
        );
        if index == 0 {
            losses.clear();
        }
        let batch = batch_of(&shard, epoch, index as usize, config, rank);
        let y = Tensor::from_slice(&batch.labels, batch.len(), &config.device)?;
        let forward = Instant::now();
        let version = trainer.rows_version();
        let mut repairs = 0;
        let x = loop {
            match rows
                .inputs(trainer.client(), &batch, version, embedding.width)
                .await
            {
                Err(TrainerError::Client(error)) if repairs < MAX_REPAIRS => {
                    repairs += 1;
                    trainer.repair(error).await?;
                }
                done => break done?,
            }
        };
        let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
        losses.push(f64::from(loss.to_scalar::<f32>()?));
        let grads = loss.backward()?;
        trainer.add_compute(forward.elapsed());
        let at = trainer.at();
        push_rows(&rows, &mut trainer, &grads, at).await?;
        let repairs_before = trainer.repairs();
        trainer.apply_gradients(&grads).await?;
        if trainer.repairs() > repairs_before {
            // A server was lost or the map moved during the dense exchange:
            // buckets restored since took this step's rows from a checkpoint
            // behind it. Pushing them again completes the step there; buckets
            // that had them acknowledge the repeat.
            push_rows(&rows, &mut trainer, &grads, at).await?;
        }
        bar.inc(1);
        bar.set_message(format!("loss {:.4}", losses.last().unwrap_or(&0.0)));
    }
    bar.finish_and_clear();
    let time_split = trainer.step_times().split(started.elapsed());
    trainer.refresh().await?;
    let test_accuracy =
        accuracy(&model, &mut rows, &mut trainer, &data.test, embedding.width).await?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let steps = trainer.step().get();
    trainer.leave().await;
    Ok(TrainSummary {
        dataset: data.name.clone(),
        rank,
        workers,
        test_accuracy,
        train_loss: losses.iter().sum::<f64>() / losses.len().max(1) as f64,
        steps,
        batch_size: config.batch_size,
        wall_seconds,
        examples_per_second: steps as f64 * config.batch_size as f64 / wall_seconds.max(1e-9),
        time_split,
        wire_dtype: config.wire.to_string(),
        nice: crate::share_cores::current_nice().unwrap_or(0),
    })
}

/// Pushes this step's row gradients as `at`, repairing placement between
/// attempts as the trainer does for its own steps.
async fn push_rows(
    rows: &Rows,
    trainer: &mut PsTrainer,
    grads: &GradStore,
    at: (Rank, Step),
) -> Result<(), TrainError> {
    let mut repairs = 0;
    while let Err(error) = rows.push(trainer.client(), grads, at).await {
        match error {
            TrainerError::Client(error) if repairs < MAX_REPAIRS => {
                repairs += 1;
                trainer.repair(error).await?;
            }
            other => return Err(other.into()),
        }
    }
    Ok(())
}

/// Fraction of `split` the model classifies correctly, with the rows as the
/// servers hold them now (placement repaired on the way: the other workers
/// leaving moves the shard map on).
async fn accuracy(
    model: &Mlp,
    rows: &mut Rows,
    trainer: &mut PsTrainer,
    split: &Split,
    width: usize,
) -> Result<f64, TrainError> {
    let mut correct = 0usize;
    for start in (0..split.len()).step_by(1024) {
        let batch = split.select(&(start..(start + 1024).min(split.len())).collect::<Vec<_>>());
        let mut repairs = 0;
        let x = loop {
            match rows.current(trainer.client(), &batch, width).await {
                Err(TrainerError::Client(error)) if repairs < MAX_REPAIRS => {
                    repairs += 1;
                    trainer.repair(error).await?;
                }
                done => break done?,
            }
        };
        let predicted: Vec<u32> = model.forward(&x)?.argmax(1)?.to_vec1()?;
        correct += predicted
            .iter()
            .zip(&batch.labels)
            .filter(|(p, l)| p == l)
            .count();
    }
    Ok(correct as f64 / split.len().max(1) as f64)
}
