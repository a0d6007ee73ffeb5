//! The cost model: a setup's predicted step time as a sum of named terms,
//! each from the model's bytes, the cluster's links and the measured
//! constants ([`Constants`]), so that `--explain` can show every one.
//!
//! Per step, each worker pushes its gradients and pulls the values back:
//! `W = model bytes × wire bytes / 4` each way. A link carries both
//! directions at once, so a direction's time is its busiest link's bytes over
//! its rate times the link efficiency. The terms:
//!
//! - `compute`: the worker's forward and backward pass (given or measured).
//! - `push`, `pull`: the busiest link's bytes each way over its rate, or the
//!   busiest server's per-byte CPU for its share when that is slower (its
//!   workers' connections served on up to half the host's cores), plus the
//!   worker's per-byte CPU, plus one round trip each.
//! - `apply`: the busiest server's gradients (f32) over the apply rate, less
//!   what arriving in pieces hides: a push to one server cut into `R`
//!   requests (or, pipelined, `G / S` groups) arrives one piece after another
//!   on the server's session, and the server applies each while the next is
//!   on the wire, so all but the last piece's apply can hide behind the link.
//! - `requests`: requests per step (a push and a pull per key group) times
//!   the per-request CPU.
//! - `overlap` (negative): time the two directions share. Pipelined, a
//!   group's pull overlaps the pushes of groups at other servers; when a
//!   server's link is busier than a worker's, the worker whose push ends first
//!   pulls while the others still push; beside every worker, a host's two
//!   directions already carry both phases and nothing more hides. With a
//!   segmented backward, the push also overlaps the backward pass but for
//!   its last segment.

use ps_proto::placement::{self, Param};
use serde::{Deserialize, Serialize};

/// The measured constants of the model, each with where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Constants {
    /// CPU seconds per request, both sides together.
    pub request_seconds: f64,
    /// Bytes per second a worker encodes or copies (each direction).
    pub worker_bytes_per_sec: f64,
    /// Bytes of f32 gradient per second a server applies (SGD), one core.
    pub apply_bytes_per_sec: f64,
    /// The share of a link's rate a job's bytes get.
    pub link_efficiency: f64,
    /// Bytes per second a server receives or sends (its CPU per byte of a
    /// push's decoding or a pull's encoding), one core. Plan files from
    /// before it was measured take the built-in value.
    #[serde(default = "built_in_server_rate")]
    pub server_bytes_per_sec: f64,
    /// Where each constant came from, in the order above.
    pub sources: Vec<String>,
}

impl Constants {
    /// Fills in where the constants of a file written before
    /// [`Constants::server_bytes_per_sec`] existed came from: that one is
    /// the built-in value.
    pub fn with_known_sources(mut self) -> Self {
        if self.sources.len() == 4 && self.server_bytes_per_sec == SERVER_RATE_MEASURED {
            self.sources.push(SERVER_RATE_SOURCE.into());
        }
        self
    }
}

/// The built-in [`Constants::server_bytes_per_sec`]: the receiving side's
/// CPU per byte of a 4 MiB gRPC stream over loopback.
const SERVER_RATE_MEASURED: f64 = 5.9e9;
/// Where [`SERVER_RATE_MEASURED`] came from.
const SERVER_RATE_SOURCE: &str = "the receiver's CPU per byte of a 4 MiB gRPC stream over loopback, 0.17 s/GB (ps-microbench bandwidth, docs/plan.md)";

fn built_in_server_rate() -> f64 {
    SERVER_RATE_MEASURED
}

impl Default for Constants {
    /// The constants measured on the development machine (2 cores), from
    /// `docs/benchmarks.md`.
    fn default() -> Self {
        Self {
            request_seconds: 110e-6,
            worker_bytes_per_sec: 3.5e9,
            apply_bytes_per_sec: 5.0e9,
            link_efficiency: 0.85,
            server_bytes_per_sec: SERVER_RATE_MEASURED,
            sources: vec![
                "4 KiB push p50 over gRPC, 110-120 us (ps-microbench kv, docs/benchmarks.md, issue 38)".into(),
                "16 MiB pull over gRPC, 3.4-3.6 GB/s (ps-microbench kv, same table)".into(),
                "copy-then-SGD floor, one core, 4.9-7.3 GB/s at 16 MiB (ps-microbench kv --data-path shm)".into(),
                "link use of pipelined push and pull, 0.8-0.9 of the shaped rate (ps-testbed, docs/overlap.md)".into(),
                SERVER_RATE_SOURCE.into(),
            ],
        }
    }
}

/// Where the servers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// On hosts of their own.
    Dedicated,
    /// One on each of the first worker hosts, beside its worker.
    Colocated,
}

/// One candidate setup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    /// Server processes.
    pub servers: u32,
    /// Where they run.
    pub placement: Placement,
    /// The largest part a tensor is cut into, in bytes.
    pub partition_bytes: u64,
    /// Bytes per value on the wire: 4 (f32) or 2 (bf16, f16).
    pub wire_bytes: u32,
    /// Push and pull pipelined per key group.
    pub pipeline: bool,
    /// Backward-pass segments whose pushes overlap the rest (1: none).
    pub backward_segments: u32,
    /// Requests a push (and a pull) to one server is cut into when not
    /// pipelined (the client's `requests_per_server`; a pipelined step cuts
    /// by group bytes instead and leaves it at the client's default). Plan
    /// files from before it was chosen take that default.
    #[serde(default = "client_requests_per_server")]
    pub requests_per_server: u32,
}

/// The client's default requests per server (`ps_client::DEFAULT_REQUESTS_PER_SERVER`).
pub const CLIENT_REQUESTS_PER_SERVER: u32 = 4;

fn client_requests_per_server() -> u32 {
    CLIENT_REQUESTS_PER_SERVER
}

/// The cluster a plan is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// Worker hosts, one worker each.
    pub workers: u32,
    /// Each worker host's link, bytes per second each way.
    pub worker_link: f64,
    /// Each server host's link when servers have hosts of their own.
    pub server_link: f64,
    /// Round-trip time between hosts, seconds.
    pub rtt: f64,
    /// Seconds of compute per step.
    pub compute: f64,
    /// Cores of each host. A server serves its workers' connections on half
    /// of them (its runtime threads). Plan files from before it was an input
    /// take 2, the machine the built-in constants were measured on.
    #[serde(default = "two_cores")]
    pub cores: u32,
}

fn two_cores() -> u32 {
    2
}

/// Threads a server on a host of `cores` serves connections on: half the
/// cores, at least one (`ps-server --runtime-threads`' default).
pub fn server_threads(cores: u32) -> u32 {
    (cores / 2).max(1)
}

/// A prediction: its terms in seconds, and their sum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Terms {
    /// Forward and backward.
    pub compute: f64,
    /// The push's link time (or the server's CPU for its share, when
    /// slower), the worker's per-byte CPU and a round trip.
    pub push: f64,
    /// The pull's.
    pub pull: f64,
    /// The busiest server's apply.
    pub apply: f64,
    /// Per-request CPU.
    pub requests: f64,
    /// Time hidden by pipelining and segmenting (at most zero).
    pub overlap: f64,
    /// The predicted step time.
    pub step: f64,
    /// The busiest link's bytes each way per step.
    pub busiest_link_bytes: f64,
    /// The busiest server's share of the model, as a multiple of an even share.
    pub imbalance: f64,
}

/// The smallest group of keys a pipelined step sends as a request of its
/// own: the client's `MIN_GROUP_BYTES` (`client/src/config.rs`), its default
/// `pipeline_group_bytes`.
pub const PIPELINE_GROUP_BYTES: u64 = 1 << 20;

/// The share of a step's compute that is the backward pass.
pub const BACKWARD_SHARE: f64 = 2.0 / 3.0;

/// Predicts `setup`'s step time for a model of `tensor_bytes` (f32) on
/// `cluster`, with `constants`.
pub fn predict(
    setup: &Setup,
    tensor_bytes: &[u64],
    cluster: &Cluster,
    constants: &Constants,
) -> Terms {
    let model: u64 = tensor_bytes.iter().sum();
    let (parts, imbalance) = balance(tensor_bytes, setup.partition_bytes, setup.servers);
    let wire = model as f64 * f64::from(setup.wire_bytes) / 4.0;
    let ((link_time, busiest_link_bytes), slack) =
        busiest_link(setup, cluster, constants, wire, imbalance);
    let cpu_bytes = wire / constants.worker_bytes_per_sec;
    // The busiest server decodes its share of every worker's push (and
    // encodes its pull) as the bytes arrive, each worker's connection on one
    // of its threads: it binds only when slower than the link.
    let threads = server_threads(cluster.cores).min(cluster.workers.max(1));
    let server_cpu = f64::from(cluster.workers) * wire / f64::from(setup.servers) * imbalance
        / (constants.server_bytes_per_sec * f64::from(threads));
    let carried = link_time.max(server_cpu);
    let push = carried + cpu_bytes + cluster.rtt;
    let pull = carried + cpu_bytes + cluster.rtt;
    let even_share = model as f64 / f64::from(setup.servers);
    let whole_apply =
        f64::from(cluster.workers) * even_share * imbalance / constants.apply_bytes_per_sec;
    let groups = groups_per_step(setup, wire, parts);
    // A server takes its requests (or pipelined groups) one after another,
    // and applies each while the next arrives: all but the last one's apply
    // can hide behind the link.
    let arrivals = (groups / u64::from(setup.servers.max(1))).max(1) as f64;
    let apply = whole_apply - whole_apply.min(carried) * (1.0 - 1.0 / arrivals);
    // A push and a pull per group.
    let requests = (2 * groups) as f64 * constants.request_seconds;
    let overlap = -hidden(
        setup,
        cluster.workers,
        (groups, slack),
        cluster.compute,
        (push, pull, apply),
    );
    let step = cluster.compute + push + pull + apply + requests + overlap;
    Terms {
        compute: cluster.compute,
        push,
        pull,
        apply,
        requests,
        overlap,
        step,
        busiest_link_bytes,
        imbalance,
    }
}

/// The busiest link each way per step: `(seconds, bytes)`, its rate taken
/// at the link efficiency; and the share of that time a worker's own link
/// (carrying its `W`) leaves free.
fn busiest_link(
    setup: &Setup,
    cluster: &Cluster,
    constants: &Constants,
    wire: f64,
    imbalance: f64,
) -> ((f64, f64), f64) {
    let (n, s) = (f64::from(cluster.workers), f64::from(setup.servers));
    let share = wire / s * imbalance;
    let links = match setup.placement {
        // A worker's link carries its own W; a server's, N workers' shares.
        Placement::Dedicated => vec![
            (wire, cluster.worker_link),
            (n * share, cluster.server_link),
        ],
        // In the push, a host with a server sends its worker's shares for
        // the other servers and receives the other workers' shares for its
        // own; the pull is the same the other way. Each direction carries
        // the larger of the two (BytePS's 2 W (N - 1) / N is both phases'
        // sends together). A host without a server carries its worker's W.
        Placement::Colocated => {
            let with_server = ((wire - share).max((n - 1.0) * share), cluster.worker_link);
            if s < n {
                vec![with_server, (wire, cluster.worker_link)]
            } else {
                vec![with_server]
            }
        }
    };
    let time = |bytes: f64, rate: f64| bytes / (rate * constants.link_efficiency);
    let busiest = links
        .into_iter()
        .map(|(bytes, rate)| (time(bytes, rate), bytes))
        .fold(
            (0.0, 0.0),
            |busiest, link| if link.0 > busiest.0 { link } else { busiest },
        );
    let own = time(wire, cluster.worker_link);
    let slack = if busiest.0 > 0.0 {
        (1.0 - own / busiest.0).max(0.0)
    } else {
        0.0
    };
    (busiest, slack)
}

/// Parts the system's own planner (`ps_proto::placement::plan`) cuts a model
/// of `tensor_bytes` into for `servers` with parts of at most `partition`
/// bytes, and the busiest server's load over an even share.
pub fn balance(tensor_bytes: &[u64], partition: u64, servers: u32) -> (u64, f64) {
    let params: Vec<Param> = tensor_bytes
        .iter()
        .enumerate()
        .map(|(i, &bytes)| Param {
            name: i.to_string(),
            elements: (bytes / 4) as usize,
            elem_size: 4,
        })
        .collect();
    let servers = servers.max(1) as usize;
    let assignments = placement::plan(&params, servers, partition as usize);
    let imbalance = placement::imbalance(&params, &assignments, servers);
    (assignments.len() as u64, imbalance.max(1.0))
}

/// Requests a push to one server is cut into when not pipelined: the
/// setup's requests per server, but at most one per [`PIPELINE_GROUP_BYTES`]
/// of a server's even `share` of wire bytes (and one for the rest) and one
/// per part it holds, as the client's `in_groups` cuts them.
pub fn requests_cut_per_server(setup: &Setup, share: f64, parts: u64) -> u64 {
    let by_bytes = (share / PIPELINE_GROUP_BYTES as f64).ceil() as u64;
    let parts_here = parts.div_ceil(u64::from(setup.servers.max(1)));
    u64::from(setup.requests_per_server.max(1))
        .min(by_bytes)
        .min(parts_here)
        .max(1)
}

/// Key groups a step's push (and pull) is cut into: with pipelining, one
/// per [`PIPELINE_GROUP_BYTES`] of wire bytes, at least one per server and at
/// most one per part; without, [`requests_cut_per_server`] per server.
pub fn groups_per_step(setup: &Setup, wire: f64, parts: u64) -> u64 {
    let servers = u64::from(setup.servers);
    if !setup.pipeline {
        let share = wire / servers.max(1) as f64;
        return servers * requests_cut_per_server(setup, share, parts);
    }
    let by_bytes = (wire / PIPELINE_GROUP_BYTES as f64).ceil() as u64;
    by_bytes.clamp(servers, parts.max(servers))
}

/// Time hidden by overlapping the two directions, and the push with the
/// backward pass.
///
/// - Pipelined, a group's pull waits for every worker's push of that group
///   at its server, and holds that server's session meanwhile: only groups at
///   the other servers go on, so `(1 - 1/S) x (1 - 1/G)` of the shorter
///   direction hides (none with one server).
/// - Staggered: when a server's link carries more than a worker's (`slack`,
///   the share of the busiest link's time a worker's own link is free), the
///   worker whose push ends first pulls while the others still push, so that
///   share of the shorter direction hides, pipelined or not.
/// - Beside the workers, a host with a server carries both phases each way
///   (its worker's push out and the others' pushes in, then the others'
///   pulls out and its worker's in), so pipelining only fills what one
///   direction leaves idle: at most [`colocated_room`] of the shorter
///   direction hides (none with a server beside every worker).
/// - Segmented in `k`, the push hides behind the backward pass but for its
///   last segment.
fn hidden(
    setup: &Setup,
    workers: u32,
    (groups, slack): (u64, f64),
    compute: f64,
    (push, pull, apply): (f64, f64, f64),
) -> f64 {
    let shorter = pull.min(push + apply);
    let pipelined = if setup.pipeline {
        let servers = f64::from(setup.servers);
        let across_servers = (1.0 - 1.0 / servers) * (1.0 - 1.0 / groups as f64);
        match setup.placement {
            Placement::Dedicated => across_servers,
            Placement::Colocated => across_servers.min(colocated_room(setup.servers, workers)),
        }
    } else {
        0.0
    };
    let mut hidden = shorter * pipelined.max(slack);
    if setup.backward_segments > 1 {
        let segments = f64::from(setup.backward_segments);
        let backward = compute * BACKWARD_SHARE;
        hidden += push.min(backward * (segments - 1.0) / segments);
    }
    hidden
}

/// The share of one phase's link time that pipelining can still hide on a
/// host with a server beside its worker, `servers` of them for `workers`
/// workers. Of a model of 1, the host sends `out = 1 - 1/S` and receives
/// `in = (N - 1)/S` in the push, the reverse in the pull: one phase after
/// the other take `2 max(out, in)`, overlapped each direction carries
/// `out + in`, so `max - min` of a phase's `max` hides: `1 - min/max`.
pub fn colocated_room(servers: u32, workers: u32) -> f64 {
    let (s, n) = (f64::from(servers.max(1)), f64::from(workers.max(1)));
    let (out, into) = (1.0 - 1.0 / s, (n - 1.0) / s);
    let busier = out.max(into);
    if busier <= 0.0 {
        return 0.0;
    }
    1.0 - out.min(into) / busier
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(servers: u32, placement: Placement) -> Setup {
        Setup {
            servers,
            placement,
            partition_bytes: 4 << 20,
            wire_bytes: 4,
            pipeline: false,
            backward_segments: 1,
            requests_per_server: 1,
        }
    }

    fn constants() -> Constants {
        Constants {
            request_seconds: 100e-6,
            worker_bytes_per_sec: 1e9,
            apply_bytes_per_sec: 2e9,
            link_efficiency: 1.0,
            server_bytes_per_sec: 1e9,
            sources: Vec::new(),
        }
    }

    fn cluster(workers: u32) -> Cluster {
        Cluster {
            workers,
            worker_link: 125e6,
            server_link: 125e6,
            rtt: 0.0,
            compute: 0.1,
            cores: 2,
        }
    }

    #[test]
    fn a_dedicated_setup_adds_up_as_worked_by_hand() {
        // 2 workers, 2 dedicated servers at 1 Gbit/s, a 100 MB model of 25
        // tensors of 4 MB.
        let tensors = vec![4_000_000u64; 25];
        let terms = predict(
            &setup(2, Placement::Dedicated),
            &tensors,
            &cluster(2),
            &constants(),
        );
        // The planner cuts each tensor in two (a multiple of the servers, under
        // the 4 MiB cap): 50 parts of 2 MB, 25 per server, evenly.
        assert_eq!(balance(&tensors, 4 << 20, 2), (50, 1.0));
        // A worker's link: 100 MB; a server's: 2 workers x 50 MB = 100 MB.
        assert!((terms.busiest_link_bytes - 100e6).abs() < 1.0);
        // push = 100 MB / 125 MB/s + 100 MB / 1 GB/s + RTT 0 = 0.8 + 0.1.
        assert!((terms.push - 0.9).abs() < 1e-9);
        assert!((terms.pull - 0.9).abs() < 1e-9);
        // apply = 2 workers x 50 MB / 2 GB/s = 0.05.
        assert!((terms.apply - 0.05).abs() < 1e-9);
        // requests = 2 x 2 servers x 100 us.
        assert!((terms.requests - 0.0004).abs() < 1e-12);
        let step = 0.1 + 0.9 + 0.9 + 0.05 + 0.0004;
        assert!((terms.step - step).abs() < 1e-9, "{terms:?}");
    }

    /// BytePS's figure: with servers beside every worker, a host sends
    /// 2 W (N - 1) / N a step, W (N - 1) / N in the push and as much in the
    /// pull.
    #[test]
    fn colocated_servers_send_two_n_minus_one_over_n_a_step() {
        let tensors = vec![1_000_000u64; 40]; // 40 MB in 1 MB parts
        let terms = predict(
            &setup(4, Placement::Colocated),
            &tensors,
            &cluster(4),
            &constants(),
        );
        assert!((terms.imbalance - 1.0).abs() < 1e-12);
        assert!((terms.busiest_link_bytes - 40e6 * 3.0 / 4.0).abs() < 1.0);
        assert_eq!(terms.overlap, 0.0, "every host carries as much: no slack");
        // One server beside one of two workers: its host receives the other
        // worker's whole W in the push, the other host sends it.
        let one = predict(
            &setup(1, Placement::Colocated),
            &tensors,
            &cluster(2),
            &constants(),
        );
        assert!((one.busiest_link_bytes - 40e6).abs() < 1.0);
    }

    #[test]
    fn a_server_slower_than_its_link_binds_the_push_and_pull() {
        // 100 MB, 4 workers, 1 server on a 100 GB/s link: the link takes
        // 4 ms for the server's 400 MB, its CPU at 1 GB/s 400 ms.
        let tensors = vec![4_000_000u64; 25];
        let mut fast = cluster(4);
        (fast.worker_link, fast.server_link) = (100e9, 100e9);
        let terms = predict(
            &setup(1, Placement::Dedicated),
            &tensors,
            &fast,
            &constants(),
        );
        // The server's 0.4 s, then the worker's own 100 MB at 1 GB/s.
        assert!((terms.push - (0.4 + 0.1)).abs() < 1e-9, "{terms:?}");
        assert_eq!(terms.push, terms.pull);
        // On 16 cores the server serves the four workers' connections on
        // four of its eight threads: 0.1 s.
        fast.cores = 16;
        let wide = predict(
            &setup(1, Placement::Dedicated),
            &tensors,
            &fast,
            &constants(),
        );
        assert!((wide.push - (0.1 + 0.1)).abs() < 1e-9, "{wide:?}");
        assert_eq!(server_threads(16), 8);
        assert_eq!(server_threads(1), 1);
    }

    #[test]
    fn beside_every_worker_pipelining_hides_nothing_and_beside_fewer_what_a_direction_leaves() {
        assert_eq!(colocated_room(2, 2), 0.0);
        assert_eq!(colocated_room(4, 4), 0.0);
        // One server beside one of two workers: its host receives W in the
        // push and sends W in the pull, so the two can overlap whole.
        assert!((colocated_room(1, 2) - 1.0).abs() < 1e-12);
        // Two servers beside four workers: a host sends 1/2 and receives
        // 3/2 a phase; overlapped each way carries 2 against 3 for the two
        // phases apart, a third of the step's 3, two thirds of a phase.
        assert!((colocated_room(2, 4) - 2.0 / 3.0).abs() < 1e-12);
        let tensors = vec![1u64 << 20; 8];
        let mut pipelined = setup(2, Placement::Colocated);
        pipelined.pipeline = true;
        let terms = predict(&pipelined, &tensors, &cluster(2), &constants());
        assert_eq!(terms.overlap, 0.0, "{terms:?}");
    }

    #[test]
    fn pipelining_hides_what_other_servers_can_carry_on_with() {
        // 4 MiB in four whole 1 MiB tensors, two servers, one worker: four
        // 1 MiB groups; (1 - 1/2) x (1 - 1/4) of the pull hides.
        let tensors = vec![1u64 << 20; 4];
        let mut pipelined = setup(2, Placement::Dedicated);
        pipelined.pipeline = true;
        let plain = predict(
            &setup(2, Placement::Dedicated),
            &tensors,
            &cluster(1),
            &constants(),
        );
        let terms = predict(&pipelined, &tensors, &cluster(1), &constants());
        assert_eq!(groups_per_step(&pipelined, 4.0 * 1048576.0, 8), 4);
        assert_eq!(plain.overlap, 0.0);
        assert!(
            (terms.overlap + plain.pull * 0.375).abs() < 1e-9,
            "{terms:?}"
        );
        // Requests: a push and a pull per group, 8 instead of 2 x 2 servers.
        assert!((terms.requests - 8.0 * 100e-6).abs() < 1e-12);
        // One server: nothing hides.
        let mut one = pipelined.clone();
        one.servers = 1;
        assert_eq!(
            predict(&one, &tensors, &cluster(1), &constants()).overlap,
            0.0
        );
        // Groups are at least one per server and at most one per part.
        let mut three = pipelined.clone();
        three.servers = 3;
        assert_eq!(groups_per_step(&three, 1000.0, 10), 3);
        assert_eq!(groups_per_step(&three, 100.0 * 1048576.0, 10), 10);
    }

    #[test]
    fn a_server_link_busier_than_the_workers_hides_by_staggering() {
        // One server for two workers: its link carries 2 W, each worker's W,
        // so half the server link's time a worker's own link is free, and
        // half the pull hides even without pipelining.
        let tensors = vec![1u64 << 20; 4];
        let terms = predict(
            &setup(1, Placement::Dedicated),
            &tensors,
            &cluster(2),
            &constants(),
        );
        assert!((terms.busiest_link_bytes - 2.0 * 4.0 * 1048576.0).abs() < 1.0);
        assert!((terms.overlap + 0.5 * terms.pull).abs() < 1e-9, "{terms:?}");
        // Two servers for two workers: every link carries W, nothing hides.
        let even = predict(
            &setup(2, Placement::Dedicated),
            &tensors,
            &cluster(2),
            &constants(),
        );
        assert_eq!(even.overlap, 0.0);
    }

    #[test]
    fn more_requests_per_server_hide_the_apply_behind_the_link_and_cost_requests() {
        // The hand-worked dedicated case (2 workers, 2 servers, 100 MB in
        // 50 parts of 2 MB): apply 0.05 s, the push's link 0.8 s.
        let tensors = vec![4_000_000u64; 25];
        let mut four = setup(2, Placement::Dedicated);
        four.requests_per_server = 4;
        let terms = predict(&four, &tensors, &cluster(2), &constants());
        // Four requests a server: three quarters of the apply hide.
        assert!((terms.apply - 0.05 / 4.0).abs() < 1e-9, "{terms:?}");
        // A push and a pull of 4 requests to each of 2 servers.
        assert!((terms.requests - 16.0 * 100e-6).abs() < 1e-12);
        // No more requests than a server's MiBs of wire bytes (and one for
        // the rest), or its parts.
        assert_eq!(requests_cut_per_server(&four, 2.5 * 1048576.0, 50), 3);
        assert_eq!(requests_cut_per_server(&four, 50e6, 6), 3);
        // Pipelined, a server's groups arrive in pieces the same way: 100 MB
        // in 1 MiB groups (96, capped by the 50 parts), 25 a server.
        let mut pipelined = four.clone();
        pipelined.pipeline = true;
        let piped = predict(&pipelined, &tensors, &cluster(2), &constants());
        assert!((piped.apply - 0.05 / 25.0).abs() < 1e-9, "{piped:?}");
        // A link faster than the apply hides only the link's time of it.
        let mut fast = cluster(2);
        (fast.worker_link, fast.server_link) = (100e9, 100e9);
        let quick = predict(&four, &tensors, &fast, &constants());
        // The link takes 1 ms, the server's CPU 100 MB at 1 GB/s: 0.1 s,
        // more than the apply, so three quarters of it still hide.
        assert!((quick.apply - 0.05 / 4.0).abs() < 1e-9, "{quick:?}");
        let mut fast_cpu = constants();
        fast_cpu.server_bytes_per_sec = 1e12;
        let bound = predict(&four, &tensors, &fast, &fast_cpu);
        // Now the link's 1 ms (100 MB / 100 GB/s) is all that hides: 3/4 of it.
        assert!(
            (bound.apply - (0.05 - 0.001 * 0.75)).abs() < 1e-9,
            "{bound:?}"
        );
    }

    #[test]
    fn old_plan_files_take_the_clients_requests_per_server() {
        let mut json = serde_json::to_value(setup(1, Placement::Dedicated)).unwrap();
        json.as_object_mut().unwrap().remove("requests_per_server");
        let read: Setup = serde_json::from_value(json).unwrap();
        assert_eq!(read.requests_per_server, CLIENT_REQUESTS_PER_SERVER);
    }

    #[test]
    fn the_balance_is_the_system_planners() {
        // One 64 MiB tensor over 3 servers, parts of at most 4 MiB: a
        // multiple of 3 parts (18), even to a part.
        let (parts, imbalance) = balance(&[64 << 20], 4 << 20, 3);
        assert_eq!(parts, 18);
        assert!(imbalance < 1.001, "{imbalance}");
        // Two whole tensors of 3 and 1 bytes' worth on one server: 1.0.
        assert_eq!(balance(&[12, 4], 1 << 20, 1), (2, 1.0));
    }
}
