//! Placement repair: what a worker does after a call failed for a reason a
//! repair can fix ([`Repair`]), so that it can repeat the call. Which repair,
//! and whether to go on, is the [`Recovering`] machine's decision.
//!
//! - The shard map moved on: fetch the newer map.
//! - A server lacks keys it should hold (it restarted empty, or just took them
//!   over), or holds one behind this worker's copy: register them again.
//! - A server is unreachable after the retries: wait for the scheduler's next
//!   map, which places the lost server's keys on the live ones, or for the
//!   server's return at its address.
//!
//! Either way every key is then registered again with the worker's
//! [`LocalCopy`], so a server that now owns a key it lacks restores it (from a
//! checkpoint, or from the copy), and every embedding table is declared again
//! (its buckets from checkpoints only). A repair that itself fails for one of these
//! reasons (the map moved again meanwhile) is repaired in turn, within a
//! [`RepairBudget`]. A repeated push keeps its `(worker, step)`: keys that took
//! it do not apply it twice.

use std::time::{Duration, Instant};

use ps_proto::ids::{Step, Version};
use ps_proto::v1;

use crate::connection::PsClient;
use crate::error::{ClientError, Repair};
use crate::recovery::{Action, Outcome, Recovering};
use crate::wire::ParamBytes;

/// How long each wait for a newer shard map lasts before checking whether an
/// unreachable server is back at its address.
const PLACEMENT_PROBE: Duration = Duration::from_millis(500);

/// A worker's own copy of every parameter, offered to servers that must restore
/// keys.
#[derive(Debug, Clone)]
pub struct LocalCopy {
    /// Every parameter's values, by name.
    pub values: Vec<ParamBytes>,
    /// The version of these values (0: initial values).
    pub version: Version,
    /// The optimizer the keys are registered with.
    pub optimizer: v1::Optimizer,
}

/// How many repairs one operation (a step, a load) may make before giving up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairBudget {
    left: usize,
}

impl Default for RepairBudget {
    /// Five repairs: enough for a map that moves twice while a server restarts.
    fn default() -> Self {
        Self { left: 5 }
    }
}

impl RepairBudget {
    /// A budget of `repairs` repairs.
    pub fn new(repairs: usize) -> Self {
        Self { left: repairs }
    }

    /// Takes one repair from the budget; false when none was left.
    pub(crate) fn spend(&mut self) -> bool {
        let spent = self.left > 0;
        self.left = self.left.saturating_sub(1);
        spent
    }
}

impl PsClient {
    /// Makes `repair`, which `recovering` asked for after `error` failed an
    /// operation of a worker at `step`, and any further repair it asks for when
    /// one fails in turn; `Ok` when the operation can be repeated, otherwise
    /// the error to give up with.
    ///
    /// # Errors
    /// The last error, when `recovering` gives up.
    pub async fn recover(
        &mut self,
        recovering: &mut Recovering,
        mut repair: Repair,
        mut error: ClientError,
        step: Step,
        copy: &LocalCopy,
    ) -> Result<(), ClientError> {
        loop {
            let outcome = match self.repair(repair, &error, step, copy).await {
                Ok(()) => Outcome::Succeeded,
                Err(failed) => {
                    let recovery = failed.recovery(step);
                    error = failed;
                    Outcome::Failed(recovery)
                }
            };
            match recovering.step(outcome) {
                Some(Action::Attempt) => return Ok(()),
                Some(Action::Repair(next)) => repair = next,
                Some(Action::Rejoin(_) | Action::Done) | None => return Err(error),
            }
        }
    }

    /// One repair.
    async fn repair(
        &mut self,
        repair: Repair,
        error: &ClientError,
        step: Step,
        copy: &LocalCopy,
    ) -> Result<(), ClientError> {
        match repair {
            Repair::StaleMap { version } => {
                tracing::info!(
                    %step,
                    %version,
                    "the shard map moved on; placing keys by the new one and registering this worker's copy"
                );
                self.refresh(version).await?;
            }
            Repair::KeyBehind { version } => tracing::warn!(
                %step,
                key_version = %version,
                loaded = %copy.version,
                "a parameter server holds an older version of a key than this worker; offering this worker's copy"
            ),
            Repair::KeysMissing => tracing::warn!(
                %step,
                %error,
                "a parameter server lacks keys (it restarted, or took them over); restoring them"
            ),
            Repair::ServerLost => {
                tracing::warn!(%step, %error, "a parameter server looks lost; waiting for a new shard map or its return, then restoring its keys");
                return self.await_placement(copy).await;
            }
        }
        self.offer(copy).await
    }

    /// Registers every key again with `copy`, and declares every embedding
    /// table again at its version (a table has no worker copy: a bucket a
    /// server lacks comes from its checkpoints, moved forward to the job).
    ///
    /// # Errors
    /// [`ClientError`] from any server.
    pub async fn offer(&self, copy: &LocalCopy) -> Result<(), ClientError> {
        self.register_copy(&copy.values, &copy.optimizer, copy.version)
            .await?;
        self.redeclare_tables(copy.version).await
    }

    /// Routes by the scheduler's newer shard map, if it announced one, and
    /// registers `copy` there. True when the map changed.
    ///
    /// # Errors
    /// [`ClientError`] from the scheduler or any server.
    pub async fn follow_newer_map(&mut self, copy: &LocalCopy) -> Result<bool, ClientError> {
        let Some(version) = self.newer_map() else {
            return Ok(false);
        };
        self.refresh(version).await?;
        self.offer(copy).await?;
        Ok(true)
    }

    /// After a server could not be reached: waits until the scheduler publishes
    /// a map without it, or until the server is back at its address (it restarted
    /// before the scheduler declared it dead), whichever comes first, then
    /// registers `copy`; for at most the pull timeout.
    ///
    /// A newer map may name a server that cannot be reached yet (a replacement
    /// whose name an orchestrator publishes once it is healthy) or any more (it
    /// died after the map was made): then this waits a probe and routes by the
    /// newest map again, until the deadline.
    async fn await_placement(&mut self, copy: &LocalCopy) -> Result<(), ClientError> {
        if !self.has_scheduler() {
            return self.offer(copy).await;
        }
        let next = self.map_version().next();
        let deadline = Instant::now() + self.pull_timeout();
        let mut said_waiting = false;
        loop {
            match self.refresh_within(next, PLACEMENT_PROBE).await {
                Ok(()) => return self.offer(copy).await,
                Err(error) if error.no_newer_map() => {}
                Err(error) if error.still_lost() && Instant::now() < deadline => {
                    if !said_waiting {
                        tracing::info!(%error, "a server of the new shard map cannot be reached yet; waiting for it, or for a newer map");
                        said_waiting = true;
                    }
                    tokio::time::sleep(PLACEMENT_PROBE).await;
                    continue;
                }
                Err(error) => return Err(error),
            }
            match self.offer(copy).await {
                Ok(()) => {
                    tracing::info!("the parameter server is back at its address; keys restored");
                    return Ok(());
                }
                Err(error) if error.still_lost() && Instant::now() < deadline => {}
                Err(error) => return Err(error),
            }
        }
    }
}
