//! The result of an analysis: every number the report shows, serialisable
//! as JSON. Rates are fractions in [0, 1]; `gap_pp` is in percentage points.
//! `None` (JSON `null`) means undefined, never zero.

use serde::Serialize;

use crate::model::Condition;
use crate::stats::{Column, Interval};

/// A point estimate with its bootstrap interval and the number of tasks it
/// rests on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    pub value: Option<f64>,
    pub ci: Option<Interval>,
    pub tasks: usize,
}

impl Estimate {
    pub(crate) fn from_column(col: &Column, ci: Option<Interval>) -> Self {
        Estimate {
            value: col.point(),
            ci,
            tasks: col.support(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub meta: Meta,
    pub outcomes: Vec<OutcomeCounts>,
    pub inherited: Inherited,
    pub recovery: Recovery,
    /// Every task or state that a number had to leave out, and why.
    pub exclusions: Vec<Exclusion>,
    /// The residual pipeline: how many candidates each stage dropped, and why.
    pub losses: Losses,
}

/// Candidates at one stage of the residual pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StageCount {
    pub stage: String,
    /// Candidates that reached it.
    pub reached: usize,
    /// Of those, dropped here.
    pub dropped: usize,
}

/// The loss table (SWE-Residual's section 4.1): the pipeline as a whole, per
/// predecessor and per task, and every dropped candidate with its reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Losses {
    pub candidates: usize,
    pub kept: usize,
    pub stages: Vec<StageCount>,
    /// (predecessor, dropped per stage in [`crate::STAGES`] order, kept).
    pub by_predecessor: Vec<(String, Vec<usize>, usize)>,
    pub by_task: Vec<(String, Vec<usize>, usize)>,
    pub dropped: Vec<crate::model::CandidateEnd>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    pub runs: Vec<String>,
    pub trials: usize,
    /// Rows with outcome `infra_error`: in no number, counted here.
    pub infra_errors_excluded: usize,
    pub draws: usize,
    pub seed: u64,
    pub min_trials: usize,
    pub confidence: f64,
}

/// Outcomes of the trials of one agent under one condition.
#[derive(Debug, Clone, Serialize)]
pub struct OutcomeCounts {
    pub condition: Condition,
    pub agent: String,
    pub pass: usize,
    pub fail: usize,
    pub budget_exhausted: usize,
    pub no_submit: usize,
    pub infra_error: usize,
    pub normally_submitted: usize,
}

/// Inherited-start (residual) metrics.
#[derive(Debug, Clone, Serialize)]
pub struct Inherited {
    pub by_agent: Vec<InheritedRow>,
    pub by_predecessor: Vec<InheritedRow>,
    pub signatures: Vec<SignatureRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct InheritedRow {
    pub agent: String,
    /// `None` for all predecessors together.
    pub predecessor: Option<String>,
    /// Tasks with both a clean and a residual value (N).
    pub tasks: usize,
    /// Residual states behind those tasks.
    pub states: usize,
    /// Tasks in scope that had to be left out (see `exclusions`).
    pub excluded_tasks: usize,
    pub clean: Estimate,
    pub residual: Estimate,
    pub gap_pp: Estimate,
    /// Over the tasks solved from the clean start; undefined when none is.
    pub conditional_failure: Estimate,
    /// Sum over tasks of the clean success (|C_A| when clean outcomes are 0/1).
    pub clean_solved: f64,
}

/// Behaviour signatures over normally submitted residual continuations.
#[derive(Debug, Clone, Serialize)]
pub struct SignatureRow {
    pub agent: String,
    pub predecessor: Option<String>,
    pub continuations: usize,
    /// Residual trials left out because they did not end in a normal
    /// submission (budget exhausted, no submit, not submitted).
    pub not_normally_submitted: usize,
    pub same_failing: Share,
    pub kept: Mean,
    pub left_out: LeftOut,
    pub steps_ratio: StepsRatio,
}

/// `count` of `of`; `unknown` could not be decided (missing data).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Share {
    pub count: usize,
    pub of: usize,
    pub value: Option<f64>,
    pub unknown: usize,
}

/// A mean over continuations; `undefined` had no value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Mean {
    pub value: Option<f64>,
    pub n: usize,
    pub undefined: usize,
}

impl Mean {
    pub(crate) fn of(values: &[Option<f64>]) -> Self {
        let defined: Vec<f64> = values.iter().flatten().copied().collect();
        Mean {
            value: crate::stats::mean(&defined),
            n: defined.len(),
            undefined: values.len() - defined.len(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LeftOut {
    /// Continuations whose start state left out at least one reference file.
    pub continuations: usize,
    /// Continuations whose predecessor changed every reference file.
    pub none_left_out: usize,
    /// Continuations without a task reference or a state patch.
    pub unknown: usize,
    /// Mean share of a continuation's left-out files it opened / changed.
    pub opened: Mean,
    pub changed: Mean,
    /// The same agent's clean runs of the task, on the same files.
    pub clean_opened: Mean,
    pub clean_changed: Mean,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepsRatio {
    /// Median across tasks of the per-task mean ratio.
    pub median: Option<f64>,
    pub tasks: usize,
    pub continuations: usize,
    /// Continuations without a clean run to compare with.
    pub undefined: usize,
}

/// Recovery metrics (failure-conditioned rescue).
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    pub directions: Vec<Direction>,
    pub pooled: Vec<Pooled>,
}

/// A contrast and the tasks whose mean difference has each sign.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Contrast {
    pub estimate: Estimate,
    pub tasks_positive: usize,
    pub tasks_negative: usize,
    pub tasks_zero: usize,
}

/// HRG(A->B) = [C(B) - C(A)] + [FTV(A->B) - FTV(A->A)], on the tasks where
/// all four of R(A->B), R(A->A), C(B), C(A) are defined.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Decomposition {
    pub tasks: usize,
    pub hrg: Estimate,
    pub capability: Estimate,
    pub state: Estimate,
    pub rescue: Option<f64>,
    pub rescue_same: Option<f64>,
    pub control_rescuer: Option<f64>,
    pub control_predecessor: Option<f64>,
}

/// One direction A->B: B rescues A's failures.
#[derive(Debug, Clone, Serialize)]
pub struct Direction {
    pub predecessor: String,
    pub rescuer: String,
    /// |F_A|: tasks with any recovery trial on A's failures.
    pub failure_set: usize,
    pub rescue: Estimate,
    pub rescue_note: Estimate,
    pub control: Estimate,
    pub ftv: Contrast,
    pub ctv: Contrast,
    /// Only for A != B with same-model rescues of A.
    pub hrg: Option<Contrast>,
    pub decomposition: Option<Decomposition>,
}

/// Estimates averaged over several directions: every (direction, task)
/// pair weighs the same, and the bootstrap resamples the distinct tasks.
#[derive(Debug, Clone, Serialize)]
pub struct Pooled {
    pub scope: String,
    pub directions: Vec<String>,
    pub tasks: usize,
    pub hrg: Estimate,
    pub ftv: Estimate,
    pub ctv: Estimate,
    pub decomposition_hrg: Estimate,
    pub capability: Estimate,
    pub state: Estimate,
    pub rescue_same: Estimate,
    pub rescue_other: Estimate,
    pub note_same: Estimate,
    pub note_other: Estimate,
    pub control_same: Estimate,
    pub control_other: Estimate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Section {
    Inherited,
    Recovery,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The task is not in the number at all.
    TaskExcluded,
    /// One state is left out; the task stays on its other states.
    StateExcluded,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exclusion {
    pub section: Section,
    /// What the missing value was for, e.g. `clean`, `residual`, `R(A->B)`.
    pub quantity: String,
    pub agent: String,
    pub predecessor: Option<String>,
    pub task: String,
    pub state: Option<String>,
    pub valid_trials: usize,
    pub infra_errors: usize,
    pub reason: String,
    pub effect: Effect,
}
