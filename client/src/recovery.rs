//! [`Recovering`]: a worker's recovery from failed calls as a small state machine
//! with no I/O, in the manner of raft-rs's `RawNode`: the driver (the trainer,
//! or [`PsClient::recover`](crate::PsClient::recover)) tells it what happened
//! with [`Recovering::step`] and asks what to do next with
//! [`Recovering::ready`]. Every repair sequence can so be tested as a table of
//! outcomes and actions, without sockets (the tests below).
//!
//! The rules:
//! - an attempt that succeeds is done;
//! - an attempt of a step refused because the group completed the step
//!   without this worker rejoins at the group's step (only the caller can load
//!   it); any other operation gives up there;
//! - a failure a repair can fix ([`Repair`]) is repaired, then the attempt is
//!   repeated, and a repair that fails for such a reason is repaired in turn,
//!   all within one [`RepairBudget`];
//! - anything else, a repair failing for any other reason, or a spent budget,
//!   gives up with the last error.

use ps_proto::ids::Step;

use crate::error::{Recovery, Repair};
use crate::repair::RepairBudget;

/// What happened with the last action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The action succeeded.
    Succeeded,
    /// The action failed; what the error calls for.
    Failed(Recovery),
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Make the attempt (again).
    Attempt,
    /// Repair placement for this failure, then report the outcome.
    Repair(Repair),
    /// Load the values at the group's step and go on from there.
    Rejoin(Step),
    /// Nothing more: the attempt succeeded.
    Done,
}

/// One operation's recovery: attempts, repairs between them, and the budget.
/// `None` from [`Recovering::ready`] means: give up with the last error.
#[derive(Debug, Clone)]
pub struct Recovering {
    budget: RepairBudget,
    rejoins: bool,
    next: Option<Action>,
}

impl Recovering {
    /// Recovery for a step: a refusal because the group completed it rejoins.
    pub fn step_of_group(budget: RepairBudget) -> Self {
        Self {
            budget,
            rejoins: true,
            next: Some(Action::Attempt),
        }
    }

    /// Recovery for any other operation (a load, a registration): a refusal
    /// naming a completed step gives up.
    pub fn operation(budget: RepairBudget) -> Self {
        Self {
            rejoins: false,
            ..Self::step_of_group(budget)
        }
    }

    /// What to do next; `None` to give up.
    pub fn ready(&self) -> Option<Action> {
        self.next
    }

    /// Takes the outcome of the action [`Recovering::ready`] gave, and says
    /// what to do next.
    pub fn step(&mut self, outcome: Outcome) -> Option<Action> {
        self.next = match (self.next, outcome) {
            (Some(Action::Attempt), Outcome::Succeeded) => Some(Action::Done),
            (Some(Action::Repair(_)), Outcome::Succeeded) => Some(Action::Attempt),
            (Some(Action::Attempt), Outcome::Failed(Recovery::Rejoin { step })) if self.rejoins => {
                Some(Action::Rejoin(step))
            }
            (
                Some(Action::Attempt | Action::Repair(_)),
                Outcome::Failed(Recovery::Repair(repair)),
            ) => self.budget.spend().then_some(Action::Repair(repair)),
            (Some(Action::Attempt | Action::Repair(_)), Outcome::Failed(_)) => None,
            (settled @ (Some(Action::Done | Action::Rejoin(_)) | None), _) => settled,
        };
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::ids::{MapVersion, Version};

    use Outcome::{Failed, Succeeded};

    const STALE: Recovery = Recovery::Repair(Repair::StaleMap {
        version: MapVersion(3),
    });
    const LOST: Recovery = Recovery::Repair(Repair::ServerLost);
    const MISSING: Recovery = Recovery::Repair(Repair::KeysMissing);
    const BEHIND: Recovery = Recovery::Repair(Repair::KeyBehind {
        version: Version(2),
    });
    const REJOIN: Recovery = Recovery::Rejoin { step: Step(9) };

    /// A named sequence: its budget, the outcomes fed in, the actions asked for.
    type Case = (&'static str, usize, Vec<Outcome>, Vec<Option<Action>>);

    /// The actions a step's recovery with `budget` repairs asks for, given
    /// `outcomes` of each in turn (`None`: give up).
    fn run(budget: usize, outcomes: &[Outcome]) -> Vec<Option<Action>> {
        let mut recovering = Recovering::step_of_group(RepairBudget::new(budget));
        let mut actions = vec![recovering.ready()];
        for outcome in outcomes {
            actions.push(recovering.step(*outcome));
        }
        actions
    }

    #[test]
    fn each_sequence_of_outcomes_asks_for_its_actions() {
        const GIVE_UP: Option<Action> = None;
        let (attempt, done) = (Some(Action::Attempt), Some(Action::Done));
        let repair = |r: Recovery| match r {
            Recovery::Repair(repair) => Some(Action::Repair(repair)),
            other => panic!("{other:?} is not repaired"),
        };
        let table: Vec<Case> = vec![
            ("first try", 5, vec![Succeeded], vec![attempt, done]),
            (
                "map moved",
                5,
                vec![Failed(STALE), Succeeded, Succeeded],
                vec![attempt, repair(STALE), attempt, done],
            ),
            (
                "the map moves again during the repair",
                5,
                vec![Failed(STALE), Failed(STALE), Succeeded, Succeeded],
                vec![attempt, repair(STALE), repair(STALE), attempt, done],
            ),
            (
                "server lost, then its keys missing at the new owner",
                5,
                vec![
                    Failed(LOST),
                    Succeeded,
                    Failed(MISSING),
                    Succeeded,
                    Succeeded,
                ],
                vec![
                    attempt,
                    repair(LOST),
                    attempt,
                    repair(MISSING),
                    attempt,
                    done,
                ],
            ),
            (
                "a key behind this worker",
                5,
                vec![Failed(BEHIND), Succeeded, Succeeded],
                vec![attempt, repair(BEHIND), attempt, done],
            ),
            (
                "the step completed without this worker",
                5,
                vec![Failed(REJOIN)],
                vec![attempt, Some(Action::Rejoin(Step(9)))],
            ),
            (
                "a fatal refusal",
                5,
                vec![Failed(Recovery::Fatal)],
                vec![attempt, GIVE_UP],
            ),
            (
                "a repair that fails for good",
                5,
                vec![Failed(LOST), Failed(Recovery::Fatal)],
                vec![attempt, repair(LOST), GIVE_UP],
            ),
            (
                "a repair refused because the step completed: only an attempt rejoins",
                5,
                vec![Failed(MISSING), Failed(REJOIN)],
                vec![attempt, repair(MISSING), GIVE_UP],
            ),
            (
                "the budget spent",
                2,
                vec![Failed(LOST), Failed(LOST), Failed(LOST)],
                vec![attempt, repair(LOST), repair(LOST), GIVE_UP],
            ),
            (
                "no budget at all",
                0,
                vec![Failed(STALE)],
                vec![attempt, GIVE_UP],
            ),
            (
                "a settled recovery stays settled",
                5,
                vec![Succeeded, Failed(LOST)],
                vec![attempt, done, done],
            ),
        ];
        for (case, budget, outcomes, actions) in table {
            assert_eq!(run(budget, &outcomes), actions, "{case}");
        }
    }

    #[test]
    fn an_operation_other_than_a_step_gives_up_where_a_step_rejoins() {
        let mut recovering = Recovering::operation(RepairBudget::default());
        assert_eq!(recovering.step(Failed(REJOIN)), None);
        let mut recovering = Recovering::operation(RepairBudget::default());
        assert_eq!(
            recovering.step(Failed(LOST)),
            Some(Action::Repair(Repair::ServerLost))
        );
    }
}
