//! The report's content: tables (CSV and display forms), figures, and one
//! document model rendered to Markdown and to HTML.

use std::fmt::Write;

use super::svg::{bars, dot_whisker, Axis, Point, Row};
use super::{esc, Figure};
use crate::analysis::{Analysis, Contrast, Estimate, InheritedRow, Mean, Share};

/// A table in two forms: CSV (raw numbers) and display (rounded text).
#[derive(Debug, Clone)]
pub struct Table {
    /// CSV file stem.
    pub name: &'static str,
    pub title: String,
    pub csv_header: Vec<String>,
    pub csv_rows: Vec<Vec<String>>,
    pub view_header: Vec<String>,
    pub view_rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    fn new(name: &'static str, title: &str, csv_header: &[&str], view_header: &[&str]) -> Self {
        Table {
            name,
            title: title.to_string(),
            csv_header: csv_header.iter().map(|s| s.to_string()).collect(),
            csv_rows: Vec::new(),
            view_header: view_header.iter().map(|s| s.to_string()).collect(),
            view_rows: Vec::new(),
            notes: Vec::new(),
        }
    }
}

// ---- number formatting -------------------------------------------------

fn raw(v: Option<f64>) -> String {
    v.map(|v| format!("{v}")).unwrap_or_default()
}

fn est_csv(e: &Estimate) -> Vec<String> {
    vec![
        raw(e.value),
        raw(e.ci.map(|c| c.lo)),
        raw(e.ci.map(|c| c.hi)),
        e.tasks.to_string(),
    ]
}

fn est_hdr(p: &str) -> Vec<String> {
    vec![
        p.to_string(),
        format!("{p}_lo"),
        format!("{p}_hi"),
        format!("{p}_tasks"),
    ]
}

fn with_ci(e: &Estimate, f: impl Fn(f64) -> String) -> String {
    match (e.value, e.ci) {
        (None, _) => "undefined".into(),
        (Some(v), Some(ci)) => format!("{} [{}, {}]", f(v), f(ci.lo), f(ci.hi)),
        (Some(v), None) => f(v),
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn pct0(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

fn pp(v: f64) -> String {
    format!("{v:+.1}")
}

fn rate(v: f64) -> String {
    format!("{v:.3}")
}

fn signed(v: f64) -> String {
    // Keep "+0.000" from printing as "-0.000".
    let v = if v.abs() < 5e-4 { 0.0 } else { v };
    format!("{v:+.3}")
}

fn ratio_axis(v: f64) -> String {
    format!("{v:.2}")
}

fn share_view(s: &Share) -> String {
    let unknown = if s.unknown > 0 {
        format!("; {} unknown", s.unknown)
    } else {
        String::new()
    };
    match s.value {
        Some(v) => format!("{} ({}/{}{unknown})", pct(v), s.count, s.of),
        None => format!("undefined (0/0{unknown})"),
    }
}

fn mean_view(m: &Mean) -> String {
    let undefined = if m.undefined > 0 {
        format!("; {} undefined", m.undefined)
    } else {
        String::new()
    };
    match m.value {
        Some(v) => format!("{} (n={}{undefined})", pct(v), m.n),
        None => format!("undefined (n=0{undefined})"),
    }
}

fn opt_view(v: Option<f64>, f: fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "undefined".into())
}

// ---- tables ------------------------------------------------------------

pub(crate) fn build(a: &Analysis) -> Vec<Table> {
    vec![
        outcomes(a),
        inherited(a, false),
        inherited(a, true),
        signatures(a),
        rescue_success(a),
        contrasts(a),
        decomposition(a),
        pooled(a),
        exclusions(a),
        losses(a),
        losses_by(a, false),
        losses_by(a, true),
        drops(a),
    ]
}

/// The residual pipeline, stage by stage.
fn losses(a: &Analysis) -> Table {
    let cols = ["stage", "reached", "dropped", "left"];
    let mut t = Table::new(
        "residual_losses",
        "Residual candidates, stage by stage",
        &cols,
        &cols,
    );
    for s in &a.losses.stages {
        let row = vec![
            s.stage.clone(),
            s.reached.to_string(),
            s.dropped.to_string(),
            (s.reached - s.dropped.min(s.reached)).to_string(),
        ];
        t.csv_rows.push(row.clone());
        t.view_rows.push(row);
    }
    t.notes.push(format!(
        "{} candidates, {} kept as start states. Stages: {}.",
        a.losses.candidates,
        a.losses.kept,
        crate::STAGES.join(" → ")
    ));
    t
}

/// Dropped per stage, per predecessor or per task.
fn losses_by(a: &Analysis, by_task: bool) -> Table {
    let (name, title, key, rows) = if by_task {
        (
            "residual_losses_by_task",
            "Residual candidates dropped, by task",
            "task",
            &a.losses.by_task,
        )
    } else {
        (
            "residual_losses_by_predecessor",
            "Residual candidates dropped, by predecessor",
            "predecessor",
            &a.losses.by_predecessor,
        )
    };
    let mut cols = vec![key, "candidates"];
    cols.extend(crate::STAGES.iter().copied());
    cols.push("kept");
    let mut t = Table::new(name, title, &cols, &cols);
    for (n, per, kept) in rows {
        let mut row = vec![n.clone(), (per.iter().sum::<usize>() + kept).to_string()];
        row.extend(per.iter().map(|c| c.to_string()));
        row.push(kept.to_string());
        t.csv_rows.push(row.clone());
        t.view_rows.push(row);
    }
    t
}

/// Every dropped candidate and why.
fn drops(a: &Analysis) -> Table {
    let cols = ["run", "candidate", "task", "predecessor", "stage", "reason"];
    let mut t = Table::new(
        "residual_drops",
        "Residual candidates dropped, and why",
        &cols,
        &cols,
    );
    for e in &a.losses.dropped {
        let row = vec![
            e.run_id.clone(),
            e.candidate.clone(),
            e.task.clone(),
            e.predecessor.clone(),
            e.stage.clone(),
            e.reason.clone(),
        ];
        t.csv_rows.push(row.clone());
        t.view_rows.push(row);
    }
    t
}

fn outcomes(a: &Analysis) -> Table {
    let cols = [
        "condition",
        "agent",
        "pass",
        "fail",
        "budget_exhausted",
        "no_submit",
        "infra_error",
        "normally_submitted",
    ];
    let mut t = Table::new("outcomes", "Trial outcomes", &cols, &cols);
    for o in &a.outcomes {
        let row = vec![
            o.condition.as_str().to_string(),
            o.agent.clone(),
            o.pass.to_string(),
            o.fail.to_string(),
            o.budget_exhausted.to_string(),
            o.no_submit.to_string(),
            o.infra_error.to_string(),
            o.normally_submitted.to_string(),
        ];
        t.csv_rows.push(row.clone());
        t.view_rows.push(row);
    }
    t
}

fn inherited(a: &Analysis, by_pred: bool) -> Table {
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

fn signatures(a: &Analysis) -> Table {
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

fn rescue_success(a: &Analysis) -> Table {
    let mut csv: Vec<String> = ["predecessor", "rescuer", "failure_set"]
        .map(String::from)
        .to_vec();
    for p in ["rescue", "rescue_note", "control"] {
        csv.extend(est_hdr(p));
    }
    let hdr: Vec<&str> = csv.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "recovery_success",
        "Rescue success per direction",
        &hdr,
        &[
            "Direction A->B",
            "|F_A|",
            "R(A->B)",
            "Rnote(A->B)",
            "C(B) on F_A",
        ],
    );
    for d in &a.recovery.directions {
        let mut c = vec![
            d.predecessor.clone(),
            d.rescuer.clone(),
            d.failure_set.to_string(),
        ];
        for e in [&d.rescue, &d.rescue_note, &d.control] {
            c.extend(est_csv(e));
        }
        t.csv_rows.push(c);
        t.view_rows.push(vec![
            format!("{}->{}", d.predecessor, d.rescuer),
            d.failure_set.to_string(),
            with_tasks(&d.rescue, rate),
            with_tasks(&d.rescue_note, rate),
            with_tasks(&d.control, rate),
        ]);
    }
    t
}

fn with_tasks(e: &Estimate, f: fn(f64) -> String) -> String {
    format!("{} (n={})", with_ci(e, f), e.tasks)
}

fn contrasts(a: &Analysis) -> Table {
    let csv = [
        "scope",
        "name",
        "contrast",
        "value",
        "lo",
        "hi",
        "tasks",
        "tasks_positive",
        "tasks_negative",
        "tasks_zero",
    ];
    let mut t = Table::new(
        "recovery_contrasts",
        "Recovery contrasts",
        &csv,
        &[
            "Contrast",
            "Scope",
            "Estimate [95% CI]",
            "Tasks",
            "Tasks + / - / 0",
        ],
    );
    let mut push = |scope: &str, name: &str, kind: &str, e: &Estimate, signs: Option<&Contrast>| {
        let mut c = vec![scope.to_string(), name.to_string(), kind.to_string()];
        c.extend(est_csv(e).into_iter().take(3));
        c.push(e.tasks.to_string());
        match signs {
            Some(s) => {
                c.extend([s.tasks_positive, s.tasks_negative, s.tasks_zero].map(|v| v.to_string()))
            }
            None => c.extend([String::new(), String::new(), String::new()]),
        }
        t.csv_rows.push(c);
        t.view_rows.push(vec![
            kind.to_string(),
            if scope == "pooled" {
                format!("pooled {name}")
            } else {
                name.to_string()
            },
            with_ci(e, signed),
            e.tasks.to_string(),
            signs
                .map(|s| {
                    format!(
                        "{} / {} / {}",
                        s.tasks_positive, s.tasks_negative, s.tasks_zero
                    )
                })
                .unwrap_or_default(),
        ]);
    };
    for (kind, pick) in contrast_kinds() {
        for d in &a.recovery.directions {
            if let Some(c) = pick(d) {
                push(
                    "direction",
                    &format!("{}->{}", d.predecessor, d.rescuer),
                    kind,
                    &c.estimate,
                    Some(&c),
                );
            }
        }
        for p in &a.recovery.pooled {
            let e = match kind {
                "HRG" => &p.hrg,
                "FTV" => &p.ftv,
                _ => &p.ctv,
            };
            push("pooled", &p.scope, kind, e, None);
        }
    }
    t.notes.push(
        "HRG(A->B) = R(A->B) - R(A->A); FTV(A->B) = R(A->B) - C(B); CTV(A->B) = Rnote(A->B) - R(A->B); \
         each the mean over tasks of per-task differences (replicates averaged first). Tasks + / - / 0 \
         count tasks by the sign of their mean difference. Pooled: every (direction, task) pair weighs \
         the same; HRG pools the cross directions, FTV and CTV all four."
            .into(),
    );
    t
}

type Pick = fn(&crate::analysis::Direction) -> Option<Contrast>;

fn contrast_kinds() -> [(&'static str, Pick); 3] {
    [
        ("HRG", |d| d.hrg),
        ("FTV", |d| Some(d.ftv)),
        ("CTV", |d| Some(d.ctv)),
    ]
}

fn decomposition(a: &Analysis) -> Table {
    let mut csv: Vec<String> = ["scope", "name", "tasks"].map(String::from).to_vec();
    for p in ["hrg", "capability", "state"] {
        csv.extend(est_hdr(p).into_iter().take(3));
    }
    csv.extend(
        [
            "rescue",
            "rescue_same",
            "control_rescuer",
            "control_predecessor",
        ]
        .map(String::from),
    );
    let hdr: Vec<&str> = csv.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "recovery_decomposition",
        "HRG decomposition",
        &hdr,
        &[
            "Direction A->B",
            "Tasks",
            "HRG",
            "= C(B) - C(A)",
            "+ FTV(A->B) - FTV(A->A)",
            "R(A->B)",
            "R(A->A)",
            "C(B)",
            "C(A)",
        ],
    );
    for d in &a.recovery.directions {
        let Some(x) = &d.decomposition else { continue };
        let name = format!("{}->{}", d.predecessor, d.rescuer);
        let mut c = vec!["direction".to_string(), name.clone(), x.tasks.to_string()];
        for e in [&x.hrg, &x.capability, &x.state] {
            c.extend(est_csv(e).into_iter().take(3));
        }
        c.extend(
            [
                x.rescue,
                x.rescue_same,
                x.control_rescuer,
                x.control_predecessor,
            ]
            .map(raw),
        );
        t.csv_rows.push(c);
        t.view_rows.push(vec![
            name,
            x.tasks.to_string(),
            with_ci(&x.hrg, signed),
            with_ci(&x.capability, signed),
            with_ci(&x.state, signed),
            opt_view(x.rescue, rate),
            opt_view(x.rescue_same, rate),
            opt_view(x.control_rescuer, rate),
            opt_view(x.control_predecessor, rate),
        ]);
    }
    for p in &a.recovery.pooled {
        let mut c = vec![
            "pooled".to_string(),
            p.scope.clone(),
            p.decomposition_hrg.tasks.to_string(),
        ];
        for e in [&p.decomposition_hrg, &p.capability, &p.state] {
            c.extend(est_csv(e).into_iter().take(3));
        }
        c.extend([String::new(), String::new(), String::new(), String::new()]);
        t.csv_rows.push(c);
        t.view_rows.push(vec![
            format!("pooled {}", p.scope),
            p.decomposition_hrg.tasks.to_string(),
            with_ci(&p.decomposition_hrg, signed),
            with_ci(&p.capability, signed),
            with_ci(&p.state, signed),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    t.notes.push(
        "HRG(A->B) = [C(B) - C(A)] + [FTV(A->B) - FTV(A->A)] holds exactly per task, on the tasks \
         where R(A->B), R(A->A), C(B) and C(A) all exist; the first bracket is the capability term, \
         the second the failed-state term."
            .into(),
    );
    t
}

fn pooled(a: &Analysis) -> Table {
    let mut csv: Vec<String> = ["scope", "directions", "tasks"].map(String::from).to_vec();
    let names = [
        "rescue_same",
        "rescue_other",
        "note_same",
        "note_other",
        "control_same",
        "control_other",
    ];
    for p in names {
        csv.extend(est_hdr(p));
    }
    let hdr: Vec<&str> = csv.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "recovery_pooled",
        "Pooled rescue success",
        &hdr,
        &[
            "Scope",
            "Tasks",
            "R same model",
            "R other model",
            "Rnote same",
            "Rnote other",
            "C same",
            "C other",
        ],
    );
    for p in &a.recovery.pooled {
        let ests = [
            &p.rescue_same,
            &p.rescue_other,
            &p.note_same,
            &p.note_other,
            &p.control_same,
            &p.control_other,
        ];
        let mut c = vec![p.scope.clone(), p.directions.join(" "), p.tasks.to_string()];
        for e in ests {
            c.extend(est_csv(e));
        }
        t.csv_rows.push(c);
        let mut v = vec![p.scope.clone(), p.tasks.to_string()];
        v.extend(ests.iter().map(|e| with_ci(e, rate)));
        t.view_rows.push(v);
    }
    t
}

fn exclusions(a: &Analysis) -> Table {
    let cols = [
        "section",
        "quantity",
        "agent",
        "predecessor",
        "task",
        "state",
        "valid_trials",
        "infra_errors",
        "effect",
        "reason",
    ];
    let mut t = Table::new("exclusions", "Left out of the numbers", &cols, &cols);
    for e in &a.exclusions {
        let row = vec![
            match e.section {
                crate::analysis::Section::Inherited => "inherited",
                crate::analysis::Section::Recovery => "recovery",
            }
            .to_string(),
            e.quantity.clone(),
            e.agent.clone(),
            e.predecessor.clone().unwrap_or_default(),
            e.task.clone(),
            e.state.clone().unwrap_or_default(),
            e.valid_trials.to_string(),
            e.infra_errors.to_string(),
            match e.effect {
                crate::analysis::Effect::TaskExcluded => "task excluded",
                crate::analysis::Effect::StateExcluded => "state excluded",
            }
            .to_string(),
            e.reason.clone(),
        ];
        t.csv_rows.push(row.clone());
        t.view_rows.push(row);
    }
    t
}

// ---- figures -----------------------------------------------------------

fn point(series: usize, e: &Estimate) -> Point {
    Point {
        series,
        value: e.value,
        lo: e.ci.map(|c| c.lo),
        hi: e.ci.map(|c| c.hi),
    }
}

/// A [0, 1] axis, in percent (inherited starts) or as a rate (recovery,
/// matching its tables).
fn rate_axis(label: &str, as_rate: bool) -> Axis {
    Axis {
        min: -0.02,
        max: 1.02,
        label: label.to_string(),
        fmt: if as_rate { ratio_axis } else { pct0 },
        tip: if as_rate { rate } else { pct },
        zero_line: false,
    }
}

pub(crate) fn figures(a: &Analysis) -> Vec<Figure> {
    let mut out = Vec::new();
    let clean_res = |rows: &[InheritedRow], with_pred: bool| -> Vec<Row> {
        rows.iter()
            .map(|r| Row {
                label: match (&r.predecessor, with_pred) {
                    (Some(p), true) => format!("{} <- {p}", r.agent),
                    _ => r.agent.clone(),
                },
                points: vec![point(0, &r.clean), point(1, &r.residual)],
                emphasis: false,
            })
            .collect()
    };
    if !a.inherited.by_agent.is_empty() {
        let title = "Clean vs residual start, per agent (95% CI)";
        out.push(Figure {
            file: "clean_vs_residual.svg",
            title: title.into(),
            svg: dot_whisker(
                title,
                &["Clean", "Residual"],
                &clean_res(&a.inherited.by_agent, false),
                &rate_axis("success rate", false),
            ),
            table: "inherited_by_agent",
        });
    }
    if !a.inherited.by_predecessor.is_empty() {
        let title = "Clean vs residual start, by predecessor (agent <- predecessor)";
        out.push(Figure {
            file: "clean_vs_residual_by_predecessor.svg",
            title: title.into(),
            svg: dot_whisker(
                title,
                &["Clean", "Residual"],
                &clean_res(&a.inherited.by_predecessor, true),
                &rate_axis("success rate", false),
            ),
            table: "inherited_by_predecessor",
        });
    }
    let overall: Vec<_> = a
        .inherited
        .signatures
        .iter()
        .filter(|s| s.predecessor.is_none())
        .collect();
    if !overall.is_empty() {
        let rows: Vec<Row> = overall
            .iter()
            .map(|s| {
                let v = |i: usize, value: Option<f64>| Point {
                    series: i,
                    value,
                    lo: None,
                    hi: None,
                };
                Row {
                    label: s.agent.clone(),
                    points: vec![
                        v(0, s.same_failing.value),
                        v(1, s.kept.value),
                        v(2, s.left_out.opened.value),
                        v(3, s.left_out.changed.value),
                        v(4, s.left_out.clean_changed.value),
                    ],
                    emphasis: false,
                }
            })
            .collect();
        let title = "Behaviour signatures of residual continuations";
        out.push(Figure {
            file: "signatures.svg",
            title: title.into(),
            svg: bars(
                title,
                &[
                    "same-failing",
                    "kept lines",
                    "left-out opened",
                    "left-out changed",
                    "clean runs changed",
                ],
                &rows,
                &rate_axis("share", false),
            ),
            table: "signatures",
        });
    }
    if !a.recovery.directions.is_empty() {
        let rows: Vec<Row> = a
            .recovery
            .directions
            .iter()
            .map(|d| Row {
                label: format!("{}->{}", d.predecessor, d.rescuer),
                points: vec![
                    point(0, &d.rescue),
                    point(1, &d.rescue_note),
                    point(2, &d.control),
                ],
                emphasis: false,
            })
            .collect();
        let title = "Rescue success per direction A->B (95% CI)";
        out.push(Figure {
            file: "rescue_success.svg",
            title: title.into(),
            svg: dot_whisker(
                title,
                &["R(A->B)", "Rnote(A->B)", "C(B)"],
                &rows,
                &rate_axis("success rate", true),
            ),
            table: "recovery_success",
        });
        let mut rows = Vec::new();
        for (i, (kind, pick)) in contrast_kinds().into_iter().enumerate() {
            for d in &a.recovery.directions {
                if let Some(c) = pick(d) {
                    rows.push(Row {
                        label: format!("{kind} {}->{}", d.predecessor, d.rescuer),
                        points: vec![point(i, &c.estimate)],
                        emphasis: false,
                    });
                }
            }
            for p in &a.recovery.pooled {
                let e = match kind {
                    "HRG" => &p.hrg,
                    "FTV" => &p.ftv,
                    _ => &p.ctv,
                };
                rows.push(Row {
                    label: format!("{kind} pooled {}", p.scope),
                    points: vec![point(i, e)],
                    emphasis: true,
                });
            }
        }
        let title = "Recovery contrasts (95% CI; diamonds: pooled)";
        let axis = Axis::fit(
            &rows,
            "difference in success rate",
            ratio_axis,
            signed,
            true,
        );
        out.push(Figure {
            file: "contrasts_forest.svg",
            title: title.into(),
            svg: dot_whisker(title, &["HRG", "FTV", "CTV"], &rows, &axis),
            table: "recovery_contrasts",
        });
    }
    out
}

// ---- documents ---------------------------------------------------------

enum Block<'a> {
    H1(String),
    H2(String),
    H3(String),
    /// Text with `code` spans.
    Para(String),
    List(Vec<String>),
    Table(&'a Table),
    Figure(&'a Figure),
}

/// How many exclusion rows the documents list before pointing to the CSV.
const EXCLUSIONS_SHOWN: usize = 200;

fn document<'a>(a: &Analysis, tables: &'a [Table], figures: &'a [Figure]) -> Vec<Block<'a>> {
    let table = |name: &str| {
        tables
            .iter()
            .find(|t| t.name == name)
            .expect("table exists")
    };
    let figure = |file: &str| figures.iter().find(|f| f.file == file);
    let mut doc = vec![Block::H1("forkd evaluation report".into())];
    let m = &a.meta;
    doc.push(Block::Para(format!(
        "Runs: {}. {} trials; {} with outcome `infra_error` are in no number (counted only). \
         95% intervals: percentile bootstrap over tasks, {} draws, seed `{:#x}`, one resample \
         shared by every number of a family (paired). A cell needs at least {} valid trial(s).",
        if m.runs.is_empty() {
            "none recorded".to_string()
        } else {
            m.runs
                .iter()
                .map(|r| format!("`{r}`"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        m.trials,
        m.infra_errors_excluded,
        m.draws,
        m.seed,
        m.min_trials
    )));
    doc.push(Block::H2("Trial outcomes".into()));
    doc.push(Block::Table(table("outcomes")));

    if a.losses.candidates > 0 {
        doc.push(Block::H2(
            "Residual start states: where candidates were lost".into(),
        ));
        doc.push(Block::Table(table("residual_losses")));
        doc.push(Block::Table(table("residual_losses_by_predecessor")));
        doc.push(Block::Table(table("residual_losses_by_task")));
        if !a.losses.dropped.is_empty() {
            doc.push(Block::Table(table("residual_drops")));
        }
    }

    doc.push(Block::H2("Inherited starts".into()));
    if a.inherited.by_agent.is_empty() {
        doc.push(Block::Para("No residual trials.".into()));
    } else {
        doc.push(Block::H3("Clean vs residual start".into()));
        if let Some(f) = figure("clean_vs_residual.svg") {
            doc.push(Block::Figure(f));
        }
        doc.push(Block::Table(table("inherited_by_agent")));
        doc.push(Block::H3("By predecessor".into()));
        doc.push(Block::Para(
            "Each predecessor's states cover a different set of tasks: compare agents within a row \
             group, not absolute values across groups."
                .into(),
        ));
        if let Some(f) = figure("clean_vs_residual_by_predecessor.svg") {
            doc.push(Block::Figure(f));
        }
        doc.push(Block::Table(table("inherited_by_predecessor")));
        doc.push(Block::H3("Behaviour signatures".into()));
        if let Some(f) = figure("signatures.svg") {
            doc.push(Block::Figure(f));
        }
        doc.push(Block::Table(table("signatures")));
    }

    doc.push(Block::H2("Recovery".into()));
    if a.recovery.directions.is_empty() {
        doc.push(Block::Para("No rescue or pristine-control trials.".into()));
    } else {
        doc.push(Block::H3("Rescue success".into()));
        if let Some(f) = figure("rescue_success.svg") {
            doc.push(Block::Figure(f));
        }
        doc.push(Block::Table(table("recovery_success")));
        doc.push(Block::H3("Contrasts".into()));
        if let Some(f) = figure("contrasts_forest.svg") {
            doc.push(Block::Figure(f));
        }
        doc.push(Block::Table(table("recovery_contrasts")));
        doc.push(Block::H3("Decomposition of HRG".into()));
        doc.push(Block::Table(table("recovery_decomposition")));
        if !a.recovery.pooled.is_empty() {
            doc.push(Block::H3("Pooled rescue success".into()));
            doc.push(Block::Table(table("recovery_pooled")));
        }
    }

    doc.push(Block::H2("Left out of the numbers".into()));
    let ex = table("exclusions");
    if ex.csv_rows.is_empty() {
        doc.push(Block::Para(
            "Nothing: every task in scope entered every number.".into(),
        ));
    } else {
        let tasks_out = a
            .exclusions
            .iter()
            .filter(|e| e.effect == crate::analysis::Effect::TaskExcluded)
            .count();
        doc.push(Block::Para(format!(
            "{} entries ({} dropping a task from a number, {} dropping one state of a task that \
             stays in on its other states); all are in `exclusions.csv`.",
            ex.csv_rows.len(),
            tasks_out,
            ex.csv_rows.len() - tasks_out
        )));
        doc.push(Block::Table(ex));
    }

    doc.push(Block::H2("Definitions".into()));
    doc.push(Block::List(definitions()));
    doc
}

fn definitions() -> Vec<String> {
    [
        "y = 1 iff the verifier accepted the final state (`pass`); `budget_exhausted` and `no_submit` are failures; `infra_error` rows are excluded.",
        "Cell: (condition, agent, predecessor, task, start state); its success is the mean over replicates.",
        "Res(A) = (1/N) sum_i (1/K_i) sum_{S in R_i} y_A,i(S); Clean(A) = (1/N) sum_i y_A,i(S_0,i) over the same N tasks.",
        "Gap(A) = 100 x (Clean(A) - Res(A)) percentage points.",
        "Conditional failure rate = sum_i c_i (1 - r_i) / sum_i c_i: over C_A = {i : c_i = 1}, the mean of 1 - r_i; undefined when C_A is empty.",
        "Same-failing: failed continuations whose final failing-test set equals the start state's exactly.",
        "Kept: sum over files of LCS(predecessor's added lines, final added lines) / predecessor's added lines, per continuation; mean over continuations.",
        "Left-out files: reference-changed files the start state does not touch; opened = content shown by a command, changed = in final.patch.",
        "Steps ratio: continuation steps / mean steps of the agent's clean runs of the task; mean per task, median over tasks.",
        "R(A->B), Rnote(A->B), C(B): success of B's plain rescue, note rescue, pristine control on F_A (tasks with recovery trials on A's failures).",
        "HRG(A->B) = R(A->B) - R(A->A); FTV(A->B) = R(A->B) - C(B); CTV(A->B) = Rnote(A->B) - R(A->B).",
        "HRG(A->B) = [C(B) - C(A)] + [FTV(A->B) - FTV(A->A)] exactly (capability term + failed-state term).",
        "Intervals: 2.5% and 97.5% percentiles (linear interpolation) of the statistic over bootstrap resamples of tasks.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

pub(crate) fn markdown(a: &Analysis, tables: &[Table], figures: &[Figure]) -> String {
    let mut out = String::new();
    for block in document(a, tables, figures) {
        match block {
            Block::H1(s) => {
                let _ = writeln!(out, "# {s}\n");
            }
            Block::H2(s) => {
                let _ = writeln!(out, "## {s}\n");
            }
            Block::H3(s) => {
                let _ = writeln!(out, "### {s}\n");
            }
            Block::Para(s) => {
                let _ = writeln!(out, "{s}\n");
            }
            Block::List(items) => {
                for i in items {
                    let _ = writeln!(out, "- {i}");
                }
                out.push('\n');
            }
            Block::Figure(f) => {
                let _ = writeln!(out, "![{}]({})\n", f.title, f.file);
            }
            Block::Table(t) => {
                if t.view_rows.is_empty() {
                    let _ = writeln!(out, "_No rows._ (`{}.csv`)\n", t.name);
                    continue;
                }
                let header: Vec<String> = t.view_header.iter().map(|h| md_cell(h)).collect();
                let _ = writeln!(out, "| {} |", header.join(" | "));
                let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
                let shown = if t.name == "exclusions" {
                    EXCLUSIONS_SHOWN
                } else {
                    usize::MAX
                };
                for row in t.view_rows.iter().take(shown) {
                    let cells: Vec<String> = row.iter().map(|c| md_cell(c)).collect();
                    let _ = writeln!(out, "| {} |", cells.join(" | "));
                }
                if t.view_rows.len() > shown {
                    let _ = writeln!(
                        out,
                        "\n... and {} more rows in `{}.csv`.",
                        t.view_rows.len() - shown,
                        t.name
                    );
                }
                out.push('\n');
                for n in &t.notes {
                    let _ = writeln!(out, "{n}\n");
                }
                let _ = writeln!(out, "Data: `{}.csv`.\n", t.name);
            }
        }
    }
    out
}

/// HTML-escape text and turn `code` spans into `<code>`.
fn inline_html(s: &str) -> String {
    let mut out = String::new();
    for (i, part) in s.split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{}</code>", esc(part));
        } else {
            out.push_str(&esc(part));
        }
    }
    out
}

const CSS: &str = "body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}h3{margin-top:1.5em}\
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#f2f2f2}tr:nth-child(even) td{background:#fafafa}code{background:#f3f3f3;padding:0 .2em;border-radius:3px}\
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}.note{font-size:.88em;color:#444}.chart{max-width:100%;height:auto}";

pub(crate) fn html(a: &Analysis, tables: &[Table], figures: &[Figure]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" \
         content=\"width=device-width, initial-scale=1\"><title>forkd evaluation report</title><style>{CSS}</style></head><body>\n"
    );
    for block in document(a, tables, figures) {
        match block {
            Block::H1(s) => {
                let _ = writeln!(out, "<h1>{}</h1>", esc(&s));
            }
            Block::H2(s) => {
                let _ = writeln!(out, "<h2>{}</h2>", esc(&s));
            }
            Block::H3(s) => {
                let _ = writeln!(out, "<h3>{}</h3>", esc(&s));
            }
            Block::Para(s) => {
                let _ = writeln!(out, "<p>{}</p>", inline_html(&s));
            }
            Block::List(items) => {
                out.push_str("<ul>");
                for i in items {
                    let _ = write!(out, "<li>{}</li>", inline_html(&i));
                }
                out.push_str("</ul>\n");
            }
            Block::Figure(f) => {
                let _ = writeln!(
                    out,
                    "<figure>{}<figcaption>Data: <code>{}.csv</code></figcaption></figure>",
                    f.svg, f.table
                );
            }
            Block::Table(t) => {
                if t.view_rows.is_empty() {
                    let _ = writeln!(
                        out,
                        "<p><em>No rows.</em> (<code>{}.csv</code>)</p>",
                        t.name
                    );
                    continue;
                }
                let _ = write!(
                    out,
                    "<table><caption>{}</caption><thead><tr>",
                    esc(&t.title)
                );
                for h in &t.view_header {
                    let _ = write!(out, "<th>{}</th>", esc(h));
                }
                out.push_str("</tr></thead><tbody>\n");
                let shown = if t.name == "exclusions" {
                    EXCLUSIONS_SHOWN
                } else {
                    usize::MAX
                };
                for row in t.view_rows.iter().take(shown) {
                    out.push_str("<tr>");
                    for c in row {
                        let _ = write!(out, "<td>{}</td>", esc(c));
                    }
                    out.push_str("</tr>\n");
                }
                out.push_str("</tbody></table>\n");
                if t.view_rows.len() > shown {
                    let _ = writeln!(
                        out,
                        "<p class=\"note\">... and {} more rows in <code>{}.csv</code>.</p>",
                        t.view_rows.len() - shown,
                        t.name
                    );
                }
                for n in &t.notes {
                    let _ = writeln!(out, "<p class=\"note\">{}</p>", inline_html(n));
                }
                let _ = writeln!(
                    out,
                    "<p class=\"note\">Data: <code>{}.csv</code></p>",
                    t.name
                );
            }
        }
    }
    out.push_str("</body></html>\n");
    out
}
