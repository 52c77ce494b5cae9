//! Tables of trial bookkeeping: outcome counts per condition and agent,
//! everything left out of the numbers (exclusions), and the residual
//! candidate pipeline (losses per stage, per predecessor or task, and each
//! dropped candidate with its reason).

use super::Table;
use crate::analysis::Analysis;

/// The residual pipeline, stage by stage.
pub(super) fn losses(a: &Analysis) -> Table {
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
pub(super) fn losses_by(a: &Analysis, by_task: bool) -> Table {
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
pub(super) fn drops(a: &Analysis) -> Table {
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

pub(super) fn outcomes(a: &Analysis) -> Table {
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

pub(super) fn exclusions(a: &Analysis) -> Table {
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
