//! The scheduler's Prometheus metrics on `--metrics-listen`: live servers and
//! workers, the shard map's version, the group's size, declared parameters,
//! nodes declared dead, how long workers waited at barriers, and the heartbeat
//! lag (the longest time since a live node was heard from, by kind), read from
//! the scheduler's state at each scrape.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use ps_common::metrics::{Exposition, gauge, register_build_info, registered};

use crate::membership::Membership;
use crate::shared_state::SchedulerState;

/// Labels naming a kind of node.
type Kind = Vec<(&'static str, &'static str)>;

/// The scheduler's metrics over `state`.
pub fn exposition(state: Arc<SchedulerState>) -> Exposition {
    let mut registry = Registry::default();
    register_build_info(&mut registry, "ps-scheduler");
    registry.register(
        "candle_ps_scheduler_declared_dead",
        "Servers and workers declared dead for missing their heartbeats, by kind",
        state.declared_dead.clone(),
    );
    let servers = gauge(
        &mut registry,
        "candle_ps_scheduler_live_servers",
        "Servers heartbeating",
    );
    let workers = gauge(
        &mut registry,
        "candle_ps_scheduler_live_workers",
        "Workers heartbeating",
    );
    let map_version = gauge(
        &mut registry,
        "candle_ps_scheduler_map_version",
        "Version of the current shard map (0 before the first)",
    );
    let map_parts = gauge(
        &mut registry,
        "candle_ps_scheduler_map_parts",
        "Parameter parts in the current shard map",
    );
    let group = gauge(
        &mut registry,
        "candle_ps_scheduler_group_size",
        "Workers in the group (0 until it forms)",
    );
    registry.register(
        "candle_ps_scheduler_barrier_wait_duration_seconds",
        "Time a worker waited at a barrier until every live worker arrived",
        state.barrier_waits.clone(),
    );
    let heartbeat_lag: Family<Kind, Gauge<f64, AtomicU64>> = registered(
        &mut registry,
        "candle_ps_scheduler_heartbeat_lag_seconds",
        "The longest time since a live node's last heartbeat, by kind",
        Family::default(),
    );
    Exposition::new(registry, move || {
        let now = Instant::now();
        state.read(|m: &Membership| {
            for (kind, seen) in [
                (
                    "server",
                    m.servers()
                        .iter()
                        .filter(|s| s.alive)
                        .map(|s| s.last_seen)
                        .min(),
                ),
                (
                    "worker",
                    m.workers()
                        .iter()
                        .filter(|w| w.alive)
                        .map(|w| w.last_seen)
                        .min(),
                ),
            ] {
                let lag = seen.map_or(0.0, |seen| {
                    now.saturating_duration_since(seen).as_secs_f64()
                });
                heartbeat_lag.get_or_create(&vec![("kind", kind)]).set(lag);
            }
            servers.set(m.live_servers().len() as i64);
            workers.set(m.live_workers().len() as i64);
            let map = m.map();
            map_version.set(map.map_or(0, |map| map.version.get()) as i64);
            map_parts.set(map.map_or(0, |map| map.assignments.len()) as i64);
            group.set(i64::from(m.group_size().unwrap_or(0)));
        });
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::SchedulerConfig;

    fn sample(text: &str, series: &str) -> Option<String> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map(str::to_string)
    }

    #[test]
    fn membership_and_deaths_are_exposed() {
        let state = Arc::new(SchedulerState::new(SchedulerConfig::default()).unwrap());
        let exposition = exposition(Arc::clone(&state));
        // Heard from 2 s ago (well within the heartbeat timeout).
        let now = Instant::now() - Duration::from_secs(2);
        state.update(|m| m.register_server("127.0.0.1:7070", now).unwrap());
        state.update(|m| m.register_server("127.0.0.1:7071", now).unwrap());
        let text = exposition.text();
        assert_eq!(
            sample(&text, "candle_ps_scheduler_live_servers").as_deref(),
            Some("2")
        );
        assert_eq!(
            sample(&text, "candle_ps_scheduler_live_workers").as_deref(),
            Some("0")
        );
        assert!(text.contains("program=\"ps-scheduler\""), "{text}");
        let lag = sample(
            &text,
            r#"candle_ps_scheduler_heartbeat_lag_seconds{kind="server"}"#,
        );
        assert!(
            lag.is_some_and(|l| l.parse::<f64>().unwrap() >= 2.0),
            "{text}"
        );
        assert!(
            text.contains("candle_ps_scheduler_barrier_wait_duration_seconds_count 0"),
            "{text}"
        );

        // Both miss their heartbeats: declared dead, and counted.
        state.tick_at(now + Duration::from_secs(3600));
        let text = exposition.text();
        assert_eq!(
            sample(&text, "candle_ps_scheduler_live_servers").as_deref(),
            Some("0")
        );
        let dead = r#"candle_ps_scheduler_declared_dead_total{kind="server"}"#;
        assert_eq!(sample(&text, dead).as_deref(), Some("2"), "{text}");
    }
}
