//! Tables of recovery: rescue success per direction (R, Rnote, C), the
//! contrasts (HRG, FTV, CTV) per direction and pooled, the exact
//! decomposition of HRG, and pooled rescue success.

use super::Table;
use crate::analysis::{Analysis, Contrast, Estimate};
use crate::report::format::{est_csv, est_hdr, opt_view, rate, raw, signed, with_ci, with_tasks};

pub(super) fn rescue_success(a: &Analysis) -> Table {
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

pub(super) fn contrasts(a: &Analysis) -> Table {
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

pub(in crate::report) type Pick = fn(&crate::analysis::Direction) -> Option<Contrast>;

pub(in crate::report) fn contrast_kinds() -> [(&'static str, Pick); 3] {
    [
        ("HRG", |d| d.hrg),
        ("FTV", |d| Some(d.ftv)),
        ("CTV", |d| Some(d.ctv)),
    ]
}

pub(super) fn decomposition(a: &Analysis) -> Table {
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

pub(super) fn pooled(a: &Analysis) -> Table {
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
