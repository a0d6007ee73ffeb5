//! The one placement planner: which server owns which contiguous part of which
//! parameter. The scheduler plans its shard maps with it, and a worker without a
//! scheduler plans with it too, so both place a model the same way.
//!
//! [`plan`] keeps tensors up to a threshold (1/40 of a server's mean load) whole
//! and cuts larger ones into near-equal contiguous parts, then gives the pieces,
//! largest first, each to the server holding the fewest bytes (LPT). A tensor is
//! cut into the fewer of two counts: parts of at most the threshold, or a
//! multiple of the server count with parts of at most [`MAX_PART_BYTES`] (or a
//! caller's smaller cap). The second is what a large tensor among few gets:
//! one equal share per server instead of dozens of threshold-sized parts, each
//! a request of its own on every step (a lone 16 MiB key over two servers was
//! 81 parts, now 4). LPT never leaves a server more than one piece above the
//! mean; on ResNet-50 and BERT-base over 2-8 servers the heaviest server holds
//! at most 1.011x the mean (docs/placement.md). No part is larger than the cap,
//! a comfortable message. With one server every tensor stays whole: splitting
//! would only add keys.
//!
//! The scheduler's `placement` module compares it with the planners of other
//! parameter servers on real models.

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
/// Largest part of a plan by default: a part is what a pipelined step pushes
/// and then pulls as one, so the smaller it is, the sooner the pulls start on
/// a link-bound step (1 MiB against 4 MiB took the pipelined step's
/// communication from 0.81 to 0.61 of the serial step's in the emulated
/// cluster, docs/benchmarks.md); a push or pull still groups a server's parts
/// into a few requests of similar size. The scheduler cuts up to
/// [`MAX_PART_BYTES`] instead when parts this small would make a shard map
/// too large for one message.
pub const DEFAULT_PART_BYTES: usize = 1 << 20;
/// Smallest split threshold: tensors this small are never split.
pub const MIN_PART_BYTES: usize = 64 << 10;

/// `bytes` as a largest part a user asks for (`--partition-bytes`): from
/// [`MIN_PART_BYTES`] to [`MAX_PART_BYTES`].
///
/// # Errors
/// A message naming the range, for a size outside it.
pub fn check_partition_bytes(bytes: usize) -> Result<usize, String> {
    if (MIN_PART_BYTES..=MAX_PART_BYTES).contains(&bytes) {
        Ok(bytes)
    } else {
        Err(format!(
            "a partition of {bytes} bytes is outside {}..={} bytes (64KiB to 4MiB): smaller parts \
             would each be a request of their own, larger ones an oversized message",
            MIN_PART_BYTES, MAX_PART_BYTES
        ))
    }
}

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

/// The split threshold for `total` bytes over `servers` servers, with parts of
/// at most `max_part_bytes` (a cap below [`MIN_PART_BYTES`] wins over it).
pub fn part_bytes(total: usize, servers: usize, max_part_bytes: usize) -> usize {
    (total / (servers.max(1) * PIECES_PER_SERVER))
        .max(MIN_PART_BYTES)
        .min(max_part_bytes.max(1))
}

/// Places `params` over `servers` servers: balanced bytes, small tensors whole,
/// no part above `max_part_bytes` ([`MAX_PART_BYTES`] unless a caller needs
/// smaller parts). Deterministic: the same input gives the same plan.
pub fn plan(params: &[Param], servers: usize, max_part_bytes: usize) -> Vec<Assignment> {
    plan_cut_for(params, servers, servers, max_part_bytes)
}

/// How many parts a plan over `servers` servers cuts each parameter into,
/// counted without planning (what a map of them will weigh).
pub fn part_counts(params: &[Param], servers: usize, max_part_bytes: usize) -> Vec<usize> {
    let threshold = threshold_for(params, servers, max_part_bytes);
    params
        .iter()
        .map(|param| parts_of(param, servers.max(1), threshold, max_part_bytes))
        .collect()
}

fn threshold_for(params: &[Param], servers: usize, max_part_bytes: usize) -> usize {
    let total: usize = params.iter().map(Param::bytes).sum();
    part_bytes(total, servers.max(1), max_part_bytes)
}

/// The parts of `param` over `servers` servers with split threshold
/// `threshold` and parts of at most `max_part_bytes`: a parameter above the
/// threshold is cut into equal parts, as few as fit the cap, in a multiple of
/// the server count, so that every server can take the same share of it.
fn parts_of(param: &Param, servers: usize, threshold: usize, max_part_bytes: usize) -> usize {
    if servers == 1 || param.bytes() <= threshold {
        return 1;
    }
    let by_threshold = param.bytes().div_ceil(threshold);
    let per_server = param.bytes().div_ceil(servers * max_part_bytes.max(1));
    by_threshold
        .min(servers * per_server)
        .min(param.elements)
        .max(1)
}

/// [`plan`] over `servers` servers, with parts cut as [`plan`] cuts them for
/// `cut_for` servers (at most `servers`): coarser parts, fewer of them, when
/// a plan as fine as `servers` calls for would make too large a map.
pub fn plan_cut_for(
    params: &[Param],
    servers: usize,
    cut_for: usize,
    max_part_bytes: usize,
) -> Vec<Assignment> {
    let servers = servers.max(1);
    let cut_for = cut_for.clamp(1, servers);
    let threshold = threshold_for(params, cut_for, max_part_bytes);
    let mut pieces: Vec<Assignment> = Vec::new();
    for (index, param) in params.iter().enumerate() {
        let parts = parts_of(param, cut_for, threshold, max_part_bytes);
        for part in 0..parts {
            let start = param.elements * part / parts;
            let end = param.elements * (part + 1) / parts;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, elements: usize) -> Param {
        Param {
            name: name.into(),
            elements,
            elem_size: 4,
        }
    }

    /// Checks that every parameter's parts are numbered in order and cover it once.
    pub(crate) fn covers_every_element_once(params: &[Param], assignments: &[Assignment]) {
        for (i, param) in params.iter().enumerate() {
            let mut parts: Vec<&Assignment> = assignments.iter().filter(|a| a.param == i).collect();
            parts.sort_by_key(|a| a.part);
            let mut next = 0;
            for (k, a) in parts.iter().enumerate() {
                assert_eq!(
                    (a.part as usize, a.start),
                    (k, next),
                    "{} parts are contiguous and numbered",
                    param.name
                );
                next += a.len;
            }
            assert_eq!(next, param.elements, "{} is fully covered", param.name);
        }
    }

    #[test]
    fn a_large_tensor_is_cut_into_equal_shares_per_server_up_to_the_cap() {
        let big = [p("big", 4 << 20)]; // 16 MiB of f32
        for (servers, cap, parts) in [
            (2, DEFAULT_PART_BYTES, 16),
            (2, MAX_PART_BYTES, 4),
            (2, 8 << 20, 2),
            (3, DEFAULT_PART_BYTES, 18),
            (3, MAX_PART_BYTES, 6),
        ] {
            let plan = plan(&big, servers, cap);
            covers_every_element_once(&big, &plan);
            assert_eq!(
                plan.len(),
                parts,
                "{servers} servers, parts of {cap} bytes at most"
            );
            assert!(plan.iter().all(|a| a.len * 4 <= cap), "{plan:?}");
            let load = loads(&big, &plan, servers);
            let (max, min) = (load.iter().max().unwrap(), load.iter().min().unwrap());
            assert!(
                max - min <= 4,
                "every server takes the same share: {load:?}"
            );
        }
    }

    #[test]
    fn table_of_small_cases() {
        // (params, servers) -> sorted loads
        let cases: Vec<(Vec<Param>, usize, Vec<usize>)> = vec![
            (vec![p("a", 10)], 1, vec![40]),
            (vec![p("a", 10), p("b", 10)], 2, vec![40, 40]),
            (vec![p("a", 30), p("b", 10), p("c", 20)], 2, vec![120, 120]),
            (vec![p("big", 1 << 20)], 4, vec![1 << 20; 4]),
            (
                (0..8).map(|i| p(&format!("p{i}"), 100)).collect(),
                2,
                vec![1600, 1600],
            ),
            (vec![], 3, vec![0, 0, 0]),
        ];
        for (params, servers, expected) in cases {
            let assignments = plan(&params, servers, MAX_PART_BYTES);
            covers_every_element_once(&params, &assignments);
            let mut load = loads(&params, &assignments, servers);
            load.sort_unstable();
            assert_eq!(load, expected, "{params:?} over {servers}");
        }
    }

    #[test]
    fn one_server_keeps_every_tensor_whole() {
        let params = [p("a", 10_000_000), p("b", 3)];
        let assignments = plan(&params, 1, 1024);
        assert_eq!(assignments.len(), 2);
        assert!(assignments.iter().all(|a| a.part == 0 && a.server == 0));
    }

    #[test]
    fn a_smaller_cap_makes_smaller_parts() {
        let params = [p("w", 1000), p("b", 10)];
        let assignments = plan(&params, 2, 1024);
        covers_every_element_once(&params, &assignments);
        assert!(
            assignments.iter().all(|a| a.len * 4 <= 1024),
            "{assignments:?}"
        );
        assert_eq!(assignments.iter().filter(|a| a.param == 0).count(), 4);
    }

    #[test]
    fn plans_do_not_depend_on_the_input_order() {
        let a = [p("x", 7_000_000), p("y", 100), p("z", 2_000_000)];
        let b = [a[2].clone(), a[0].clone(), a[1].clone()];
        let by_name = |params: &[Param], plan: Vec<Assignment>| {
            let mut named: Vec<_> = plan
                .into_iter()
                .map(|a| {
                    (
                        params[a.param].name.clone(),
                        a.part,
                        a.start,
                        a.len,
                        a.server,
                    )
                })
                .collect();
            named.sort();
            named
        };
        assert_eq!(
            by_name(&a, plan(&a, 3, MAX_PART_BYTES)),
            by_name(&b, plan(&b, 3, MAX_PART_BYTES))
        );
    }
}
