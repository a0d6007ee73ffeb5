//! [`ShardMap`]: a published placement, and [`next_map`], the pure rule that
//! turns the live servers, the declared parameters and the worker group into the
//! next one. Membership calls it after every change; it decides nothing about
//! who is alive.

use ps_proto::ids::{MapVersion, Rank, ServerId};
use ps_proto::placement::{Assignment, Param, plan_cut_for};

use crate::declared::{finest_fitting_cut, part_cap};

/// A published placement: servers, parts, live workers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardMap {
    /// Increases with every change.
    pub version: MapVersion,
    /// Live servers as `(id, address)`; assignments index into this list.
    pub servers: Vec<(ServerId, String)>,
    /// The parameters placed.
    pub params: Vec<Param>,
    /// Where every part lives.
    pub assignments: Vec<Assignment>,
    /// Ranks the BSP group waits for: every rank except those declared dead or gone
    /// (a rank not registered yet is still expected).
    pub workers: Vec<Rank>,
    /// Size of the worker group.
    pub group_size: u32,
}

impl ShardMap {
    /// The parts and bytes the server at `index` of [`ShardMap::servers`] owns.
    pub fn owned_by(&self, index: usize) -> (u64, u64) {
        let parts = self.assignments.iter().filter(|a| a.server == index);
        parts.fold((0, 0), |(n, bytes), a| {
            (
                n + 1,
                bytes + (a.len * self.params[a.param].elem_size) as u64,
            )
        })
    }
}

/// The worker group a map names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerGroup {
    /// Size of the group.
    pub size: u32,
    /// Ranks still expected (not declared dead, not gone).
    pub expected: Vec<Rank>,
}

/// The map that follows `previous` for these live `servers`, `params` and
/// `group`, with parts of at most `partition_bytes` (unless parts that small
/// would outgrow one message), or `None` when it would say the same as
/// `previous`. The parts stay where they are while the live servers do not
/// change; any change of servers places the parameters afresh.
pub fn next_map(
    previous: Option<&ShardMap>,
    servers: Vec<(ServerId, String)>,
    params: &[Param],
    group: WorkerGroup,
    partition_bytes: usize,
) -> Option<ShardMap> {
    let assignments = match previous {
        Some(map) if map.servers == servers && map.params == params => map.assignments.clone(),
        _ => {
            let cut_for = finest_fitting_cut(params, servers.len());
            if cut_for < servers.len() {
                tracing::warn!(
                    servers = servers.len(),
                    cut_for,
                    "the model cut as finely as every server calls for would make a shard map past one message; its parts are cut as for fewer servers"
                );
            }
            let cap = part_cap(params, cut_for, partition_bytes);
            if cap != partition_bytes {
                tracing::warn!(
                    asked = partition_bytes,
                    used = cap,
                    "parts as small as --partition-bytes asks would make a shard map past one message; the parameters are cut in larger parts"
                );
            }
            let placed = plan_cut_for(params, servers.len(), cut_for, cap);
            let largest = placed.iter().map(|a| a.len * params[a.param].elem_size);
            tracing::info!(
                servers = servers.len(),
                parts = placed.len(),
                largest_part_bytes = largest.max().unwrap_or(0),
                partition_bytes = cap,
                "placed the parameters"
            );
            placed
        }
    };
    let next = ShardMap {
        version: previous.map_or(MapVersion(0), |m| m.version).next(),
        servers,
        params: params.to_vec(),
        assignments,
        workers: group.expected,
        group_size: group.size,
    };
    let same = |map: &ShardMap| {
        ShardMap {
            version: next.version,
            ..map.clone()
        } == next
    };
    (!previous.is_some_and(same)).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::placement::DEFAULT_PART_BYTES;

    fn params() -> Vec<Param> {
        ["w", "b"]
            .iter()
            .map(|name| Param {
                name: (*name).into(),
                elements: 100_000,
                elem_size: 4,
            })
            .collect()
    }

    fn servers(n: u32) -> Vec<(ServerId, String)> {
        (0..n)
            .map(|id| (ServerId(id), format!("s{id}:1")))
            .collect()
    }

    /// The map after `previous` for the test's two parameters, `count`
    /// servers and `expected` ranks, cut at the default partition size.
    fn next(previous: Option<&ShardMap>, count: u32, expected: &[u32]) -> Option<ShardMap> {
        next_map(
            previous,
            servers(count),
            &params(),
            group(expected),
            DEFAULT_PART_BYTES,
        )
    }

    fn group(expected: &[u32]) -> WorkerGroup {
        WorkerGroup {
            size: 2,
            expected: expected.iter().copied().map(Rank).collect(),
        }
    }

    #[test]
    fn parts_are_at_most_the_partition_bytes_asked_for() {
        let params = vec![Param {
            name: "w".into(),
            elements: 1 << 20,
            elem_size: 4,
        }];
        let parts = |partition: usize| {
            let map = next_map(None, servers(2), &params, group(&[0, 1]), partition).unwrap();
            let largest = map.assignments.iter().map(|a| a.len * 4).max().unwrap();
            assert!(largest <= partition, "{largest} > {partition}");
            map.assignments.len()
        };
        assert_eq!(parts(DEFAULT_PART_BYTES), 4, "4 MiB in parts of 1 MiB");
        assert_eq!(parts(256 << 10), 16, "4 MiB in parts of 256 KiB");
    }

    #[test]
    fn the_first_map_is_version_1() {
        let map = next(None, 2, &[0, 1]).expect("a map");
        assert_eq!((map.version, map.servers.len()), (MapVersion(1), 2));
        let (first, second) = (map.owned_by(0).1, map.owned_by(1).1);
        assert_eq!(first + second, 800_000, "every byte placed once");
        assert_eq!(first, second, "balanced");
    }

    #[test]
    fn nothing_new_publishes_nothing() {
        let first = next(None, 2, &[0, 1]).unwrap();
        assert_eq!(next(Some(&first), 2, &[0, 1]), None);
    }

    #[test]
    fn a_dead_worker_keeps_the_parts_where_they_are() {
        let first = next(None, 2, &[0, 1]).unwrap();
        let next = next(Some(&first), 2, &[1]).unwrap();
        assert_eq!(
            (next.version, next.workers.clone()),
            (MapVersion(2), vec![Rank(1)])
        );
        assert_eq!(next.assignments, first.assignments);
    }

    #[test]
    fn a_lost_server_moves_its_parts_to_the_live_ones() {
        let first = next(None, 2, &[0, 1]).unwrap();
        let next = next(Some(&first), 1, &[0, 1]).unwrap();
        assert_eq!(next.version, MapVersion(2));
        assert!(next.assignments.iter().all(|a| a.server == 0));
        assert_eq!(next.owned_by(0), (2, 800_000));
    }

    /// 200 parameters of 16 MiB under 256-byte names: cut for two servers the
    /// map is small, cut as finely as 1,024 servers call for it would be about
    /// 12 MB.
    fn wide_model() -> Vec<Param> {
        (0..200)
            .map(|i| Param {
                name: format!("{i:0>256}"),
                elements: 4 << 20,
                elem_size: 4,
            })
            .collect()
    }

    #[test]
    fn servers_that_join_after_the_declaration_never_grow_the_map_past_one_message() {
        use crate::declared::{MAX_MAP_PARTS_BYTES, finest_fitting_cut, map_parts_bytes};
        let params = wide_model();
        assert_eq!(
            finest_fitting_cut(&params, 2),
            2,
            "two servers cut as usual"
        );
        assert!(map_parts_bytes(&params, 1024) > MAX_MAP_PARTS_BYTES);
        let map = next_map(
            None,
            servers(1024),
            &params,
            group(&[0, 1]),
            DEFAULT_PART_BYTES,
        )
        .expect("a map");
        let weight: usize = map
            .assignments
            .iter()
            .map(|a| params[a.param].name.len() + 32)
            .sum();
        assert!(weight <= MAX_MAP_PARTS_BYTES, "{weight} bytes of parts");
        for index in 0..1024 {
            assert!(map.owned_by(index).0 > 0, "server {index} holds nothing");
        }
        for (i, param) in params.iter().enumerate() {
            let placed: usize = map
                .assignments
                .iter()
                .filter(|a| a.param == i)
                .map(|a| a.len)
                .sum();
            assert_eq!(placed, param.elements, "{} placed once", param.name);
        }
    }
}
