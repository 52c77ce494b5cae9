//! Behaviour signatures of residual continuations, per agent and per
//! (agent, predecessor): same-failing share, kept lines (LCS of the
//! predecessor's added lines), left-out reference files opened and changed
//! next to the agent's clean runs, and the steps ratio.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::analysis::{LeftOut, Mean, Share, SignatureRow, StepsRatio};
use crate::model::{Condition, Dataset, Outcome, Trial};
use crate::opened::ContentViews;
use crate::patch::{lcs_len, Patch};
use crate::stats::median;

/// What one continuation contributes to the signatures.
struct Continuation<'a> {
    agent: &'a str,
    pred: &'a str,
    task: &'a str,
    /// `Some` for failed continuations: whether the final failing set equals
    /// the start's (`None` inside when the start state is unknown).
    same_failing: Option<Option<bool>>,
    kept: Option<f64>,
    left_out: LeftOutRecord,
    steps_ratio: Option<f64>,
}

enum LeftOutRecord {
    Unknown,
    NoneLeftOut,
    Files {
        opened: Option<f64>,
        changed: Option<f64>,
        clean_opened: Option<f64>,
        clean_changed: Option<f64>,
    },
}

/// Of the lines the predecessor added (per file, in order), the share the
/// final state still has, matched by LCS against the final patch's added
/// lines of the same file. `None` when the predecessor added no lines.
pub(crate) fn kept_share(state: &Patch, final_patch: &Patch) -> Option<f64> {
    let (mut kept, mut total) = (0usize, 0usize);
    for f in &state.files {
        let Some(path) = f.new_path.as_deref() else {
            continue;
        };
        if f.added.is_empty() {
            continue;
        }
        let pred: Vec<&str> = f.added.iter().map(String::as_str).collect();
        let fin: Vec<&str> = final_patch.added_lines(path).collect();
        kept += lcs_len(&pred, &fin);
        total += pred.len();
    }
    (total > 0).then(|| kept as f64 / total as f64)
}

fn share_of(files: &[&str], hit: impl Fn(&str) -> bool) -> f64 {
    files.iter().filter(|f| hit(f)).count() as f64 / files.len() as f64
}

pub(super) fn signatures(ds: &Dataset) -> Vec<SignatureRow> {
    // Normally submitted clean runs per (agent, task), for comparisons.
    let mut clean_runs: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for (i, t) in ds.trials.iter().enumerate() {
        if t.row.condition == Condition::Clean && t.row.is_normally_submitted() {
            clean_runs
                .entry((&t.row.agent, &t.row.task))
                .or_default()
                .push(i);
        }
    }
    let clean_views: HashMap<usize, ContentViews> = clean_runs
        .values()
        .flatten()
        .filter_map(|&i| {
            let t = &ds.trials[i];
            let traj = t.trajectory.as_ref()?;
            let mut known: Vec<&str> = ds
                .tasks
                .get(&t.row.task)
                .map(|ti| {
                    ti.reference_changed_files
                        .iter()
                        .map(String::as_str)
                        .collect()
                })
                .unwrap_or_default();
            if let Some(p) = &t.final_patch {
                known.extend(p.changed_paths());
            }
            Some((i, ContentViews::from_trajectory(traj, known)))
        })
        .collect();

    let mut conts: Vec<Continuation<'_>> = Vec::new();
    let mut skipped: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for t in &ds.trials {
        let r = &t.row;
        if r.condition != Condition::Residual || r.is_infra_error() {
            continue;
        }
        let pred = r.predecessor.as_deref().unwrap_or("");
        if !r.is_normally_submitted() {
            *skipped.entry((&r.agent, pred)).or_default() += 1;
            continue;
        }
        let state = ds.states.get(&r.start_state);
        // Without per-test verdicts the final failing set is unknown, not empty.
        let same_failing = (r.outcome == Outcome::Fail).then(|| {
            state.filter(|_| !r.tests.is_empty()).map(|s| {
                let start: BTreeSet<&str> = s.failing_tests.iter().map(String::as_str).collect();
                r.failing_tests() == start
            })
        });
        let state_patch = state.and_then(|s| s.patch.as_ref());
        let kept = match (state_patch, &t.final_patch) {
            (Some(sp), Some(fp)) => kept_share(sp, fp),
            _ => None,
        };
        let clean: Option<Vec<&Trial>> = clean_runs
            .get(&(r.agent.as_str(), r.task.as_str()))
            .map(|v| v.iter().map(|&i| &ds.trials[i]).collect());
        let clean_idx = clean_runs.get(&(r.agent.as_str(), r.task.as_str()));
        let left_out = match (ds.tasks.get(&r.task), state_patch) {
            (Some(task), Some(sp)) => {
                let touched = sp.changed_paths();
                let files: Vec<&str> = task
                    .reference_changed_files
                    .iter()
                    .map(String::as_str)
                    .filter(|f| !touched.contains(f))
                    .collect();
                if files.is_empty() {
                    LeftOutRecord::NoneLeftOut
                } else {
                    let opened = t.trajectory.as_ref().map(|traj| {
                        let mut known: Vec<&str> = task
                            .reference_changed_files
                            .iter()
                            .map(String::as_str)
                            .collect();
                        known.extend(touched.iter().copied());
                        if let Some(fp) = &t.final_patch {
                            known.extend(fp.changed_paths());
                        }
                        let views = ContentViews::from_trajectory(traj, known);
                        share_of(&files, |f| views.shows(f))
                    });
                    let changed = t
                        .final_patch
                        .as_ref()
                        .map(|fp| share_of(&files, |f| fp.touches(f)));
                    let clean_changed = clean.as_ref().and_then(|runs| {
                        let v: Vec<f64> = runs
                            .iter()
                            .filter_map(|c| c.final_patch.as_ref())
                            .map(|fp| share_of(&files, |f| fp.touches(f)))
                            .collect();
                        crate::stats::mean(&v)
                    });
                    let clean_opened = clean_idx.and_then(|runs| {
                        let v: Vec<f64> = runs
                            .iter()
                            .filter_map(|i| clean_views.get(i))
                            .map(|views| share_of(&files, |f| views.shows(f)))
                            .collect();
                        crate::stats::mean(&v)
                    });
                    LeftOutRecord::Files {
                        opened,
                        changed,
                        clean_opened,
                        clean_changed,
                    }
                }
            }
            _ => LeftOutRecord::Unknown,
        };
        let steps_ratio = clean.as_ref().and_then(|runs| {
            let mean = runs.iter().map(|c| c.row.steps as f64).sum::<f64>() / runs.len() as f64;
            (mean > 0.0).then(|| r.steps as f64 / mean)
        });
        conts.push(Continuation {
            agent: &r.agent,
            pred,
            task: &r.task,
            same_failing,
            kept,
            left_out,
            steps_ratio,
        });
    }

    let mut groups: BTreeSet<(&str, Option<&str>)> = BTreeSet::new();
    for c in &conts {
        groups.insert((c.agent, None));
        groups.insert((c.agent, Some(c.pred)));
    }
    for (agent, pred) in skipped.keys() {
        groups.insert((agent, None));
        groups.insert((agent, Some(pred)));
    }
    // Overall rows first, then per predecessor.
    let mut order: Vec<(&str, Option<&str>)> = groups.into_iter().collect();
    order.sort_by_key(|(a, p)| (p.is_some(), *a, *p));
    order
        .into_iter()
        .map(|(agent, pred)| {
            let members: Vec<&Continuation<'_>> = conts
                .iter()
                .filter(|c| c.agent == agent && (pred.is_none() || pred == Some(c.pred)))
                .collect();
            let not_normally_submitted = skipped
                .iter()
                .filter(|((a, p), _)| *a == agent && (pred.is_none() || pred == Some(*p)))
                .map(|(_, n)| n)
                .sum();
            signature_row(agent, pred, &members, not_normally_submitted)
        })
        .collect()
}

fn signature_row(
    agent: &str,
    pred: Option<&str>,
    members: &[&Continuation<'_>],
    not_normally_submitted: usize,
) -> SignatureRow {
    let mut same = Share::default();
    for c in members {
        match c.same_failing {
            Some(Some(true)) => {
                same.count += 1;
                same.of += 1;
            }
            Some(Some(false)) => same.of += 1,
            Some(None) => same.unknown += 1,
            None => {}
        }
    }
    same.value = (same.of > 0).then(|| same.count as f64 / same.of as f64);

    let kept = Mean::of(&members.iter().map(|c| c.kept).collect::<Vec<_>>());

    let mut left = LeftOut::default();
    let (mut opened, mut changed, mut c_opened, mut c_changed) = (vec![], vec![], vec![], vec![]);
    for c in members {
        match &c.left_out {
            LeftOutRecord::Unknown => left.unknown += 1,
            LeftOutRecord::NoneLeftOut => left.none_left_out += 1,
            LeftOutRecord::Files {
                opened: o,
                changed: ch,
                clean_opened: co,
                clean_changed: cc,
            } => {
                left.continuations += 1;
                opened.push(*o);
                changed.push(*ch);
                c_opened.push(*co);
                c_changed.push(*cc);
            }
        }
    }
    left.opened = Mean::of(&opened);
    left.changed = Mean::of(&changed);
    left.clean_opened = Mean::of(&c_opened);
    left.clean_changed = Mean::of(&c_changed);

    let mut per_task: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut undefined = 0;
    for c in members {
        match c.steps_ratio {
            Some(v) => per_task.entry(c.task).or_default().push(v),
            None => undefined += 1,
        }
    }
    let task_means: Vec<f64> = per_task
        .values()
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
        .collect();
    let steps_ratio = StepsRatio {
        tasks: task_means.len(),
        median: median(task_means),
        continuations: members.len() - undefined,
        undefined,
    };

    SignatureRow {
        agent: agent.to_string(),
        predecessor: pred.map(str::to_string),
        continuations: members.len(),
        not_normally_submitted,
        same_failing: same,
        kept,
        left_out: left,
        steps_ratio,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{StateInfo, TaskInfo, TestResult, TrajectoryCommand};
    use crate::testutil::{close, row};
    use crate::{analyze, Options};
    use Condition::{Clean, Residual};
    use Outcome::{BudgetExhausted, Fail, InfraError, Pass};

    fn opts() -> Options {
        Options {
            draws: 200,
            ..Options::default()
        }
    }

    fn patch(files: &[(&str, &[&str])]) -> Patch {
        let mut text = String::new();
        for (path, added) in files {
            text.push_str(&format!(
                "diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,0 +1,{} @@\n",
                added.len()
            ));
            for l in *added {
                text.push_str(&format!("+{l}\n"));
            }
        }
        Patch::parse(&text).unwrap()
    }

    fn trial(task: &str, cond: Condition, state: &str, outcome: Outcome, steps: u64) -> Trial {
        let pred = (cond == Residual).then_some("P");
        let mut r = row(task, cond, state, pred, "A", outcome);
        r.steps = steps;
        Trial::new(r)
    }

    fn with(mut t: Trial, final_patch: Option<Patch>, traj: &[&str], failing: &[&str]) -> Trial {
        t.final_patch = final_patch;
        if !traj.is_empty() {
            t.trajectory = Some(
                traj.iter()
                    .map(|s| TrajectoryCommand::Shell(s.to_string()))
                    .collect(),
            );
        }
        for f in failing {
            t.row.tests.insert(f.to_string(), TestResult::Fail);
        }
        t.row.tests.insert("T3".into(), TestResult::Pass);
        t
    }

    fn signature_example() -> Dataset {
        let mut ds = Dataset::default();
        ds.tasks.insert(
            "t1".into(),
            TaskInfo {
                task: "t1".into(),
                reference_changed_files: vec!["a.go".into(), "b.go".into(), "c.go".into()],
                f2p: vec![],
                p2p: vec![],
            },
        );
        ds.tasks.insert(
            "t2".into(),
            TaskInfo {
                task: "t2".into(),
                reference_changed_files: vec!["d.go".into()],
                f2p: vec![],
                p2p: vec![],
            },
        );
        ds.states.insert(
            "s1".into(),
            StateInfo {
                state_id: "s1".into(),
                task: "t1".into(),
                predecessor: Some("P".into()),
                failing_tests: ["T1", "T2"].iter().map(|s| s.to_string()).collect(),
                patch: Some(patch(&[("a.go", &["x1", "x2", "x3", "x4"])])),
            },
        );
        ds.states.insert(
            "s2".into(),
            StateInfo {
                state_id: "s2".into(),
                task: "t2".into(),
                predecessor: Some("P".into()),
                failing_tests: Default::default(),
                patch: Some(patch(&[("d.go", &["q"])])),
            },
        );
        // Failed, same failing set (error counts as failing), kept 3/4,
        // opened b.go only, changed nothing left out.
        let mut c1 = with(
            trial("t1", Residual, "s1", Fail, 5),
            Some(patch(&[("a.go", &["x1", "x3", "x4", "y"])])),
            &["git status", "cat b.go"],
            &["T1"],
        );
        c1.row.tests.insert("T2".into(), TestResult::Error);
        ds.trials.push(c1);
        // Failed, different failing set, kept 4/4, opened both, changed b.go.
        ds.trials.push(with(
            trial("t1", Residual, "s1", Fail, 15),
            Some(patch(&[
                ("a.go", &["x1", "x2", "x3", "x4"]),
                ("b.go", &["z"]),
            ])),
            &["grep -rn foo ."],
            &["T1"],
        ));
        // Passed, kept 1/4 (order matters), changed both, opened none.
        ds.trials.push(with(
            trial("t1", Residual, "s1", Pass, 10),
            Some(patch(&[
                ("a.go", &["x4", "x3", "x2", "x1"]),
                ("b.go", &["z"]),
                ("c.go", &["w"]),
            ])),
            &["ls", "rg --files", "grep -l foo b.go c.go"],
            &[],
        ));
        // Not normally submitted, and an infrastructure failure: left out.
        ds.trials
            .push(trial("t1", Residual, "s1", BudgetExhausted, 99));
        ds.trials.push(trial("t1", Residual, "s1", InfraError, 99));
        // The same agent's clean runs of t1: one changed b.go and opened
        // c.go, one changed both (no trajectory); 20 steps on average.
        ds.trials.push(with(
            trial("t1", Clean, "clean", Pass, 10),
            Some(patch(&[("b.go", &["z"])])),
            &["cat c.go"],
            &[],
        ));
        ds.trials.push(with(
            trial("t1", Clean, "clean", Fail, 30),
            Some(patch(&[("b.go", &["z"]), ("c.go", &["w"])])),
            &[],
            &[],
        ));
        // t2: nothing left out, no final patch, steps 30 against clean 10.
        ds.trials
            .push(with(trial("t2", Residual, "s2", Pass, 30), None, &[], &[]));
        ds.trials
            .push(with(trial("t2", Clean, "clean", Pass, 10), None, &[], &[]));
        ds
    }

    #[test]
    fn behaviour_signatures() {
        let a = analyze(&signature_example(), &opts());
        assert_eq!(a.inherited.signatures.len(), 2);
        for s in &a.inherited.signatures {
            assert_eq!(s.agent, "A");
            assert_eq!((s.continuations, s.not_normally_submitted), (4, 1));
            assert_eq!(
                s.same_failing,
                Share {
                    count: 1,
                    of: 2,
                    value: Some(0.5),
                    unknown: 0
                }
            );
            // (3/4 + 1 + 1/4) / 3; t2 has no final patch.
            close(s.kept.value, 2.0 / 3.0);
            assert_eq!((s.kept.n, s.kept.undefined), (3, 1));
            let l = &s.left_out;
            assert_eq!((l.continuations, l.none_left_out, l.unknown), (3, 1, 0));
            // Left out: b.go, c.go. Opened 1/2, 1, 0; changed 0, 1/2, 1.
            close(l.opened.value, 0.5);
            close(l.changed.value, 0.5);
            // Clean runs changed 1/2 and 1 of them; only one has a trajectory.
            close(l.clean_changed.value, 0.75);
            close(l.clean_opened.value, 0.5);
            // t1: (5 + 15 + 10) / 20 / 3 = 0.5; t2: 30 / 10 = 3; median 1.75.
            close(s.steps_ratio.median, 1.75);
            assert_eq!((s.steps_ratio.tasks, s.steps_ratio.undefined), (2, 0));
        }
        assert_eq!(a.inherited.signatures[0].predecessor, None);
        assert_eq!(a.inherited.signatures[1].predecessor.as_deref(), Some("P"));
    }

    #[test]
    fn failed_continuation_without_test_verdicts_is_unknown() {
        let mut ds = signature_example();
        let mut t = trial("t1", Residual, "s1", Fail, 5);
        t.row.tests.clear();
        ds.trials.push(t);
        let a = analyze(&ds, &opts());
        let s = &a.inherited.signatures[0].same_failing;
        assert_eq!((s.count, s.of, s.unknown), (1, 2, 1));
    }

    #[test]
    fn kept_counts_added_lines_in_order_and_ignores_deletions() {
        let state = Patch::parse(
            "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,2 +1,4 @@\n-old\n+a\n+b\n ctx\n+c\n\
             diff --git a/gone b/gone\ndeleted file mode 100644\n--- a/gone\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n",
        )
        .unwrap();
        let fin = patch(&[("f", &["a", "c", "new"])]);
        assert_eq!(kept_share(&state, &fin), Some(2.0 / 3.0));
        assert_eq!(kept_share(&state, &Patch::default()), Some(0.0));
        let only_deletes =
            Patch::parse("diff --git a/g b/g\n--- a/g\n+++ b/g\n@@ -1 +0,0 @@\n-x\n").unwrap();
        assert_eq!(kept_share(&only_deletes, &fin), None);
    }
}
