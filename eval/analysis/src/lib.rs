//! forkd-analysis: the evaluator's analysis of finished runs. Pure
//! computation over run directories: no daemon, no privileges.
//!
//! It owns two families of metrics and the report that shows them:
//! - inherited starts: success from a predecessor's failed-but-submitted
//!   final state against the clean start (Res, Clean, Gap, conditional
//!   failure rate), per agent and per predecessor, and the behaviour
//!   signatures of the continuations (same-failing, kept lines, left-out
//!   files opened and changed, steps ratio); see [`inherited`];
//! - recovery: rescue of a failed run by the same or another agent (R,
//!   Rnote, C, HRG, FTV, CTV, the exact decomposition of HRG), per direction
//!   and pooled; see [`recovery`].
//!
//! The task is the unit of analysis: replicates are averaged within a cell,
//! cells within a task, tasks with equal weight; 95% intervals come from a
//! seeded, paired percentile bootstrap over tasks ([`stats`]).
//!
//! # Run directory contract
//!
//! ```text
//! RUN/manifest.json           {"run_id": "...", ...}   (other fields ignored)
//! RUN/results.jsonl           one JSON object per trial (its final attempt):
//!   {"run_id", "trial_id", "task",
//!    "condition": "clean" | "residual" | "rescue_notice" | "rescue_note" | "pristine_control",
//!    "start_state": "clean" | <state id>,
//!    "predecessor": <agent> | null,   // null exactly for clean; for residual and
//!                                     // rescue_* the agent whose failed final state
//!                                     // this start is; for pristine_control the agent
//!                                     // whose failure set it controls for
//!    "agent", "replicate": int,
//!    "outcome": "pass" | "fail" | "budget_exhausted" | "infra_error" | "no_submit",
//!    "submitted": bool,               // ended normally, claiming completion
//!    "tests": {"<test id>": "pass" | "fail" | "error" | "skip"},
//!    "steps": int, "wall_ms": int, "infra_attempts": int}
//! RUN/states/<state_id>.json  {"state_id", "task", "predecessor", "failing_tests": [..],
//!                              "patch": "<state_id>.patch"}
//! RUN/states/<state_id>.patch unified diff (a/ b/ prefixes) of the state against the clean start
//! RUN/tasks/<task>.json       {"task", "reference_changed_files": [paths], "f2p": [..], "p2p": [..]}
//! RUN/trials/<trial_id>/trajectory.jsonl  one line per command:
//!                              {"t_ms", "argv": [..]} | {"t_ms", "shell": "..."} | {"t_ms", "keys": "..."}
//! RUN/trials/<trial_id>/final.patch       unified diff of the final state against the clean start
//! ```
//!
//! Reading rules: y = 1 iff `outcome == "pass"`. `infra_error` rows count
//! neither for nor against an agent: they are excluded from every number and
//! reported as a count. `budget_exhausted` and `no_submit` are failures for
//! success metrics but, like unsubmitted runs, are left out of the
//! signatures, which use only normally submitted trials (`submitted` and
//! outcome `pass` or `fail`). A failing test is one with verdict `fail` or
//! `error`. Trial artifacts are read only for normally submitted clean and
//! residual trials; a missing artifact leaves the metrics that need it
//! undefined for that trial (and counted), it is not an error. Several runs
//! are merged: trials add up as replicates, and a state or task defined in
//! more than one run must be defined identically.

#![forbid(unsafe_code)]

mod analysis;
mod analyze;
mod cells;
mod error;
use forkd_glob as glob;
pub mod inherited;
mod load;
mod model;
mod opened;
mod patch;
pub mod recovery;
mod report;
mod shell;
pub mod stats;
#[cfg(test)]
mod testutil;

pub use analysis::{
    Analysis, Contrast, Decomposition, Direction, Effect, Estimate, Exclusion, Inherited,
    InheritedRow, LeftOut, Losses, Mean, Meta, OutcomeCounts, Pooled, Recovery, Section, Share,
    SignatureRow, StageCount, StepsRatio,
};
pub use analyze::analyze;
pub use error::AnalysisError;
pub use load::load_runs;
pub use model::{
    CandidateEnd, Condition, Dataset, Outcome, RunInfo, StateInfo, TaskInfo, TestResult,
    TrajectoryCommand, Trial, TrialRow, STAGES,
};
pub use opened::ContentViews;
pub use patch::{lcs_len, FilePatch, Patch, PatchError};
pub use report::csv::field as csv_field;
pub use report::{write_report, Format};
pub use stats::Interval;

/// Analysis settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Bootstrap draws per interval; 0 disables intervals.
    pub draws: usize,
    /// Seed of the bootstrap: the same seed and data give the same intervals.
    pub seed: u64,
    /// Valid (non-infra) trials a cell needs to enter a success number
    /// (Res, Clean, R, Rnote, C and everything built on them); cells with
    /// fewer are left out and listed among the exclusions. Signatures use
    /// every normally submitted continuation.
    pub min_trials: usize,
}

impl Options {
    pub const DEFAULT_DRAWS: usize = 5000;
    /// Small enough to survive a round trip through a JSON double.
    pub const DEFAULT_SEED: u64 = 0x5EED_F04B;
}

impl Default for Options {
    fn default() -> Self {
        Options {
            draws: Self::DEFAULT_DRAWS,
            seed: Self::DEFAULT_SEED,
            min_trials: 1,
        }
    }
}
