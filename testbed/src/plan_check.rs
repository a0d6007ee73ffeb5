//! Checking `ps-scheduler plan`'s cost model against measurement: a grid of
//! setups (link rate, server count and placement, partition size, wire
//! dtype, pipelining or requests per server, model) each run in the
//! emulated cluster, each one's step time predicted by the model, and the
//! two compared (`ps-testbed plan-check`, `docs/plan.md`).
//!
//! Each model's compute per step is measured once, on the grid's fastest
//! link with one server and no pipelining (the share of the step its
//! workers spent computing), and given to the model for every setup, as a
//! user would give `--compute`; everything else is predicted.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use ps_common::rate::LinkRate;
use ps_scheduler::plan::cost::{self, Cluster, Constants, Placement, Setup};
use ps_scheduler::plan::model::ModelShapes;
use serde::{Deserialize, Serialize};

use crate::hosts::{HostCounts, plan};
use crate::job::{self, JobSpec};
use crate::netns::Network;
use crate::report::Report;

/// One model of the grid: its shapes and the worker flags that train it.
#[derive(Debug, Clone)]
pub struct GridModel {
    /// A short name for the table.
    pub label: &'static str,
    /// `mlp:IN,HIDDEN...,OUT`, as the planner reads it.
    pub shapes: String,
    /// The `ps-worker` flags that train it.
    pub worker_args: Vec<String>,
}

/// The grid's two models: one whose step the links bound (25 MB of
/// parameters, small batches) and one whose compute does (1 MB, large
/// batches).
pub fn default_models() -> Vec<GridModel> {
    let args = |text: &str| text.split_whitespace().map(String::from).collect();
    vec![
        GridModel {
            label: "comm-bound",
            shapes: "mlp:1024,2048,2048,4".into(),
            worker_args: args(
                "--dataset synthetic --synthetic-features 1024 --hidden 2048,2048 --synthetic-train 3200 --epochs 1 --batch-size 32",
            ),
        },
        GridModel {
            label: "compute-bound",
            shapes: "mlp:256,1024,4".into(),
            worker_args: args(
                "--dataset synthetic --synthetic-features 256 --hidden 1024 --synthetic-train 80000 --epochs 1 --batch-size 2048",
            ),
        },
    ]
}

/// The grid to run.
#[derive(Debug, Clone)]
pub struct Grid {
    /// Models.
    pub models: Vec<GridModel>,
    /// Link rates, every host's.
    pub links: Vec<LinkRate>,
    /// Server counts.
    pub servers: Vec<usize>,
    /// Where the servers run: hosts of their own, beside the workers (server
    /// counts above the workers' are skipped there), or both.
    pub placements: Vec<Placement>,
    /// The largest parts, bytes.
    pub partitions: Vec<u64>,
    /// Bytes per value on the wire: 4 (f32), 2 (bf16).
    pub wires: Vec<u32>,
    /// Whether pipelined, push then pull, or both.
    pub pipelining: Vec<bool>,
    /// Requests per server of the setups that are not pipelined.
    pub requests: Vec<u32>,
    /// Worker hosts.
    pub workers: usize,
    /// Where the binaries are.
    pub bin_dir: PathBuf,
    /// Where each run's logs go.
    pub out: PathBuf,
    /// Namespace prefix.
    pub prefix: String,
    /// The constants the predictions use.
    pub constants: Constants,
}

/// One setup of the grid, run and predicted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// The model's label.
    pub model: String,
    /// The link rate.
    pub link: String,
    /// Servers.
    pub servers: usize,
    /// Whether they ran beside the workers (on the first worker hosts).
    #[serde(default)]
    pub colocated: bool,
    /// Whether push and pull were pipelined.
    pub pipeline: bool,
    /// The largest part, bytes (grids run before it varied: 1 MiB).
    #[serde(default = "default_partition")]
    pub partition_bytes: u64,
    /// Bytes per value on the wire (grids run before it varied: 4, f32).
    #[serde(default = "f32_wire")]
    pub wire_bytes: u32,
    /// Requests per server when not pipelined (grids run before it varied:
    /// the client's 4).
    #[serde(default = "client_requests")]
    pub requests_per_server: u32,
    /// The compute per step given to the model, ms.
    pub compute_ms: f64,
    /// The predicted step, ms.
    pub predicted_ms: f64,
    /// The measured step (the workers' mean), ms.
    pub measured_ms: f64,
    /// Predicted over measured, minus one.
    pub error: f64,
}

fn default_partition() -> u64 {
    ps_scheduler::plan::PARTITIONS[0]
}

fn f32_wire() -> u32 {
    4
}

fn client_requests() -> u32 {
    cost::CLIENT_REQUESTS_PER_SERVER
}

/// One setup of the grid: what runs, and what the model is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Servers.
    pub servers: usize,
    /// Beside the workers, or on hosts of their own.
    pub colocated: bool,
    /// Push and pull pipelined.
    pub pipeline: bool,
    /// The largest part, bytes.
    pub partition_bytes: u64,
    /// Bytes per value on the wire.
    pub wire_bytes: u32,
    /// Requests per server when not pipelined.
    pub requests_per_server: u32,
}

impl Point {
    /// One dedicated server, push then pull, the system's defaults otherwise:
    /// the setup a model's compute is calibrated on.
    fn calibration() -> Self {
        Self {
            servers: 1,
            colocated: false,
            pipeline: false,
            partition_bytes: default_partition(),
            wire_bytes: f32_wire(),
            requests_per_server: client_requests(),
        }
    }

    /// A short name for the run's folder: `2-beside-1MiB-bf16-pipelined`, or
    /// `...-r4` push then pull with 4 requests per server.
    fn label(&self) -> String {
        let beside = if self.colocated { "-beside" } else { "" };
        let wire = if self.wire_bytes == 2 { "bf16" } else { "f32" };
        let step = match self.pipeline {
            true => "pipelined".to_string(),
            false => format!("r{}", self.requests_per_server),
        };
        format!(
            "{}{beside}-{}-{wire}-{step}",
            self.servers,
            ps_common::size::format_size(self.partition_bytes as usize)
        )
    }
}

impl Row {
    /// The setup the row ran.
    pub fn point(&self) -> Point {
        Point {
            servers: self.servers,
            colocated: self.colocated,
            pipeline: self.pipeline,
            partition_bytes: self.partition_bytes,
            wire_bytes: self.wire_bytes,
            requests_per_server: self.requests_per_server,
        }
    }
}

/// The grid's setups, in the order they run: placement, servers, partition
/// size, wire dtype, then pipelined or each of the requests per server.
fn points(grid: &Grid) -> Vec<Point> {
    let mut points = Vec::new();
    for &placement in &grid.placements {
        let colocated = placement == Placement::Colocated;
        let servers = grid
            .servers
            .iter()
            .filter(|&&servers| !colocated || servers <= grid.workers);
        for &servers in servers {
            for &partition_bytes in &grid.partitions {
                for &wire_bytes in &grid.wires {
                    for &pipeline in &grid.pipelining {
                        let requests: &[u32] = match pipeline {
                            true => &[cost::CLIENT_REQUESTS_PER_SERVER],
                            false => &grid.requests,
                        };
                        for &requests_per_server in requests {
                            points.push(Point {
                                servers,
                                colocated,
                                pipeline,
                                partition_bytes,
                                wire_bytes,
                                requests_per_server,
                            });
                        }
                    }
                }
            }
        }
    }
    points
}

/// Runs the grid: per model, a calibration run for its compute, then every
/// setup.
///
/// # Errors
/// The cluster or a job failed.
pub async fn run(grid: &Grid) -> anyhow::Result<Vec<Row>> {
    let fastest = *grid.links.iter().max().expect("at least one link rate");
    let mut rows = Vec::new();
    for model in &grid.models {
        let shapes = ModelShapes::from_spec(&model.shapes).map_err(anyhow::Error::msg)?;
        let calibration =
            run_one(grid, model, fastest, Point::calibration(), "calibration").await?;
        let compute = calibration.compute_seconds;
        tracing::info!(
            model = model.label,
            compute_ms = compute * 1e3,
            "compute calibrated"
        );
        for &link in &grid.links {
            for point in points(grid) {
                let label = format!("{}-{link}-{}", model.label, point.label());
                let measured = run_one(grid, model, link, point, &label).await?;
                let predicted =
                    predict(&shapes, link, point, compute, grid.workers, &grid.constants);
                let row = Row {
                    model: model.label.to_string(),
                    link: link.to_string(),
                    servers: point.servers,
                    colocated: point.colocated,
                    pipeline: point.pipeline,
                    partition_bytes: point.partition_bytes,
                    wire_bytes: point.wire_bytes,
                    requests_per_server: point.requests_per_server,
                    compute_ms: compute * 1e3,
                    predicted_ms: predicted * 1e3,
                    measured_ms: measured.step_seconds * 1e3,
                    error: predicted / measured.step_seconds - 1.0,
                };
                tracing::info!(?row, "measured");
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The step time the cost model predicts for `shapes` run as `point` by
/// `workers` workers on links of `link`, given `compute` seconds of compute
/// per step, with `constants`; seconds.
pub fn predict(
    shapes: &ModelShapes,
    link: LinkRate,
    point: Point,
    compute: f64,
    workers: usize,
    constants: &Constants,
) -> f64 {
    let setup = Setup {
        servers: point.servers as u32,
        placement: match point.colocated {
            true => Placement::Colocated,
            false => Placement::Dedicated,
        },
        partition_bytes: point.partition_bytes,
        wire_bytes: point.wire_bytes,
        pipeline: point.pipeline,
        backward_segments: 1,
        requests_per_server: point.requests_per_server,
    };
    let cluster = Cluster {
        workers: workers as u32,
        worker_link: link.bytes_per_sec(),
        server_link: link.bytes_per_sec(),
        rtt: 100e-6,
        compute,
        // The emulated hosts share this machine's two cores.
        cores: 2,
    };
    cost::predict(&setup, &shapes.tensor_bytes(), &cluster, constants).step
}

/// Predicts `rows` again with this build's cost model and `constants` (the
/// measurements stay), for the tables of an earlier run.
///
/// # Errors
/// A row's model is not one of the grid's.
pub fn predict_again(
    rows: &mut [Row],
    workers: usize,
    constants: &Constants,
) -> anyhow::Result<()> {
    let models = default_models();
    for row in rows {
        let model = models
            .iter()
            .find(|m| m.label == row.model)
            .ok_or_else(|| anyhow::anyhow!("{}: not a model of the grid", row.model))?;
        let shapes = ModelShapes::from_spec(&model.shapes).map_err(anyhow::Error::msg)?;
        let link: LinkRate = row.link.parse().map_err(anyhow::Error::msg)?;
        let predicted = predict(
            &shapes,
            link,
            row.point(),
            row.compute_ms / 1e3,
            workers,
            constants,
        );
        row.predicted_ms = predicted * 1e3;
        row.error = row.predicted_ms / row.measured_ms - 1.0;
    }
    Ok(())
}

/// A row's largest part for a person: `1MiB`.
fn parts(row: &Row) -> String {
    ps_common::size::format_size(row.partition_bytes as usize)
}

/// A row's wire dtype: `f32` or `bf16`.
fn wire(row: &Row) -> &'static str {
    if row.wire_bytes == 2 { "bf16" } else { "f32" }
}

/// A row's servers for a person: `2`, or `2 beside` the workers.
fn servers(row: &Row) -> String {
    match row.colocated {
        true => format!("{} beside", row.servers),
        false => row.servers.to_string(),
    }
}

/// A run's mean step and the compute share of it.
struct Measured {
    step_seconds: f64,
    compute_seconds: f64,
}

async fn run_one(
    grid: &Grid,
    model: &GridModel,
    link: LinkRate,
    point: Point,
    label: &str,
) -> anyhow::Result<Measured> {
    let counts = HostCounts {
        servers: point.servers,
        workers: grid.workers,
        colocated: point.colocated,
    };
    let hosts = plan(counts, link, &[]).map_err(anyhow::Error::msg)?;
    let mut worker_args = model.worker_args.clone();
    if !point.pipeline {
        worker_args.push("--no-pipeline".into());
    }
    if point.wire_bytes == 2 {
        worker_args.extend(["--wire-dtype".into(), "bf16".into()]);
    }
    worker_args.extend([
        "--requests-per-server".into(),
        point.requests_per_server.to_string(),
    ]);
    let spec = JobSpec {
        bin_dir: grid.bin_dir.clone(),
        out: grid.out.join(label),
        worker_args,
        server_args: Vec::new(),
        scheduler_args: vec![
            "--partition-bytes".into(),
            point.partition_bytes.to_string(),
        ],
        timeout: Duration::from_secs(300),
    };
    std::fs::create_dir_all(&spec.out)?;
    let network = Network::build(&grid.prefix, &hosts)?;
    let outcome = job::run(&network, &spec).await;
    drop(network);
    let report = Report::of(&outcome?, None);
    let count = report.workers.len().max(1) as f64;
    let step_ms: f64 = report.workers.iter().map(|w| w.step_ms).sum::<f64>() / count;
    let compute_share: f64 = report
        .workers
        .iter()
        .map(|w| {
            w.split
                .iter()
                .find(|(phase, _)| phase == "compute")
                .map_or(0.0, |p| p.1)
        })
        .sum::<f64>()
        / count;
    Ok(Measured {
        step_seconds: step_ms / 1e3,
        compute_seconds: step_ms / 1e3 * compute_share,
    })
}

/// The rows as a Markdown table, and the summary: the share within ±20 %,
/// the largest error, and per model and link the plan's pick (as
/// `ps-scheduler plan` picks: its link rule, then `ps_scheduler::plan::pick`)
/// against the fastest measured and against the default (one server per
/// worker, pipelined: beside the workers when the grid ran that, as the
/// compose cluster's settings are, on hosts of their own otherwise).
pub fn table(rows: &[Row], workers: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| model | link | servers | parts | wire | pipelined | compute ms | predicted ms | measured ms | error |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:+.0} % |",
            r.model,
            r.link,
            servers(r),
            parts(r),
            wire(r),
            match r.pipeline {
                true => "yes".to_string(),
                false => format!("no, {} req.", r.requests_per_server),
            },
            r.compute_ms,
            r.predicted_ms,
            r.measured_ms,
            r.error * 100.0
        );
    }
    let within = rows.iter().filter(|r| r.error.abs() <= 0.20).count();
    let worst = rows.iter().map(|r| r.error.abs()).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "\nWithin ±20 %: {within} of {} ({:.0} %); the largest error {:.0} %.\n",
        rows.len(),
        100.0 * within as f64 / rows.len().max(1) as f64,
        worst * 100.0
    );
    let _ = writeln!(
        out,
        "| model | link | plan's pick | its measured ms | fastest measured | pick / fastest | default ({workers} servers, pipelined) ms | default / pick |\n|---|---|---|---|---|---|---|---|"
    );
    // Each model and link once, in the order first run (a table may join
    // grids run apart, one per placement).
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for row in rows {
        let group = (row.model.as_str(), row.link.as_str());
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    for (model, link) in groups {
        let group: Vec<&Row> = rows
            .iter()
            .filter(|r| r.model == model && r.link == link)
            .collect();
        // The planner's link rule: dedicated servers need at least the
        // workers' link in all (every link here has the same rate).
        let allowed: Vec<&Row> = group
            .iter()
            .copied()
            .filter(|r| r.colocated || r.servers >= workers)
            .collect();
        let candidates = if allowed.is_empty() { &group } else { &allowed };
        let at = ps_scheduler::plan::pick(candidates, |r| (r.predicted_ms, r.servers as u32));
        let pick = candidates[at.expect("a row")];
        let fastest = group
            .iter()
            .map(|r| r.measured_ms)
            .fold(f64::INFINITY, f64::min);
        // The issue's default: a server per worker, pipelined, f32, 4 MiB
        // parts (or the grid's nearest: any part size).
        let default = |colocated: bool, partition: Option<u64>| {
            group.iter().find(|r| {
                r.servers == workers
                    && r.pipeline
                    && r.colocated == colocated
                    && r.wire_bytes == 4
                    && partition.is_none_or(|p| r.partition_bytes == p)
            })
        };
        let four_mib = Some(ps_scheduler::plan::PARTITIONS[1]);
        let default = default(true, four_mib)
            .or_else(|| default(false, four_mib))
            .or_else(|| default(true, None))
            .or_else(|| default(false, None));
        let (default_ms, gain) = default.map_or(("-".to_string(), "-".to_string()), |d| {
            (
                format!(
                    "{:.0}{}",
                    d.measured_ms,
                    if d.colocated { " (beside)" } else { "" }
                ),
                format!("{:.2}", d.measured_ms / pick.measured_ms),
            )
        });
        let _ = writeln!(
            out,
            "| {model} | {link} | {} server(s), {} parts, {}, {} | {:.0} | {fastest:.0} | {:.2} | {default_ms} | {gain} |",
            servers(pick),
            parts(pick),
            wire(pick),
            match pick.pipeline {
                true => "pipelined".to_string(),
                false => format!("push then pull, {} req.", pick.requests_per_server),
            },
            pick.measured_ms,
            pick.measured_ms / fastest,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        Grid {
            models: default_models(),
            links: vec!["500mbit".parse().unwrap(), "1gbit".parse().unwrap()],
            servers: vec![1, 2, 3],
            placements: vec![Placement::Colocated],
            partitions: vec![256 << 10, 4 << 20],
            wires: vec![4, 2],
            pipelining: vec![false, true],
            requests: vec![1, 4],
            workers: 2,
            bin_dir: PathBuf::new(),
            out: PathBuf::new(),
            prefix: "test".into(),
            constants: Constants::default(),
        }
    }

    #[test]
    fn the_grid_runs_every_setup_once_with_requests_only_where_they_apply() {
        let points = points(&grid());
        // Beside two workers: 1 and 2 servers (3 is skipped); 2 parts x 2
        // wires x (pipelined once + push then pull with 1 and with 4).
        assert_eq!(points.len(), 2 * 2 * 2 * 3);
        assert!(points.iter().all(|p| p.servers <= 2 && p.colocated));
        for p in points.iter().filter(|p| p.pipeline) {
            assert_eq!(p.requests_per_server, cost::CLIENT_REQUESTS_PER_SERVER);
        }
        let mut labels: Vec<String> = points.iter().map(Point::label).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(
            labels.len(),
            points.len(),
            "each run has a folder of its own"
        );
        assert!(
            labels.contains(&"2-beside-256KiB-bf16-r1".to_string()),
            "{labels:?}"
        );
        assert!(
            labels.contains(&"1-beside-4MiB-f32-pipelined".to_string()),
            "{labels:?}"
        );
    }

    #[test]
    fn rows_of_grids_run_before_the_new_columns_read_as_what_they_ran() {
        let old = r#"{"model": "comm-bound", "link": "1gbit", "servers": 2, "pipeline": false,
            "compute_ms": 122.0, "predicted_ms": 600.0, "measured_ms": 620.0, "error": -0.03}"#;
        let row: Row = serde_json::from_str(old).unwrap();
        let point = row.point();
        assert!(!point.colocated);
        assert_eq!(point.partition_bytes, 1 << 20);
        assert_eq!(point.wire_bytes, 4);
        assert_eq!(point.requests_per_server, 4);
    }
}
