//! What an agent is given for a trial and how its run ended: shared by the ways an
//! agent runs (an external command, a harness).

use super::confine::Confined;
use super::session::{InfraResult, Session};
use super::task::Task;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How an agent's run ended.
#[derive(Debug, Clone)]
pub struct AgentRun {
    pub submitted: bool,
    pub budget_exhausted: bool,
    pub note: String,
    /// Steps as the harness counts them (model calls); otherwise the execs it ran.
    pub steps: Option<u64>,
}

/// What the agent is given.
pub struct Brief<'a> {
    pub task: &'a Task,
    pub sandbox: &'a str,
    pub instruction: String,
    pub note: Option<String>,
    pub timeout: Duration,
    pub max_steps: u64,
    /// The trial's directory: an external agent's own directory is `agent/` in it, and
    /// its grant's record `grant.json`.
    pub scratch: &'a Path,
    /// What an external agent must not see (the suites, the run directory).
    pub hide: Vec<PathBuf>,
}

impl Brief<'_> {
    /// The agent's confinement for this trial (see [`super::confine`]): its own user and
    /// directory (`agent/` in the trial's), a grant on the sandbox within the step
    /// budget, and what it must not see out of sight.
    pub fn confine(&self, s: &Session) -> InfraResult<Confined> {
        Confined::prepare(
            s,
            self.sandbox,
            self.max_steps,
            &self.scratch.join("agent"),
            self.hide.clone(),
        )
    }
}
