//! Success counts per cell: (condition, agent, predecessor, task, start
//! state). A cell's success is the mean of y over its replicates; a task's
//! success in a group is the mean over its states of the cell means (states
//! first, then tasks, as both studies prescribe). Infrastructure errors are
//! counted but never enter a mean. A cell with fewer valid trials than
//! `min_trials` is left out and reported.

use std::collections::BTreeMap;

use crate::analysis::{Effect, Exclusion, Section};
use crate::model::{Condition, Dataset};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cell {
    pub valid: usize,
    pub pass: usize,
    pub infra: usize,
}

impl Cell {
    pub fn mean(&self) -> f64 {
        self.pass as f64 / self.valid as f64
    }
}

pub type GroupKey<'a> = (Condition, &'a str, Option<&'a str>);
/// task -> state -> cell
pub type Group<'a> = BTreeMap<&'a str, BTreeMap<&'a str, Cell>>;

pub struct Cells<'a> {
    pub groups: BTreeMap<GroupKey<'a>, Group<'a>>,
    pub min_trials: usize,
}

/// The mean of a task over its usable states, and the states left out.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskMean<'a> {
    pub value: Option<f64>,
    pub used: usize,
    pub dropped: Vec<(&'a str, Cell)>,
}

impl<'a> Cells<'a> {
    pub fn build(ds: &'a Dataset, min_trials: usize) -> Self {
        let mut groups: BTreeMap<GroupKey<'a>, Group<'a>> = BTreeMap::new();
        for t in &ds.trials {
            let r = &t.row;
            let cell = groups
                .entry((r.condition, r.agent.as_str(), r.predecessor.as_deref()))
                .or_default()
                .entry(r.task.as_str())
                .or_default()
                .entry(r.start_state.as_str())
                .or_default();
            if r.is_infra_error() {
                cell.infra += 1;
            } else {
                cell.valid += 1;
                cell.pass += usize::from(r.success());
            }
        }
        Cells {
            groups,
            min_trials: min_trials.max(1),
        }
    }

    pub fn usable(&self, c: &Cell) -> bool {
        c.valid >= self.min_trials
    }

    /// Mean over the usable states of one task's cells.
    pub fn task_mean<'s>(
        &self,
        states: impl IntoIterator<Item = (&'a str, &'s Cell)>,
    ) -> TaskMean<'a> {
        let mut sum = 0.0;
        let mut used = 0;
        let mut dropped = Vec::new();
        for (state, cell) in states {
            if self.usable(cell) {
                sum += cell.mean();
                used += 1;
            } else {
                dropped.push((state, *cell));
            }
        }
        TaskMean {
            value: (used > 0).then(|| sum / used as f64),
            used,
            dropped,
        }
    }

    pub fn group(
        &self,
        cond: Condition,
        agent: &'a str,
        pred: Option<&'a str>,
    ) -> Option<&Group<'a>> {
        self.groups.get(&(cond, agent, pred))
    }

    /// Why a cell was left out, in words.
    pub fn reason(&self, cell: &Cell) -> String {
        let infra = if cell.infra > 0 {
            format!(" ({} infra_error)", cell.infra)
        } else {
            String::new()
        };
        if cell.valid == 0 {
            format!("no valid trial{infra}")
        } else {
            format!(
                "{} valid trial(s){infra}, fewer than min_trials={}",
                cell.valid, self.min_trials
            )
        }
    }

    /// Record the left-out states of a task mean (and the task itself when
    /// nothing usable is left).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        out: &mut Vec<Exclusion>,
        section: Section,
        quantity: &str,
        agent: &str,
        predecessor: Option<&str>,
        task: &str,
        mean: &TaskMean<'_>,
    ) {
        for (state, cell) in &mean.dropped {
            out.push(Exclusion {
                section,
                quantity: quantity.to_string(),
                agent: agent.to_string(),
                predecessor: predecessor.map(str::to_string),
                task: task.to_string(),
                state: Some(state.to_string()),
                valid_trials: cell.valid,
                infra_errors: cell.infra,
                reason: self.reason(cell),
                effect: if mean.value.is_some() {
                    Effect::StateExcluded
                } else {
                    Effect::TaskExcluded
                },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Outcome, Trial};
    use crate::testutil::row;

    #[test]
    fn replicates_average_within_states_then_states_within_tasks() {
        let mut ds = Dataset::default();
        // State s1: 2 of 3 replicates pass; s2: 0 of 1; plus an infra error.
        for (state, outcome) in [
            ("s1", Outcome::Pass),
            ("s1", Outcome::Pass),
            ("s1", Outcome::Fail),
            ("s2", Outcome::Fail),
            ("s2", Outcome::InfraError),
        ] {
            ds.trials.push(Trial::new(row(
                "t",
                Condition::Residual,
                state,
                Some("P"),
                "A",
                outcome,
            )));
        }
        let cells = Cells::build(&ds, 1);
        let g = cells.group(Condition::Residual, "A", Some("P")).unwrap();
        let states = &g["t"];
        assert_eq!(
            states["s2"],
            Cell {
                valid: 1,
                pass: 0,
                infra: 1
            }
        );
        let m = cells.task_mean(states.iter().map(|(s, c)| (*s, c)));
        // (2/3 + 0) / 2 = 1/3, not the pooled 2/4.
        assert_eq!(m.value, Some((2.0 / 3.0 + 0.0) / 2.0));
        assert_eq!(m.used, 2);

        let strict = Cells::build(&ds, 2);
        let m = strict.task_mean(states.iter().map(|(s, c)| (*s, c)));
        assert_eq!(m.value, Some(2.0 / 3.0));
        assert_eq!(
            m.dropped,
            vec![(
                "s2",
                Cell {
                    valid: 1,
                    pass: 0,
                    infra: 1
                }
            )]
        );
        assert_eq!(
            strict.reason(&m.dropped[0].1),
            "1 valid trial(s) (1 infra_error), fewer than min_trials=2"
        );
        let none = Cell {
            valid: 0,
            pass: 0,
            infra: 2,
        };
        assert_eq!(strict.reason(&none), "no valid trial (2 infra_error)");
    }
}
