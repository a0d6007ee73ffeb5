//! [`ServerMetrics`]: what a parameter server reports on `--metrics-listen`:
//! requests, bytes and latency by RPC and status, the time pushes take to
//! apply, BSP step waits, checkpoint times, and what the store holds (keys,
//! bytes by kind, each parameter's version), read when Prometheus scrapes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use ps_common::access::Answers;
use ps_common::metrics::{Exposition, gauge, register_build_info, registered};
use tonic::Code;

use crate::checkpointer::CheckpointTimes;
use crate::param::HeldBytes;
use crate::store::Store;

/// Labels of one RPC's outcome (fixed strings: recording one allocates nothing).
type RpcCode = [(&'static str, &'static str); 2];
/// Labels naming one RPC.
type Rpc = [(&'static str, &'static str); 1];
/// Labels naming a kind of bytes held.
type Kind = Vec<(&'static str, &'static str)>;
/// Labels naming a parameter.
type Param = Vec<(&'static str, String)>;

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
    /// The metrics, registered with the store's gauges (read at each scrape),
    /// the checkpoints' times (when the server checkpoints) and the build
    /// information into an exposition.
    pub fn new(store: Arc<Store>, checkpoints: Option<CheckpointTimes>) -> (Arc<Self>, Exposition) {
        let mut registry = Registry::default();
        register_build_info(&mut registry, "ps-server");
        let reg = &mut registry;
        let metrics = Arc::new(Self {
            requests: registered(
                reg,
                "candle_ps_server_requests",
                "Requests answered, by RPC and gRPC status code (refused ones have a code other than OK)",
                Family::default(),
            ),
            latency: registered(
                reg,
                "candle_ps_server_request_duration_seconds",
                "Time from a request's arrival to its answer, by RPC",
                Family::new_with_constructor(seconds_buckets),
            ),
            push_bytes: registered(
                reg,
                "candle_ps_server_push_bytes",
                "Gradient bytes received in pushes that were applied or taken as retries",
                Counter::default(),
            ),
            pull_bytes: registered(
                reg,
                "candle_ps_server_pull_bytes",
                "Value bytes sent in answers to pulls",
                Counter::default(),
            ),
            apply: registered(
                reg,
                "candle_ps_server_push_apply_duration_seconds",
                "Time to admit and apply one push's gradients to the store",
                seconds_buckets(),
            ),
        });
        let waits = store.step_waits();
        registered(
            reg,
            "candle_ps_server_bsp_step_wait_duration_seconds",
            "Time a key's BSP step waited from its first push to its last",
            waits.waits.clone(),
        );
        registered(
            reg,
            "candle_ps_server_bsp_steps_completed_by",
            "Keys' BSP steps completed by each worker's push: the worker each step waited for",
            waits.completed_by.clone(),
        );
        let checkpoint_age = checkpoints.map(|times| checkpoint_metrics(reg, times));
        let store_refresh = store_gauges(reg, store);
        let refresh = move || {
            store_refresh();
            if let Some(refresh_age) = &checkpoint_age {
                refresh_age();
            }
        };
        (metrics, Exposition::new(registry, refresh))
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

/// Registers the checkpoints' durations and times, and returns the function
/// that brings their age up to date.
fn checkpoint_metrics(
    registry: &mut Registry,
    times: CheckpointTimes,
) -> impl Fn() + Send + Sync + use<> {
    registered(
        registry,
        "candle_ps_server_checkpoint_duration_seconds",
        "Time to write one checkpoint",
        times.durations.clone(),
    );
    registered(
        registry,
        "candle_ps_server_checkpoint_last_written_timestamp_seconds",
        "When the newest checkpoint was written (Unix time; 0 before the first)",
        times.newest.clone(),
    );
    let age: Gauge<f64, AtomicU64> = registered(
        registry,
        "candle_ps_server_checkpoint_age_seconds",
        "Seconds since the newest checkpoint was written (-1 before the first)",
        Gauge::default(),
    );
    move || {
        age.set(times.age().unwrap_or(-1.0));
    }
}

/// Registers the gauges read from `store`, and the function that reads them.
fn store_gauges(registry: &mut Registry, store: Arc<Store>) -> impl Fn() + Send + Sync + use<> {
    let keys = gauge(registry, "candle_ps_server_keys", "Keys held");
    let held = gauge(
        registry,
        "candle_ps_server_memory_held_bytes",
        "Bytes charged to the memory budget: values, optimizer state, accumulators, buffered streams and pulls in flight",
    );
    let held_by_kind: Family<Kind, Gauge> = registered(
        registry,
        "candle_ps_server_key_bytes",
        "Bytes the keys hold, by kind: values, optimizer_state, accumulator (BSP gradient sums) and pull_snapshot",
        Family::default(),
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
    let param_versions: Family<Param, Gauge> = registered(
        registry,
        "candle_ps_server_param_version",
        "Each parameter's version on this server (the highest of the parts it holds)",
        Family::default(),
    );
    move || {
        let stats = store.stats();
        keys.set(stats.keys.len() as i64);
        held.set(stats.memory_held as i64);
        budget.set(stats.memory_budget as i64);
        workers.set(store.live_workers().len() as i64);
        version.set(store.max_version().get() as i64);
        let mut by_kind = HeldBytes::default();
        let mut versions = BTreeMap::<&str, u64>::new();
        for key in &stats.keys {
            by_kind += key.held;
            let highest = versions
                .entry(key.spec.header.key.name.as_str())
                .or_default();
            *highest = (*highest).max(key.version.get());
        }
        for (kind, bytes) in by_kind.by_kind() {
            held_by_kind
                .get_or_create(&vec![("kind", kind)])
                .set(bytes as i64);
        }
        // Cleared first: a parameter that moved to another server is not left behind.
        param_versions.clear();
        for (param, version) in versions {
            let labels = vec![("param", param.to_string())];
            param_versions.get_or_create(&labels).set(version as i64);
        }
    }
}

/// A status code as gRPC names it (`OK`, `INVALID_ARGUMENT`, ...).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

impl Answers for ServerMetrics {
    /// Records a request to `method` answered with `code` after `took`.
    fn answered(&self, method: &'static str, code: Code, took: Duration) {
        let labels = [("rpc", method), ("code", code_name(code))];
        self.requests.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&[("rpc", method)])
            .observe(took.as_secs_f64());
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
        assert_eq!(code_name(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
        assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
    }
}
