//! The analysis itself: the cells of the trials, then the inherited-failure and
//! recovery sections, the outcome counts and the losses of candidate states, put
//! together as an [`Analysis`].

use std::collections::BTreeMap;

use crate::analysis::*;
use crate::cells::Cells;
use crate::model::{Condition, Dataset, Outcome};
use crate::{inherited, recovery, Options};

/// Computes everything the report shows.
pub fn analyze(ds: &Dataset, opts: &Options) -> Analysis {
    let cells = Cells::build(ds, opts.min_trials);
    let mut exclusions = Vec::new();
    let inherited = inherited::analyze(ds, &cells, opts, &mut exclusions);
    let recovery = recovery::analyze(&cells, opts, &mut exclusions);
    Analysis {
        meta: Meta {
            runs: ds.runs.iter().map(|r| r.run_id.clone()).collect(),
            trials: ds.trials.len(),
            infra_errors_excluded: ds.trials.iter().filter(|t| t.row.is_infra_error()).count(),
            draws: opts.draws,
            seed: opts.seed,
            min_trials: cells.min_trials,
            confidence: 0.95,
        },
        outcomes: outcome_counts(ds),
        inherited,
        recovery,
        exclusions,
        losses: losses(ds),
    }
}

fn outcome_counts(ds: &Dataset) -> Vec<OutcomeCounts> {
    let mut map: BTreeMap<(Condition, &str), OutcomeCounts> = BTreeMap::new();
    for t in &ds.trials {
        let r = &t.row;
        let c = map
            .entry((r.condition, &r.agent))
            .or_insert_with(|| OutcomeCounts {
                condition: r.condition,
                agent: r.agent.clone(),
                pass: 0,
                fail: 0,
                budget_exhausted: 0,
                no_submit: 0,
                infra_error: 0,
                normally_submitted: 0,
            });
        match r.outcome {
            Outcome::Pass => c.pass += 1,
            Outcome::Fail => c.fail += 1,
            Outcome::BudgetExhausted => c.budget_exhausted += 1,
            Outcome::NoSubmit => c.no_submit += 1,
            Outcome::InfraError => c.infra_error += 1,
        }
        c.normally_submitted += usize::from(r.is_normally_submitted());
    }
    map.into_values().collect()
}

fn losses(ds: &Dataset) -> Losses {
    use crate::model::STAGES;
    let ends = &ds.candidates;
    let at = |stage: &str| ends.iter().filter(|e| !e.kept && e.stage == stage).count();
    let mut reached = ends.len();
    let mut stages = Vec::new();
    for s in STAGES {
        let dropped = at(s);
        stages.push(StageCount {
            stage: s.to_string(),
            reached,
            dropped,
        });
        reached -= dropped.min(reached);
    }
    let other = ends
        .iter()
        .filter(|e| !e.kept && !STAGES.contains(&e.stage.as_str()))
        .count();
    if other > 0 {
        stages.push(StageCount {
            stage: "other".into(),
            reached,
            dropped: other,
        });
    }
    let group = |key: fn(&crate::model::CandidateEnd) -> &str| {
        let mut names: Vec<&str> = ends.iter().map(key).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|n| {
                let of: Vec<_> = ends.iter().filter(|e| key(e) == n).collect();
                let per = STAGES
                    .iter()
                    .map(|s| of.iter().filter(|e| !e.kept && e.stage == *s).count())
                    .collect();
                (n.to_string(), per, of.iter().filter(|e| e.kept).count())
            })
            .collect::<Vec<_>>()
    };
    Losses {
        candidates: ends.len(),
        kept: ends.iter().filter(|e| e.kept).count(),
        stages,
        by_predecessor: group(|e| e.predecessor.as_str()),
        by_task: group(|e| e.task.as_str()),
        dropped: ends.iter().filter(|e| !e.kept).cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::add;
    use Condition::{Clean, Residual};
    use Outcome::{Fail, Pass};

    fn dataset() -> Dataset {
        let mut ds = Dataset::default();
        for i in 0..12 {
            let t = format!("t{i}");
            let c = if i % 3 == 0 {
                [Fail, Fail]
            } else {
                [Pass, Fail]
            };
            let r = if i % 4 == 0 {
                [Pass, Pass]
            } else {
                [Fail, Fail]
            };
            add(&mut ds, &t, Clean, "clean", None, "A", &c);
            add(&mut ds, &t, Residual, &format!("s{i}"), Some("P"), "A", &r);
        }
        ds
    }

    #[test]
    fn bootstrap_is_deterministic_for_a_seed() {
        let ds = dataset();
        let o = Options::default();
        let json = |a: &Analysis| serde_json::to_string(a).unwrap();
        assert_eq!(json(&analyze(&ds, &o)), json(&analyze(&ds, &o)));
        let other = analyze(
            &ds,
            &Options {
                seed: 1,
                ..o.clone()
            },
        );
        assert_ne!(json(&analyze(&ds, &o)), json(&other));
        // Point estimates do not depend on the seed.
        assert_eq!(
            other.inherited.by_agent[0].gap_pp.value,
            analyze(&ds, &o).inherited.by_agent[0].gap_pp.value
        );
        // No draws: no intervals, same estimates.
        let none = analyze(&ds, &Options { draws: 0, ..o });
        assert!(none.inherited.by_agent[0].clean.ci.is_none());
    }

    #[test]
    fn outcome_counts_include_everything() {
        let mut ds = dataset();
        add(
            &mut ds,
            "t0",
            Clean,
            "clean",
            None,
            "A",
            &[Outcome::InfraError, Outcome::NoSubmit],
        );
        let a = analyze(
            &ds,
            &Options {
                draws: 0,
                ..Options::default()
            },
        );
        let clean = a.outcomes.iter().find(|o| o.condition == Clean).unwrap();
        assert_eq!(
            (clean.pass, clean.fail, clean.infra_error, clean.no_submit),
            (8, 16, 1, 1)
        );
        assert_eq!(clean.normally_submitted, 24);
        assert_eq!(a.meta.infra_errors_excluded, 1);
    }
}
