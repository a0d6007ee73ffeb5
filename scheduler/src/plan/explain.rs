//! A [`Plan`] as text: the candidates' table, and with `--explain` the
//! formulas and every constant with where it came from.

use std::fmt::Write;

use ps_common::size::{format_rate, format_size};

use super::cost::{BACKWARD_SHARE, PIPELINE_GROUP_BYTES, Terms};
use super::{Candidate, Placement, Plan, Setup};

/// The setup in a few words: `2 servers beside workers, 4 MiB parts, f32,
/// pipelined, 4 backward segments`, or `..., push then pull, 4 requests per
/// server`.
pub fn describe(setup: &Setup) -> String {
    let servers = match (setup.servers, setup.placement) {
        (1, Placement::Colocated) => "1 server beside a worker".to_string(),
        (n, Placement::Colocated) => format!("{n} servers beside workers"),
        (1, Placement::Dedicated) => "1 server on its own host".to_string(),
        (n, Placement::Dedicated) => format!("{n} servers on their own hosts"),
    };
    let wire = if setup.wire_bytes == 2 { "bf16" } else { "f32" };
    let pipeline = match (setup.pipeline, setup.requests_per_server) {
        (true, _) => "pipelined".to_string(),
        (false, 1) => "push then pull, 1 request per server".to_string(),
        (false, n) => format!("push then pull, {n} requests per server"),
    };
    let segments = match setup.backward_segments {
        1 => String::new(),
        n => format!(", {n} backward segments"),
    };
    format!(
        "{servers}, {} parts, {wire}, {pipeline}{segments}",
        format_size(setup.partition_bytes as usize)
    )
}

fn ms(seconds: f64) -> String {
    format!("{:.1}", seconds * 1e3)
}

/// The step's terms, in the order the table and the explanation show them:
/// the step, then what it sums.
const TERM_NAMES: [&str; 7] = [
    "step", "compute", "push", "pull", "apply", "requests", "overlap",
];

/// `terms` in milliseconds, in [`TERM_NAMES`]' order.
fn term_ms(t: &Terms) -> [String; 7] {
    [
        t.step, t.compute, t.push, t.pull, t.apply, t.requests, t.overlap,
    ]
    .map(ms)
}

/// The table of the `top` fastest candidates (and the chosen one), each
/// term in milliseconds.
pub fn table(plan: &Plan, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} ({} parameters, {}) on {} worker(s), {} links, {} ms of compute per step\n",
        plan.model,
        plan.parameters,
        format_size(plan.parameters as usize * 4),
        plan.cluster.workers,
        format_rate(plan.cluster.worker_link),
        ms(plan.cluster.compute)
    );
    let header: String = TERM_NAMES
        .iter()
        .map(|name| match *name {
            "step" => format!(" {:>8}", "step ms"),
            name => format!(" {name:>8}"),
        })
        .collect();
    let _ = writeln!(out, "{:>4}{header}  setup", "#");
    let shown = plan
        .candidates
        .iter()
        .enumerate()
        .filter(|(i, c)| *i < top || c.setup == plan.chosen);
    for (i, candidate) in shown {
        let _ = writeln!(out, "{}", row(i + 1, candidate, &plan.chosen));
    }
    let _ = writeln!(
        out,
        "\nchosen: {}; consistency {}",
        describe(&plan.chosen),
        plan.consistency
    );
    if plan.chosen.wire_bytes == 2 {
        let _ = writeln!(
            out,
            "bf16 on the wire halves the bytes but rounds every gradient and value to 8 bits of mantissa: check the accuracy you reach against f32 once"
        );
    }
    out
}

fn row(rank: usize, candidate: &Candidate, chosen: &Setup) -> String {
    let t = &candidate.terms;
    let mark = if &candidate.setup == chosen { "*" } else { " " };
    let ruled = candidate
        .ruled_out
        .as_ref()
        .map(|why| format!(" [ruled out: {why}]"))
        .unwrap_or_default();
    let terms: String = term_ms(t).iter().map(|v| format!(" {v:>8}")).collect();
    format!(
        "{mark}{rank:>3}{terms}  {}{ruled}",
        describe(&candidate.setup)
    )
}

/// The formulas, the constants with their sources, and the chosen setup's
/// terms worked out.
pub fn explanation(plan: &Plan) -> String {
    let c = &plan.constants;
    let mut out = String::new();
    let group = format_size(PIPELINE_GROUP_BYTES as usize);
    let _ = writeln!(
        out,
        "The model (scheduler/src/plan/cost.rs), per step and worker:
  W        = model bytes x wire bytes / 4                 (each way)
  link     = busiest link's bytes / (its rate x efficiency)
             a dedicated server's link carries N x W / S x imbalance,
             a worker's W; beside workers, a host with a server carries
             max(W - share, (N - 1) x share) each way (2 W (N-1)/N a step
             when S = N)
  server   = N x W / S x imbalance / (server rate x threads)  (the busiest
             server's CPU for its share of every push, and again of every
             pull; threads = min(N, half the host's cores))
  push     = max(link, server) + W / worker rate + RTT
  pull     = max(link, server) + W / worker rate + RTT
  R        = requests per server when not pipelined: the setup's, at most
             (W / S) / {group} (rounded up) and a server's parts
  groups G = S x R, or when pipelined W / {group} (at least S, at most the parts)
  apply    = N x (model bytes / S) x imbalance / apply rate
             - min(that, max(link, server)) x (1 - S/G)   (a server applies
             each request or group while the next is on the wire)
  requests = 2 x G x request CPU
  slack    = 1 - (a worker's own link time / the busiest link's time)
  overlap  = -min(pull, push + apply) x max(slack, pipelined: (1 - 1/S) x (1 - 1/G))
             (beside workers, pipelined at most the room a host's two
             directions leave: 1 - min(out, in) / max(out, in), with
             out = 1 - 1/S and in = (N - 1)/S; none when S = N)
             -(segmented in k: min(push, compute x {BACKWARD_SHARE:.2} x (k - 1) / k))
  step     = compute + push + pull + apply + requests + overlap
  imbalance: the busiest server's load over an even share, as the system's
             own planner places the parts (ps_proto::placement::plan).
Rules: a server's memory (values, accumulator, snapshot, optimizer state)
within --server-memory; servers on their own hosts have at least as much
link in all as the workers.
Requests per server: 1, 2, 4 or 8 when not pipelined (more hide more of
the apply, each costs request CPU); a pipelined step cuts by group bytes and
leaves the client's 4.

Constants:"
    );
    let values = [
        ("request CPU", format!("{:.0} us", c.request_seconds * 1e6)),
        ("worker rate", format_rate(c.worker_bytes_per_sec)),
        ("apply rate", format_rate(c.apply_bytes_per_sec)),
        ("link efficiency", format!("{:.2}", c.link_efficiency)),
        ("server rate", format_rate(c.server_bytes_per_sec)),
    ];
    for (i, (name, value)) in values.iter().enumerate() {
        let source = c.sources.get(i).map_or("given", String::as_str);
        let _ = writeln!(out, "  {name:<16} {value:<12} {source}");
    }
    let cl = &plan.cluster;
    let _ = writeln!(
        out,
        "  RTT              {:.0} us\n  compute          {} ms\n  worker link      {}\n  server link      {}\n  cores            {} a host",
        cl.rtt * 1e6,
        ms(cl.compute),
        format_rate(cl.worker_link),
        format_rate(cl.server_link),
        cl.cores
    );
    for line in &plan.measured {
        let _ = writeln!(out, "  measured: {line}");
    }
    if let Some(chosen) = plan.candidates.iter().find(|c| c.setup == plan.chosen) {
        let t = &chosen.terms;
        let values = term_ms(t);
        let sum: Vec<String> = TERM_NAMES[1..]
            .iter()
            .zip(&values[1..])
            .map(|(name, value)| format!("{name} {value}"))
            .collect();
        let _ = writeln!(
            out,
            "\nThe chosen setup, {}:\n  busiest link {} each way, imbalance {:.3}, server memory {}\n  step {} ms = {}",
            describe(&chosen.setup),
            format_size(t.busiest_link_bytes as usize),
            t.imbalance,
            format_size(chosen.server_memory as usize),
            values[0],
            sum.join(" + ")
        );
    }
    out
}
