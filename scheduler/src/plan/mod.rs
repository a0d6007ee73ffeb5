//! `ps-scheduler plan`: which setup to run a model on a cluster with, chosen
//! by a cost model that says why.
//!
//! - [`model`]: the model's tensors (built-in shapes, JSON, safetensors).
//! - [`cost`]: the cost model, a step's time as named terms.
//! - [`explain`]: the table, the formulas and the constants, as text.
//! - [`cli`]: the command's flags, and the plan file.
//! - [`calibrate`]: the link, compute and apply rate measured by the tool.
//! - [`apply`]: a plan file's chosen setup as a run takes it, and
//!   `ps-scheduler plan-env`.
//!
//! [`plan`] predicts every candidate setup (servers and where they run,
//! partition size, wire dtype, pipelining, requests per server, backward
//! segments), sets aside
//! those a rule forbids, and picks the fastest of the rest, or one with
//! fewer servers predicted within 5 % of it. The result is a
//! [`Plan`], a JSON file a person can read and edit, and that `ps-local
//! --plan FILE` runs.

pub mod apply;
pub mod calibrate;
pub mod cli;
pub mod cost;
pub mod explain;
pub mod model;

use serde::{Deserialize, Serialize};

pub use cost::{Cluster, Constants, Placement, Setup, Terms};
pub use model::ModelShapes;

/// The largest parts a plan considers: the system's default, 1 MiB (first,
/// so that it wins a tie), and its largest, 4 MiB (BytePS cuts 4,096,000
/// bytes).
pub const PARTITIONS: [u64; 2] = [
    ps_proto::placement::DEFAULT_PART_BYTES as u64,
    ps_proto::placement::MAX_PART_BYTES as u64,
];

/// The requests per server a step that is not pipelined may be cut into
/// (the client's default, 4, first, so that it wins a tie).
pub const REQUESTS_PER_SERVER: [u32; 4] = [cost::CLIENT_REQUESTS_PER_SERVER, 1, 2, 8];

/// What the user allows and asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choices {
    /// The most servers to consider.
    pub max_servers: u32,
    /// Hosts of their own the servers may take (0: only beside workers).
    pub server_hosts: u32,
    /// Whether 2-byte wire values (bf16) may be chosen.
    pub allow_bf16: bool,
    /// Whether workers may read values up to this many steps stale (SSP);
    /// 0 keeps BSP.
    pub staleness: u32,
    /// Each server's memory budget in bytes.
    pub server_memory: u64,
    /// Optimizer state per value, in f32 copies: 0 (SGD), 1 (momentum), 2 (Adam).
    pub optimizer_state: u32,
}

/// A candidate setup with its prediction, and why it may not be chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The setup.
    pub setup: Setup,
    /// Its predicted terms.
    pub terms: Terms,
    /// Memory the busiest server needs, bytes.
    pub server_memory: u64,
    /// Why a rule sets it aside, if one does.
    pub ruled_out: Option<String>,
}

/// A plan: the inputs, every candidate, and the one chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The model's name, parameters and bytes.
    pub model: String,
    /// Its parameters.
    pub parameters: u64,
    /// The cluster.
    pub cluster: Cluster,
    /// What was allowed.
    pub choices: Choices,
    /// The constants used, with their sources.
    pub constants: Constants,
    /// Every candidate, fastest first.
    pub candidates: Vec<Candidate>,
    /// The chosen setup: of the candidates no rule sets aside, the fewest
    /// servers within [`WORTH_A_SERVER`] of the fastest ([`pick`]).
    pub chosen: Setup,
    /// The consistency to run with: `bsp`, or `ssp:N` when staleness is allowed.
    pub consistency: String,
    /// When and where the plan was made.
    pub made: String,
    /// What `--measure-link` and `--measure-compute` measured, and where.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<String>,
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No candidate passes the rules.
    #[error(
        "no setup fits: {0}; allow more servers (--max-servers, --server-hosts) or give them more memory (--server-memory)"
    )]
    NothingFits(String),
    /// The inputs make no sense.
    #[error("{0}")]
    Invalid(String),
}

/// Plans `model` on `cluster`.
///
/// # Errors
/// [`PlanError`]: inputs out of range, or every candidate ruled out (the
/// message says by what).
pub fn plan(
    model: &ModelShapes,
    cluster: &Cluster,
    choices: &Choices,
    constants: &Constants,
) -> Result<Plan, PlanError> {
    validate(cluster, choices)?;
    let tensor_bytes = model.tensor_bytes();
    let mut candidates: Vec<Candidate> = setups(cluster, choices)
        .into_iter()
        .map(|setup| {
            let terms = cost::predict(&setup, &tensor_bytes, cluster, constants);
            let server_memory = server_memory(model.f32_bytes(), &setup, &terms, choices);
            let ruled_out = rule_out(&setup, server_memory, cluster, choices);
            Candidate {
                setup,
                terms,
                server_memory,
                ruled_out,
            }
        })
        .collect();
    candidates.sort_by(|a, b| a.terms.step.total_cmp(&b.terms.step));
    let allowed: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.ruled_out.is_none())
        .collect();
    let chosen = pick(&allowed, |c| (c.terms.step, c.setup.servers))
        .map(|at| allowed[at].setup.clone())
        .ok_or_else(|| {
            let why = candidates
                .first()
                .and_then(|c| c.ruled_out.clone())
                .unwrap_or_else(|| "no candidates".to_string());
            PlanError::NothingFits(why)
        })?;
    Ok(Plan {
        model: model.name.clone(),
        parameters: model.parameters(),
        cluster: cluster.clone(),
        choices: choices.clone(),
        constants: constants.clone(),
        candidates,
        chosen,
        consistency: match choices.staleness {
            0 => "bsp".to_string(),
            n => format!("ssp:{n}"),
        },
        made: String::new(),
        measured: Vec::new(),
    })
}

/// How much slower (as a share) a setup with fewer servers may be predicted
/// and still be chosen: a server is a host or a process to pay for, and the
/// model cannot tell setups this close apart (docs/plan.md).
pub const WORTH_A_SERVER: f64 = 0.05;

/// Which of `items` to choose, given each one's predicted step and servers:
/// the fewest servers among those within [`WORTH_A_SERVER`] of the fastest,
/// the fastest of those. `None` when `items` is empty.
pub fn pick<T>(items: &[T], step_and_servers: impl Fn(&T) -> (f64, u32)) -> Option<usize> {
    let fastest = items
        .iter()
        .map(|item| step_and_servers(item).0)
        .min_by(f64::total_cmp)?;
    let close = |item: &T| step_and_servers(item).0 <= fastest * (1.0 + WORTH_A_SERVER);
    (0..items.len())
        .filter(|&i| close(&items[i]))
        .min_by(|&a, &b| {
            let (step_a, servers_a) = step_and_servers(&items[a]);
            let (step_b, servers_b) = step_and_servers(&items[b]);
            servers_a.cmp(&servers_b).then(step_a.total_cmp(&step_b))
        })
}

fn validate(cluster: &Cluster, choices: &Choices) -> Result<(), PlanError> {
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if cluster.workers == 0 || choices.max_servers == 0 {
        return Err(PlanError::Invalid(
            "a plan needs at least one worker and one server".into(),
        ));
    }
    if !positive(cluster.worker_link) || !positive(cluster.server_link) {
        return Err(PlanError::Invalid("link rates must be positive".into()));
    }
    if !(cluster.compute.is_finite() && cluster.compute >= 0.0 && cluster.rtt >= 0.0) {
        return Err(PlanError::Invalid(
            "compute time and round trip must be zero or more".into(),
        ));
    }
    Ok(())
}

/// Every setup worth predicting: servers from 1 to the most allowed, beside
/// the workers (at most one per worker host) or on hosts of their own (at
/// most the hosts given), each partition size and wire dtype allowed, with
/// and without pipelining (without, each of [`REQUESTS_PER_SERVER`]), and
/// with 1 or 4 backward segments.
fn setups(cluster: &Cluster, choices: &Choices) -> Vec<Setup> {
    let wires: &[u32] = if choices.allow_bf16 { &[4, 2] } else { &[4] };
    let mut setups = Vec::new();
    for placement in [Placement::Colocated, Placement::Dedicated] {
        let most = match placement {
            Placement::Colocated => cluster.workers,
            Placement::Dedicated => choices.server_hosts,
        }
        .min(choices.max_servers);
        for servers in 1..=most {
            for &partition_bytes in &PARTITIONS {
                for &wire_bytes in wires {
                    for pipeline in [false, true] {
                        let requests: &[u32] = match pipeline {
                            false => &REQUESTS_PER_SERVER,
                            true => &[cost::CLIENT_REQUESTS_PER_SERVER],
                        };
                        for &requests_per_server in requests {
                            for backward_segments in [1, 4] {
                                setups.push(Setup {
                                    servers,
                                    placement,
                                    partition_bytes,
                                    wire_bytes,
                                    pipeline,
                                    backward_segments,
                                    requests_per_server,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    setups
}

/// Memory the busiest server holds: its share of the values, the BSP
/// accumulator, the pull snapshot and the optimizer's state, all f32.
fn server_memory(model_bytes: u64, setup: &Setup, terms: &Terms, choices: &Choices) -> u64 {
    let share = model_bytes as f64 / f64::from(setup.servers) * terms.imbalance;
    (share * f64::from(3 + choices.optimizer_state)).ceil() as u64
}

/// The rules no chosen setup may break: a server's memory within its
/// budget, and, with servers on hosts of their own, at least as much server
/// link as worker link (BytePS's rule: otherwise the servers' links are the
/// bottleneck whatever else is done).
fn rule_out(setup: &Setup, memory: u64, cluster: &Cluster, choices: &Choices) -> Option<String> {
    if memory > choices.server_memory {
        return Some(format!(
            "a server would hold {} of a {} budget",
            ps_common::size::format_size(memory as usize),
            ps_common::size::format_size(choices.server_memory as usize)
        ));
    }
    let servers_link = f64::from(setup.servers) * cluster.server_link;
    let workers_link = f64::from(cluster.workers) * cluster.worker_link;
    if setup.placement == Placement::Dedicated && servers_link < workers_link {
        return Some(format!(
            "{} dedicated server link(s) carry less than the {} workers' links",
            setup.servers, cluster.workers
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(workers: u32, gbit: f64, compute: f64) -> Cluster {
        Cluster {
            workers,
            worker_link: gbit * 125e6,
            server_link: gbit * 125e6,
            rtt: 100e-6,
            compute,
            cores: 2,
        }
    }

    fn choices() -> Choices {
        Choices {
            max_servers: 4,
            server_hosts: 4,
            allow_bf16: false,
            staleness: 0,
            server_memory: 16 << 30,
            optimizer_state: 0,
        }
    }

    #[test]
    fn the_chosen_setup_has_the_fewest_servers_close_to_the_fastest_allowed() {
        let model = ModelShapes::from_spec("resnet50").unwrap();
        let plan = plan(
            &model,
            &cluster(4, 1.0, 0.2),
            &choices(),
            &Constants::default(),
        )
        .unwrap();
        let first = plan
            .candidates
            .iter()
            .find(|c| c.ruled_out.is_none())
            .unwrap();
        assert_eq!(plan.chosen, first.setup);
        let steps: Vec<f64> = plan.candidates.iter().map(|c| c.terms.step).collect();
        assert!(steps.windows(2).all(|w| w[0] <= w[1]), "fastest first");
        // Four workers at 1 Gbit/s: fewer than four dedicated servers is
        // ruled out, and never chosen.
        for c in &plan.candidates {
            let unbalanced = c.setup.placement == Placement::Dedicated && c.setup.servers < 4;
            assert_eq!(unbalanced, c.ruled_out.is_some(), "{c:?}");
        }
    }

    #[test]
    fn a_close_setup_with_fewer_servers_is_picked() {
        let items = [(1.00, 3), (1.03, 2), (1.06, 1), (0.99, 4)];
        assert_eq!(pick(&items, |&(step, servers)| (step, servers)), Some(1));
        assert_eq!(pick(&items[..0], |&(step, servers)| (step, servers)), None);
    }

    #[test]
    fn a_budget_too_small_rules_out_few_servers_and_says_so() {
        let model = ModelShapes::from_spec("bert-base").unwrap();
        let small = Choices {
            server_memory: 700 << 20,
            ..choices()
        };
        let plan = plan(&model, &cluster(2, 1.0, 0.2), &small, &Constants::default()).unwrap();
        assert!(
            plan.chosen.servers >= 2,
            "438 MB x 3 does not fit one 700 MiB server"
        );
        let tiny = Choices {
            server_memory: 1 << 20,
            ..choices()
        };
        let error =
            super::plan(&model, &cluster(2, 1.0, 0.2), &tiny, &Constants::default()).unwrap_err();
        assert!(error.to_string().contains("budget"), "{error}");
    }

    #[test]
    fn bf16_is_chosen_on_a_slow_link_only_when_allowed() {
        let model = ModelShapes::from_spec("resnet50").unwrap();
        let slow = cluster(2, 0.5, 0.05);
        let f32_only = plan(&model, &slow, &choices(), &Constants::default()).unwrap();
        assert_eq!(f32_only.chosen.wire_bytes, 4);
        let allowed = Choices {
            allow_bf16: true,
            ..choices()
        };
        let with_bf16 = plan(&model, &slow, &allowed, &Constants::default()).unwrap();
        assert_eq!(with_bf16.chosen.wire_bytes, 2);
    }
}
