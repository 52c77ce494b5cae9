//! Builders for hand-made datasets in unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::model::{Condition, Outcome, TrialRow};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A normally submitted (for pass/fail) row with a fresh trial id.
pub fn row(
    task: &str,
    condition: Condition,
    state: &str,
    pred: Option<&str>,
    agent: &str,
    outcome: Outcome,
) -> TrialRow {
    TrialRow {
        run_id: "run".into(),
        trial_id: format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        task: task.into(),
        condition,
        start_state: state.into(),
        predecessor: pred.map(str::to_string),
        agent: agent.into(),
        replicate: 0,
        outcome,
        submitted: matches!(outcome, Outcome::Pass | Outcome::Fail),
        tests: Default::default(),
        steps: 10,
        wall_ms: 1000,
        infra_attempts: 1,
    }
}

use crate::model::{Dataset, Trial};

/// Add one trial per outcome (replicates of one cell).
pub fn add(
    ds: &mut Dataset,
    task: &str,
    condition: Condition,
    state: &str,
    pred: Option<&str>,
    agent: &str,
    outcomes: &[Outcome],
) {
    for (i, o) in outcomes.iter().enumerate() {
        let mut r = row(task, condition, state, pred, agent, *o);
        r.replicate = i as u32;
        ds.trials.push(Trial::new(r));
    }
}

/// Equal within 1e-12.
#[track_caller]
pub fn close(a: Option<f64>, b: f64) {
    let a = a.expect("a defined value");
    assert!((a - b).abs() <= 1e-12, "{a} != {b}");
}

/// Agent `agent` on two tasks, from the clean start (t1: pass, pass; t2:
/// pass) and from predecessor P's failed states (s1 of t1: pass, fail; s2
/// of t2: fail). Clean = 1, Res = (1/2 + 0) / 2 = 1/4, Gap = 75 pp,
/// conditional failure = 3/4.
pub fn two_task_residuals(agent: &str) -> Dataset {
    use Condition::{Clean, Residual};
    use Outcome::{Fail, Pass};
    let mut ds = Dataset::default();
    add(&mut ds, "t1", Clean, "clean", None, agent, &[Pass, Pass]);
    add(
        &mut ds,
        "t1",
        Residual,
        "s1",
        Some("P"),
        agent,
        &[Pass, Fail],
    );
    add(&mut ds, "t2", Clean, "clean", None, agent, &[Pass]);
    add(&mut ds, "t2", Residual, "s2", Some("P"), agent, &[Fail]);
    ds
}
