//! A task's configuration, `task.toml`, as read from a task directory (Harbor's
//! `task.toml` is mapped onto it by [`super::harbor_task`]):
//!
//! ```toml
//! [task]        kind = "swe" | "terminal", image = "debian", workdir = "/testbed",
//!               build = "dir", rebuild = false, pull = false
//! [environment] setup = ["shell line", ...], background = ["shell line", ...],
//!               live = true | false (default: true for terminal tasks)
//! [verifier]    command = "...", tests_dir = "...", format = "pytest" | "junit" | "reward",
//!               junit_path, reward_path, ctrf_path, timeout_secs, fail_to_pass = [...],
//!               pass_to_pass = [...]
//! [agent]       timeout_secs, max_steps
//! [residual]    ignore = ["glob", ...]
//! ```
//!

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskToml {
    pub task: TaskSection,
    #[serde(default)]
    pub environment: EnvSection,
    pub verifier: VerifierSection,
    #[serde(default)]
    pub agent: AgentSection,
    #[serde(default)]
    pub residual: ResidualSection,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSection {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_kind")]
    pub kind: String,
    pub image: String,
    #[serde(default = "default_workdir")]
    pub workdir: String,
    #[serde(default)]
    pub description: Option<String>,
    /// A build context in the task directory (with a `Dockerfile`) that `image` is built
    /// from (`forkd image build`) when the daemon lacks `image`, or always when `rebuild`.
    #[serde(default)]
    pub build: Option<String>,
    /// Build `image` from `build` on every run (the step cache makes an unchanged
    /// rebuild cost milliseconds) rather than only when it is missing.
    #[serde(default)]
    pub rebuild: bool,
    /// `image` is a prebuilt image on a registry: pulled when the daemon lacks it, before
    /// any build (a Harbor task's `docker_image`).
    #[serde(default)]
    pub pull: bool,
}

fn default_kind() -> String {
    "swe".into()
}
fn default_workdir() -> String {
    "/testbed".into()
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    #[serde(default)]
    pub setup: Vec<String>,
    #[serde(default)]
    pub background: Vec<String>,
    /// Whether the task's states are whole machines, their processes kept; unset, what
    /// the kind implies ([`TaskToml::live`]).
    #[serde(default)]
    pub live: Option<bool>,
    /// Start the image's ENTRYPOINT (with `sleep infinity` as its command, as Harbor's
    /// Docker backend does) when the clean state is made. On for Harbor tasks.
    #[serde(default)]
    pub entrypoint: bool,
    /// A command that must succeed before the clean state is checkpointed; tried every
    /// 200 ms for up to `ready_timeout_secs` (Harbor's `[environment.healthcheck]`).
    #[serde(default)]
    pub ready: Option<String>,
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_secs: u64,
    /// What the task's sandboxes may reach: `none` (default), `egress` or
    /// `allowlist=HOST,...` (docs/NETWORK.md). Every state and trial of the task has it.
    #[serde(default)]
    pub network: Option<String>,
    /// `unconfined` for a task whose software needs what the system-call filter refuses
    /// (docs/DESIGN.md); `default` otherwise.
    #[serde(default)]
    pub seccomp: Option<String>,
    /// What each of the task's sandboxes may write, in MiB (Harbor's `storage_mb`): each
    /// trial is charged only its own writes. Not enforced, with a warning, where the
    /// daemon cannot hold disk limits.
    #[serde(default)]
    pub disk_mb: Option<u64>,
}

impl TaskToml {
    /// Whether the task's states are whole machines: the clean state, every trial's final
    /// state and the fork it is graded in keep their processes, so the verifier meets the
    /// services as the agent left them, as the task's own harness grades (Harbor runs the
    /// verifier in the trial's machine). Terminal tasks are, unless they say
    /// `live = false`; SWE tasks are graded on the files alone (a pristine copy with the
    /// trial's change) unless they say `live = true`.
    pub fn live(&self) -> bool {
        self.environment
            .live
            .unwrap_or(self.task.kind == "terminal")
    }
}

fn default_ready_timeout() -> u64 {
    30
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifierSection {
    pub command: String,
    pub tests_dir: String,
    #[serde(default = "default_format")]
    pub format: String,
    #[serde(default)]
    pub junit_path: Option<String>,
    #[serde(default)]
    pub reward_path: Option<String>,
    /// With `format = "reward"`: a CTRF report (`{"results": {"tests": [{"name",
    /// "status"}]}}`, what pytest-json-ctrf writes) whose per-test outcomes are kept
    /// beside the reward when the verifier wrote one.
    #[serde(default)]
    pub ctrf_path: Option<String>,
    #[serde(default = "default_verifier_timeout")]
    pub timeout_secs: u64,
    #[serde(default)]
    pub fail_to_pass: Vec<String>,
    #[serde(default)]
    pub pass_to_pass: Vec<String>,
}

fn default_format() -> String {
    "pytest".into()
}
fn default_verifier_timeout() -> u64 {
    600
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    #[serde(default = "default_agent_timeout")]
    pub timeout_secs: u64,
    #[serde(default = "default_steps")]
    pub max_steps: u64,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            timeout_secs: default_agent_timeout(),
            max_steps: default_steps(),
        }
    }
}

fn default_agent_timeout() -> u64 {
    1800
}
fn default_steps() -> u64 {
    250
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResidualSection {
    #[serde(default)]
    pub ignore: Vec<String>,
    /// How a predecessor's work becomes a start state: `exact` (its final state as it
    /// was, the default) or `patch` (SWE tasks: the clean state with its patch applied,
    /// uncommitted); see [`super::reconstruct`].
    #[serde(default)]
    pub reconstruct: Option<Reconstruct>,
    /// Files outside the work tree a `patch` state takes from the predecessor's final
    /// state (default: root's shell histories).
    #[serde(default)]
    pub carry: Option<Vec<String>>,
}

impl ResidualSection {
    /// The files a `patch` state carries over.
    pub fn carry(&self) -> Vec<String> {
        self.carry
            .clone()
            .unwrap_or_else(|| DEFAULT_CARRY.iter().map(|s| s.to_string()).collect())
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reconstruct {
    #[default]
    Exact,
    Patch,
}

impl std::str::FromStr for Reconstruct {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Reconstruct> {
        match s {
            "exact" => Ok(Reconstruct::Exact),
            "patch" => Ok(Reconstruct::Patch),
            other => anyhow::bail!("reconstruct {other:?}: use exact or patch"),
        }
    }
}

/// Files outside the work tree that a patch-on-base state takes from the predecessor's
/// final state when no `[residual] carry` is given.
pub const DEFAULT_CARRY: &[&str] = &["/root/.bash_history", "/root/.python_history"];
