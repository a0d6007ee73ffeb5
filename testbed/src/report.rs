//! What a testbed run reports: per worker its accuracy, steps per second and
//! step time split; per link the bytes each way, per step, and the share of
//! the link's rate they used; per process its CPU (cores), so a reader can
//! check that the two shared cores were not the limit.
//!
//! Link bytes are counted from the workers' start to their end, so they
//! include the one-off registration and first pull; utilisation divides them
//! by the rate times the slowest worker's training time (its time split's
//! total). On a run of many steps the one-off part is small.

use std::fmt::Write as _;

use serde::Serialize;

use crate::ceiling::Ceiling;
use crate::hosts::Role;
use crate::job::JobOutcome;

/// One worker's line.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerLine {
    /// Its host.
    pub host: String,
    /// Test accuracy at the end.
    pub test_accuracy: f64,
    /// Steps it took.
    pub steps: u64,
    /// Seconds its training loop ran.
    pub training_seconds: f64,
    /// Steps per second.
    pub steps_per_second: f64,
    /// Mean step time, milliseconds.
    pub step_ms: f64,
    /// Share of the step in each phase: compute, gather, push, wait, pull,
    /// apply, other.
    pub split: Vec<(String, f64)>,
}

/// One host link's line.
#[derive(Debug, Clone, Serialize)]
pub struct LinkLine {
    /// Its host.
    pub host: String,
    /// What runs there.
    pub role: Role,
    /// A server runs there beside the worker.
    pub server_beside: bool,
    /// Its rate each way, as given.
    pub rate: String,
    /// Bytes the host sent.
    pub sent_bytes: u64,
    /// Bytes the host received.
    pub received_bytes: u64,
    /// Bytes sent per training step.
    pub sent_per_step: f64,
    /// Bytes received per training step.
    pub received_per_step: f64,
    /// Sent bytes over what the rate allows in the training time.
    pub up_utilisation: f64,
    /// Received bytes over what the rate allows in the training time.
    pub down_utilisation: f64,
}

/// One process's CPU.
#[derive(Debug, Clone, Serialize)]
pub struct CpuLine {
    /// The process: its host's name, or `worker1-server` beside a worker.
    pub host: String,
    /// CPU seconds over its life.
    pub seconds: f64,
    /// Mean cores busy over the workers' run.
    pub cores: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Seconds from the workers' start to the last one's end.
    pub seconds: f64,
    /// Per worker.
    pub workers: Vec<WorkerLine>,
    /// Per host link.
    pub links: Vec<LinkLine>,
    /// Per process.
    pub cpu: Vec<CpuLine>,
    /// Raw TCP between a worker and a server host, when measured.
    pub ceiling: Option<Ceiling>,
}

impl Report {
    /// The report of `outcome`.
    pub fn of(outcome: &JobOutcome, ceiling: Option<Ceiling>) -> Self {
        let workers: Vec<WorkerLine> = outcome
            .workers
            .iter()
            .map(|(host, s)| {
                let parts = s.time_split.parts();
                let training_seconds: f64 = parts.iter().map(|(_, p)| p.seconds).sum();
                let steps = s.steps.max(1) as f64;
                WorkerLine {
                    host: host.clone(),
                    test_accuracy: s.test_accuracy,
                    steps: s.steps,
                    training_seconds,
                    steps_per_second: steps / training_seconds.max(1e-9),
                    step_ms: training_seconds * 1e3 / steps,
                    split: parts
                        .iter()
                        .map(|(n, p)| (n.to_string(), p.share))
                        .collect(),
                }
            })
            .collect();
        let slowest = workers
            .iter()
            .map(|w| w.training_seconds)
            .fold(0.0, f64::max)
            .max(1e-9);
        let steps = workers.iter().map(|w| w.steps).max().unwrap_or(0).max(1) as f64;
        let links = outcome
            .links
            .iter()
            .map(|(host, bytes)| {
                let allowed = host.rate.bytes_per_sec() * slowest;
                LinkLine {
                    host: host.name.clone(),
                    role: host.role,
                    server_beside: host.serves && host.role != Role::Server,
                    rate: host.rate.to_string(),
                    sent_bytes: bytes.sent,
                    received_bytes: bytes.received,
                    sent_per_step: bytes.sent as f64 / steps,
                    received_per_step: bytes.received as f64 / steps,
                    up_utilisation: bytes.sent as f64 / allowed,
                    down_utilisation: bytes.received as f64 / allowed,
                }
            })
            .collect();
        let cpu = outcome
            .cpu
            .iter()
            .map(|(host, &seconds)| CpuLine {
                host: host.clone(),
                seconds,
                cores: seconds / outcome.seconds.max(1e-9),
            })
            .collect();
        Self {
            seconds: outcome.seconds,
            workers,
            links,
            cpu,
            ceiling,
        }
    }

    /// The report as tables for a person.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "workers ran {:.1} s", self.seconds);
        let _ = writeln!(
            out,
            "\n{:<10} {:>8} {:>7} {:>9} {:>9}  split",
            "worker", "accuracy", "steps", "steps/s", "step ms"
        );
        for w in &self.workers {
            let split: Vec<String> = w
                .split
                .iter()
                .filter(|(_, share)| *share >= 0.005)
                .map(|(name, share)| format!("{name} {:.0}%", share * 100.0))
                .collect();
            let _ = writeln!(
                out,
                "{:<10} {:>8.4} {:>7} {:>9.2} {:>9.1}  {}",
                w.host,
                w.test_accuracy,
                w.steps,
                w.steps_per_second,
                w.step_ms,
                split.join(", ")
            );
        }
        let _ = writeln!(
            out,
            "\n{:<10} {:<13} {:>8} {:>12} {:>12} {:>8} {:>8}",
            "link", "role", "rate", "sent/step", "recv/step", "up use", "down use"
        );
        for l in &self.links {
            let _ = writeln!(
                out,
                "{:<10} {:<13} {:>8} {:>12} {:>12} {:>8.2} {:>8.2}",
                l.host,
                match l.server_beside {
                    true => format!("{}+server", l.role),
                    false => l.role.to_string(),
                },
                l.rate,
                ps_common::size::format_size(l.sent_per_step as usize),
                ps_common::size::format_size(l.received_per_step as usize),
                l.up_utilisation,
                l.down_utilisation
            );
        }
        if let Some(c) = &self.ceiling {
            let _ = writeln!(
                out,
                "\nraw TCP {} <-> {}, both ways at once: up {:.1} MB/s, down {:.1} MB/s",
                c.worker,
                c.server,
                c.up_bytes_per_sec / 1e6,
                c.down_bytes_per_sec / 1e6
            );
        }
        let _ = writeln!(out, "\n{:<14} {:>10} {:>8}", "process", "cpu s", "cores");
        for c in &self.cpu {
            let _ = writeln!(out, "{:<14} {:>10.2} {:>8.2}", c.host, c.seconds, c.cores);
        }
        out
    }
}
