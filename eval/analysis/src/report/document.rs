//! The report as one document model: the sequence of headings, paragraphs,
//! tables, figures and definitions that both the Markdown and the HTML
//! renderer walk, so the two cannot disagree on content or order.

use super::tables::Table;
use super::Figure;
use crate::analysis::Analysis;

/// One piece of the report, in reading order.
pub(super) enum Block<'a> {
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

/// How many of a table's rows the documents list: all of them, except for
/// the exclusions, which may run to thousands and are complete in the CSV.
pub(super) fn rows_shown(t: &Table) -> usize {
    if t.name == "exclusions" {
        EXCLUSIONS_SHOWN
    } else {
        usize::MAX
    }
}

/// The report's blocks for an analysis and its built tables and figures.
pub(super) fn document<'a>(
    a: &Analysis,
    tables: &'a [Table],
    figures: &'a [Figure],
) -> Vec<Block<'a>> {
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
