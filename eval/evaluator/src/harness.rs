//! Real agent harnesses run in a trial: mini-swe-agent, through the Python package's
//! driver (`python/src/forkd/minisweagent/evalrun.py`).
//!
//! The evaluator writes a brief (socket, the trial's sandbox, its workdir, the
//! condition's full text, the harness configuration, the step budget, the wall-clock
//! budget, where to write), runs `FORKD_PYTHON -m forkd.minisweagent.evalrun BRIEF` in a
//! process group of its own, confined to the trial as external agents are
//! ([`super::confine`]: its own user, a grant on the sandbox as its socket), and reads the
//! result the driver writes. mini-swe-agent enforces the step budget itself (its
//! `step_limit`, model calls), the daemon the same number of execs, and the harness the
//! wall clock (its `wall_time_limit_seconds`); the evaluator kills the whole group past
//! the wall clock plus a grace period, or once the daemon refused an exec for the budget,
//! which are budget exhaustions too. A harness or model-endpoint
//! failure (connection refused, HTTP 5xx, timeouts, a harness that exits without a
//! result) is infrastructure: the trial is retried from the identical state.
//!
//! Spec: `mini-swe-agent[:CONFIG][#MODEL]`. CONFIG is a mini-swe-agent config file
//! (default its own `mini.yaml`); MODEL a LiteLLM model string (default the config's
//! `model.model_name`, else `MSWEA_MODEL_NAME`). Base URL and key come from the
//! environment, as LiteLLM reads them (`OPENAI_API_BASE`, `OPENAI_API_KEY`,
//! `HOSTED_VLLM_API_BASE`, ...).

use super::brief::{AgentRun, Brief};
use super::confine::budget_refused;
use super::session::{Infra, InfraResult, Session};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The spec's prefix.
pub const MINI_SWE_AGENT: &str = "mini-swe-agent";

/// Extra wall-clock time past the budget before the evaluator kills the harness (it
/// stops itself at the budget and saves its trajectory first).
const GRACE: Duration = Duration::from_secs(30);

/// A mini-swe-agent agent: its config file and model, when given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiniSweAgent {
    pub config: Option<PathBuf>,
    pub model: Option<String>,
}

impl MiniSweAgent {
    /// Parses the part after `mini-swe-agent` (empty, or `:CONFIG`, then `#MODEL`).
    pub fn parse(rest: &str) -> anyhow::Result<MiniSweAgent> {
        let (body, model) = match rest.split_once('#') {
            Some((b, m)) if !m.trim().is_empty() => (b, Some(m.trim().to_string())),
            Some(_) => anyhow::bail!("agent {MINI_SWE_AGENT}{rest}: empty model after '#'"),
            None => (rest, None),
        };
        let config = match body {
            "" => None,
            _ => {
                let Some(path) = body.strip_prefix(':').filter(|p| !p.is_empty()) else {
                    anyhow::bail!(
                        "agent {MINI_SWE_AGENT}{rest}: expected {MINI_SWE_AGENT}[:CONFIG][#MODEL]"
                    )
                };
                let p = PathBuf::from(path);
                anyhow::ensure!(
                    p.is_file(),
                    "agent {MINI_SWE_AGENT}: config file {} does not exist",
                    p.display()
                );
                Some(std::fs::canonicalize(p)?)
            }
        };
        Ok(MiniSweAgent { config, model })
    }

    /// Its name in results: `mini-swe-agent`, or `mini-swe-agent.STEM` with a config.
    pub fn name(&self) -> String {
        match &self.config {
            None => MINI_SWE_AGENT.into(),
            Some(p) => format!(
                "{MINI_SWE_AGENT}.{}",
                p.file_stem()
                    .map(|s| s.to_string_lossy().to_string())
                    .unwrap_or_default()
            ),
        }
    }

    /// The spec's text, with `model` filled in when it has none (`--model`).
    pub fn with_default_model(spec: &str, model: &str) -> String {
        if spec.starts_with(MINI_SWE_AGENT) && !spec.contains('#') {
            format!("{spec}#{model}")
        } else {
            spec.to_string()
        }
    }

    fn brief(&self, socket: &Path) -> serde_json::Value {
        serde_json::json!({
            "socket": socket,
            "configs": self.config.iter().collect::<Vec<_>>(),
            "model": self.model,
        })
    }

    /// Loads the configuration and the model without running anything, so that a run
    /// refuses a broken configuration before its first trial.
    pub fn check(&self, socket: &Path, scratch: &Path) -> anyhow::Result<String> {
        std::fs::create_dir_all(scratch)?;
        let path = scratch.join("check-brief.json");
        std::fs::write(&path, serde_json::to_vec(&self.brief(socket))?)?;
        let out = self
            .command(&path, socket)
            .arg("--check")
            .output()
            .map_err(|e| anyhow::anyhow!("start {}: {e} (set FORKD_PYTHON)", python()))?;
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir(scratch);
        anyhow::ensure!(
            out.status.success(),
            "agent {}: {} -m forkd.minisweagent.evalrun --check failed ({}): {}",
            self.name(),
            python(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Writes a handoff note at `out`: one tool-free request to this agent's model with
    /// its own trajectory (`python/src/forkd/minisweagent/note.py`).
    pub fn write_note(&self, socket: &Path, trajectory: &Path, out: &Path) -> anyhow::Result<()> {
        let mut brief = self.brief(socket);
        brief["trajectory"] = trajectory.to_string_lossy().into_owned().into();
        brief["out"] = out.to_string_lossy().into_owned().into();
        let path = out.with_extension("brief.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&brief)?)?;
        let result = self
            .module_command("forkd.minisweagent.note", &path, socket)
            .output()
            .map_err(|e| anyhow::anyhow!("start {}: {e} (set FORKD_PYTHON)", python()));
        let _ = std::fs::remove_file(&path);
        let out_ = result?;
        anyhow::ensure!(
            out_.status.success() && out.is_file(),
            "handoff note of {} from {}: {} ({})",
            self.name(),
            trajectory.display(),
            String::from_utf8_lossy(&out_.stderr).trim(),
            out_.status
        );
        Ok(())
    }

    fn command(&self, brief: &Path, socket: &Path) -> std::process::Command {
        self.module_command("forkd.minisweagent.evalrun", brief, socket)
    }

    fn module_command(&self, module: &str, brief: &Path, socket: &Path) -> std::process::Command {
        let mut cmd = std::process::Command::new(python());
        cmd.arg("-m")
            .arg(module)
            .arg(brief)
            .env("FORKD_SOCKET", socket)
            .stdin(std::process::Stdio::null());
        // Quiet, offline defaults for the harness, unless the user set them.
        for (k, v) in [
            ("MSWEA_SILENT_STARTUP", "1"),
            ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
            ("MSWEA_COST_TRACKING", "ignore_errors"),
        ] {
            if std::env::var_os(k).is_none() {
                cmd.env(k, v);
            }
        }
        cmd
    }

    /// Runs the harness on the trial's sandbox under the brief's budgets, confined to it
    /// (see [`super::confine`]): its own user, a grant on the sandbox, the suites and the
    /// run directory out of sight. Its configuration files are copied into its directory.
    pub fn run(&self, s: &Session, b: &Brief) -> InfraResult<AgentRun> {
        let infra = |m: String| Infra(format!("{}: {m}", self.name()));
        let jail = b.confine(s)?;
        let dir = jail.dir.clone();
        let (brief_path, result_path) = (dir.join("brief.json"), dir.join("result.json"));
        let trajectory = dir.join("trajectory.json");
        let mut brief = self.brief(Path::new(&jail.grant.socket));
        let mut configs = Vec::new();
        for (i, c) in self.config.iter().enumerate() {
            let data = std::fs::read(c).map_err(|e| infra(format!("read {}: {e}", c.display())))?;
            let name = format!(
                "config-{i}-{}",
                c.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            );
            configs.push(jail.give(&name, &data)?);
        }
        brief["configs"] = serde_json::to_value(&configs).expect("json");
        brief["sandbox"] = b.sandbox.into();
        brief["workdir"] = b.task.workdir().into();
        brief["task"] = b.instruction.clone().into();
        brief["step_limit"] = b.max_steps.into();
        brief["wall_time_limit_seconds"] = b.timeout.as_secs().into();
        brief["trajectory"] = trajectory.to_string_lossy().into_owned().into();
        brief["result"] = result_path.to_string_lossy().into_owned().into();
        jail.give(
            "brief.json",
            &serde_json::to_vec_pretty(&brief).expect("json"),
        )?;
        let file = |name: &str| {
            std::fs::File::create(b.scratch.join(name))
                .map_err(|e| infra(format!("create {}: {e}", b.scratch.join(name).display())))
        };
        let mut cmd = self.command(&brief_path, Path::new(&jail.grant.socket));
        cmd.stdout(file("harness.out")?)
            .stderr(file("harness.err")?);
        jail.apply(&mut cmd)?;
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let record = b.scratch.join("grant.json");
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = jail.finish(s, &record);
                return Err(infra(format!("start {}: {e} (set FORKD_PYTHON)", python())));
            }
        };
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().map_err(|e| infra(e.to_string()))? {
                break Some(st);
            }
            if start.elapsed() > b.timeout + GRACE || jail.budget_spent(s) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::SIGKILL,
                );
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let grant = jail.finish(s, &record)?;
        if budget_refused(&grant) || status.is_none() {
            let note = if budget_refused(&grant) {
                "step budget (an exec past it was refused)"
            } else {
                "wall-clock budget (killed)"
            };
            return Ok(AgentRun {
                submitted: false,
                budget_exhausted: true,
                note: note.into(),
                steps: None,
            });
        }
        let status = status.expect("checked above");
        let result: HarnessResult = match std::fs::read(&result_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| infra(format!("result {}: {e}", result_path.display())))?,
            Err(_) => {
                return Err(infra(format!(
                    "exited ({status}) without a result; stderr: {}",
                    tail(&b.scratch.join("harness.err"))
                )))
            }
        };
        let steps = Some(result.steps);
        match result.status.as_str() {
            "submitted" => Ok(AgentRun {
                submitted: true,
                budget_exhausted: false,
                note: result.exit_status,
                steps,
            }),
            "budget" => Ok(AgentRun {
                submitted: false,
                budget_exhausted: true,
                note: result.exit_status,
                steps,
            }),
            "stopped" => Ok(AgentRun {
                submitted: false,
                budget_exhausted: false,
                note: result.exit_status,
                steps,
            }),
            "infra" => Err(infra(result.error)),
            other => Err(infra(format!("unknown result status {other:?}"))),
        }
    }
}

#[derive(Deserialize)]
struct HarnessResult {
    status: String,
    #[serde(default)]
    exit_status: String,
    #[serde(default)]
    steps: u64,
    #[serde(default)]
    error: String,
}

/// The Python that has mini-swe-agent and this package: `FORKD_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("FORKD_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The last lines of a log, for an error message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(8).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_with_config_and_model() {
        let a = MiniSweAgent::parse("").unwrap();
        assert_eq!(
            a,
            MiniSweAgent {
                config: None,
                model: None
            }
        );
        assert_eq!(a.name(), "mini-swe-agent");
        let a = MiniSweAgent::parse("#hosted_vllm/Qwen/Qwen3-8B").unwrap();
        assert_eq!(a.model.as_deref(), Some("hosted_vllm/Qwen/Qwen3-8B"));
        let dir = std::env::temp_dir().join(format!("forkd-msa-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("swe.yaml");
        std::fs::write(&cfg, "agent: {}\n").unwrap();
        let a = MiniSweAgent::parse(&format!(":{}#openai/m", cfg.display())).unwrap();
        assert_eq!(a.name(), "mini-swe-agent.swe");
        assert_eq!(a.model.as_deref(), Some("openai/m"));
        assert!(MiniSweAgent::parse(":/no/such.yaml").is_err());
        assert!(MiniSweAgent::parse("#").is_err());
        assert!(MiniSweAgent::parse("x").is_err());
        assert_eq!(
            MiniSweAgent::with_default_model("mini-swe-agent", "m"),
            "mini-swe-agent#m"
        );
        assert_eq!(
            MiniSweAgent::with_default_model("mini-swe-agent#x", "m"),
            "mini-swe-agent#x"
        );
        assert_eq!(MiniSweAgent::with_default_model("oracle", "m"), "oracle");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
