//! [`StepWaits`]: how long each BSP step of a key waited, from the first
//! worker's push to the last one's, and whose push was the last (the worker
//! the step waited for), for the server's metrics.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use ps_proto::ids::Rank;

/// Labels naming a worker.
type Worker = Vec<(&'static str, String)>;

/// BSP step waits and the workers that ended them.
#[derive(Debug, Clone)]
pub struct StepWaits {
    /// From a step's first push to its completion, per key.
    pub waits: Histogram,
    /// Steps completed by each worker's push: the one the step waited for.
    pub completed_by: Family<Worker, Counter>,
}

impl Default for StepWaits {
    fn default() -> Self {
        Self {
            // 10 µs to about 80 s, doubling.
            waits: Histogram::new(exponential_buckets(10e-6, 2.0, 24)),
            completed_by: Family::default(),
        }
    }
}

impl StepWaits {
    /// A step that waited `waited` and was completed by `worker`'s push (none
    /// when the scheduler declared the missing workers dead).
    pub fn record(&self, waited: Duration, worker: Option<Rank>) {
        self.waits.observe(waited.as_secs_f64());
        if let Some(worker) = worker {
            let labels = vec![("worker", worker.get().to_string())];
            self.completed_by.get_or_create(&labels).inc();
        }
    }
}
