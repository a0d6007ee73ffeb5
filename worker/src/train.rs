//! [`train`]: the training loop of the `ps-worker` binary and of `ps-local`. It
//! trains an [`Mlp`] on this worker's slice of a [`Dataset`], shows progress, then
//! evaluates on the test split and returns a [`TrainSummary`].
//!
//! Under BSP every worker must run the same number of steps, or the others would
//! wait for a step that never comes: each epoch has as many batches as the smallest
//! worker slice holds, and every worker knows that number without asking.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::ctr::EmbeddingConfig;
use crate::data::rng::SplitMix64;
use crate::data::{DataError, Dataset, Split, shard_range};
use crate::metrics::WorkerMetrics;
use crate::model::Mlp;
use crate::report::{EpochRecord, RunRecord, StepRecord};
use crate::segmented::Cuts;
use crate::step_time::TimeSplit;
use crate::trainer::{PsTrainer, TrainerError};
use ps_client::optim::OptimizerChoice;
use ps_client::{GroupInfo, PsClient};

/// Why training failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The trainer failed (servers or candle).
    #[error(transparent)]
    Trainer(#[from] TrainerError),
    /// candle failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The data could not be prepared.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The settings do not fit the data.
    #[error("{0}")]
    Config(String),
    /// `--out` could not be written.
    #[error("cannot write the run's report: {0}")]
    Report(String),
    /// Parameters could not be read from or written to a file.
    #[error("{what} {path}: {source}")]
    File {
        /// "loading" or "saving".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What failed.
        source: candle_core::Error,
    },
}

/// How to train.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Hidden layer widths of the MLP.
    pub hidden: Vec<usize>,
    /// Examples per step on each worker.
    pub batch_size: usize,
    /// Passes over each worker's slice.
    pub epochs: usize,
    /// Server-side optimizer.
    pub optimizer: OptimizerChoice,
    /// Learning rate.
    pub lr: f64,
    /// Where candle computes.
    pub device: Device,
    /// Seed of the initial parameters and of the batch order.
    pub seed: u64,
    /// Segments of the backward pass (1: one whole pass, then the push); see
    /// [`PsTrainer::backward_segments`].
    pub backward_segments: usize,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Start from the parameters in this safetensors file (as `--save` writes them).
    pub load: Option<PathBuf>,
    /// Write the trained parameters here, as safetensors that candle's
    /// `VarMap::load` reads into the same model.
    pub save: Option<PathBuf>,
    /// Record each step here (served on `--metrics-listen`).
    pub metrics: Option<Arc<WorkerMetrics>>,
    /// Write per-epoch loss and accuracy, per-step timings and their charts
    /// here (evaluating on the test split after every epoch).
    pub out: Option<PathBuf>,
    /// Train the click-through model (`crate::ctr`) with this embedding
    /// table instead of the MLP alone.
    pub embedding: Option<EmbeddingConfig>,
    /// The dense values' dtype on the wire ([`PsTrainer::new_on_wire`]).
    pub wire: ps_proto::codec::DType,
    /// Nice levels to lower this process's priority by once its servers are
    /// found to share its host (`crate::share_cores`); 0 keeps it, and a
    /// process that also runs the servers (`ps-local`) must keep it.
    pub yield_to_servers: u8,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            hidden: vec![64],
            batch_size: 32,
            epochs: 30,
            optimizer: OptimizerChoice::Adam,
            lr: 0.005,
            device: Device::Cpu,
            seed: 7,
            backward_segments: 1,
            progress: false,
            load: None,
            save: None,
            metrics: None,
            out: None,
            embedding: None,
            wire: ps_proto::codec::DType::F32,
            yield_to_servers: 0,
        }
    }
}

/// What a worker reports when it is done. With `--json` it is printed as the last
/// line of stdout.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainSummary {
    /// Data set name.
    pub dataset: String,
    /// This worker's rank.
    pub rank: usize,
    /// Workers in the group.
    pub workers: usize,
    /// Accuracy on the test split after training.
    pub test_accuracy: f64,
    /// Mean training loss over the last epoch on this worker.
    pub train_loss: f64,
    /// Steps this worker pushed.
    pub steps: u64,
    /// Examples per step on this worker.
    pub batch_size: usize,
    /// Seconds from the first step to the end of evaluation.
    pub wall_seconds: f64,
    /// Training examples this worker processed per second.
    pub examples_per_second: f64,
    /// Where the training loop's time went (evaluation not included):
    /// compute, push, wait, pull, apply, other.
    pub time_split: TimeSplit,
    /// The dense values' dtype on the wire: f32, bf16 or f16.
    #[serde(default = "f32_name")]
    pub wire_dtype: String,
    /// The nice value this worker trained at (0 where it could not be read):
    /// its own, plus `TrainConfig::yield_to_servers` when it shares its host
    /// with its servers (`crate::share_cores`).
    #[serde(default)]
    pub nice: i32,
}

fn f32_name() -> String {
    ps_proto::codec::DType::F32.to_string()
}

/// Batches per epoch that every worker can run: the smallest slice, in whole batches.
///
/// # Errors
/// [`TrainError::Config`] when a slice cannot fill one batch.
pub fn steps_per_epoch(
    train_len: usize,
    workers: usize,
    batch_size: usize,
) -> Result<u64, TrainError> {
    let smallest = (0..workers.max(1))
        .map(|r| {
            let (s, e) = shard_range(train_len, r, workers);
            e - s
        })
        .min()
        .unwrap_or(0);
    let steps = smallest / batch_size.max(1);
    if steps == 0 {
        return Err(TrainError::Config(format!(
            "batch size {batch_size} is larger than the smallest worker slice ({smallest} of {train_len} examples over {workers} workers); lower --batch-size"
        )));
    }
    Ok(steps as u64)
}

/// Trains an MLP on `data` as worker `group.rank`, then evaluates it.
///
/// # Errors
/// [`TrainError`] from the servers, candle, or settings that do not fit the data.
pub async fn train(
    client: PsClient,
    group: GroupInfo,
    data: &Dataset,
    config: &TrainConfig,
) -> Result<TrainSummary, TrainError> {
    if let Some(embedding) = &config.embedding {
        return crate::ctr::train(client, group, data, config, embedding).await;
    }
    let (rank, workers) = (group.rank.get() as usize, group.workers as usize);
    let per_epoch = steps_per_epoch(data.train.len(), workers, config.batch_size)?;
    let total_steps = per_epoch * config.epochs as u64;
    let shard = data.train.shard(rank, workers);
    let (varmap, model) = model_and_vars(data, config)?;
    let optimizer = config.optimizer.with_lr(config.lr);
    let mut trainer =
        PsTrainer::new_on_wire(client, group, &varmap, optimizer, config.wire).await?;
    crate::share_cores::when_servers_share_this_host(trainer.client(), config.yield_to_servers)
        .await;
    tracing::info!(rank, workers, examples = shard.len(), steps = total_steps, dataset = %data.name, "training");

    let bar = progress_bar(config.progress, total_steps, rank);
    bar.set_position(trainer.step().get().min(total_steps));
    let started = Instant::now();
    let mut log = RunLog::default();
    while trainer.step().get() < total_steps {
        let (epoch, index) = (
            trainer.step().get() / per_epoch,
            trainer.step().get() % per_epoch,
        );
        log.enter(epoch);
        let batch = batch_of(&shard, epoch, index as usize, config, rank);
        let (x, y) = batch.to_tensors(&config.device)?;
        let (times_before, repairs_before) = (trainer.step_times(), trainer.repairs());
        let forward = Instant::now();
        let mut cuts = Cuts::default();
        let logits = model.forward_cut(&x, config.backward_segments, &mut cuts)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        let loss_value = loss.to_scalar::<f32>()? as f64;
        trainer.add_compute(forward.elapsed());
        if cuts.is_empty() {
            trainer.backward_step(&loss).await?;
        } else {
            trainer.backward_segments(&loss, cuts).await?;
        }
        log.losses.push(loss_value);
        let step_times = trainer.step_times().since(&times_before);
        if let Some(metrics) = &config.metrics {
            metrics.step(&step_times, config.batch_size, loss_value);
            metrics.repaired(trainer.repairs() - repairs_before);
        }
        if config.out.is_some() {
            let step = trainer.step().get() - 1;
            let epoch_done = trainer.step().get() % per_epoch == 0;
            log.record_step(step, epoch, step_times);
            if epoch_done {
                log.record_epoch(epoch, accuracy(&model, &data.test, &config.device)?);
            }
        }
        bar.inc(1);
        let examples = (trainer.step().get() as f64) * config.batch_size as f64;
        bar.set_message(format!(
            "loss {:.4}  {:.0} ex/s",
            log.losses.last().unwrap_or(&0.0),
            examples / started.elapsed().as_secs_f64()
        ));
    }
    bar.finish_and_clear();
    let finished = Finished {
        data,
        config,
        varmap: &varmap,
        model: &model,
        log,
        started,
    };
    finished.summarise(trainer, rank, workers).await
}

/// The model on the configured device, its variables drawn from the run's
/// seed, or loaded from `--load` when given.
fn model_and_vars(data: &Dataset, config: &TrainConfig) -> Result<(VarMap, Mlp), TrainError> {
    let mut varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &config.device);
    let model = Mlp::new(vb, data.width(), &config.hidden, data.classes)?;
    model.draw_parameters(&varmap, config.seed)?;
    if let Some(path) = &config.load {
        varmap.load(path).map_err(|source| TrainError::File {
            what: "loading the parameters from",
            path: path.clone(),
            source,
        })?;
        tracing::info!(path = %path.display(), "starting from saved parameters");
    }
    Ok((varmap, model))
}

/// What the loop keeps of the run: the current epoch's losses and, with
/// `--out`, every step and epoch.
#[derive(Default)]
struct RunLog {
    losses: Vec<f64>,
    losses_of: Option<u64>,
    record: RunRecord,
}

impl RunLog {
    /// Starts counting `epoch`'s losses, unless they are counted already (a
    /// worker that joins at the group's step may skip into a new epoch).
    fn enter(&mut self, epoch: u64) {
        if self.losses_of != Some(epoch) {
            self.losses.clear();
            self.losses_of = Some(epoch);
        }
    }

    /// The mean loss of the epoch so far.
    fn mean_loss(&self) -> f64 {
        self.losses.iter().sum::<f64>() / self.losses.len().max(1) as f64
    }

    fn record_step(&mut self, step: u64, epoch: u64, times: crate::step_time::StepTimes) {
        self.record.steps.push(StepRecord { step, epoch, times });
    }

    fn record_epoch(&mut self, epoch: u64, test_accuracy: f64) {
        let train_loss = self.mean_loss();
        self.record.epochs.push(EpochRecord {
            epoch,
            train_loss,
            test_accuracy,
        });
    }
}

/// A run whose steps are done, and what its summary is made from.
struct Finished<'a> {
    data: &'a Dataset,
    config: &'a TrainConfig,
    varmap: &'a VarMap,
    model: &'a Mlp,
    log: RunLog,
    started: Instant,
}

impl Finished<'_> {
    /// Loads the final values, evaluates them, writes `--out` and `--save`,
    /// leaves the job and says how the run went.
    async fn summarise(
        self,
        mut trainer: PsTrainer,
        rank: usize,
        workers: usize,
    ) -> Result<TrainSummary, TrainError> {
        let Self {
            data,
            config,
            varmap,
            model,
            log,
            started,
        } = self;
        let time_split = trainer.step_times().split(started.elapsed());
        trainer.refresh().await?;
        let test_accuracy = accuracy(model, &data.test, &config.device)?;
        if let Some(dir) = &config.out {
            let written = log
                .record
                .write(dir)
                .map_err(|e| TrainError::Report(e.to_string()))?;
            tracing::info!(files = ?written, "wrote the run's loss, accuracy and timings");
        }
        if let Some(path) = &config.save {
            save(varmap, path)?;
            tracing::info!(path = %path.display(), test_accuracy, "saved the trained parameters");
        }
        let wall_seconds = started.elapsed().as_secs_f64();
        let steps = trainer.step().get();
        trainer.leave().await;
        Ok(TrainSummary {
            dataset: data.name.clone(),
            rank,
            workers,
            test_accuracy,
            train_loss: log.mean_loss(),
            steps,
            batch_size: config.batch_size,
            wall_seconds,
            examples_per_second: steps as f64 * config.batch_size as f64 / wall_seconds.max(1e-9),
            time_split,
            wire_dtype: config.wire.to_string(),
            nice: crate::share_cores::current_nice().unwrap_or(0),
        })
    }
}

/// Writes `varmap` to `path` atomically: to a temporary file beside it, then
/// renamed over it, so a crash never leaves half a model behind.
fn save(varmap: &VarMap, path: &Path) -> Result<(), TrainError> {
    let failed = |source| TrainError::File {
        what: "saving the parameters to",
        path: path.to_path_buf(),
        source,
    };
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    varmap.save(&partial).map_err(failed)?;
    std::fs::rename(&partial, path).map_err(|e| failed(e.into()))
}

pub(crate) fn progress_bar(visible: bool, total: u64, rank: usize) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} steps  {msg}",
    )
    .expect("valid template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("worker {rank}"));
    bar
}

/// Batch `index` of `epoch`: the epoch's fixed shuffle of the slice, cut in batches.
pub(crate) fn batch_of(
    shard: &Split,
    epoch: u64,
    index: usize,
    config: &TrainConfig,
    rank: usize,
) -> Split {
    let mut order: Vec<usize> = (0..shard.len()).collect();
    SplitMix64::new(config.seed ^ (epoch << 20) ^ ((rank as u64) << 40)).shuffle(&mut order);
    shard.select(&order[index * config.batch_size..(index + 1) * config.batch_size])
}

/// Fraction of `split` that `model` classifies correctly.
///
/// # Errors
/// When candle fails.
pub fn accuracy(
    model: &impl Module,
    split: &Split,
    device: &Device,
) -> Result<f64, candle_core::Error> {
    let mut correct = 0usize;
    for start in (0..split.len()).step_by(1024) {
        let batch = split.select(&(start..(start + 1024).min(split.len())).collect::<Vec<_>>());
        let x = Tensor::from_slice(&batch.features, (batch.len(), batch.width), device)?;
        let predicted: Vec<u32> = model.forward(&x)?.argmax(1)?.to_vec1()?;
        correct += predicted
            .iter()
            .zip(&batch.labels)
            .filter(|(p, l)| p == l)
            .count();
    }
    Ok(correct as f64 / split.len().max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_runs_the_same_number_of_steps() {
        assert_eq!(steps_per_epoch(1437, 2, 32).unwrap(), 22);
        assert_eq!(steps_per_epoch(1437, 3, 32).unwrap(), 14);
        let err = steps_per_epoch(10, 4, 32).unwrap_err().to_string();
        assert!(err.contains("--batch-size"), "{err}");
    }
}
