//! `ps-testbed run --plan FILE`: the job a plan file (`ps-scheduler plan
//! --out`) describes, in the emulated cluster: its servers on hosts of their
//! own or beside the workers, as the plan places them; its workers told to
//! pipeline or not, how many backward segments to cut, and which dtype to
//! put on the wire; the scheduler told the consistency and the partition
//! size.

use ps_scheduler::plan::Plan;
use ps_scheduler::plan::apply::{DType, applied, mlp_layers};

/// The worker flags a plan sets.
const PLANNED_FLAGS: [&str; 4] = [
    "--no-pipeline",
    "--backward-segments",
    "--wire-dtype",
    "--requests-per-server",
];
/// The scheduler flags a plan sets.
const PLANNED_SCHEDULER_FLAGS: [&str; 2] = ["--consistency", "--partition-bytes"];

/// What a run takes from a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedJob {
    /// Servers.
    pub servers: usize,
    /// Whether they run beside the workers, on the first worker hosts.
    pub colocated: bool,
    /// Arguments every worker gets, after the user's.
    pub worker_args: Vec<String>,
    /// Arguments the scheduler gets.
    pub scheduler_args: Vec<String>,
    /// What the testbed runs differently from the plan, in words.
    pub differences: Vec<String>,
}

/// The job `plan` describes for workers given `user_args` (whose
/// `--hidden` says how many layers there are to cut into segments) and a
/// scheduler given `scheduler_args`.
///
/// # Errors
/// The plan (a file a person may have edited) names no servers, or wire
/// values of another size than 4 or 2 bytes; `user_args` or
/// `scheduler_args` give a flag the plan sets.
pub fn job(
    plan: &Plan,
    user_args: &[String],
    scheduler_args: &[String],
) -> anyhow::Result<PlannedJob> {
    refuse_planned(&PLANNED_FLAGS, user_args, "the worker arguments")?;
    refuse_planned(&PLANNED_SCHEDULER_FLAGS, scheduler_args, "--scheduler-arg")?;
    let applied = applied(plan, layers(user_args))?;
    let mut worker_args = Vec::new();
    let mut differences = Vec::new();
    if let Some(asked) = applied.segments_asked {
        differences.push(format!(
            "the plan cuts the backward pass in {asked}; the model has fewer layers, so {}",
            applied.backward_segments
        ));
    }
    if !applied.pipeline {
        worker_args.push("--no-pipeline".to_string());
    }
    if applied.backward_segments > 1 {
        worker_args.extend([
            "--backward-segments".to_string(),
            applied.backward_segments.to_string(),
        ]);
    }
    if applied.wire != DType::F32 {
        worker_args.extend(["--wire-dtype".to_string(), applied.wire.to_string()]);
    }
    worker_args.extend([
        "--requests-per-server".to_string(),
        applied.requests_per_server.to_string(),
    ]);
    let mut scheduler_args = match applied.consistency.as_str() {
        "bsp" => Vec::new(),
        other => vec!["--consistency".to_string(), other.to_string()],
    };
    scheduler_args.extend([
        "--partition-bytes".to_string(),
        applied.partition_bytes.to_string(),
    ]);
    Ok(PlannedJob {
        servers: applied.servers,
        colocated: applied.colocated,
        worker_args,
        scheduler_args,
        differences,
    })
}

/// Refuses `given` arguments holding one of `flags`, which the plan sets.
fn refuse_planned(flags: &[&str], given: &[String], where_given: &str) -> anyhow::Result<()> {
    for flag in flags {
        let found = given
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
        anyhow::ensure!(
            !found,
            "--plan sets {flag} from the plan file; leave it out of {where_given} (or edit the plan)"
        );
    }
    Ok(())
}

/// The MLP's layers as `args` give them: one more than its `--hidden`
/// widths (the worker's default is one hidden layer).
fn layers(args: &[String]) -> usize {
    let hidden = args
        .iter()
        .position(|a| a == "--hidden")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--hidden=")))
        .unwrap_or("64");
    mlp_layers(hidden)
}

#[cfg(test)]
mod tests {
    use ps_scheduler::plan::{Choices, Cluster, Constants, ModelShapes, Placement, plan};

    use super::*;

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

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_plan_becomes_servers_and_worker_flags() {
        let mut plan = a_plan();
        plan.chosen.servers = 3;
        plan.chosen.placement = Placement::Dedicated;
        plan.chosen.pipeline = false;
        plan.chosen.backward_segments = 4;
        plan.chosen.wire_bytes = 2;
        plan.chosen.partition_bytes = 4 << 20;
        plan.chosen.requests_per_server = 8;
        plan.consistency = "ssp:2".into();
        let job = job(&plan, &args("--hidden 64,64 --epochs 1"), &[]).unwrap();
        assert_eq!((job.servers, job.colocated), (3, false));
        assert_eq!(
            job.worker_args,
            args("--no-pipeline --backward-segments 3 --wire-dtype bf16 --requests-per-server 8")
        );
        assert_eq!(
            job.scheduler_args,
            args("--consistency ssp:2 --partition-bytes 4194304")
        );
        assert_eq!(job.differences.len(), 1, "{:?}", job.differences);
        assert!(job.differences[0].contains("in 4"), "{:?}", job.differences);
    }

    #[test]
    fn the_defaults_add_only_the_partition_size_and_requests_and_servers_beside_workers_stay_there()
    {
        let mut plan = a_plan();
        plan.chosen.placement = Placement::Colocated;
        plan.chosen.pipeline = true;
        plan.chosen.backward_segments = 1;
        plan.chosen.wire_bytes = 4;
        plan.chosen.partition_bytes = 1 << 20;
        plan.chosen.requests_per_server = 4;
        plan.consistency = "bsp".into();
        let job = job(&plan, &args("--epochs 1"), &[]).unwrap();
        assert_eq!(job.worker_args, args("--requests-per-server 4"));
        assert_eq!(job.scheduler_args, args("--partition-bytes 1048576"));
        assert!(job.colocated && job.differences.is_empty());
    }

    #[test]
    fn a_plan_without_servers_or_with_odd_wire_values_is_refused() {
        let mut plan = a_plan();
        plan.chosen.wire_bytes = 3;
        assert!(
            job(&plan, &[], &[])
                .unwrap_err()
                .to_string()
                .contains("3-byte")
        );
        plan.chosen.servers = 0;
        assert!(
            job(&plan, &[], &[])
                .unwrap_err()
                .to_string()
                .contains("no servers")
        );
    }

    #[test]
    fn a_flag_the_plan_sets_is_refused_in_the_worker_arguments() {
        let plan = a_plan();
        for given in [
            "--wire-dtype f32",
            "--backward-segments=2",
            "--no-pipeline",
            "--requests-per-server=2",
        ] {
            let error = job(&plan, &args(given), &[]).unwrap_err().to_string();
            assert!(error.contains("--plan sets"), "{given}: {error}");
        }
        for given in ["--consistency=asp", "--partition-bytes"] {
            let error = job(&plan, &[], &args(given)).unwrap_err().to_string();
            assert!(error.contains("--scheduler-arg"), "{given}: {error}");
        }
    }

    #[test]
    fn the_layers_come_from_hidden_in_either_spelling() {
        assert_eq!(layers(&args("--hidden 8,8,8")), 4);
        assert_eq!(layers(&args("--hidden=8,8")), 3);
        assert_eq!(layers(&args("--epochs 2")), 2);
    }
}
