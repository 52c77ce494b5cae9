//! Inherited-start success per agent, or per (agent, predecessor): Res,
//! Clean, Gap and the conditional failure rate over the tasks with both a
//! clean and a residual value, with their paired bootstrap intervals, and
//! the exclusions (states and tasks an agent has no usable trials for).

use std::collections::BTreeMap;

use crate::analysis::{Effect, Estimate, Exclusion, InheritedRow, Section};
use crate::cells::{Cell, Cells};
use crate::model::Condition;
use crate::stats::{bootstrap, Column};
use crate::Options;

pub(super) fn success_row(
    cells: &Cells<'_>,
    agent: &str,
    pred: Option<&str>,
    opts: &Options,
    mut exclusions: Option<&mut Vec<Exclusion>>,
) -> InheritedRow {
    let matches = |p: &Option<&str>| pred.is_none() || *p == pred;
    // Scope: every (task, state) with residual trials in this predecessor
    // group by any agent, so that a task or state an agent did not run is
    // reported, not silently averaged away.
    let mut scope: BTreeMap<&str, BTreeMap<&str, Option<&str>>> = BTreeMap::new();
    for ((c, _, p), g) in &cells.groups {
        if *c == Condition::Residual && matches(p) {
            for (task, states) in g {
                let entry = scope.entry(task).or_default();
                for state in states.keys() {
                    entry.insert(state, *p);
                }
            }
        }
    }
    let own: Vec<_> = cells
        .groups
        .iter()
        .filter(|((c, a, p), _)| *c == Condition::Residual && *a == agent && matches(p))
        .map(|(_, g)| g)
        .collect();
    let clean_group = cells.group(Condition::Clean, agent, None);

    let (mut clean, mut residual) = (Vec::new(), Vec::new());
    let (mut states, mut excluded) = (0, 0);
    for (task, expected) in &scope {
        let task_states: Vec<(&str, &Cell)> = own
            .iter()
            .filter_map(|g| g.get(task))
            .flat_map(|s| s.iter().map(|(k, c)| (*k, c)))
            .collect();
        let r = cells.task_mean(task_states.iter().copied());
        let c = clean_group
            .and_then(|g| g.get(task))
            .map(|s| cells.task_mean(s.iter().map(|(k, c)| (*k, c))));
        if let Some(out) = exclusions.as_deref_mut() {
            let effect = if r.value.is_some() {
                Effect::StateExcluded
            } else {
                Effect::TaskExcluded
            };
            for (state, cell) in &r.dropped {
                let state_pred = expected.get(state).copied().flatten();
                out.push(Exclusion {
                    valid_trials: cell.valid,
                    infra_errors: cell.infra,
                    reason: cells.reason(cell),
                    ..missing(agent, task, state_pred, Some(state), "residual", effect)
                });
            }
            for (state, state_pred) in expected {
                if !task_states.iter().any(|(s, _)| s == state) {
                    out.push(missing(
                        agent,
                        task,
                        *state_pred,
                        Some(state),
                        "residual",
                        effect,
                    ));
                }
            }
            match &c {
                Some(c) => cells.record(out, Section::Inherited, "clean", agent, None, task, c),
                None => out.push(missing(
                    agent,
                    task,
                    None,
                    None,
                    "clean",
                    Effect::TaskExcluded,
                )),
            }
        }
        match (c.and_then(|c| c.value), r.value) {
            (Some(cv), Some(rv)) => {
                clean.push(cv);
                residual.push(rv);
                states += r.used;
            }
            _ => excluded += 1,
        }
    }

    let n = clean.len();
    let clean_col = Column::mean_of(&clean.iter().map(|v| Some(*v)).collect::<Vec<_>>());
    let res_col = Column::mean_of(&residual.iter().map(|v| Some(*v)).collect::<Vec<_>>());
    let gap_col = Column::mean_of(
        &clean
            .iter()
            .zip(&residual)
            .map(|(c, r)| Some(100.0 * (c - r)))
            .collect::<Vec<_>>(),
    );
    let mut cfr_col = Column::zeros(n);
    for i in 0..n {
        cfr_col.num[i] = clean[i] * (1.0 - residual[i]);
        cfr_col.den[i] = clean[i];
    }
    let key = format!("inherited/{agent}/{}", pred.unwrap_or("*"));
    let cols = [clean_col, res_col, gap_col, cfr_col];
    let ci = bootstrap(&cols, opts.draws, opts.seed, &key);
    InheritedRow {
        agent: agent.to_string(),
        predecessor: pred.map(str::to_string),
        tasks: n,
        states,
        excluded_tasks: excluded,
        clean: Estimate::from_column(&cols[0], ci[0]),
        residual: Estimate::from_column(&cols[1], ci[1]),
        gap_pp: Estimate::from_column(&cols[2], ci[2]),
        conditional_failure: Estimate::from_column(&cols[3], ci[3]),
        clean_solved: clean.iter().sum(),
    }
}

/// A state or task without trials for this agent.
fn missing(
    agent: &str,
    task: &str,
    predecessor: Option<&str>,
    state: Option<&str>,
    quantity: &str,
    effect: Effect,
) -> Exclusion {
    Exclusion {
        section: Section::Inherited,
        quantity: quantity.to_string(),
        agent: agent.to_string(),
        predecessor: predecessor.map(str::to_string),
        task: task.to_string(),
        state: state.map(str::to_string),
        valid_trials: 0,
        infra_errors: 0,
        reason: "no trials".to_string(),
        effect,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dataset, Outcome};
    use crate::testutil::{add, close};
    use crate::{analyze, Options};
    use Condition::{Clean, Residual};
    use Outcome::{Fail, InfraError, Pass};

    fn opts() -> Options {
        Options {
            draws: 200,
            ..Options::default()
        }
    }

    /// Agent A: t1 has one state, t2 three (two predecessors), t3 one;
    /// replicates disagree and an infra error must not count. Agent B never
    /// solves anything from the clean start and skipped t2.
    fn example() -> Dataset {
        let mut ds = Dataset::default();
        add(&mut ds, "t1", Clean, "clean", None, "A", &[Pass, Pass]);
        add(&mut ds, "t1", Residual, "s1", Some("P"), "A", &[Pass, Fail]);
        add(
            &mut ds,
            "t2",
            Clean,
            "clean",
            None,
            "A",
            &[Pass, Fail, InfraError],
        );
        add(&mut ds, "t2", Residual, "s2a", Some("P"), "A", &[Fail]);
        add(&mut ds, "t2", Residual, "s2b", Some("P"), "A", &[Pass]);
        add(
            &mut ds,
            "t2",
            Residual,
            "s2c",
            Some("Q"),
            "A",
            &[Pass, Pass, Fail, Fail, InfraError],
        );
        add(&mut ds, "t3", Clean, "clean", None, "A", &[Fail]);
        add(&mut ds, "t3", Residual, "s3", Some("Q"), "A", &[Pass]);
        add(&mut ds, "t1", Clean, "clean", None, "B", &[Fail]);
        add(&mut ds, "t1", Residual, "s1", Some("P"), "B", &[Fail]);
        add(&mut ds, "t3", Clean, "clean", None, "B", &[Fail]);
        add(&mut ds, "t3", Residual, "s3", Some("Q"), "B", &[Pass]);
        ds
    }

    #[test]
    fn res_clean_gap_and_conditional_failure() {
        let a = analyze(&example(), &opts());
        let rows = &a.inherited.by_agent;
        assert_eq!(rows.len(), 2);
        let ra = &rows[0];
        assert_eq!(
            (ra.agent.as_str(), ra.tasks, ra.states, ra.excluded_tasks),
            ("A", 3, 5, 0)
        );
        // c = (1, 1/2, 0); r = (1/2, (0 + 1 + 1/2)/3, 1) = (1/2, 1/2, 1).
        close(ra.clean.value, 0.5);
        close(ra.residual.value, 2.0 / 3.0);
        close(ra.gap_pp.value, 100.0 * (0.5 - 2.0 / 3.0));
        // sum c(1 - r) / sum c = (1/2 + 1/4 + 0) / (3/2).
        close(ra.conditional_failure.value, 0.5);
        assert_eq!(ra.conditional_failure.tasks, 2);
        assert_eq!(ra.clean_solved, 1.5);

        let rb = &rows[1];
        assert_eq!(
            (rb.agent.as_str(), rb.tasks, rb.excluded_tasks),
            ("B", 2, 1)
        );
        close(rb.clean.value, 0.0);
        close(rb.residual.value, 0.5);
        // Empty clean-solved set: undefined, not 0, and no interval.
        assert_eq!(rb.conditional_failure.value, None);
        assert_eq!(rb.conditional_failure.ci, None);
        assert_eq!(rb.conditional_failure.tasks, 0);
        // B's missing task is reported: its three states and the clean side.
        let b_ex: Vec<_> = a.exclusions.iter().filter(|e| e.agent == "B").collect();
        assert_eq!(b_ex.len(), 4);
        assert!(b_ex
            .iter()
            .all(|e| e.task == "t2" && e.effect == Effect::TaskExcluded));
        let states: Vec<_> = b_ex
            .iter()
            .map(|e| (e.state.as_deref(), e.predecessor.as_deref()))
            .collect();
        assert_eq!(
            states,
            vec![
                (Some("s2a"), Some("P")),
                (Some("s2b"), Some("P")),
                (Some("s2c"), Some("Q")),
                (None, None)
            ]
        );
        assert_eq!(a.meta.infra_errors_excluded, 2);
    }

    #[test]
    fn grouped_by_predecessor() {
        let a = analyze(&example(), &opts());
        let find = |agent: &str, p: &str| {
            a.inherited
                .by_predecessor
                .iter()
                .find(|r| r.agent == agent && r.predecessor.as_deref() == Some(p))
                .unwrap()
        };
        // P: t1 (s1 = 1/2), t2 (s2a = 0, s2b = 1 -> 1/2); clean 1 and 1/2.
        let ap = find("A", "P");
        assert_eq!((ap.tasks, ap.states), (2, 3));
        close(ap.clean.value, 0.75);
        close(ap.residual.value, 0.5);
        close(ap.gap_pp.value, 25.0);
        close(ap.conditional_failure.value, 0.5);
        // Q: t2 (s2c = 1/2), t3 (s3 = 1); clean 1/2 and 0.
        let aq = find("A", "Q");
        close(aq.clean.value, 0.25);
        close(aq.residual.value, 0.75);
        close(aq.gap_pp.value, -50.0);
        close(aq.conditional_failure.value, 0.5);
        let bq = find("B", "Q");
        assert_eq!(bq.conditional_failure.value, None);
        assert_eq!(a.inherited.by_predecessor.len(), 4);
    }

    #[test]
    fn min_trials_drops_cells_and_reports_them() {
        let a = analyze(
            &example(),
            &Options {
                min_trials: 2,
                ..opts()
            },
        );
        let ra = &a.inherited.by_agent[0];
        // t2 keeps only s2c (4 valid); t3 has a single clean and residual trial.
        assert_eq!((ra.tasks, ra.states, ra.excluded_tasks), (2, 2, 1));
        close(ra.clean.value, 0.75);
        close(ra.residual.value, 0.5);
        let states: Vec<_> = a
            .exclusions
            .iter()
            .filter(|e| e.agent == "A" && e.effect == Effect::StateExcluded)
            .map(|e| e.state.clone().unwrap())
            .collect();
        assert_eq!(states, vec!["s2a", "s2b"]);
        let t3: Vec<_> = a
            .exclusions
            .iter()
            .filter(|e| e.agent == "A" && e.task == "t3")
            .collect();
        assert_eq!(t3.len(), 2);
        assert!(t3
            .iter()
            .all(|e| e.effect == Effect::TaskExcluded && e.valid_trials == 1));
    }

    #[test]
    fn a_state_the_agent_did_not_run_is_reported() {
        let mut ds = example();
        // B runs t2's state s2c only.
        add(&mut ds, "t2", Clean, "clean", None, "B", &[Fail]);
        add(&mut ds, "t2", Residual, "s2c", Some("Q"), "B", &[Pass]);
        let a = analyze(&ds, &opts());
        let rb = &a.inherited.by_agent[1];
        assert_eq!((rb.tasks, rb.states), (3, 3));
        let b_ex: Vec<_> = a.exclusions.iter().filter(|e| e.agent == "B").collect();
        assert_eq!(b_ex.len(), 2);
        assert!(b_ex
            .iter()
            .all(|e| e.effect == Effect::StateExcluded && e.reason == "no trials"));
        // Per predecessor, t2 drops out of B's P row: its P states are the missing ones.
        let bp = a
            .inherited
            .by_predecessor
            .iter()
            .find(|r| r.agent == "B" && r.predecessor.as_deref() == Some("P"))
            .unwrap();
        assert_eq!((bp.tasks, bp.excluded_tasks), (1, 1));
    }

    #[test]
    fn gap_interval_is_paired() {
        // Clean and residual success are equal on every task but vary across
        // tasks: the clean interval is wide, the gap interval is exactly 0.
        let mut ds = Dataset::default();
        for (i, reps) in [
            [Pass, Pass],
            [Pass, Fail],
            [Fail, Fail],
            [Pass, Pass],
            [Fail, Pass],
        ]
        .iter()
        .enumerate()
        {
            let task = format!("t{i}");
            add(&mut ds, &task, Clean, "clean", None, "A", reps);
            add(
                &mut ds,
                &task,
                Residual,
                &format!("s{i}"),
                Some("P"),
                "A",
                reps,
            );
        }
        let a = analyze(
            &ds,
            &Options {
                draws: 1000,
                ..opts()
            },
        );
        let r = &a.inherited.by_agent[0];
        let clean = r.clean.ci.unwrap();
        assert!(clean.hi - clean.lo > 0.2, "{clean:?}");
        let gap = r.gap_pp.ci.unwrap();
        assert_eq!((gap.lo, gap.hi), (0.0, 0.0));
        assert_eq!(r.clean.ci, r.residual.ci);
    }
}
