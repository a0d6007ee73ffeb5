//! [`Ranks`]: hands out worker ranks to the processes that join the group, the
//! same rank again to a process that asks twice.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::consistency::Consistency;
use ps_proto::ids::Rank;

use crate::error::{Error, Result};
use crate::param::Group;

/// What a worker asks for when it joins: its token, and what it was started with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JoinRequest {
    /// A token unique to the worker process; a retry with it gets the same rank.
    pub client_id: String,
    /// The group size the worker expects, if it set one.
    pub workers: Option<u32>,
    /// The consistency model the worker expects, if it set one.
    pub consistency: Option<Consistency>,
    /// The rank the worker chose, if it chose one.
    pub rank: Option<u32>,
}

/// Ranks handed out so far, by client token.
#[derive(Debug, Default)]
pub struct Ranks {
    taken: Mutex<HashMap<String, u32>>,
}

impl Ranks {
    /// The rank of `request.client_id`: the one it chose, the one it was given
    /// before, or the lowest free one.
    ///
    /// # Errors
    /// `EmptyRequest` for an empty token; `GroupMismatch` when the worker expects
    /// another group size or consistency model; `WorkerOutsideGroup` for a chosen
    /// rank outside the group; `GroupFull` when a BSP/SSP group has no free rank.
    pub fn join(&self, group: Group, request: &JoinRequest) -> Result<u32> {
        let client_id = request.client_id.as_str();
        if client_id.is_empty() {
            return Err(Error::EmptyRequest {
                what: "JoinGroup needs a client_id",
            });
        }
        check_expectations(group, request)?;
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rank) = request.rank {
            // A restarted worker takes its rank back from its former process.
            taken.retain(|_, held| *held != rank);
            taken.insert(client_id.to_string(), rank);
            tracing::info!(rank, client_id, "worker joined with the rank it chose");
            return Ok(rank);
        }
        if let Some(&rank) = taken.get(client_id) {
            return Ok(rank);
        }
        let rank = (0..)
            .find(|r| !taken.values().any(|held| held == r))
            .unwrap_or(0);
        if group.consistency.has_group() && rank >= group.workers {
            return Err(Error::GroupFull {
                workers: group.workers,
            });
        }
        taken.insert(client_id.to_string(), rank);
        tracing::info!(rank, client_id, "worker joined");
        Ok(rank)
    }
}

/// Refuses a worker started with another group size, consistency model or an
/// out-of-group rank than this server's.
fn check_expectations(group: Group, request: &JoinRequest) -> Result<()> {
    if let Some(consistency) = request.consistency.filter(|c| *c != group.consistency) {
        return Err(Error::GroupMismatch {
            setting: "consistency",
            server: group.consistency.to_string(),
            worker: consistency.to_string(),
        });
    }
    let has_group = group.consistency.has_group();
    if let Some(workers) = request.workers.filter(|w| has_group && *w != group.workers) {
        return Err(Error::GroupMismatch {
            setting: "workers",
            server: group.workers.to_string(),
            worker: workers.to_string(),
        });
    }
    match request.rank {
        Some(rank) if has_group && rank >= group.workers => Err(Error::WorkerOutsideGroup {
            worker: Rank(rank),
            group: group.workers,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(client_id: &str) -> JoinRequest {
        JoinRequest {
            client_id: client_id.into(),
            ..JoinRequest::default()
        }
    }

    #[test]
    fn ranks_are_handed_out_in_order_and_repeated_for_retries() {
        let group = Group {
            consistency: Consistency::Bsp,
            workers: 2,
        };
        let ranks = Ranks::default();
        assert_eq!(ranks.join(group, &token("a")).unwrap(), 0);
        assert_eq!(ranks.join(group, &token("b")).unwrap(), 1);
        assert_eq!(ranks.join(group, &token("a")).unwrap(), 0);
        let full = ranks.join(group, &token("c")).unwrap_err();
        assert!(full.to_string().contains("--workers"), "{full}");
        assert!(ranks.join(group, &token("")).is_err());
    }

    #[test]
    fn asp_has_no_fixed_group() {
        let group = Group {
            consistency: Consistency::Asp,
            workers: 1,
        };
        let ranks = Ranks::default();
        assert_eq!(ranks.join(group, &token("a")).unwrap(), 0);
        assert_eq!(ranks.join(group, &token("b")).unwrap(), 1);
    }

    #[test]
    fn a_worker_started_for_another_group_is_refused_when_it_joins() {
        let group = Group {
            consistency: Consistency::Bsp,
            workers: 2,
        };
        let ranks = Ranks::default();
        // (workers, consistency, rank) the worker expects -> the flag the refusal names
        let refused = [
            (Some(3), None, None, "--workers"),
            (None, Some(Consistency::Asp), None, "--consistency"),
            (Some(2), None, Some(2), "--workers"),
        ];
        for (workers, consistency, rank, flag) in refused {
            let request = JoinRequest {
                workers,
                consistency,
                rank,
                ..token("x")
            };
            let error = ranks.join(group, &request).unwrap_err().to_string();
            assert!(error.contains(flag), "{request:?}: {error}");
        }
        assert!(
            ranks.taken.lock().unwrap().is_empty(),
            "nothing was handed out"
        );
        let matching = JoinRequest {
            workers: Some(2),
            consistency: Some(Consistency::Bsp),
            ..token("a")
        };
        assert_eq!(ranks.join(group, &matching).unwrap(), 0);
    }

    #[test]
    fn a_chosen_rank_is_taken_back_by_a_restarted_worker_and_skipped_by_others() {
        let group = Group {
            consistency: Consistency::Bsp,
            workers: 3,
        };
        let ranks = Ranks::default();
        let chosen = |id: &str, rank| JoinRequest {
            rank: Some(rank),
            ..token(id)
        };
        assert_eq!(ranks.join(group, &chosen("first", 0)).unwrap(), 0);
        assert_eq!(ranks.join(group, &chosen("restarted", 0)).unwrap(), 0);
        assert_eq!(ranks.join(group, &token("other")).unwrap(), 1);
        assert_eq!(
            ranks.taken.lock().unwrap().len(),
            2,
            "the old process's token is gone"
        );
    }
}
