//! What running a plan sets, whatever runs it: `ps-local --plan`,
//! `ps-testbed run --plan`, and `ps-scheduler plan-env` for the compose and
//! swarm settings. A plan file is one a person may have edited, so what it
//! asks is checked here once.

use std::fmt::Write as _;
use std::path::PathBuf;

pub use ps_proto::codec::DType;
use ps_proto::consistency::Consistency;
use ps_proto::placement::check_partition_bytes;

use super::Plan;
use super::cost::Placement;

/// A plan's chosen setup, as a job runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Parameter servers.
    pub servers: usize,
    /// Whether they run beside the workers (the plan's choice; a runner that
    /// cannot colocate gives them hosts of their own).
    pub colocated: bool,
    /// Whether push and pull are pipelined.
    pub pipeline: bool,
    /// Backward segments, at most the model's layers.
    pub backward_segments: usize,
    /// What the plan asked for, when that was more than the layers.
    pub segments_asked: Option<usize>,
    /// The values' dtype on the wire.
    pub wire: DType,
    /// The largest part a parameter is cut into.
    pub partition_bytes: usize,
    /// Requests a push or pull to one server is cut into (when not pipelined).
    pub requests_per_server: u16,
    /// The consistency: `bsp`, `asp` or `ssp:N`, as the binaries take it.
    pub consistency: String,
}

/// The most requests per server a worker takes (`ps-worker --requests-per-server`).
pub const MOST_REQUESTS_PER_SERVER: u16 = 64;

/// `plan`'s chosen setup for a model of `layers` layers.
///
/// # Errors
/// The plan names no servers, wire values of another size than 4 or 2
/// bytes, requests per server outside 1 to 64, or a consistency the
/// binaries do not take.
pub fn applied(plan: &Plan, layers: usize) -> anyhow::Result<Applied> {
    let consistency: Consistency = plan
        .consistency
        .parse()
        .map_err(|e| anyhow::anyhow!("the plan's consistency {:?}: {e}", plan.consistency))?;
    let chosen = &plan.chosen;
    anyhow::ensure!(
        chosen.servers > 0,
        "the plan's chosen setup has no servers; give it at least one"
    );
    let wire = match chosen.wire_bytes {
        4 => DType::F32,
        2 => DType::BF16,
        other => anyhow::bail!(
            "the plan's chosen setup puts {other}-byte values on the wire; give 4 (f32) or 2 (bf16)"
        ),
    };
    let partition_bytes = usize::try_from(chosen.partition_bytes)
        .map_err(|e| e.to_string())
        .and_then(check_partition_bytes)
        .map_err(|e| anyhow::anyhow!("the plan's chosen setup's partition_bytes: {e}"))?;
    let requests_per_server = u16::try_from(chosen.requests_per_server)
        .ok()
        .filter(|n| (1..=MOST_REQUESTS_PER_SERVER).contains(n))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the plan's chosen setup makes {} requests per server; give its requests_per_server 1 to {MOST_REQUESTS_PER_SERVER}",
                chosen.requests_per_server
            )
        })?;
    let asked = chosen.backward_segments as usize;
    let backward_segments = asked.clamp(1, layers.max(1));
    Ok(Applied {
        servers: chosen.servers as usize,
        colocated: chosen.placement == Placement::Colocated,
        pipeline: chosen.pipeline,
        backward_segments,
        segments_asked: (asked > backward_segments).then_some(asked),
        wire,
        partition_bytes,
        requests_per_server,
        consistency: consistency.to_string(),
    })
}

/// The layers of the MLP whose hidden widths are `hidden` (`64,64`): one
/// more than the widths.
pub fn mlp_layers(hidden: &str) -> usize {
    hidden.split(',').filter(|w| !w.trim().is_empty()).count() + 1
}

/// `ps-scheduler plan-env`'s flags.
#[derive(Debug, clap::Args)]
pub struct PlanEnvArgs {
    /// The plan file (`ps-scheduler plan --out`).
    pub plan: PathBuf,
    /// The workers' hidden layer widths, to cut the backward pass into at
    /// most as many segments as the model has layers.
    #[arg(long, default_value = "64", env = "PS_HIDDEN")]
    pub hidden: String,
}

impl PlanEnvArgs {
    /// Prints the plan as the variables the compose and swarm settings pass
    /// on, one `NAME=value` a line.
    ///
    /// # Errors
    /// The plan cannot be read or applied.
    pub fn run(&self) -> anyhow::Result<()> {
        let plan = super::cli::read_plan(&self.plan)?;
        let applied = applied(&plan, mlp_layers(&self.hidden))?;
        if applied.colocated {
            eprintln!(
                "plan-env: the plan puts its servers beside the workers; in compose and swarm they run in containers of their own, where Docker places them"
            );
        }
        print!("{}", environment(&applied));
        Ok(())
    }
}

/// `applied` as the variables `scheduler`, `server` and `worker` read.
pub fn environment(applied: &Applied) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "PS_SERVERS={}", applied.servers);
    let _ = writeln!(out, "PS_CONSISTENCY={}", applied.consistency);
    let _ = writeln!(out, "PS_NO_PIPELINE={}", !applied.pipeline);
    let _ = writeln!(out, "PS_BACKWARD_SEGMENTS={}", applied.backward_segments);
    let _ = writeln!(out, "PS_WIRE_DTYPE={}", applied.wire);
    let _ = writeln!(out, "PS_PARTITION_BYTES={}", applied.partition_bytes);
    let _ = writeln!(
        out,
        "PS_REQUESTS_PER_SERVER={}",
        applied.requests_per_server
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Choices, Cluster, Constants, ModelShapes, plan};

    fn a_plan() -> Plan {
        let model = ModelShapes::from_spec("mlp:64,64,64,10").unwrap();
        let cluster = Cluster {
            workers: 2,
            worker_link: 125e6,
            server_link: 125e6,
            rtt: 100e-6,
            compute: 0.01,
            cores: 2,
        };
        let choices = Choices {
            max_servers: 3,
            server_hosts: 3,
            allow_bf16: true,
            staleness: 0,
            server_memory: 1 << 30,
            optimizer_state: 0,
        };
        plan(&model, &cluster, &choices, &Constants::default()).unwrap()
    }

    #[test]
    fn a_chosen_setup_applies_with_its_segments_capped_at_the_layers() {
        let mut plan = a_plan();
        plan.chosen.servers = 3;
        plan.chosen.placement = Placement::Colocated;
        plan.chosen.pipeline = false;
        plan.chosen.backward_segments = 4;
        plan.chosen.wire_bytes = 2;
        plan.chosen.partition_bytes = 4 << 20;
        plan.chosen.requests_per_server = 8;
        plan.consistency = "ssp:2".into();
        let applied = applied(&plan, 3).unwrap();
        assert_eq!(
            applied,
            Applied {
                servers: 3,
                colocated: true,
                pipeline: false,
                backward_segments: 3,
                segments_asked: Some(4),
                wire: DType::BF16,
                partition_bytes: 4 << 20,
                requests_per_server: 8,
                consistency: "ssp:2".into(),
            }
        );
        assert_eq!(
            environment(&applied),
            "PS_SERVERS=3\nPS_CONSISTENCY=ssp:2\nPS_NO_PIPELINE=true\nPS_BACKWARD_SEGMENTS=3\nPS_WIRE_DTYPE=bf16\nPS_PARTITION_BYTES=4194304\nPS_REQUESTS_PER_SERVER=8\n"
        );
    }

    #[test]
    fn a_plan_without_servers_or_with_odd_wire_values_partitions_or_requests_is_refused() {
        let mut plan = a_plan();
        for requests in [0, 65] {
            let mut asking = plan.clone();
            asking.chosen.requests_per_server = requests;
            let refused = applied(&asking, 2).unwrap_err().to_string();
            assert!(
                refused.contains(&format!("{requests} requests per server"))
                    && refused.contains("1 to 64"),
                "{refused}"
            );
        }
        plan.chosen.wire_bytes = 3;
        let odd = applied(&plan, 2).unwrap_err().to_string();
        assert!(odd.contains("3-byte"), "{odd}");
        plan.chosen.wire_bytes = 4;
        plan.chosen.partition_bytes = 8 << 20;
        let large = applied(&plan, 2).unwrap_err().to_string();
        assert!(
            large.contains("partition_bytes") && large.contains("4MiB"),
            "{large}"
        );
        plan.chosen.servers = 0;
        let none = applied(&plan, 2).unwrap_err().to_string();
        assert!(none.contains("no servers"), "{none}");
        plan.consistency = "bsp; reboot".into();
        let odd = applied(&plan, 2).unwrap_err().to_string();
        assert!(odd.contains("the plan's consistency"), "{odd}");
    }

    #[test]
    fn an_mlp_has_one_layer_more_than_its_hidden_widths() {
        assert_eq!(mlp_layers("64"), 2);
        assert_eq!(mlp_layers("2048,2048"), 3);
        assert_eq!(mlp_layers(""), 1);
    }
}
