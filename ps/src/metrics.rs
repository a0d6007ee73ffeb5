//! [`ServerMetrics`]: what a parameter server reports on `--metrics-listen`:
//! requests, bytes and latency by RPC and status, the time pushes take to
//! apply, and what the store holds, read when Prometheus scrapes.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ps_common::metrics::{Exposition, gauge, register_build_info};
use tonic::Code;

use crate::store::Store;

/// Labels of one RPC's outcome.
type RpcCode = Vec<(&'static str, String)>;
/// Labels naming one RPC.
type Rpc = Vec<(&'static str, &'static str)>;

/// A parameter server's metrics.
#[derive(Debug)]
pub struct ServerMetrics {
    requests: Family<RpcCode, Counter>,
    latency: Family<Rpc, Histogram>,
    push_bytes: Counter,
    pull_bytes: Counter,
    apply: Histogram,
}

/// Latency buckets: 50 µs to about 13 s, doubling.
fn seconds_buckets() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.0, 19))
}

impl ServerMetrics {
    /// The metrics, registered with the store's gauges (read at each scrape)
    /// and the build information into an exposition.
    pub fn new(store: Arc<Store>) -> (Arc<Self>, Exposition) {
        let mut registry = Registry::default();
        register_build_info(&mut registry, "ps-server");
        let metrics = Arc::new(Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(seconds_buckets),
            push_bytes: Counter::default(),
            pull_bytes: Counter::default(),
            apply: seconds_buckets(),
        });
        registry.register(
            "candle_ps_server_requests",
            "Requests answered, by RPC and gRPC status code",
            metrics.requests.clone(),
        );
        registry.register(
            "candle_ps_server_request_duration_seconds",
            "Time from a request's arrival to its answer, by RPC",
            metrics.latency.clone(),
        );
        registry.register(
            "candle_ps_server_push_bytes",
            "Gradient bytes received in pushes that were applied or taken as retries",
            metrics.push_bytes.clone(),
        );
        registry.register(
            "candle_ps_server_pull_bytes",
            "Value bytes sent in answers to pulls",
            metrics.pull_bytes.clone(),
        );
        registry.register(
            "candle_ps_server_push_apply_duration_seconds",
            "Time to admit and apply one push's gradients to the store",
            metrics.apply.clone(),
        );
        let waits = store.step_waits();
        registry.register(
            "candle_ps_server_bsp_step_wait_duration_seconds",
            "Time a key's BSP step waited from its first push to its last",
            waits.waits.clone(),
        );
        registry.register(
            "candle_ps_server_bsp_steps_completed_by",
            "Keys' BSP steps completed by each worker's push: the worker each step waited for",
            waits.completed_by.clone(),
        );
        let refresh = store_gauges(&mut registry, store);
        (metrics, Exposition::new(registry, refresh))
    }

    /// Records one answered request.
    pub fn answered(&self, rpc: &'static str, code: Code, took: Duration) {
        let labels = vec![("rpc", rpc.to_string()), ("code", code_name(code))];
        self.requests.get_or_create(&labels).inc();
        let rpc_only = vec![("rpc", rpc)];
        self.latency
            .get_or_create(&rpc_only)
            .observe(took.as_secs_f64());
    }

    /// Records a push of `bytes` applied in `took`.
    pub fn pushed(&self, bytes: usize, took: Duration) {
        self.push_bytes.inc_by(bytes as u64);
        self.apply.observe(took.as_secs_f64());
    }

    /// Records a pull answered with `bytes` of values.
    pub fn pulled(&self, bytes: usize) {
        self.pull_bytes.inc_by(bytes as u64);
    }
}

/// Registers the gauges read from `store`, and the function that reads them.
fn store_gauges(registry: &mut Registry, store: Arc<Store>) -> impl Fn() + Send + Sync + 'static {
    let keys = gauge(registry, "candle_ps_server_keys", "Keys held");
    let held = gauge(
        registry,
        "candle_ps_server_memory_held_bytes",
        "Bytes charged to the memory budget: values, optimizer state, accumulators, buffered streams and pulls in flight",
    );
    let budget = gauge(
        registry,
        "candle_ps_server_memory_budget_bytes",
        "The memory budget (--memory-budget)",
    );
    let workers = gauge(
        registry,
        "candle_ps_server_live_workers",
        "Workers the server waits for in a step",
    );
    let version = gauge(
        registry,
        "candle_ps_server_max_key_version",
        "The highest version of any key (steps applied, under BSP)",
    );
    move || {
        let stats = store.stats();
        keys.set(stats.keys.len() as i64);
        held.set(stats.memory_held as i64);
        budget.set(stats.memory_budget as i64);
        workers.set(store.live_workers().len() as i64);
        version.set(store.max_version().get() as i64);
    }
}

/// A status code as gRPC names it (`OK`, `INVALID_ARGUMENT`, ...).
fn code_name(code: Code) -> String {
    let name = format!("{code:?}");
    let mut upper = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            upper.push('_');
        }
        upper.push(c.to_ascii_uppercase());
    }
    match code {
        Code::Ok => "OK".into(),
        _ => upper,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_as_grpc_names_them() {
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
        assert_eq!(code_name(Code::Unavailable), "UNAVAILABLE");
    }
}
