//! Placement: which server owns which contiguous part of which parameter.
//!
//! [`plan`] keeps tensors up to a threshold whole and cuts larger ones into
//! near-equal contiguous parts of at most that size, then gives the pieces, largest
//! first, each to the server holding the fewest bytes (LPT). LPT never leaves a
//! server more than one piece above the mean, so with the threshold at most 1/40 of
//! the mean load the heaviest server carries at most 1.025x the mean. The threshold
//! is also capped at 4 MiB, so no part is larger than a comfortable message.
//!
//! [`round_robin`] (whole tensors in turn, as TensorFlow's parameter-server strategy
//! does) and [`hashed_chunks`] (4 MB chunks placed by a hash of their name, as
//! BytePS does) are here to be compared against.

use std::hash::{DefaultHasher, Hash, Hasher};

/// A parameter to place.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Param {
    /// Name.
    pub name: String,
    /// Number of elements.
    pub elements: usize,
    /// Bytes per element.
    pub elem_size: usize,
}

impl Param {
    fn bytes(&self) -> usize {
        self.elements * self.elem_size
    }
}

/// One contiguous element range of a parameter, owned by one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    /// Index of the parameter in the input.
    pub param: usize,
    /// Partition index.
    pub part: u32,
    /// First element.
    pub start: usize,
    /// Elements.
    pub len: usize,
    /// Index of the owning server.
    pub server: usize,
}

/// Largest part the planner makes, whatever the model.
pub const MAX_PART_BYTES: usize = 4 << 20;
/// Smallest split threshold: tensors this small are never split.
pub const MIN_PART_BYTES: usize = 64 << 10;
/// The threshold is at most mean load / this.
const PIECES_PER_SERVER: usize = 40;

/// Bytes per server of `assignments`.
pub fn loads(params: &[Param], assignments: &[Assignment], servers: usize) -> Vec<usize> {
    let mut load = vec![0; servers];
    for a in assignments {
        load[a.server] += a.len * params[a.param].elem_size;
    }
    load
}

/// Max load over mean load (1.0 is perfect balance).
pub fn imbalance(params: &[Param], assignments: &[Assignment], servers: usize) -> f64 {
    let load = loads(params, assignments, servers);
    let mean = load.iter().sum::<usize>() as f64 / servers.max(1) as f64;
    *load.iter().max().unwrap_or(&0) as f64 / mean.max(1.0)
}

/// The split threshold for `total` bytes over `servers` servers.
pub fn part_bytes(total: usize, servers: usize) -> usize {
    (total / (servers.max(1) * PIECES_PER_SERVER)).clamp(MIN_PART_BYTES, MAX_PART_BYTES)
}

/// Places `params` over `servers` servers: balanced bytes, small tensors whole.
/// Deterministic: the same input gives the same plan.
pub fn plan(params: &[Param], servers: usize) -> Vec<Assignment> {
    let servers = servers.max(1);
    let total: usize = params.iter().map(Param::bytes).sum();
    let threshold = part_bytes(total, servers);
    let mut pieces: Vec<Assignment> = Vec::new();
    for (index, param) in params.iter().enumerate() {
        let parts = if param.bytes() <= threshold {
            1
        } else {
            param.bytes().div_ceil(threshold).min(param.elements)
        };
        for part in 0..parts.max(1) {
            let start = param.elements * part / parts.max(1);
            let end = param.elements * (part + 1) / parts.max(1);
            pieces.push(Assignment {
                param: index,
                part: part as u32,
                start,
                len: end - start,
                server: 0,
            });
        }
    }
    let size = |a: &Assignment| a.len * params[a.param].elem_size;
    pieces.sort_by(|a, b| {
        size(b)
            .cmp(&size(a))
            .then_with(|| (&params[a.param].name, a.part).cmp(&(&params[b.param].name, b.part)))
    });
    let mut load = vec![0usize; servers];
    for piece in &mut pieces {
        let server = (0..servers).min_by_key(|&s| (load[s], s)).unwrap_or(0);
        piece.server = server;
        load[server] += size(piece);
    }
    pieces.sort_by_key(|a| (a.param, a.part));
    pieces
}

/// Whole tensors to servers in turn (TensorFlow's default).
pub fn round_robin(params: &[Param], servers: usize) -> Vec<Assignment> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| Assignment {
            param: i,
            part: 0,
            start: 0,
            len: p.elements,
            server: i % servers.max(1),
        })
        .collect()
}

/// 4 MB chunks placed by a hash of `(name, chunk)` (BytePS's default).
pub fn hashed_chunks(params: &[Param], servers: usize) -> Vec<Assignment> {
    const CHUNK_BYTES: usize = 4_000_000;
    let mut out = Vec::new();
    for (i, p) in params.iter().enumerate() {
        let per_chunk = (CHUNK_BYTES / p.elem_size).max(1);
        let chunks = p.elements.div_ceil(per_chunk).max(1);
        for c in 0..chunks {
            let mut hasher = DefaultHasher::new();
            (&p.name, c).hash(&mut hasher);
            let start = c * per_chunk;
            let len = per_chunk.min(p.elements - start.min(p.elements));
            out.push(Assignment {
                param: i,
                part: c as u32,
                start,
                len,
                server: (hasher.finish() % servers.max(1) as u64) as usize,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::fixtures;

    fn fixture(name: &str) -> Vec<Param> {
        fixtures::by_name(name)
            .unwrap()
            .into_iter()
            .map(|(name, shape)| Param {
                name,
                elements: shape.iter().product(),
                elem_size: 4,
            })
            .collect()
    }

    fn covers_every_element_once(params: &[Param], assignments: &[Assignment]) {
        for (i, p) in params.iter().enumerate() {
            let mut parts: Vec<&Assignment> = assignments.iter().filter(|a| a.param == i).collect();
            parts.sort_by_key(|a| a.part);
            let mut next = 0;
            for (k, a) in parts.iter().enumerate() {
                assert_eq!(
                    (a.part as usize, a.start),
                    (k, next),
                    "{} parts are contiguous and numbered",
                    p.name
                );
                next += a.len;
            }
            assert_eq!(next, p.elements, "{} is fully covered", p.name);
        }
    }

    #[test]
    fn planner_beats_round_robin_and_hashing_within_5_percent_of_perfect() {
        for model in ["resnet50", "bert-base"] {
            let params = fixture(model);
            for servers in [2, 3, 4, 8] {
                let ours = plan(&params, servers);
                covers_every_element_once(&params, &ours);
                let mine = imbalance(&params, &ours, servers);
                let rr = imbalance(&params, &round_robin(&params, servers), servers);
                let hashed = imbalance(&params, &hashed_chunks(&params, servers), servers);
                assert!(mine <= 1.05, "{model} over {servers}: {mine:.3}");
                assert!(
                    mine <= rr && mine <= hashed,
                    "{model} over {servers}: ours {mine:.3}, round-robin {rr:.3}, hashed {hashed:.3}"
                );
            }
        }
    }

    #[test]
    fn small_tensors_stay_whole_and_parts_stay_under_4_mib() {
        let params = fixture("bert-base");
        let assignments = plan(&params, 4);
        for a in &assignments {
            assert!(
                a.len * 4 <= MAX_PART_BYTES,
                "a part of {} is {} bytes",
                params[a.param].name,
                a.len * 4
            );
        }
        let bias = params
            .iter()
            .position(|p| p.name == "pooler.dense.bias")
            .unwrap();
        assert_eq!(assignments.iter().filter(|a| a.param == bias).count(), 1);
    }

    #[test]
    fn table_of_small_cases() {
        let p = |name: &str, elements| Param {
            name: name.into(),
            elements,
            elem_size: 4,
        };
        // (params, servers) -> loads
        let cases: Vec<(Vec<Param>, usize, Vec<usize>)> = vec![
            (vec![p("a", 10)], 1, vec![40]),
            (vec![p("a", 10), p("b", 10)], 2, vec![40, 40]),
            (vec![p("a", 30), p("b", 10), p("c", 20)], 2, vec![120, 120]),
            (vec![p("big", 1 << 20)], 4, vec![1 << 20; 4]),
            (vec![], 3, vec![0, 0, 0]),
        ];
        for (params, servers, expected) in cases {
            let assignments = plan(&params, servers);
            covers_every_element_once(&params, &assignments);
            let mut load = loads(&params, &assignments, servers);
            load.sort_unstable();
            assert_eq!(load, expected, "{params:?} over {servers}");
        }
    }

    #[test]
    fn plans_are_deterministic() {
        let params = fixture("resnet50");
        assert_eq!(plan(&params, 3), plan(&params, 3));
    }
}

/// One line of the placement report: max/mean bytes per server for each planner.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportLine {
    /// Model fixture.
    pub model: String,
    /// Servers.
    pub servers: usize,
    /// This planner.
    pub planned: f64,
    /// Round-robin of whole tensors.
    pub round_robin: f64,
    /// Hash of 4 MB chunks.
    pub hashed_chunks: f64,
    /// Parts this planner made.
    pub parts: usize,
}

/// The placement report over the ResNet-50 and BERT-base fixtures and 2, 3, 4, 8 servers.
pub fn report() -> Vec<ReportLine> {
    let mut lines = Vec::new();
    for model in ["resnet50", "bert-base"] {
        let params: Vec<Param> = ps_proto::fixtures::by_name(model)
            .expect("known fixture")
            .into_iter()
            .map(|(name, shape)| Param {
                name,
                elements: shape.iter().product(),
                elem_size: 4,
            })
            .collect();
        for servers in [2, 3, 4, 8] {
            let planned = plan(&params, servers);
            lines.push(ReportLine {
                model: model.to_string(),
                servers,
                planned: imbalance(&params, &planned, servers),
                round_robin: imbalance(&params, &round_robin(&params, servers), servers),
                hashed_chunks: imbalance(&params, &hashed_chunks(&params, servers), servers),
                parts: planned.len(),
            });
        }
    }
    lines
}

/// The report as a Markdown table.
pub fn report_markdown() -> String {
    let mut out = String::from(
        "| model | servers | candle-ps | round-robin (TF) | hash of 4 MB chunks (BytePS) | parts |\n|---|---|---|---|---|---|\n",
    );
    for l in report() {
        out.push_str(&format!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {} |\n",
            l.model, l.servers, l.planned, l.round_robin, l.hashed_chunks, l.parts
        ));
    }
    out
}

#[cfg(test)]
mod report_tests {
    #[test]
    fn report_covers_both_models_and_four_server_counts() {
        let table = super::report_markdown();
        println!("{table}");
        assert_eq!(table.lines().count(), 2 + 8);
    }
}
