//! [`Barriers`]: named barriers of the worker group. Plain state: a barrier
//! releases once every live worker has arrived, so a worker declared dead (by
//! the membership's clock) stops holding the others back. The gRPC layer only
//! waits for changes and applies its deadline.

use std::collections::{BTreeMap, BTreeSet};

use ps_proto::ids::Rank;

/// Where a barrier stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BarrierState {
    /// Every live worker has arrived: the ranks that arrived.
    Released(Vec<Rank>),
    /// Live workers that have not arrived yet.
    Waiting(Vec<Rank>),
}

/// The workers that arrived at each named barrier.
#[derive(Debug, Default)]
pub struct Barriers {
    arrived: BTreeMap<String, BTreeSet<Rank>>,
}

impl Barriers {
    /// Worker `rank` arrives at barrier `name`.
    pub fn arrive(&mut self, name: &str, rank: Rank) {
        self.arrived
            .entry(name.to_string())
            .or_default()
            .insert(rank);
    }

    /// Barrier `name` given the workers alive now.
    pub fn state(&self, name: &str, live: &[Rank]) -> BarrierState {
        let arrived = self.arrived.get(name);
        let has = |rank: &Rank| arrived.is_some_and(|a| a.contains(rank));
        let waiting: Vec<Rank> = live.iter().copied().filter(|r| !has(r)).collect();
        if waiting.is_empty() {
            BarrierState::Released(arrived.map_or_else(Vec::new, |a| a.iter().copied().collect()))
        } else {
            BarrierState::Waiting(waiting)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn ranks(ranks: &[u32]) -> Vec<Rank> {
        ranks.iter().copied().map(Rank).collect()
    }
    use crate::membership::Membership;

    #[test]
    fn releases_when_every_live_worker_arrived() {
        let mut barriers = Barriers::default();
        barriers.arrive("epoch-1", Rank(1));
        assert_eq!(
            barriers.state("epoch-1", &ranks(&[0, 1])),
            BarrierState::Waiting(ranks(&[0]))
        );
        barriers.arrive("epoch-1", Rank(0));
        assert_eq!(
            barriers.state("epoch-1", &ranks(&[0, 1])),
            BarrierState::Released(ranks(&[0, 1]))
        );
        assert_eq!(
            barriers.state("epoch-2", &ranks(&[0, 1])),
            BarrierState::Waiting(ranks(&[0, 1]))
        );
    }

    #[test]
    fn a_worker_declared_dead_stops_holding_the_barrier() {
        let timeout = Duration::from_secs(5);
        let start = Instant::now();
        let mut membership = Membership::new(timeout, 2, 1);
        membership.register_worker("a", start).unwrap();
        membership.register_worker("b", start).unwrap();
        let mut barriers = Barriers::default();
        barriers.arrive("end", Rank(0));
        let later = start + Duration::from_secs(3);
        membership
            .heartbeat(
                crate::membership::Node::Worker(Rank(0)),
                ps_proto::ids::Step(7),
                later,
            )
            .unwrap();
        assert_eq!(
            barriers.state("end", &membership.live_workers()),
            BarrierState::Waiting(ranks(&[1]))
        );
        membership.tick(start + Duration::from_secs(6));
        assert_eq!(
            barriers.state("end", &membership.live_workers()),
            BarrierState::Released(ranks(&[0]))
        );
    }
}
