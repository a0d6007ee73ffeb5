//! The planner of `ps_proto::placement` next to the planners of other parameter
//! servers, on real models: [`round_robin`] (whole tensors in turn, as
//! TensorFlow's parameter-server strategy does) and [`hashed_chunks`] (4 MB chunks
//! placed by a hash of their name, as BytePS does), and the report that compares
//! them (printed by its test, quoted in docs/placement.md).

use std::hash::{DefaultHasher, Hash, Hasher};

use ps_common::fixtures;
use ps_proto::placement::{Assignment, MAX_PART_BYTES, Param, imbalance, plan};

/// A fixture model's parameters as `f32` tensors.
fn fixture(model: &str) -> Vec<Param> {
    fixtures::by_name(model)
        .expect("known fixture")
        .into_iter()
        .map(|(name, shape)| Param {
            name,
            elements: shape.iter().product(),
            elem_size: 4,
        })
        .collect()
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
        let params = fixture(model);
        for servers in [2, 3, 4, 8] {
            let planned = plan(&params, servers, MAX_PART_BYTES);
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
mod tests {
    use super::*;
    use ps_proto::placement::loads;

    #[test]
    fn planner_beats_round_robin_and_hashing_within_5_percent_of_perfect() {
        for model in ["resnet50", "bert-base"] {
            let params = fixture(model);
            for servers in [2, 3, 4, 8] {
                let ours = plan(&params, servers, MAX_PART_BYTES);
                let covered: usize = ours.iter().map(|a| a.len).sum();
                assert_eq!(covered, params.iter().map(|p| p.elements).sum::<usize>());
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
        let assignments = plan(&params, 4, MAX_PART_BYTES);
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
        assert_eq!(loads(&params, &assignments, 4).len(), 4);
    }

    #[test]
    fn plans_are_deterministic() {
        let params = fixture("resnet50");
        assert_eq!(
            plan(&params, 3, MAX_PART_BYTES),
            plan(&params, 3, MAX_PART_BYTES)
        );
    }

    #[test]
    fn report_covers_both_models_and_four_server_counts() {
        let table = report_markdown();
        println!("{table}");
        assert_eq!(table.lines().count(), 2 + 8);
    }
}
