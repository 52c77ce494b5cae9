//! Tables of inherited starts: clean vs residual success (Res, Clean, Gap,
//! conditional failure) per agent or per predecessor, and the behaviour
//! signatures of the residual continuations.

use super::Table;
use crate::analysis::{Analysis, InheritedRow};
use crate::report::format::{
    est_csv, est_hdr, mean_view, opt_view, pct, pp, ratio_axis, raw, share_view, with_ci,
};

pub(super) fn inherited(a: &Analysis, by_pred: bool) -> Table {
    let (name, title, rows): (_, _, &[InheritedRow]) = if by_pred {
        (
            "inherited_by_predecessor",
            "Clean vs residual start, by predecessor",
            &a.inherited.by_predecessor,
        )
    } else {
        (
            "inherited_by_agent",
            "Clean vs residual start",
            &a.inherited.by_agent,
        )
    };
    let mut csv_header: Vec<String> = vec!["agent".into()];
    if by_pred {
        csv_header.push("predecessor".into());
    }
    csv_header.extend(["tasks", "states", "excluded_tasks"].map(String::from));
    for p in ["clean", "residual", "gap_pp", "conditional_failure"] {
        csv_header.extend(est_hdr(p));
    }
    csv_header.extend(["conditional_failure_undefined_draws", "clean_solved"].map(String::from));
    let mut view: Vec<&str> = vec!["Agent"];
    if by_pred {
        view.push("Predecessor");
    }
    view.extend([
        "Tasks (states)",
        "Clean",
        "Residual",
        "Gap (pp)",
        "Conditional failure",
        "Excluded tasks",
    ]);
    let hdr: Vec<&str> = csv_header.iter().map(String::as_str).collect();
    let mut t = Table::new(name, title, &hdr, &view);
    for r in rows {
        let mut c = vec![r.agent.clone()];
        if by_pred {
            c.push(r.predecessor.clone().unwrap_or_default());
        }
        c.extend([
            r.tasks.to_string(),
            r.states.to_string(),
            r.excluded_tasks.to_string(),
        ]);
        for e in [&r.clean, &r.residual, &r.gap_pp, &r.conditional_failure] {
            c.extend(est_csv(e));
        }
        c.push(
            r.conditional_failure
                .ci
                .map(|ci| ci.undefined_draws.to_string())
                .unwrap_or_default(),
        );
        c.push(format!("{}", r.clean_solved));
        t.csv_rows.push(c);

        let mut v = vec![r.agent.clone()];
        if by_pred {
            v.push(r.predecessor.clone().unwrap_or_default());
        }
        v.extend([
            format!("{} ({})", r.tasks, r.states),
            with_ci(&r.clean, pct),
            with_ci(&r.residual, pct),
            with_ci(&r.gap_pp, pp),
            format!(
                "{} (n={})",
                with_ci(&r.conditional_failure, pct),
                r.conditional_failure.tasks
            ),
            r.excluded_tasks.to_string(),
        ]);
        t.view_rows.push(v);
        let who = match &r.predecessor {
            Some(p) => format!("{} (predecessor {p})", r.agent),
            None => r.agent.clone(),
        };
        if r.conditional_failure.value.is_none() && r.tasks > 0 {
            t.notes.push(format!(
                "Conditional failure rate of {who} is undefined: it solved none of its {} task(s) from the clean start.",
                r.tasks
            ));
        }
        if r.tasks == 0 {
            t.notes.push(format!(
                "{who}: no task has both a clean and a residual value; see the excluded tasks."
            ));
        }
        if let Some(ci) = r.conditional_failure.ci.filter(|ci| ci.undefined_draws > 0) {
            t.notes.push(format!(
                "Conditional failure interval of {who}: {} of {} draws resampled no clean-solved task and are left out of the percentiles.",
                ci.undefined_draws, a.meta.draws
            ));
        }
    }
    t.notes.push(
        "Res: success averaged over a task's states, then over tasks. Clean: the same tasks. \
         Gap = 100 x (Clean - Res), the mean of per-task differences. Conditional failure: \
         sum c(1 - r) / sum c, i.e. the residual failure rate on the tasks solved from clean."
            .into(),
    );
    t
}

pub(super) fn signatures(a: &Analysis) -> Table {
    let csv = [
        "agent",
        "predecessor",
        "continuations",
        "not_normally_submitted",
        "same_failing_count",
        "same_failing_of",
        "same_failing",
        "same_failing_unknown",
        "kept",
        "kept_n",
        "kept_undefined",
        "left_out_continuations",
        "left_out_none",
        "left_out_unknown",
        "opened",
        "opened_n",
        "changed",
        "changed_n",
        "clean_opened",
        "clean_opened_n",
        "clean_changed",
        "clean_changed_n",
        "steps_ratio_median",
        "steps_ratio_tasks",
        "steps_ratio_undefined",
    ];
    let view = [
        "Agent",
        "Predecessor",
        "Continuations",
        "Same-failing",
        "Kept",
        "Left-out: opened",
        "Left-out: changed",
        "Clean: changed",
        "Clean: opened",
        "Steps ratio (tasks)",
    ];
    let mut t = Table::new("signatures", "Behaviour signatures", &csv, &view);
    for s in &a.inherited.signatures {
        let l = &s.left_out;
        t.csv_rows.push(vec![
            s.agent.clone(),
            s.predecessor.clone().unwrap_or_default(),
            s.continuations.to_string(),
            s.not_normally_submitted.to_string(),
            s.same_failing.count.to_string(),
            s.same_failing.of.to_string(),
            raw(s.same_failing.value),
            s.same_failing.unknown.to_string(),
            raw(s.kept.value),
            s.kept.n.to_string(),
            s.kept.undefined.to_string(),
            l.continuations.to_string(),
            l.none_left_out.to_string(),
            l.unknown.to_string(),
            raw(l.opened.value),
            l.opened.n.to_string(),
            raw(l.changed.value),
            l.changed.n.to_string(),
            raw(l.clean_opened.value),
            l.clean_opened.n.to_string(),
            raw(l.clean_changed.value),
            l.clean_changed.n.to_string(),
            raw(s.steps_ratio.median),
            s.steps_ratio.tasks.to_string(),
            s.steps_ratio.undefined.to_string(),
        ]);
        t.view_rows.push(vec![
            s.agent.clone(),
            s.predecessor.clone().unwrap_or_else(|| "all".into()),
            format!(
                "{} (+{} left out)",
                s.continuations, s.not_normally_submitted
            ),
            share_view(&s.same_failing),
            mean_view(&s.kept),
            mean_view(&l.opened),
            mean_view(&l.changed),
            mean_view(&l.clean_changed),
            mean_view(&l.clean_opened),
            format!(
                "{} ({})",
                opt_view(s.steps_ratio.median, ratio_axis),
                s.steps_ratio.tasks
            ),
        ]);
    }
    t.notes.push(
        "Over normally submitted residual continuations only (submitted, verdict pass or fail); \
         \"left out\" counts the others. Same-failing: share of failed continuations whose final \
         failing tests equal the start's exactly. Kept: mean share of the predecessor's added lines \
         still present in order (LCS). Left-out files: reference files the predecessor did not \
         change; mean share per continuation opened (content shown) and changed, next to the same \
         agent's clean runs on the same files. Steps ratio: continuation steps over the mean steps \
         of the agent's clean runs of the task, averaged per task, median across tasks."
            .into(),
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::two_task_residuals;
    use crate::{analyze, Options};

    #[test]
    fn clean_vs_residual_by_agent() {
        let opts = Options {
            draws: 0,
            ..Options::default()
        };
        let a = analyze(&two_task_residuals("A"), &opts);
        let t = inherited(&a, false);
        assert_eq!(t.name, "inherited_by_agent");
        assert_eq!(t.csv_header.len(), 4 + 4 * 4 + 2);
        assert_eq!(
            &t.csv_header[..5],
            ["agent", "tasks", "states", "excluded_tasks", "clean"]
        );
        // No bootstrap: interval columns are empty.
        let csv: Vec<&str> = t.csv_rows[0].iter().map(String::as_str).collect();
        assert_eq!(
            csv,
            [
                "A", "2", "2", "0", // tasks, states, excluded
                "1", "", "", "2", // clean
                "0.25", "", "", "2", // residual
                "75", "", "", "2", // gap
                "0.75", "", "", "2", // conditional failure
                "", "2", // undefined draws, clean solved
            ]
        );
        assert_eq!(
            t.view_rows,
            [["A", "2 (2)", "100.0%", "25.0%", "+75.0", "75.0% (n=2)", "0"]]
        );
        // Only the definitions note: nothing is undefined.
        assert_eq!(t.notes.len(), 1);
        assert!(t.notes[0].starts_with("Res: success averaged"));

        let by_pred = inherited(&a, true);
        assert_eq!(by_pred.name, "inherited_by_predecessor");
        assert_eq!(&by_pred.csv_header[..2], ["agent", "predecessor"]);
        assert_eq!(&by_pred.view_rows[0][..3], ["A", "P", "2 (2)"]);
    }

    #[test]
    fn undefined_conditional_failure_is_spelled_out() {
        use crate::model::{Condition, Dataset, Outcome};
        use crate::testutil::add;
        // B never solves a task from the clean start.
        let mut ds = Dataset::default();
        add(
            &mut ds,
            "t1",
            Condition::Clean,
            "clean",
            None,
            "B",
            &[Outcome::Fail],
        );
        add(
            &mut ds,
            "t1",
            Condition::Residual,
            "s1",
            Some("P"),
            "B",
            &[Outcome::Pass],
        );
        let opts = Options {
            draws: 0,
            ..Options::default()
        };
        let t = inherited(&analyze(&ds, &opts), false);
        assert_eq!(t.view_rows[0][5], "undefined (n=0)");
        assert_eq!(
            t.notes[0],
            "Conditional failure rate of B is undefined: it solved none of its 1 task(s) from the clean start."
        );
    }
}
