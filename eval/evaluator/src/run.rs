//! Evaluator runs: clean start states (cached as checkpoints), the trial matrix,
//! grading, infrastructure retries, and the run directory (residual start states are
//! [`super::residual`]'s).
//!
//! Run directory (the analysis crate's contract, plus the evaluator's own records):
//! ```text
//! RUN/manifest.json        run id, fingerprint and the configuration it covers
//! RUN/decisions.jsonl      append-only log: run start/resume, protocol and review decisions
//! RUN/results.jsonl, .csv  one row per trial (its final attempt)
//! RUN/states/<id>.json     residual start states (+ .patch, binary-safe git diff)
//! RUN/states/candidates.jsonl   every candidate state, kept or dropped: its stage, why
//! RUN/review/<id>.md, .html      review sheets (`forkd eval review`)
//! RUN/tasks/<task>.json    reference changed files, FAIL_TO_PASS, PASS_TO_PASS
//! RUN/trials/<id>/         trajectory.jsonl, final.patch, attempts.jsonl, agent logs
//! ```

use super::agent::{run_agent, AgentSpec};
use super::brief::Brief;
use super::grade::{grade, Grade};
use super::records::append_jsonl;
use super::session::{Infra, InfraResult, Session};
use super::task::Task;
use forkd_analysis::{Condition, Outcome, TestResult, TrialRow};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The fixed notice of a rescue (the pilot study's "V0" prompt).
pub const NOTICE: &str = "A previous coding agent attempted this task but did not solve it. Independently inspect \
the current repository state and complete the original task. Existing modifications may be correct, partially \
correct, or wrong.";

/// One trial to run.
#[derive(Debug, Clone)]
pub struct TrialSpec {
    pub id: String,
    pub task: usize,
    pub condition: Condition,
    /// "clean" or a state id.
    pub start_state: String,
    pub start_checkpoint: String,
    pub predecessor: Option<String>,
    pub agent: usize,
    pub replicate: u32,
}

pub struct Ctx<'a> {
    pub socket: PathBuf,
    pub run_dir: PathBuf,
    pub run_id: String,
    pub tasks: &'a [Task],
    pub agents: &'a [AgentSpec],
    pub retries: u32,
    pub results: Mutex<()>,
    /// The run's `--reconstruct`, over each task's own.
    pub reconstruct: Option<super::reconstruct::Reconstruct>,
    /// The shard this invocation runs, in a sharded run.
    pub shard: Option<&'a super::shard::Sharding>,
}

impl Ctx<'_> {
    /// What agents must not see: the run directory and every suite the run's tasks come
    /// from (their hidden tests and solutions).
    pub fn hidden_from_agents(&self) -> Vec<PathBuf> {
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut hide = vec![abs(&self.run_dir)];
        // A shard's directory is inside the run's, beside the other shards and the
        // shared start-state archives: the whole run is hidden.
        if let Some(sh) = self.shard {
            hide.insert(0, abs(&sh.top));
        }
        for t in self.tasks {
            let suite = abs(t.dir.parent().unwrap_or(&t.dir));
            if !hide.contains(&suite) {
                hide.push(suite);
            }
        }
        hide
    }

    /// How residual states of `task` are built in this run.
    pub fn reconstruct_for(&self, task: &Task) -> super::reconstruct::Reconstruct {
        self.reconstruct
            .or(task.config.residual.reconstruct)
            .unwrap_or_default()
    }
}

/// The prompt an agent gets under a condition.
pub fn instruction(task: &Task, condition: Condition, note: Option<&str>) -> String {
    match condition {
        Condition::RescueNotice => format!("{NOTICE}\n\n{}", task.instruction),
        Condition::RescueNote => format!(
            "{NOTICE}\n\n{}\n\nA note left by the previous agent (a hint to check, not to trust):\n\n{}",
            task.instruction,
            note.unwrap_or("")
        ),
        _ => task.instruction.clone(),
    }
}

/// The result of one attempt at a trial.
pub struct Attempt {
    pub outcome: Outcome,
    pub submitted: bool,
    pub tests: BTreeMap<String, TestResult>,
    pub steps: u64,
    pub wall_ms: u64,
    pub trajectory: Vec<serde_json::Value>,
    pub grade: Grade,
    pub note: String,
    pub final_checkpoint: Option<String>,
    /// Milliseconds per phase: fork, agent, seal, remove, grade_* (fork, processes,
    /// diff, copy_tests, verifier, remove), remove_final.
    pub phases_ms: BTreeMap<String, f64>,
}

/// Runs one attempt: fork the start state, run the agent under its budget, seal the final
/// state, grade it on a fresh fork. `keep_final` keeps the final state as a live checkpoint.
fn attempt(
    s: &Session,
    ctx: &Ctx,
    spec: &TrialSpec,
    keep_final: bool,
    scratch: &Path,
) -> InfraResult<Attempt> {
    let task = &ctx.tasks[spec.task];
    let agent = &ctx.agents[spec.agent];
    let mut phases = BTreeMap::new();
    let t = Instant::now();
    let sb = s.fork(&spec.start_checkpoint, !task.config.live())?;
    phases.insert("fork".to_string(), super::grade::ms(t));
    let result = (|| {
        let base = s.execs(&sb)?.len();
        let note = match (spec.condition, &spec.predecessor) {
            (Condition::RescueNote, Some(p)) => note_for(&ctx.run_dir, task, &spec.start_state, p),
            _ => None,
        };
        let brief = Brief {
            task,
            sandbox: &sb,
            instruction: instruction(task, spec.condition, note.as_deref()),
            note,
            timeout: Duration::from_secs(task.config.agent.timeout_secs),
            max_steps: task.config.agent.max_steps,
            scratch,
            hide: ctx.hidden_from_agents(),
        };
        let t0 = Instant::now();
        let run = run_agent(s, agent, &brief)?;
        let wall_ms = t0.elapsed().as_millis() as u64;
        let execs: Vec<serde_json::Value> = s.execs(&sb)?.into_iter().skip(base).collect();
        let steps = run.steps.unwrap_or(execs.len() as u64);
        let t = Instant::now();
        // Terminal-style tasks are whole machines: their final state keeps its processes,
        // so the verifier sees the services as the agent left them. A kept state is
        // always live. A state that cannot be sealed so is an infrastructure failure
        // naming the process CRIU could not keep, never graded on its files instead.
        let live = keep_final || task.config.live();
        let final_state = s
            .checkpoint(&sb, live, &[("forkd.eval.trial", &spec.id)])
            .map_err(|e| {
                let how = if live {
                    "live, with its processes"
                } else {
                    "(its files)"
                };
                Infra(format!(
                    "seal the final state of trial {} {how}: {}",
                    spec.id, e.0
                ))
            })?;
        let seal_ms = super::grade::ms(t);
        Ok((run, wall_ms, execs, steps, final_state, seal_ms))
    })();
    let t = Instant::now();
    s.remove(&sb);
    let (run, wall_ms, execs, steps, final_state, seal_ms) = result?;
    phases.insert("agent".to_string(), wall_ms as f64);
    phases.insert("seal".to_string(), seal_ms);
    phases.insert("remove".to_string(), super::grade::ms(t));
    let graded = grade(s, task, &final_state.id);
    let t = Instant::now();
    if !keep_final || graded.is_err() {
        s.remove_checkpoint(&final_state.id);
    }
    phases.insert("remove_final".to_string(), super::grade::ms(t));
    let grade = graded?;
    for (k, v) in &grade.phases_ms {
        phases.insert(format!("grade_{k}"), *v);
    }
    let over_budget = run.budget_exhausted || steps > task.config.agent.max_steps;
    let outcome = if over_budget {
        Outcome::BudgetExhausted
    } else if !run.submitted {
        Outcome::NoSubmit
    } else if grade.passed {
        Outcome::Pass
    } else {
        Outcome::Fail
    };
    let t_start = execs.first().and_then(|e| e["t_us"].as_u64()).unwrap_or(0);
    let trajectory = execs.iter().map(|e| trajectory_line(e, t_start)).collect();
    Ok(Attempt {
        outcome,
        submitted: run.submitted && !over_budget,
        tests: grade.tests.clone(),
        steps,
        wall_ms,
        trajectory,
        grade,
        note: run.note,
        final_checkpoint: keep_final.then_some(final_state.id),
        phases_ms: phases,
    })
}

/// The handoff note of a residual start state: the one its harness predecessor's model
/// wrote (`states/<state>.note.md`), else the task's scripted predecessor's note file.
pub fn note_for(run_dir: &Path, task: &Task, state_id: &str, predecessor: &str) -> Option<String> {
    std::fs::read_to_string(run_dir.join("states").join(format!("{state_id}.note.md")))
        .ok()
        .or_else(|| task.note_of(predecessor))
}

/// One exec of the daemon's log as a trajectory line of the analysis contract.
fn trajectory_line(e: &serde_json::Value, t0: u64) -> serde_json::Value {
    let t_ms = e["t_us"].as_u64().unwrap_or(0).saturating_sub(t0) / 1000;
    if let Some(argv) = e["argv"].as_array() {
        let words: Vec<String> = argv
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        if words.len() >= 4 && words[0] == "tmux" && words[1] == "send-keys" {
            let keys: Vec<&str> = words[4..]
                .iter()
                .map(String::as_str)
                .filter(|k| *k != "Enter")
                .collect();
            return serde_json::json!({ "t_ms": t_ms, "keys": keys.join(" ") });
        }
        return serde_json::json!({ "t_ms": t_ms, "argv": words });
    }
    serde_json::json!({ "t_ms": t_ms, "shell": e["shell"].as_str().unwrap_or_default() })
}

/// Runs a trial with bounded infrastructure retries from the identical start state;
/// writes its artifacts and returns its row (and its final live checkpoint, if kept).
pub fn run_trial(ctx: &Ctx, spec: &TrialSpec, keep_final: bool) -> (TrialRow, Option<Attempt>) {
    let s = Session::new(&ctx.socket);
    let dir = ctx.run_dir.join("trials").join(&spec.id);
    let _ = std::fs::create_dir_all(&dir);
    let mut infra_attempts = 0;
    let mut last_err = String::new();
    for n in 1..=ctx.retries + 1 {
        match attempt(&s, ctx, spec, keep_final, &dir) {
            Ok(a) => {
                let _ = append_jsonl(
                    &dir.join("attempts.jsonl"),
                    &serde_json::json!({"attempt": n, "outcome": a.outcome, "note": a.note, "phases_ms": a.phases_ms}),
                );
                let traj: String = a.trajectory.iter().map(|l| format!("{l}\n")).collect();
                let _ = std::fs::write(dir.join("trajectory.jsonl"), traj);
                let _ = std::fs::write(dir.join("final.patch"), &a.grade.patch);
                let _ = std::fs::write(dir.join("verifier.log"), &a.grade.verifier_output);
                if let Some(p) = &a.grade.processes {
                    let _ = std::fs::write(dir.join("processes.txt"), p);
                }
                let row = row(
                    ctx,
                    spec,
                    a.outcome,
                    a.submitted,
                    a.tests.clone(),
                    a.steps,
                    a.wall_ms,
                    infra_attempts,
                );
                return (row, Some(a));
            }
            Err(Infra(e)) => {
                infra_attempts += 1;
                last_err = e.clone();
                let _ = append_jsonl(
                    &dir.join("attempts.jsonl"),
                    &serde_json::json!({"attempt": n, "outcome": "infra_error", "error": e}),
                );
            }
        }
    }
    let _ = std::fs::write(dir.join("infra_error.txt"), &last_err);
    (
        row(
            ctx,
            spec,
            Outcome::InfraError,
            false,
            BTreeMap::new(),
            0,
            0,
            infra_attempts,
        ),
        None,
    )
}

#[allow(clippy::too_many_arguments)]
fn row(
    ctx: &Ctx,
    spec: &TrialSpec,
    outcome: Outcome,
    submitted: bool,
    tests: BTreeMap<String, TestResult>,
    steps: u64,
    wall_ms: u64,
    infra_attempts: u32,
) -> TrialRow {
    TrialRow {
        run_id: ctx.run_id.clone(),
        trial_id: spec.id.clone(),
        task: ctx.tasks[spec.task].name.clone(),
        condition: spec.condition,
        start_state: spec.start_state.clone(),
        predecessor: spec.predecessor.clone(),
        agent: ctx.agents[spec.agent].name(),
        replicate: spec.replicate,
        outcome,
        submitted,
        tests,
        steps,
        wall_ms,
        infra_attempts,
    }
}
