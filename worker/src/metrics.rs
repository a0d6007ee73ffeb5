//! [`WorkerMetrics`]: what a worker reports on `--metrics-listen`: its steps
//! and examples, the last step's loss, each step's time split into compute,
//! push, wait, pull and apply (histograms), the placement repairs it made, and
//! the RPCs it retried.
//!
//! Examples per second is `rate(candle_ps_worker_examples_total[1m])`; the
//! share of a step spent waiting for the others is the `wait` phase's sum over
//! all phases' sums.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ps_client::retry::RetryTally;
use ps_common::metrics::{Exposition, register_build_info, registered};

use crate::step_time::{PHASES, StepTimes};

/// Labels naming one phase of a step.
type Phase = Vec<(&'static str, &'static str)>;
/// Labels naming an RPC.
type Rpc = Vec<(&'static str, String)>;

/// A worker's metrics.
#[derive(Debug)]
pub struct WorkerMetrics {
    steps: Counter,
    examples: Counter,
    loss: Gauge<f64, AtomicU64>,
    phases: Family<Phase, Histogram>,
    repairs: Counter,
}

/// Phase buckets: 10 µs to about 10 s, doubling.
fn seconds_buckets() -> Histogram {
    Histogram::new(exponential_buckets(10e-6, 2.0, 21))
}

impl WorkerMetrics {
    /// The metrics, registered with the build information into an exposition;
    /// the retries shown are those counted in `tally` (the worker's client's
    /// [`ps_client::retry::RetryPolicy::tally`]).
    pub fn new(tally: RetryTally) -> (Arc<Self>, Exposition) {
        let mut registry = Registry::default();
        register_build_info(&mut registry, "ps-worker");
        let reg = &mut registry;
        let metrics = Arc::new(Self {
            steps: registered(
                reg,
                "candle_ps_worker_steps",
                "Training steps completed",
                Counter::default(),
            ),
            examples: registered(
                reg,
                "candle_ps_worker_examples",
                "Training examples processed",
                Counter::default(),
            ),
            loss: registered(
                reg,
                "candle_ps_worker_loss",
                "The training loss of the last step",
                Gauge::default(),
            ),
            phases: registered(
                reg,
                "candle_ps_worker_step_phase_duration_seconds",
                "Time of one step's phase: compute (forward, loss, backward), push, wait (held by the servers for the step), pull (the transfer) and apply (into the model)",
                Family::new_with_constructor(seconds_buckets),
            ),
            repairs: registered(
                reg,
                "candle_ps_worker_repairs",
                "Placement repairs (lost servers, moved maps, restored keys)",
                Counter::default(),
            ),
        });
        let retries: Family<Rpc, Counter> = registered(
            reg,
            "candle_ps_worker_rpc_retries",
            "RPCs retried after a transient failure (unavailable, aborted, cancelled), by RPC; every client whose retry policy counts into these metrics",
            Family::default(),
        );
        let refresh = move || {
            for (rpc, count) in tally.counts() {
                let counter = retries.get_or_create(&vec![("rpc", rpc)]);
                counter.inner().store(count, Ordering::Relaxed);
            }
        };
        (metrics, Exposition::new(registry, refresh))
    }

    /// Records one step of `examples` examples at `loss`, whose phases took `times`.
    /// The phases are recorded before the step is counted, so a scrape never
    /// shows more steps than phase samples.
    pub fn step(&self, times: &StepTimes, examples: usize, loss: f64) {
        for (phase, took) in PHASES.into_iter().zip(times.phases()) {
            self.observe(phase, took);
        }
        self.loss.set(loss);
        self.examples.inc_by(examples as u64);
        self.steps.inc();
    }

    fn observe(&self, phase: &'static str, took: Duration) {
        self.phases
            .get_or_create(&vec![("phase", phase)])
            .observe(took.as_secs_f64());
    }

    /// Records `repairs` more placement repairs.
    pub fn repaired(&self, repairs: u64) {
        self.repairs.inc_by(repairs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_step_shows_in_every_phase_and_the_counters() {
        let policy = ps_client::retry::RetryPolicy::default();
        let (metrics, exposition) = WorkerMetrics::new(policy.tally.clone());
        let times = StepTimes {
            compute: Duration::from_millis(3),
            gather: Duration::from_micros(300),
            push: Duration::from_millis(2),
            wait: Duration::from_millis(5),
            pull: Duration::from_millis(1),
            apply: Duration::from_micros(200),
        };
        metrics.step(&times, 32, 0.25);
        metrics.repaired(2);
        let mut failures = 1;
        policy
            .run("MetricsProbe", || {
                let failed = failures > 0;
                failures -= 1;
                async move {
                    match failed {
                        true => Err(tonic::Status::unavailable("restarting")),
                        false => Ok(()),
                    }
                }
            })
            .await
            .unwrap();
        let text = exposition.text();
        for line in [
            "candle_ps_worker_steps_total 1",
            "candle_ps_worker_examples_total 32",
            "candle_ps_worker_loss 0.25",
            "candle_ps_worker_repairs_total 2",
            "candle_ps_worker_rpc_retries_total{rpc=\"MetricsProbe\"} 1",
            "candle_ps_worker_step_phase_duration_seconds_count{phase=\"wait\"} 1",
            "candle_ps_build_info{",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        for phase in PHASES {
            assert!(text.contains(&format!("phase=\"{phase}\"")), "{text}");
        }
    }
}
