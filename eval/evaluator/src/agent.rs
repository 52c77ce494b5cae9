//! Agents. An agent is an external command given the request and a handle to its
//! sandbox (`FORKD_SOCKET`: a grant on that sandbox only, `FORKD_SANDBOX`,
//! `FORKD_WORKDIR`, `FORKD_INSTRUCTION`: a file holding the request, `FORKD_NOTE`: a
//! handoff note when there is one); it runs confined to its trial ([`super::confine`]),
//! acts through forkd's CLI or API, and its exit is its submission (0: it claims
//! completion). Budgets: wall clock and steps (execs in its sandbox, counted and enforced
//! by the daemon). Built-in scripted agents, for tests,
//! demos and predecessors: `oracle`, `noop`, `patch:FILE`, `script:FILE`, `replay:FILE`.
//! Real harnesses (`mini-swe-agent[:CONFIG][#MODEL]`) are in [`super::harness`].
//! Every exec of every agent is logged by the daemon with timestamps: the trajectory.

use super::brief::{AgentRun, Brief};
use super::confine::budget_refused;
use super::harness::{MiniSweAgent, MINI_SWE_AGENT};
use super::session::{InfraResult, Session};
use forkd_api::ExecRequest;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSpec {
    /// Applies the task's reference solution.
    Oracle,
    /// Does nothing and submits.
    Noop,
    /// Applies a patch (patch -p1 in the workdir) and submits.
    Patch(PathBuf),
    /// Runs a shell script in the workdir; submits when it exits 0.
    Script(PathBuf),
    /// Replays a recorded trajectory: one command a line (plain text is a shell line;
    /// JSON `{"shell": ...}`, `{"argv": [...]}` or `{"keys": ...}` for tmux send-keys).
    Replay(PathBuf),
    /// An external command run on the host.
    External { name: String, command: String },
    /// mini-swe-agent, run on the trial's sandbox through the Python package's driver.
    MiniSweAgent(MiniSweAgent),
}

impl AgentSpec {
    /// `oracle`, `noop`, `patch:FILE`, `script:FILE`, `replay:FILE`,
    /// `mini-swe-agent[:CONFIG][#MODEL]`, `NAME=COMMAND`.
    pub fn parse(s: &str) -> anyhow::Result<AgentSpec> {
        if let Some(rest) = s.strip_prefix(MINI_SWE_AGENT) {
            if rest.is_empty() || rest.starts_with(':') || rest.starts_with('#') {
                return Ok(AgentSpec::MiniSweAgent(MiniSweAgent::parse(rest)?));
            }
        }
        let file = |p: &str| -> anyhow::Result<PathBuf> {
            let p = PathBuf::from(p);
            anyhow::ensure!(p.is_file(), "agent file {} does not exist", p.display());
            Ok(std::fs::canonicalize(p)?)
        };
        Ok(match s.split_once(':') {
            _ if s == "oracle" => AgentSpec::Oracle,
            _ if s == "noop" => AgentSpec::Noop,
            Some(("patch", f)) => AgentSpec::Patch(file(f)?),
            Some(("script", f)) => AgentSpec::Script(file(f)?),
            Some(("replay", f)) => AgentSpec::Replay(file(f)?),
            _ => match s.split_once('=') {
                Some((name, command)) if super::task::valid_name(name) && !command.is_empty() => {
                    AgentSpec::External { name: name.into(), command: command.into() }
                }
                _ => anyhow::bail!(
                    "agent {s:?}: expected oracle, noop, patch:FILE, script:FILE, replay:FILE, mini-swe-agent[:CONFIG][#MODEL] or NAME=COMMAND"
                ),
            },
        })
    }

    /// The agent's name in results.
    pub fn name(&self) -> String {
        let stem = |p: &Path| {
            p.file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default()
        };
        match self {
            AgentSpec::Oracle => "oracle".into(),
            AgentSpec::Noop => "noop".into(),
            AgentSpec::Patch(p) | AgentSpec::Script(p) | AgentSpec::Replay(p) => stem(p),
            AgentSpec::External { name, .. } => name.clone(),
            AgentSpec::MiniSweAgent(a) => a.name(),
        }
    }

    /// What fingerprints the agent: its spec and the contents of its file.
    pub fn fingerprint(&self) -> String {
        let file = match self {
            AgentSpec::Patch(p) | AgentSpec::Script(p) | AgentSpec::Replay(p) => {
                std::fs::read(p).unwrap_or_default()
            }
            AgentSpec::MiniSweAgent(MiniSweAgent {
                config: Some(p), ..
            }) => std::fs::read(p).unwrap_or_default(),
            _ => Vec::new(),
        };
        use sha2::Digest;
        let h: String = sha2::Sha256::digest(&file)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{self:?}#{h}")
    }
}

pub fn run_agent(s: &Session, spec: &AgentSpec, b: &Brief) -> InfraResult<AgentRun> {
    let wd = b.task.workdir();
    let secs = Some(b.timeout.as_secs().max(1));
    let done = |ok: bool, note: &str| AgentRun {
        submitted: ok,
        budget_exhausted: false,
        note: note.into(),
        steps: None,
    };
    match spec {
        AgentSpec::Noop => Ok(done(true, "")),
        AgentSpec::Oracle => {
            let sol = b.task.dir.join("solution");
            s.put_dir(b.sandbox, &sol, "/tmp/.solution")?;
            // solve.sh runs under its own interpreter line (Harbor's are bash), else sh.
            let line = if sol.join("solve.sh").is_file() {
                "f=/tmp/.solution/solve.sh; if [ \"$(head -c 2 \"$f\")\" = '#!' ]; then chmod +x \"$f\" && \"$f\"; else sh \"$f\"; fi"
            } else {
                "patch -p1 < /tmp/.solution/patch.diff"
            };
            let r = s.sh(b.sandbox, line, wd, secs)?;
            s.sh(b.sandbox, "rm -rf /tmp/.solution", "/", Some(30))?;
            Ok(AgentRun {
                submitted: r.code == 0,
                budget_exhausted: r.timed_out,
                note: r.err(),
                steps: None,
            })
        }
        AgentSpec::Patch(p) | AgentSpec::Script(p) => {
            let data = std::fs::read(p).map_err(|e| {
                super::session::Infra(format!("read agent file {}: {e}", p.display()))
            })?;
            let line = if matches!(spec, AgentSpec::Patch(_)) {
                "patch -p1"
            } else {
                "sh -s"
            };
            let req = ExecRequest {
                shell: Some(line.into()),
                cwd: Some(wd.into()),
                timeout_ms: secs.map(|s| s * 1000),
                ..Default::default()
            };
            let r = s.exec(b.sandbox, &req, Some(&data))?;
            Ok(AgentRun {
                submitted: r.code == 0,
                budget_exhausted: r.timed_out,
                note: r.err(),
                steps: None,
            })
        }
        AgentSpec::Replay(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                super::session::Infra(format!("read trajectory {}: {e}", p.display()))
            })?;
            let start = Instant::now();
            let mut steps = 0;
            for line in text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            {
                if start.elapsed() > b.timeout || steps >= b.max_steps {
                    return Ok(AgentRun {
                        submitted: false,
                        budget_exhausted: true,
                        note: "budget".into(),
                        steps: None,
                    });
                }
                steps += 1;
                let mut req = ExecRequest {
                    cwd: Some(wd.into()),
                    timeout_ms: Some(60_000),
                    ..Default::default()
                };
                match serde_json::from_str::<serde_json::Value>(line) {
                    Ok(v) if v.get("keys").is_some() => {
                        let keys = v["keys"].as_str().unwrap_or_default().to_string();
                        req.argv = vec![
                            "tmux".into(),
                            "send-keys".into(),
                            "-t".into(),
                            "main".into(),
                            keys,
                            "Enter".into(),
                        ];
                        req.env = vec!["TERM=xterm".into()];
                    }
                    Ok(v) if v.get("argv").is_some() => {
                        req.argv = serde_json::from_value(v["argv"].clone()).unwrap_or_default();
                    }
                    Ok(v) if v.get("shell").is_some() => {
                        req.shell = v["shell"].as_str().map(String::from)
                    }
                    _ => req.shell = Some(line.to_string()),
                }
                s.exec(b.sandbox, &req, None)?;
            }
            Ok(done(true, ""))
        }
        AgentSpec::External { command, .. } => run_external(s, command, b),
        AgentSpec::MiniSweAgent(a) => a.run(s, b),
    }
}

fn run_external(s: &Session, command: &str, b: &Brief) -> InfraResult<AgentRun> {
    let infra = |m: String| super::session::Infra(m);
    let jail = b.confine(s)?;
    let instr = jail.give("instruction.md", b.instruction.as_bytes())?;
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(command)
        .env("FORKD_SANDBOX", b.sandbox)
        .env("FORKD_WORKDIR", b.task.workdir())
        .env("FORKD_INSTRUCTION", &instr)
        .env("FORKD_MAX_STEPS", b.max_steps.to_string())
        .env("FORKD_TIMEOUT_SECS", b.timeout.as_secs().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(
            std::fs::File::create(b.scratch.join("agent.out")).map_err(|e| infra(e.to_string()))?,
        )
        .stderr(
            std::fs::File::create(b.scratch.join("agent.err")).map_err(|e| infra(e.to_string()))?,
        );
    if let Some(note) = &b.note {
        cmd.env("FORKD_NOTE", jail.give("note.md", note.as_bytes())?);
    }
    jail.apply(&mut cmd)?;
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let spawned = cmd
        .spawn()
        .map_err(|e| infra(format!("start agent {command:?}: {e}")));
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = jail.finish(s, &b.scratch.join("grant.json"));
            return Err(e);
        }
    };
    let start = Instant::now();
    let ended = loop {
        if let Some(status) = child.try_wait().map_err(|e| infra(e.to_string()))? {
            break Ok(status);
        }
        let over_time = start.elapsed() > b.timeout;
        if over_time || jail.budget_spent(s) {
            // The whole process group: agents often start helpers.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::SIGKILL,
            );
            let _ = child.wait();
            break Err(if over_time {
                "wall-clock budget"
            } else {
                "step budget"
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let grant = jail.finish(s, &b.scratch.join("grant.json"))?;
    Ok(match ended {
        // An agent that ran into its step budget did not finish, whatever it exited with.
        Ok(_) if budget_refused(&grant) => AgentRun {
            submitted: false,
            budget_exhausted: true,
            note: "step budget".into(),
            steps: None,
        },
        Ok(status) => AgentRun {
            submitted: status.success(),
            budget_exhausted: false,
            note: format!("exit {status}"),
            steps: None,
        },
        Err(why) => AgentRun {
            submitted: false,
            budget_exhausted: true,
            note: why.into(),
            steps: None,
        },
    })
}
