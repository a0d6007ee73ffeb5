//! [`Ranks`]: hands out worker ranks to the processes that join the group, the
//! same rank again to a process that asks twice.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::param::Group;

/// Ranks handed out so far, by client token.
#[derive(Debug, Default)]
pub struct Ranks {
    taken: Mutex<HashMap<String, u32>>,
}

impl Ranks {
    /// The rank of `client_id`, assigning the next free one on its first call.
    ///
    /// # Errors
    /// `EmptyRequest` for an empty token; `GroupFull` when a BSP/SSP group has no free rank.
    pub fn join(&self, group: Group, client_id: &str) -> Result<u32> {
        if client_id.is_empty() {
            return Err(Error::EmptyRequest {
                what: "JoinGroup needs a client_id",
            });
        }
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&rank) = taken.get(client_id) {
            return Ok(rank);
        }
        let rank = taken.len() as u32;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consistency::Consistency;

    #[test]
    fn ranks_are_handed_out_in_order_and_repeated_for_retries() {
        let group = Group {
            consistency: Consistency::Bsp,
            workers: 2,
        };
        let ranks = Ranks::default();
        assert_eq!(ranks.join(group, "a").unwrap(), 0);
        assert_eq!(ranks.join(group, "b").unwrap(), 1);
        assert_eq!(ranks.join(group, "a").unwrap(), 0);
        let full = ranks.join(group, "c").unwrap_err();
        assert!(full.to_string().contains("--workers"), "{full}");
        assert!(ranks.join(group, "").is_err());
    }

    #[test]
    fn asp_has_no_fixed_group() {
        let group = Group {
            consistency: Consistency::Asp,
            workers: 1,
        };
        let ranks = Ranks::default();
        assert_eq!(ranks.join(group, "a").unwrap(), 0);
        assert_eq!(ranks.join(group, "b").unwrap(), 1);
    }
}
