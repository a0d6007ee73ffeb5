//! [`WorkerMetrics`]: what a worker reports on `--metrics-listen`: its steps
//! and examples, the last step's loss, each step's time split into compute,
//! push, wait, pull and apply (histograms), and the placement repairs it made.
//!
//! Examples per second is `rate(candle_ps_worker_examples_total[1m])`; the
//! share of a step spent waiting for the others is the `wait` phase's sum over
//! all phases' sums.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ps_common::metrics::{Exposition, register_build_info};

use crate::step_time::StepTimes;

/// Labels naming one phase of a step.
type Phase = Vec<(&'static str, &'static str)>;

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
    /// The metrics, registered with the build information into an exposition.
    pub fn new() -> (Arc<Self>, Exposition) {
        let mut registry = Registry::default();
        register_build_info(&mut registry, "ps-worker");
        let metrics = Arc::new(Self {
            steps: Counter::default(),
            examples: Counter::default(),
            loss: Gauge::default(),
            phases: Family::new_with_constructor(seconds_buckets),
            repairs: Counter::default(),
        });
        registry.register(
            "candle_ps_worker_steps",
            "Training steps completed",
            metrics.steps.clone(),
        );
        registry.register(
            "candle_ps_worker_examples",
            "Training examples processed",
            metrics.examples.clone(),
        );
        registry.register(
            "candle_ps_worker_loss",
            "The training loss of the last step",
            metrics.loss.clone(),
        );
        registry.register(
            "candle_ps_worker_step_phase_duration_seconds",
            "Time of one step's phase: compute (forward, loss, backward), push, wait (held by the servers for the step), pull (the transfer) and apply (into the model)",
            metrics.phases.clone(),
        );
        registry.register(
            "candle_ps_worker_repairs",
            "Placement repairs (lost servers, moved maps, restored keys)",
            metrics.repairs.clone(),
        );
        (metrics, Exposition::new(registry, || {}))
    }

    /// Records one step of `examples` examples at `loss`, whose phases took `times`.
    /// The phases are recorded before the step is counted, so a scrape never
    /// shows more steps than phase samples.
    pub fn step(&self, times: &StepTimes, examples: usize, loss: f64) {
        for (phase, took) in [
            ("compute", times.compute),
            ("push", times.push),
            ("wait", times.wait),
            ("pull", times.pull),
            ("apply", times.apply),
        ] {
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

    #[test]
    fn a_step_shows_in_every_phase_and_the_counters() {
        let (metrics, exposition) = WorkerMetrics::new();
        let times = StepTimes {
            compute: Duration::from_millis(3),
            push: Duration::from_millis(2),
            wait: Duration::from_millis(5),
            pull: Duration::from_millis(1),
            apply: Duration::from_micros(200),
        };
        metrics.step(&times, 32, 0.25);
        metrics.repaired(2);
        let text = exposition.text();
        for line in [
            "candle_ps_worker_steps_total 1",
            "candle_ps_worker_examples_total 32",
            "candle_ps_worker_loss 0.25",
            "candle_ps_worker_repairs_total 2",
            "candle_ps_worker_step_phase_duration_seconds_count{phase=\"wait\"} 1",
            "candle_ps_build_info{",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        for phase in ["compute", "push", "wait", "pull", "apply"] {
            assert!(text.contains(&format!("phase=\"{phase}\"")), "{text}");
        }
    }
}
