//! `ps-local --plan auto|FILE`: a plan's setup applied to a local run. `auto`
//! plans this run on the spot: its MLP on its data set, its workers on this
//! host's loopback links, the compute per step timed here
//! (`ps_worker::compute_probe`). A file is a plan `ps-scheduler plan --out`
//! wrote (and a person may have edited).

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context;
use ps_common::rate::LinkRate;
use ps_scheduler::plan::apply::{Applied, applied};
use ps_scheduler::plan::cli::read_plan;
use ps_scheduler::plan::explain::describe;
use ps_scheduler::plan::{Choices, Cluster, Constants, ModelShapes, Plan, plan};
use ps_worker::data::Dataset;

/// Where the plan comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanSource {
    /// Planned for this run.
    Auto,
    /// A plan file.
    File(PathBuf),
}

impl FromStr for PlanSource {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "" => Err("--plan takes auto or a plan file".to_string()),
            "auto" => Ok(Self::Auto),
            path => Ok(Self::File(PathBuf::from(path))),
        }
    }
}

/// Loopback between the parts of one process, as a link rate: raw TCP moves
/// 4-6 GB/s here (`ps-microbench kv`'s TCP column, docs/benchmarks.md).
const LOOPBACK: &str = "40gbit";

/// What a local run takes from a plan: its setup as any runner applies it
/// (every process of a local run is on one host, so colocation changes
/// nothing), and that setup in words.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRun {
    /// Servers, pipelining, backward segments, wire dtype, partition size
    /// and consistency.
    pub setup: Applied,
    /// The setup in words, and its predicted step.
    pub summary: String,
}

/// The plan for this run: from its file, or made now for the MLP of
/// `hidden` layers on `data` in batches of `batch` with `workers` workers.
///
/// # Errors
/// The file cannot be read, the compute cannot be timed, or nothing fits.
pub fn load(
    source: &PlanSource,
    data: &Dataset,
    hidden: &[usize],
    batch: usize,
    workers: u32,
) -> anyhow::Result<Plan> {
    match source {
        PlanSource::File(path) => read_plan(path),
        PlanSource::Auto => {
            let compute = ps_worker::compute_probe::step_seconds(
                data,
                hidden,
                batch,
                &candle_core::Device::Cpu,
            )
            .context("timing a step's compute for --plan auto")?;
            let widths: Vec<String> = std::iter::once(data.width())
                .chain(hidden.iter().copied())
                .chain([data.classes])
                .map(|w| w.to_string())
                .collect();
            let model = ModelShapes::from_spec(&format!("mlp:{}", widths.join(",")))
                .map_err(anyhow::Error::msg)?;
            let link: LinkRate = LOOPBACK.parse().map_err(anyhow::Error::msg)?;
            let cluster = Cluster {
                workers,
                worker_link: link.bytes_per_sec(),
                server_link: link.bytes_per_sec(),
                rtt: 50e-6,
                compute,
                cores: ps_scheduler::plan::cli::this_hosts_cores(),
            };
            let choices = Choices {
                max_servers: 4,
                server_hosts: 0,
                allow_bf16: false,
                staleness: 0,
                server_memory: default_server_memory(),
                optimizer_state: 0,
            };
            Ok(plan(&model, &cluster, &choices, &Constants::default())?)
        }
    }
}

/// The default memory budget of a server (three quarters of this host's memory).
fn default_server_memory() -> u64 {
    ps_server::budget::default_budget() as u64
}

/// What `plan` sets for a run whose model has `layers` layers
/// ([`applied`]); a plan of 2-byte wire values runs with bf16 on the wire.
/// Over shared memory (`ps-local`'s default) a step whose shares fit is one
/// push-and-pull per server whatever `pipeline` says.
///
/// # Errors
/// The plan (a file a person may have edited) names no servers, or wire
/// values of another size than 4 or 2 bytes.
pub fn apply(plan: &Plan, layers: usize) -> anyhow::Result<PlannedRun> {
    let applied = applied(plan, layers)?;
    let predicted = plan
        .candidates
        .iter()
        .find(|c| c.setup == plan.chosen)
        .map_or(String::new(), |c| {
            format!(" (predicted step {:.2} ms)", c.terms.step * 1e3)
        });
    Ok(PlannedRun {
        setup: applied,
        summary: format!("{}{predicted}", describe(&plan.chosen)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planners_default_requests_per_server_is_the_clients() {
        assert_eq!(
            ps_scheduler::plan::cost::CLIENT_REQUESTS_PER_SERVER as usize,
            ps_client::DEFAULT_REQUESTS_PER_SERVER
        );
    }

    #[test]
    fn auto_plans_this_run_and_apply_keeps_segments_within_the_layers() {
        let data = ps_worker::data::digits::load().unwrap();
        let plan = load(&PlanSource::Auto, &data, &[64], 32, 2).unwrap();
        assert_eq!(plan.model, "mlp:64,64,10");
        assert!(plan.cluster.compute > 0.0);
        let run = apply(&plan, 2).unwrap();
        assert!((1..=4).contains(&run.setup.servers));
        assert!((1..=2).contains(&run.setup.backward_segments));
        assert_eq!(run.setup.consistency, "bsp");
        assert!(run.summary.contains("predicted step"), "{}", run.summary);
        assert_eq!("auto".parse(), Ok(PlanSource::Auto));
        assert_eq!("p.json".parse(), Ok(PlanSource::File("p.json".into())));
        assert_eq!(run.setup.wire, ps_proto::codec::DType::F32);
        assert!((1..=8).contains(&run.setup.requests_per_server));
        assert_eq!(
            run.setup.partition_bytes as u64,
            plan.chosen.partition_bytes
        );
        let mut halved = plan.clone();
        halved.chosen.wire_bytes = 2;
        assert_eq!(
            apply(&halved, 2).unwrap().setup.wire,
            ps_proto::codec::DType::BF16
        );
        halved.chosen.wire_bytes = 3;
        let odd = apply(&halved, 2).unwrap_err().to_string();
        assert!(odd.contains("3-byte"), "{odd}");
        let mut none = plan.clone();
        none.chosen.servers = 0;
        assert!(
            apply(&none, 2)
                .unwrap_err()
                .to_string()
                .contains("no servers")
        );
    }
}
