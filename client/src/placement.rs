//! [`Placement`]: which server holds which part of which parameter, as a worker
//! routes by it.
//!
//! With a scheduler it comes from the shard map ([`Placement::from_map`]).
//! Without one every worker computes the same plan from the same inputs
//! ([`Placement::plan`]) with the planner the scheduler uses
//! (`ps_proto::placement`), so a model is placed the same way either way.

use std::collections::BTreeMap;

use ps_proto::codec::{DType, element_count};
use ps_proto::header::TensorHeader;
use ps_proto::key::ParamKey;
use ps_proto::placement;

/// Default partition size: no part is larger than this.
pub const DEFAULT_PARTITION_BYTES: usize = placement::DEFAULT_PART_BYTES;

/// What the planner needs to know about a parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Name (the PS key name).
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Wire dtype.
    pub dtype: DType,
}

impl ParamInfo {
    /// Number of elements.
    pub fn len(&self) -> usize {
        element_count(&self.shape)
    }

    /// True for a parameter with no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One contiguous element range of a parameter, on one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// Partition index (the key's `part`).
    pub part: u32,
    /// Index of the server in the client's server list.
    pub server: usize,
    /// First element.
    pub start: usize,
    /// Number of elements.
    pub len: usize,
}

/// A parameter and where its parts live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The parameter.
    pub info: ParamInfo,
    /// Its parts, in element order.
    pub parts: Vec<Part>,
}

impl Placed {
    /// The shape a part is registered with: the real shape for a whole tensor, flat
    /// `[len]` for a partition.
    pub fn part_shape(&self, part: &Part) -> Vec<usize> {
        if self.parts.len() == 1 {
            self.info.shape.clone()
        } else {
            vec![part.len]
        }
    }

    /// The header a part travels under: its key, the parameter's dtype and
    /// [`Placed::part_shape`].
    pub fn header(&self, part: &Part) -> TensorHeader {
        let key = ParamKey::new(&self.info.name, part.part);
        TensorHeader::new(key, self.info.dtype, self.part_shape(part))
    }
}

/// A shard map that does not place this worker's model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// A parameter the model does not have.
    #[error("the shard map places `{0}`, which this model does not have")]
    Unknown(String),
    /// A server index past the server list.
    #[error("the shard map puts `{name}` on server {server} of {servers}")]
    NoSuchServer {
        /// The parameter.
        name: String,
        /// The server index.
        server: usize,
        /// Servers in the map.
        servers: usize,
    },
    /// Parts with a gap or an overlap.
    #[error("the shard map's parts of `{name}` are not contiguous at element {at}")]
    NotContiguous {
        /// The parameter.
        name: String,
        /// The element where the next part should start.
        at: usize,
    },
    /// Parts that do not cover the parameter.
    #[error(
        "the shard map covers {covered} of {elements} elements of `{name}`; do all workers train the same model?"
    )]
    Uncovered {
        /// The parameter.
        name: String,
        /// Elements covered.
        covered: usize,
        /// Elements of the parameter.
        elements: usize,
    },
}

/// Where every parameter lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    params: BTreeMap<String, Placed>,
    servers: usize,
}

impl Placement {
    /// Plans `params` over `servers` servers with the shared planner, with no
    /// part above `partition_bytes`.
    pub fn plan(params: &[ParamInfo], servers: usize, partition_bytes: usize) -> Self {
        let servers = servers.max(1);
        let planned: Vec<placement::Param> = params
            .iter()
            .map(|info| placement::Param {
                name: info.name.clone(),
                elements: info.len(),
                elem_size: info.dtype.size(),
            })
            .collect();
        let parts: Vec<(String, Part)> = placement::plan(&planned, servers, partition_bytes)
            .into_iter()
            .map(|a| {
                let part = Part {
                    part: a.part,
                    server: a.server,
                    start: a.start,
                    len: a.len,
                };
                (params[a.param].name.clone(), part)
            })
            .collect();
        Self::from_map(params, &parts, servers).expect("the planner covers every parameter")
    }

    /// The parameters, by name.
    pub fn params(&self) -> impl Iterator<Item = &Placed> {
        self.params.values()
    }

    /// The placement a scheduler's shard map describes: `parts` as
    /// `(name, part)`, the part naming its server's index.
    ///
    /// # Errors
    /// [`MapError`] when the map does not cover a parameter exactly, or names
    /// one the worker does not have.
    pub fn from_map(
        params: &[ParamInfo],
        parts: &[(String, Part)],
        servers: usize,
    ) -> Result<Self, MapError> {
        let mut placed: BTreeMap<String, Placed> = params
            .iter()
            .map(|info| {
                (
                    info.name.clone(),
                    Placed {
                        info: info.clone(),
                        parts: Vec::new(),
                    },
                )
            })
            .collect();
        for (name, part) in parts {
            let entry = placed
                .get_mut(name)
                .ok_or_else(|| MapError::Unknown(name.clone()))?;
            if part.server >= servers {
                return Err(MapError::NoSuchServer {
                    name: name.clone(),
                    server: part.server,
                    servers,
                });
            }
            entry.parts.push(*part);
        }
        for entry in placed.values_mut() {
            entry.parts.sort_by_key(|p| p.part);
            let mut next = 0;
            for part in &entry.parts {
                if part.start != next {
                    return Err(MapError::NotContiguous {
                        name: entry.info.name.clone(),
                        at: next,
                    });
                }
                next += part.len;
            }
            if next != entry.info.len() {
                return Err(MapError::Uncovered {
                    name: entry.info.name.clone(),
                    covered: next,
                    elements: entry.info.len(),
                });
            }
        }
        Ok(Self {
            params: placed,
            servers,
        })
    }

    /// One parameter.
    pub fn get(&self, name: &str) -> Option<&Placed> {
        self.params.get(name)
    }

    /// Number of servers planned for.
    pub fn servers(&self) -> usize {
        self.servers
    }

    /// The bytes of the parts each server holds, in the wire dtype.
    pub fn bytes_per_server(&self) -> Vec<usize> {
        let mut load = vec![0; self.servers];
        for placed in self.params.values() {
            for part in &placed.parts {
                load[part.server] += part.len * placed.info.dtype.size();
            }
        }
        load
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, len: usize) -> ParamInfo {
        ParamInfo {
            name: name.into(),
            shape: vec![len],
            dtype: DType::F32,
        }
    }

    #[test]
    fn one_server_keeps_everything_whole() {
        let plan = Placement::plan(&[info("a", 10_000_000), info("b", 3)], 1, 1024);
        assert!(
            plan.params()
                .all(|p| p.parts.len() == 1 && p.parts[0].server == 0)
        );
        assert_eq!(
            plan.get("a")
                .unwrap()
                .part_shape(&plan.get("a").unwrap().parts[0]),
            vec![10_000_000]
        );
    }

    #[test]
    fn large_tensors_are_split_contiguously_and_bytes_balanced() {
        let params = [
            info("big", 3_000_000),
            info("mid", 500_000),
            info("small", 10),
        ];
        let plan = Placement::plan(&params, 2, DEFAULT_PARTITION_BYTES);
        let big = plan.get("big").unwrap();
        assert!(big.parts.len() > 1, "12 MB over two servers is split");
        assert!(
            big.parts
                .iter()
                .all(|p| p.len * 4 <= DEFAULT_PARTITION_BYTES)
        );
        assert_eq!(big.parts.iter().map(|p| p.len).sum::<usize>(), 3_000_000);
        assert!(
            big.parts
                .windows(2)
                .all(|w| w[0].start + w[0].len == w[1].start),
            "contiguous"
        );
        assert_eq!(plan.get("small").unwrap().parts.len(), 1);
        let load = plan.bytes_per_server();
        let (max, total) = (*load.iter().max().unwrap(), load.iter().sum::<usize>());
        assert!(max as f64 <= 1.025 * total as f64 / 2.0, "{load:?}");
    }

    #[test]
    fn plan_is_deterministic_whatever_the_input_order() {
        let a = [info("x", 7_000_000), info("y", 100), info("z", 2_000_000)];
        let b = [a[2].clone(), a[0].clone(), a[1].clone()];
        assert_eq!(
            Placement::plan(&a, 3, 1 << 20),
            Placement::plan(&b, 3, 1 << 20)
        );
    }

    #[test]
    fn small_tensors_spread_over_servers() {
        let params: Vec<_> = (0..8).map(|i| info(&format!("p{i}"), 100)).collect();
        let plan = Placement::plan(&params, 2, DEFAULT_PARTITION_BYTES);
        assert_eq!(plan.bytes_per_server(), vec![1600, 1600]);
    }
}
