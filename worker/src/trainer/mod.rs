//! [`PsTrainer`]: data-parallel training of any candle `VarMap` on the parameter
//! servers. It replaces a candle optimizer:
//!
//! ```text
//! let mut opt = candle_nn::AdamW::new(varmap.all_vars(), params)?;     // single process
//! let mut opt = PsTrainer::connect(&server, &varmap, adam(1e-3)).await?; // data-parallel
//! opt.backward_step(&loss)?;        becomes        opt.backward_step(&loss).await?;
//! ```
//!
//! The first worker to register a variable sets its initial values; every worker
//! then pulls them, so all start from the same parameters. Each step pushes every
//! gradient by its `VarMap` name, pulls the version the consistency model requires,
//! and writes the values into the `Var`s.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use candle_nn::VarMap;
use ps_proto::codec;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::v1;

use ps_client::placement::ParamInfo;
use ps_client::{
    Action, ClientConfig, ClientError, GroupInfo, LocalCopy, Outcome, ParamBytes, PsClient,
    PulledParam, Recovering, RepairBudget,
};

use crate::host_copy::{CopyPlan, HostBuffers};
use crate::step_time::StepTimes;

mod segment_feed;
mod segmented_step;

/// Why a training step failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// The parameter servers failed or refused a request.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// candle failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// A segmented backward pass was cut where it cannot be.
    #[error("segmented backward: {0}")]
    Segments(String),
    /// The trainer or a layer was called out of order.
    #[error("{0}")]
    Usage(String),
}

/// Data-parallel training of a `VarMap` on parameter servers.
pub struct PsTrainer {
    client: PsClient,
    vars: Vec<(String, Var)>,
    group: GroupInfo,
    optimizer: v1::Optimizer,
    step: Step,
    /// The version of the values in the `Var`s (what this worker would restore).
    loaded: Version,
    created: bool,
    times: StepTimes,
    repairs: u64,
    /// The last values pulled; their buffers are written in place by the next
    /// pull. A buffer allocated afresh every step costs more than the copy
    /// into the `Var`: its pages are faulted in and zeroed each time (a
    /// bert-base pull ran at half the speed).
    pulled: BTreeMap<String, PulledParam>,
    /// How tensors cross between the model's device and the host.
    copy_plan: CopyPlan,
    /// The host buffer a joined copy gathers pulled values in, reused every step.
    staging: Vec<f32>,
    /// The host buffer a joined copy takes the gradients off the device into,
    /// reused every step.
    gradient_buffer: HostBuffers,
    /// The same for each segment of a segmented backward pass, by segment.
    segment_buffers: Vec<HostBuffers>,
    /// The values' dtype on the wire: f32, or bf16/f16 for half the bytes
    /// (rounded values; the servers keep and update f32).
    wire: codec::DType,
}

impl PsTrainer {
    /// Connects to `server` (a parameter server, or a scheduler), joins the worker group
    /// for a rank, and registers `varmap`'s variables.
    ///
    /// # Errors
    /// [`TrainerError`] when the server is unreachable, the group is full, or a
    /// variable conflicts with what the server holds.
    pub async fn connect(
        server: &str,
        varmap: &VarMap,
        optimizer: v1::Optimizer,
    ) -> Result<Self, TrainerError> {
        let mut client = PsClient::connect(ClientConfig::new(vec![server.to_string()])).await?;
        let group = client.join(&client_token()).await?;
        Self::new(client, group, varmap, optimizer).await
    }

    /// Registers `varmap`'s variables through `client` as worker `group.rank`, then
    /// loads the values the servers hold into them.
    ///
    /// # Errors
    /// As [`PsTrainer::connect`].
    pub async fn new(
        client: PsClient,
        group: GroupInfo,
        varmap: &VarMap,
        optimizer: v1::Optimizer,
    ) -> Result<Self, TrainerError> {
        Self::new_on_wire(client, group, varmap, optimizer, codec::DType::F32).await
    }

    /// [`PsTrainer::new`], with the values sent and received as `wire`: each
    /// gradient pushed and each value pulled is rounded to it (bf16 or f16
    /// halve the bytes on the wire), while the servers keep and update f32.
    /// Every worker of a job must use the same.
    ///
    /// # Errors
    /// As [`PsTrainer::connect`]; a server holding the variables in another
    /// dtype refuses them.
    pub async fn new_on_wire(
        mut client: PsClient,
        group: GroupInfo,
        varmap: &VarMap,
        optimizer: v1::Optimizer,
        wire: codec::DType,
    ) -> Result<Self, TrainerError> {
        let vars = vars_by_name(varmap);
        let infos: Vec<ParamInfo> = vars
            .iter()
            .map(|(name, var)| ParamInfo {
                name: name.clone(),
                shape: var.dims().to_vec(),
                dtype: wire,
            })
            .collect();
        client.place(&infos).await?;
        let copy_plan = copy_plan(&vars);
        let mut trainer = Self {
            client,
            vars,
            group,
            optimizer,
            step: Step(0),
            loaded: Version(0),
            times: StepTimes::default(),
            repairs: 0,
            pulled: BTreeMap::new(),
            created: false,
            copy_plan,
            staging: Vec::new(),
            gradient_buffer: HostBuffers::default(),
            segment_buffers: Vec::new(),
            wire,
        };
        trainer.created = trainer.register_initial().await?;
        let version = trainer.load(Version(0)).await?;
        if group.consistency.has_group() {
            trainer.step = version.next_step();
        }
        tracing::info!(
            rank = %group.rank,
            workers = group.workers,
            created = trainer.created,
            requests_per_push = trainer.client.requests_per_operation(),
            step = %trainer.step,
            "trainer ready"
        );
        Ok(trainer)
    }

    /// This worker's rank.
    pub fn rank(&self) -> usize {
        self.group.rank.get() as usize
    }

    /// Workers in the group.
    pub fn workers(&self) -> usize {
        self.group.workers as usize
    }

    /// The next step this worker will push.
    pub fn step(&self) -> Step {
        self.step
    }

    /// True when this worker's initial values were the ones registered.
    pub fn created_parameters(&self) -> bool {
        self.created
    }

    /// Ends this worker's part in the job: the scheduler (if any) stops counting it.
    pub async fn leave(mut self) {
        self.client.leave().await;
    }

    /// The client, for its placement and servers.
    pub fn client(&self) -> &PsClient {
        &self.client
    }

    /// Repairs placement after `error` failed an operation outside the
    /// trainer's own steps (an embedding layer's pull or push), as the
    /// trainer repairs its own: `Ok` when the operation can be repeated.
    ///
    /// # Errors
    /// `error` (or a later one) when no repair can help.
    pub async fn repair(&mut self, error: ClientError) -> Result<(), TrainerError> {
        let mut recovering = Recovering::operation(RepairBudget::default());
        match self.recover(&mut recovering, error).await? {
            None => Ok(()),
            Some(step) => Err(TrainerError::Usage(format!(
                "an operation's repair asked to rejoin at step {step}"
            ))),
        }
    }

    /// The client, to declare embedding tables through.
    pub fn client_mut(&mut self) -> &mut PsClient {
        &mut self.client
    }

    /// This worker's rank and the step it pushes next: what a row push of
    /// this step is tagged with.
    pub fn at(&self) -> (Rank, Step) {
        (self.group.rank, self.step)
    }

    /// The version the rows a step reads must have reached: what the
    /// consistency model waits for after the previous step (0 for the first).
    pub fn rows_version(&self) -> Version {
        match self.step.get() {
            0 => Version(0),
            step => self.group.consistency.version_after(Step(step - 1)),
        }
    }

    /// Runs backward on `loss`, pushes the gradients, pulls the new values and writes
    /// them into the variables.
    ///
    /// # Errors
    /// [`TrainerError`] from candle or the servers.
    pub async fn backward_step(&mut self, loss: &Tensor) -> Result<(), TrainerError> {
        let backward = Instant::now();
        let grads = loss.backward()?;
        // A GPU runs the backward pass after `backward` returns: wait for it, so
        // that its time is booked as compute and not as the gather after it.
        loss.device().synchronize()?;
        self.times.compute += backward.elapsed();
        self.apply_gradients(&grads).await
    }

    /// Books `took` as compute (a caller's forward pass and loss; the backward
    /// pass of [`PsTrainer::backward_step`] is booked already).
    pub fn add_compute(&mut self, took: Duration) {
        self.times.compute += took;
    }

    /// Where this trainer's time went so far: compute, push, wait, pull, apply.
    pub fn step_times(&self) -> StepTimes {
        self.times
    }

    /// How many times a failed call had placement repaired so far.
    pub fn repairs(&self) -> u64 {
        self.repairs
    }

    /// Pushes `grads` (zeros for variables without a gradient) as this worker's next
    /// step and loads the values the consistency model says to wait for.
    ///
    /// # Errors
    /// [`TrainerError`] from candle or the servers.
    pub async fn apply_gradients(&mut self, grads: &GradStore) -> Result<(), TrainerError> {
        let gathering = Instant::now();
        let pushed = self.gradients(grads)?;
        self.times.gather += gathering.elapsed();
        self.exchange(&pushed, None).await
    }

    /// Pushes `pushed` as this worker's step and loads the values to wait for,
    /// repeating the whole after a repair until it succeeds or nothing can
    /// help; `failed` is a first attempt's error, already made.
    async fn exchange(
        &mut self,
        pushed: &[ParamBytes],
        mut failed: Option<ClientError>,
    ) -> Result<(), TrainerError> {
        let wait_for = self.group.consistency.version_after(self.step);
        let mut recovering = Recovering::step_of_group(RepairBudget::default());
        loop {
            let attempt = match failed.take() {
                Some(error) => Err(TrainerError::Client(error)),
                None => self.push_and_load(pushed, wait_for).await,
            };
            let error = match attempt {
                Ok(()) => {
                    self.step = self.step.next();
                    return Ok(());
                }
                Err(TrainerError::Client(error)) => error,
                Err(error) => return Err(error),
            };
            if let Some(step) = self.recover(&mut recovering, error).await? {
                return self.join_at(step).await;
            }
        }
    }

    /// Every variable's gradient (zeros for one without) as host bytes, by name.
    fn gradients(&mut self, grads: &GradStore) -> Result<Vec<ParamBytes>, TrainerError> {
        let tensors = self
            .vars
            .iter()
            .map(|(_, var)| match grads.get(var.as_tensor()) {
                Some(grad) => Ok(grad.clone()),
                None => var.as_tensor().zeros_like(),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let bytes = self
            .copy_plan
            .to_host(&tensors, &mut self.gradient_buffer)?;
        let wired = self.gradient_buffer.to_wire(bytes, self.wire);
        Ok(self.named(wired))
    }

    /// `wired[i]` (as the wire takes them) named after variable `i`.
    fn named(&self, wired: Vec<Bytes>) -> Vec<ParamBytes> {
        self.vars
            .iter()
            .zip(wired)
            .map(|((name, _), data)| ParamBytes::new(name, data))
            .collect()
    }

    /// The group completed this worker's step without it (the worker was declared
    /// dead while it stalled, or it rejoined as the step closed): drops this step's
    /// gradients, loads the values at `step` and carries on from there, as a
    /// worker that joins a running job does.
    async fn join_at(&mut self, step: Step) -> Result<(), TrainerError> {
        tracing::info!(
            rank = %self.group.rank,
            skipped = %self.step,
            %step,
            "the group completed this step without this worker; loading the current values and joining at the group's step"
        );
        self.load(Version::before(step)).await?;
        self.step = step;
        Ok(())
    }

    /// One attempt at a step: push (exactly once per key, however often it is
    /// repeated) and load the version to wait for.
    async fn push_and_load(
        &mut self,
        pushed: &[ParamBytes],
        wait_for: Version,
    ) -> Result<(), TrainerError> {
        if self.client.newer_map().is_some() {
            let copy = self.local_copy()?;
            self.client.follow_newer_map(&copy).await?;
        }
        let exchanging = Instant::now();
        let (_, waited) = self
            .client
            .push_then_pull_into(
                (self.group.rank, self.step),
                pushed,
                wait_for,
                &mut self.pulled,
            )
            .await?;
        self.times.exchanged(exchanging.elapsed(), waited);
        self.apply_pulled()?;
        Ok(())
    }

    /// Loads the latest values the servers hold into the variables.
    ///
    /// # Errors
    /// [`TrainerError`] from candle or the servers.
    pub async fn refresh(&mut self) -> Result<Version, TrainerError> {
        self.load(Version(0)).await
    }

    /// After `error` failed an attempt: what `recovering` decides. Placement
    /// is repaired with this worker's copy of the values (`ps_client::repair`)
    /// until the attempt can be repeated (`None`); a step's recovery may name
    /// the group's step to rejoin at instead. The error when nothing can help.
    async fn recover(
        &mut self,
        recovering: &mut Recovering,
        error: ClientError,
    ) -> Result<Option<Step>, TrainerError> {
        match recovering.step(Outcome::Failed(error.recovery(self.step))) {
            Some(Action::Repair(repair)) => {
                let copy = self.local_copy()?;
                self.repairs += 1;
                let step = self.step;
                self.client
                    .recover(recovering, repair, error, step, &copy)
                    .await?;
                Ok(None)
            }
            Some(Action::Rejoin(step)) => Ok(Some(step)),
            Some(Action::Attempt | Action::Done) | None => Err(error.into()),
        }
    }

    /// Registers every variable with its initial values (placement repaired on the
    /// way when the map moves meanwhile); true when this worker's values were the
    /// ones taken.
    async fn register_initial(&mut self) -> Result<bool, TrainerError> {
        let initial = self.copy()?;
        // An operation's recovery never rejoins: it repairs or gives up.
        let mut recovering = Recovering::operation(RepairBudget::default());
        loop {
            match self.client.register(&initial, &self.optimizer).await {
                Ok(created) => return Ok(created),
                Err(error) => self.recover(&mut recovering, error).await?,
            };
        }
    }

    /// This worker's values of every variable, by name.
    fn copy(&self) -> Result<Vec<ParamBytes>, TrainerError> {
        let values: Vec<Tensor> = self
            .vars
            .iter()
            .map(|(_, v)| v.as_tensor().clone())
            .collect();
        let mut buffers = HostBuffers::default();
        let bytes = self.copy_plan.to_host(&values, &mut buffers)?;
        Ok(self.named(buffers.to_wire(bytes, self.wire)))
    }

    /// This worker's copy of every variable at the version it holds, for servers
    /// that must restore keys.
    fn local_copy(&self) -> Result<LocalCopy, TrainerError> {
        Ok(LocalCopy {
            values: self.copy()?,
            version: self.loaded,
            optimizer: self.optimizer,
        })
    }

    /// Pulls every variable at `min_version` or later into the `Var`s, repairing
    /// placement on the way when needed; returns the lowest version received.
    async fn load(&mut self, min_version: Version) -> Result<Version, TrainerError> {
        // An operation's recovery never rejoins: it repairs or gives up.
        let mut recovering = Recovering::operation(RepairBudget::default());
        loop {
            match self.load_once(min_version).await {
                Ok(version) => return Ok(version),
                Err(TrainerError::Client(error)) => self.recover(&mut recovering, error).await?,
                Err(error) => return Err(error),
            };
        }
    }

    async fn load_once(&mut self, min_version: Version) -> Result<Version, TrainerError> {
        let pulling = Instant::now();
        let waited = self.client.pull_into(min_version, &mut self.pulled).await?;
        self.times.pulled(pulling.elapsed(), waited);
        self.apply_pulled()
    }

    /// Writes the values last pulled into the variables; their lowest version.
    fn apply_pulled(&mut self) -> Result<Version, TrainerError> {
        let applying = Instant::now();
        let pulled: Vec<&PulledParam> = self
            .vars
            .iter()
            .map(|(name, _)| {
                self.pulled
                    .get(name)
                    .expect("the client pulls every placed variable")
            })
            .collect();
        let vars: Vec<&Var> = self.vars.iter().map(|(_, var)| var).collect();
        let values: Vec<&[f32]> = pulled.iter().map(|p| p.values.as_slice()).collect();
        self.copy_plan.to_vars(&vars, &values, &mut self.staging)?;
        if let Some(var) = vars.first() {
            // The copies onto a GPU are queued; wait for them to book them as apply.
            var.device().synchronize()?;
        }
        let version = pulled
            .iter()
            .map(|p| p.version)
            .min()
            .unwrap_or(Version(u64::MAX));
        self.times.apply += applying.elapsed();
        self.loaded = if version == Version(u64::MAX) {
            Version(0)
        } else {
            version
        };
        Ok(self.loaded)
    }
}

/// `varmap`'s variables with their names, sorted by name: the order a trainer
/// keeps them in.
pub fn vars_by_name(varmap: &VarMap) -> Vec<(String, Var)> {
    let mut vars: Vec<(String, Var)> = varmap
        .data()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// How the variables' tensors cross to the host: by their device (the CPU's
/// plan when there are none).
fn copy_plan(vars: &[(String, Var)]) -> CopyPlan {
    vars.first().map_or(CopyPlan::PerTensor, |(_, var)| {
        CopyPlan::for_device(var.device())
    })
}

/// A token unique to this process, so that a retried `JoinGroup` keeps its rank.
pub fn client_token() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos)
}
