//! The records of a run directory (see the crate header for the on-disk
//! contract) and the in-memory [`Dataset`] the analysis works on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::patch::Patch;

/// What the agent was told and where it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Clean start with the ordinary task prompt.
    Clean,
    /// Blind continuation from a predecessor's failed final state.
    Residual,
    /// Rescue of a failed state with the fixed notice ("V0").
    RescueNotice,
    /// Rescue with the notice and the predecessor's handoff note.
    RescueNote,
    /// Pristine-repository control on the predecessor's failure set.
    PristineControl,
}

impl Condition {
    pub const ALL: [Condition; 5] = [
        Condition::Clean,
        Condition::Residual,
        Condition::RescueNotice,
        Condition::RescueNote,
        Condition::PristineControl,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Condition::Clean => "clean",
            Condition::Residual => "residual",
            Condition::RescueNotice => "rescue_notice",
            Condition::RescueNote => "rescue_note",
            Condition::PristineControl => "pristine_control",
        }
    }

    /// Every condition except a clean start names the predecessor whose
    /// failure it starts from (or, for the control, whose failure set it
    /// controls for).
    pub fn needs_predecessor(self) -> bool {
        !matches!(self, Condition::Clean)
    }
}

/// How a trial ended, as graded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    BudgetExhausted,
    InfraError,
    NoSubmit,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Pass,
        Outcome::Fail,
        Outcome::BudgetExhausted,
        Outcome::InfraError,
        Outcome::NoSubmit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::BudgetExhausted => "budget_exhausted",
            Outcome::InfraError => "infra_error",
            Outcome::NoSubmit => "no_submit",
        }
    }
}

/// The verifier's verdict on one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestResult {
    Pass,
    Fail,
    Error,
    Skip,
}

/// One line of `results.jsonl`: the final attempt of one trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRow {
    pub run_id: String,
    pub trial_id: String,
    pub task: String,
    pub condition: Condition,
    /// `"clean"` or a residual state id.
    pub start_state: String,
    pub predecessor: Option<String>,
    pub agent: String,
    pub replicate: u32,
    pub outcome: Outcome,
    /// The agent ended normally, claiming completion.
    pub submitted: bool,
    #[serde(default)]
    pub tests: BTreeMap<String, TestResult>,
    #[serde(default)]
    pub steps: u64,
    #[serde(default)]
    pub wall_ms: u64,
    #[serde(default)]
    pub infra_attempts: u32,
}

impl TrialRow {
    /// y = 1 iff the verifier accepted the final state.
    pub fn success(&self) -> bool {
        self.outcome == Outcome::Pass
    }

    /// Infrastructure failures count neither for nor against an agent.
    pub fn is_infra_error(&self) -> bool {
        self.outcome == Outcome::InfraError
    }

    /// The agent claimed completion and the verifier returned a valid
    /// verdict: the only trials behaviour signatures look at.
    pub fn is_normally_submitted(&self) -> bool {
        self.submitted && matches!(self.outcome, Outcome::Pass | Outcome::Fail)
    }

    /// Tests whose verdict is `fail` or `error`.
    pub fn failing_tests(&self) -> BTreeSet<&str> {
        self.tests
            .iter()
            .filter(|(_, r)| matches!(r, TestResult::Fail | TestResult::Error))
            .map(|(t, _)| t.as_str())
            .collect()
    }
}

/// A residual start state: `states/<state_id>.json` plus its parsed patch.
#[derive(Debug, Clone, PartialEq)]
pub struct StateInfo {
    pub state_id: String,
    pub task: String,
    pub predecessor: Option<String>,
    pub failing_tests: BTreeSet<String>,
    /// The state against the clean start; `None` when the patch file is absent.
    pub patch: Option<Patch>,
}

/// `tasks/<task>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    pub task: String,
    #[serde(default)]
    pub reference_changed_files: Vec<String>,
    #[serde(default)]
    pub f2p: Vec<String>,
    #[serde(default)]
    pub p2p: Vec<String>,
}

/// One command of a trajectory, as the agent issued it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrajectoryCommand {
    /// A program and its arguments, run without a shell.
    Argv(Vec<String>),
    /// A shell command line, run in its own shell process.
    Shell(String),
    /// Keystrokes typed into a persistent terminal, read as a command line.
    Keys(String),
}

/// A trial and the artifacts the signatures need. The artifacts are loaded
/// only for normally submitted clean and residual trials.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub row: TrialRow,
    pub final_patch: Option<Patch>,
    pub trajectory: Option<Vec<TrajectoryCommand>>,
}

impl Trial {
    pub fn new(row: TrialRow) -> Self {
        Trial {
            row,
            final_patch: None,
            trajectory: None,
        }
    }
}

/// Where a run came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunInfo {
    pub run_id: String,
    pub dir: Option<PathBuf>,
}

/// Where one residual candidate left the pipeline (`states/candidates.jsonl`, its last
/// line): a stage of [`STAGES`], or `kept`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CandidateEnd {
    pub run_id: String,
    pub candidate: String,
    pub task: String,
    pub predecessor: String,
    pub stage: String,
    pub kept: bool,
    pub reason: String,
}

/// The residual pipeline's stages, in order: a candidate dropped at one never reaches
/// the next. `kept` is the end of those that pass them all.
pub const STAGES: &[&str] = &[
    "infrastructure",
    "no-submit",
    "passes",
    "reconstruction",
    "verification",
    "no-change",
    "duplicate",
    "review",
];

/// Every run read, merged: trials of all runs, states by id, tasks by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    /// The end of every residual candidate of every run.
    pub candidates: Vec<CandidateEnd>,
    pub runs: Vec<RunInfo>,
    pub trials: Vec<Trial>,
    pub states: BTreeMap<String, StateInfo>,
    pub tasks: BTreeMap<String, TaskInfo>,
}
