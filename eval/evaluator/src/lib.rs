//! The evaluator: paired clean-start and inherited-start experiments on forkd's own
//! checkpoint and fork API (never Docker). See `task` (the suite format), `agent`,
//! `grade`, `run` (states, trials, the run directory) and `delta` (what a state changed).
//! It speaks to the daemon only through the API and its client (`forkd-api`); the
//! statistics and report are `forkd-analysis`, beside it.
#![forbid(unsafe_code)]

pub mod agent;
pub mod archives;
pub mod brief;
pub mod clean;
pub mod confine;
pub mod delta;
pub mod grade;
pub mod harbor_task;
pub mod harness;
pub mod reconstruct;
pub mod records;
pub mod residual;
pub mod review;
pub mod run;
pub mod session;
pub mod shard;
pub mod slurm;
pub mod task;
pub mod task_toml;

use agent::AgentSpec;
use forkd_analysis::{Condition, Outcome, TrialRow};
use records::{Manifest, RunConfig};
use run::{Ctx, TrialSpec};
use session::Session;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What to run.
pub struct RunOptions {
    pub suite: PathBuf,
    pub out: PathBuf,
    pub agents: Vec<String>,
    pub predecessors: Vec<String>,
    pub conditions: Vec<Condition>,
    pub replicates: u32,
    pub parallel: usize,
    pub retries: u32,
    /// Stop after the start states (clean and residual) are built.
    pub states_only: bool,
    /// How residual states are built, for every task (else each task's own).
    pub reconstruct: Option<reconstruct::Reconstruct>,
    /// Human review of the residual candidates.
    pub review: review::Policy,
    /// This invocation runs one shard of a sharded run (`out` is the shard's directory).
    pub shard: Option<shard::Sharding>,
}

pub fn parse_condition(s: &str) -> anyhow::Result<Condition> {
    Ok(match s {
        "clean" => Condition::Clean,
        "residual" => Condition::Residual,
        "rescue_notice" | "rescue-notice" => Condition::RescueNotice,
        "rescue_note" | "rescue-note" => Condition::RescueNote,
        "pristine_control" | "pristine-control" => Condition::PristineControl,
        _ => anyhow::bail!("condition {s:?}: expected clean, residual, rescue_notice, rescue_note or pristine_control"),
    })
}

/// What a `forkd eval` command has to say when it ends: the value `--json` prints, the
/// lines a person reads instead, and the exit status. Progress goes to stderr as it
/// happens; this is the one answer on stdout.
pub struct Said {
    pub json: serde_json::Value,
    pub text: String,
    pub code: i32,
}

impl Said {
    pub fn new(json: serde_json::Value, text: impl Into<String>) -> Said {
        Said {
            json,
            text: text.into(),
            code: 0,
        }
    }

    pub fn with_code(mut self, code: i32) -> Said {
        self.code = code;
        self
    }
}

/// One task's verdict in `forkd eval validate`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Validity {
    pub task: String,
    /// Graded with its processes (a live fork of the state), as terminal tasks are.
    pub live: bool,
    /// `fails`, `passes` or `error` (the unchanged start could not be graded).
    pub start: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
    /// The reference solution's outcome, as a trial's.
    pub solution: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub solution_error: Option<String>,
    /// The start fails and the solution passes.
    pub valid: bool,
}

/// `forkd eval validate`: the reference solution passes and the unchanged start fails.
pub fn validate(socket: &Path, suite: &Path) -> anyhow::Result<Said> {
    let tasks = task::load_suite(suite)?;
    let s = Session::new(socket);
    let images = clean::ensure_images(&s, &tasks)?;
    let agents = vec![AgentSpec::Oracle];
    let dir = std::env::temp_dir().join(format!("forkd-validate-{}", std::process::id()));
    let ctx = Ctx {
        socket: socket.to_path_buf(),
        run_dir: dir.clone(),
        run_id: "validate".into(),
        tasks: &tasks,
        agents: &agents,
        retries: 1,
        results: Mutex::new(()),
        reconstruct: None,
        shard: None,
    };
    let mut verdicts = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let clean = clean::clean_state(&s, t, &images[&t.config.task.image])?;
        let start = grade::grade(&s, t, &clean);
        let spec = TrialSpec {
            id: format!("validate.{}", t.name),
            task: i,
            condition: Condition::Clean,
            start_state: "clean".into(),
            start_checkpoint: clean,
            predecessor: None,
            agent: 0,
            replicate: 0,
        };
        let (row, _) = run::run_trial(&ctx, &spec, false);
        let solution_error = (row.outcome == Outcome::InfraError)
            .then(|| {
                std::fs::read_to_string(dir.join("trials").join(&spec.id).join("infra_error.txt"))
                    .ok()
            })
            .flatten();
        let (start_word, start_error) = match &start {
            Ok(g) if g.passed => ("passes", None),
            Ok(_) => ("fails", None),
            Err(e) => ("error", Some(e.0.clone())),
        };
        verdicts.push(Validity {
            task: t.name.clone(),
            live: t.config.live(),
            start: start_word.into(),
            start_error,
            solution: row.outcome,
            solution_error,
            valid: start_word == "fails" && row.outcome == Outcome::Pass,
        });
    }
    session::drain();
    let _ = std::fs::remove_dir_all(&dir);
    let invalid = verdicts.iter().filter(|v| !v.valid).count();
    let mut text = format!(
        "{:<32} {:<6} {:<10} {:<12} VERDICT\n",
        "TASK", "GRADED", "START", "SOLUTION"
    );
    for v in &verdicts {
        let why = match (&v.start_error, &v.solution_error) {
            (Some(e), _) => format!(" (start: {e})"),
            (None, Some(e)) => format!(" (solution: {})", e.trim()),
            _ => String::new(),
        };
        text.push_str(&format!(
            "{:<32} {:<6} {:<10} {:<12} {}{why}\n",
            v.task,
            if v.live { "live" } else { "files" },
            v.start,
            outcome_word(v.solution),
            if v.valid {
                "valid"
            } else {
                "INVALID (the start must fail and the solution pass)"
            }
        ));
    }
    let json = serde_json::json!({
        "suite": std::path::absolute(suite).unwrap_or_else(|_| suite.to_path_buf()),
        "tasks": verdicts,
        "valid": verdicts.len() - invalid,
        "invalid": invalid,
    });
    Ok(Said::new(json, text).with_code(if invalid == 0 { 0 } else { 1 }))
}

/// An outcome as rows and JSON spell it (`infra_error`, `budget_exhausted`, ...).
pub fn outcome_word(o: Outcome) -> String {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

pub fn load_results(path: &Path) -> Vec<TrialRow> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `forkd eval run` (and `residualize`, with `states_only`), or `resume` of a run dir.
/// What every run starts with: the suite (a shard's tasks only), its images, the agents
/// (harnesses checked), the configuration and its fingerprint, and the run directory's
/// manifest (written, or on resume checked), decision and task records.
pub struct Begun {
    pub tasks: Vec<task::Task>,
    pub images: BTreeMap<String, Vec<String>>,
    /// The run's agents; predecessors are added after them.
    pub agents: Vec<AgentSpec>,
    pub config: RunConfig,
    pub fingerprint: String,
    pub run_id: String,
}

pub fn begin(socket: &Path, opts: &RunOptions, resume: bool) -> anyhow::Result<Begun> {
    let mut tasks = task::load_suite(&opts.suite)?;
    if let Some(sh) = &opts.shard {
        tasks.retain(|t| sh.tasks.contains(&t.name));
        if let Some(missing) = sh
            .tasks
            .iter()
            .find(|n| !tasks.iter().any(|t| &t.name == *n))
        {
            anyhow::bail!(
                "shard {} of run {}: task {missing} is no longer in suite {}",
                sh.index,
                sh.top.display(),
                opts.suite.display()
            );
        }
    }
    let s = Session::new(socket);
    eprintln!(
        "[eval] suite {} ({} tasks)",
        opts.suite.display(),
        tasks.len()
    );
    let images = clean::ensure_images(&s, &tasks)?;
    let agents: Vec<AgentSpec> = opts
        .agents
        .iter()
        .map(|a| AgentSpec::parse(a))
        .collect::<anyhow::Result<_>>()?;
    // A harness whose configuration or model does not load fails the run now, by name,
    // not each of its trials as infrastructure.
    for a in &agents {
        if let AgentSpec::MiniSweAgent(h) = a {
            let loaded = h.check(socket, &opts.out.join(".checks"))?;
            eprintln!("[eval] agent {}: {loaded}", h.name());
        }
    }
    let config = RunConfig {
        suite: std::fs::canonicalize(&opts.suite)?,
        tasks: tasks
            .iter()
            .map(|t| (t.name.clone(), t.checksum.clone()))
            .collect(),
        agents: opts.agents.clone(),
        agent_fingerprints: agents.iter().map(AgentSpec::fingerprint).collect(),
        predecessors: opts.predecessors.clone(),
        conditions: opts.conditions.clone(),
        replicates: opts.replicates,
        retries: opts.retries,
        images: images.clone(),
        forkd_version: env!("CARGO_PKG_VERSION").into(),
        reconstruct: opts.reconstruct,
        review: opts.review,
    };
    if opts.reconstruct == Some(reconstruct::Reconstruct::Patch) {
        if let Some(t) = tasks.iter().find(|t| t.config.task.kind != "swe") {
            anyhow::bail!(
                "--reconstruct patch rebuilds states from git patches, for SWE tasks only; task {} is {}",
                t.name,
                t.config.task.kind
            );
        }
    }
    let fingerprint = config.fingerprint();
    std::fs::create_dir_all(opts.out.join("trials"))?;
    std::fs::create_dir_all(opts.out.join("tasks"))?;
    let manifest_path = opts.out.join("manifest.json");
    let run_id = if resume {
        let m: Manifest = serde_json::from_slice(&std::fs::read(&manifest_path)?)?;
        if m.fingerprint != fingerprint {
            anyhow::bail!(
                "run {} was made under a different configuration (fingerprint {} here, {} in its manifest): \
                 tasks, agents, budgets, images or forkd changed; start a new run instead",
                opts.out.display(),
                fingerprint,
                m.fingerprint
            );
        }
        // Trials that ended as infrastructure failures (a daemon killed, a node lost) are
        // run again: their rows leave results.jsonl (rewritten whole, then renamed) and
        // the decision log names them.
        let results_path = opts.out.join("results.jsonl");
        let rows = load_results(&results_path);
        let (infra, kept): (Vec<TrialRow>, Vec<TrialRow>) = rows
            .into_iter()
            .partition(|r| r.outcome == Outcome::InfraError);
        if !infra.is_empty() {
            let tmp = opts.out.join(".results.jsonl.tmp");
            let body: String = kept
                .iter()
                .map(|r| format!("{}\n", serde_json::to_string(r).expect("rows serialise")))
                .collect();
            std::fs::write(&tmp, body)?;
            std::fs::rename(&tmp, &results_path)?;
        }
        records::decision(
            &opts.out,
            "resume",
            serde_json::json!({
                "fingerprint": fingerprint,
                "retried_infra": infra.iter().map(|r| r.trial_id.clone()).collect::<Vec<_>>(),
            }),
        )?;
        m.run_id
    } else {
        anyhow::ensure!(
            !manifest_path.exists(),
            "{} already holds a run: resume it, or choose another --out",
            opts.out.display()
        );
        let run_id = format!("run-{}", forkd_sandbox::id::random_hex(6));
        let m = Manifest {
            run_id: run_id.clone(),
            fingerprint: fingerprint.clone(),
            created: now_secs(),
            config: config.clone(),
            review_fingerprint: None,
            states_only: opts.states_only,
        };
        std::fs::write(&manifest_path, serde_json::to_vec_pretty(&m)?)?;
        records::decision(
            &opts.out,
            "start",
            serde_json::json!({ "fingerprint": fingerprint, "config": config }),
        )?;
        run_id
    };
    for t in &tasks {
        let info = serde_json::json!({
            "task": t.name,
            "reference_changed_files": t.reference_changed_files(),
            "f2p": t.config.verifier.fail_to_pass,
            "p2p": t.config.verifier.pass_to_pass,
        });
        std::fs::write(
            opts.out.join("tasks").join(format!("{}.json", t.name)),
            serde_json::to_vec_pretty(&info)?,
        )?;
    }

    Ok(Begun {
        tasks,
        images,
        agents,
        config,
        fingerprint,
        run_id,
    })
}

/// `forkd eval run`, `residualize` and `resume` (and a shard's run): the start states,
/// then the trials; what it says names the run directory and, when the trials ran,
/// their summary.
pub fn execute(socket: &Path, opts: &RunOptions, resume: bool) -> anyhow::Result<Said> {
    let Begun {
        tasks,
        images,
        mut agents,
        run_id,
        ..
    } = begin(socket, opts, resume)?;
    let run_agents = agents.len();
    let s = Session::new(socket);
    // 1. Clean start states.
    let mut clean = BTreeMap::new();
    for t in &tasks {
        let t0 = std::time::Instant::now();
        let id = match &opts.shard {
            Some(sh) => sh.clean_state(&s, t, &images[&t.config.task.image], &opts.out)?,
            None => clean::clean_state(&s, t, &images[&t.config.task.image])?,
        };
        clean::record_base_commit(&s, t, &id)?;
        eprintln!(
            "[eval] clean state of {}: checkpoint {id} ({:.1}s)",
            t.name,
            t0.elapsed().as_secs_f64()
        );
        clean.insert(t.name.clone(), id);
    }

    // 2. Residual start states, from the predecessors.
    let needs_states = opts.conditions.iter().any(|c| *c != Condition::Clean) || opts.states_only;
    let mut pred_pairs = Vec::new();
    for (ti, t) in tasks.iter().enumerate() {
        let specs: Vec<AgentSpec> = if opts.predecessors.is_empty() {
            t.predecessors
                .iter()
                .map(|(_, p)| {
                    if p.extension().is_some_and(|e| e == "patch") {
                        AgentSpec::Patch(p.clone())
                    } else {
                        AgentSpec::Script(p.clone())
                    }
                })
                .collect()
        } else {
            opts.predecessors
                .iter()
                .map(|p| AgentSpec::parse(p))
                .collect::<anyhow::Result<_>>()?
        };
        for spec in specs {
            let ai = match agents.iter().position(|a| *a == spec) {
                Some(i) => i,
                None => {
                    agents.push(spec);
                    agents.len() - 1
                }
            };
            pred_pairs.push((ti, ai));
        }
    }
    let ctx = Ctx {
        socket: socket.to_path_buf(),
        run_dir: opts.out.clone(),
        run_id: run_id.clone(),
        tasks: &tasks,
        agents: &agents,
        retries: opts.retries,
        results: Mutex::new(()),
        reconstruct: opts.reconstruct,
        shard: opts.shard.as_ref(),
    };
    let states = if needs_states {
        residual::residualize(&ctx, &clean, &pred_pairs)?
    } else {
        Vec::new()
    };
    let states = match reviewed(&opts.out, opts.review, states, opts.states_only)? {
        Ok(s) => s,
        Err(pending) => {
            session::drain();
            let json = serde_json::json!({ "run": opts.out, "status": "awaiting_review",
                "pending": pending });
            return Ok(Said::new(json, format!("{}\n", opts.out.display())));
        }
    };
    eprintln!("[eval] {} residual start state(s)", states.len());
    if opts.states_only {
        session::drain();
        let listed: Vec<serde_json::Value> = states
            .iter()
            .map(|st| {
                serde_json::json!({ "state": st.state_id, "task": st.task,
                    "predecessor": st.predecessor, "checkpoint": st.checkpoint })
            })
            .collect();
        let json = serde_json::json!({ "run": opts.out, "status": "states",
            "clean": clean, "states": listed });
        return Ok(Said::new(json, format!("{}\n", opts.out.display())));
    }

    // 3. The trial matrix.
    let mut specs = Vec::new();
    for (ti, t) in tasks.iter().enumerate() {
        let task_states: Vec<&records::StateRecord> =
            states.iter().filter(|st| st.task == t.name).collect();
        for &cond in &opts.conditions {
            let starts: Vec<(String, String, Option<String>)> = match cond {
                Condition::Clean => vec![("clean".into(), clean[&t.name].clone(), None)],
                Condition::PristineControl => {
                    let mut preds: Vec<String> = task_states
                        .iter()
                        .filter_map(|st| st.predecessor.clone())
                        .collect();
                    preds.sort();
                    preds.dedup();
                    preds
                        .into_iter()
                        .map(|p| ("clean".into(), clean[&t.name].clone(), Some(p)))
                        .collect()
                }
                Condition::RescueNote => task_states
                    .iter()
                    .filter(|st| {
                        st.predecessor
                            .as_deref()
                            .and_then(|p| run::note_for(&opts.out, t, &st.state_id, p))
                            .is_some()
                    })
                    .map(|st| {
                        (
                            st.state_id.clone(),
                            st.checkpoint.clone(),
                            st.predecessor.clone(),
                        )
                    })
                    .collect(),
                _ => task_states
                    .iter()
                    .map(|st| {
                        (
                            st.state_id.clone(),
                            st.checkpoint.clone(),
                            st.predecessor.clone(),
                        )
                    })
                    .collect(),
            };
            for (state, checkpoint, pred) in starts {
                for ai in 0..run_agents {
                    for r in 0..opts.replicates {
                        let cond_name = serde_json::to_value(cond)?
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        let id = format!(
                            "{}.{}.{}.{}.{}.{r}",
                            t.name,
                            cond_name,
                            state.rsplit('.').next().unwrap_or(&state),
                            pred.as_deref().unwrap_or("none"),
                            agents[ai].name()
                        );
                        specs.push(TrialSpec {
                            id,
                            task: ti,
                            condition: cond,
                            start_state: state.clone(),
                            start_checkpoint: checkpoint.clone(),
                            predecessor: pred.clone(),
                            agent: ai,
                            replicate: r,
                        });
                    }
                }
            }
        }
    }
    let results_path = opts.out.join("results.jsonl");
    let done: HashSet<String> = load_results(&results_path)
        .into_iter()
        .map(|r| r.trial_id)
        .collect();
    let todo: VecDeque<TrialSpec> = specs
        .iter()
        .filter(|s| !done.contains(&s.id))
        .cloned()
        .collect();
    let total = specs.len();
    eprintln!(
        "[eval] {} trials ({} already done), {} at a time",
        total,
        done.len(),
        opts.parallel.max(1)
    );
    let queue = Mutex::new(todo);
    let finished = Mutex::new(done.len());
    let started = std::time::Instant::now();
    // A shard attempt that lost its shard to a newer attempt stops taking trials and
    // writes no more rows.
    let fenced = || opts.shard.as_ref().and_then(|sh| sh.fence.lost());
    std::thread::scope(|scope| {
        for _ in 0..opts.parallel.max(1) {
            scope.spawn(|| loop {
                if fenced().is_some() {
                    return;
                }
                let Some(spec) = queue.lock().unwrap().pop_front() else {
                    return;
                };
                let (row, _) = run::run_trial(&ctx, &spec, false);
                let _guard = ctx.results.lock().unwrap();
                if fenced().is_some() {
                    return;
                }
                if let Err(e) = records::append_jsonl(&results_path, &row) {
                    eprintln!("[eval] write {}: {e}", results_path.display());
                }
                let mut n = finished.lock().unwrap();
                *n += 1;
                eprintln!(
                    "[eval] {:>4}/{total} {:<60} {:<16} {:>4} steps {:>6.1}s  (elapsed {:.0}s)",
                    *n,
                    row.trial_id,
                    format!("{:?}", row.outcome).to_lowercase(),
                    row.steps,
                    row.wall_ms as f64 / 1000.0,
                    started.elapsed().as_secs_f64()
                );
            });
        }
    });
    session::drain();
    if let Some(owner) = fenced() {
        anyhow::bail!(
            "{} was taken over by attempt {owner}: this attempt stopped",
            opts.out.display()
        );
    }
    let rows = load_results(&results_path);
    write_csv(&opts.out.join("results.csv"), &rows)?;
    records::decision(
        &opts.out,
        "finish",
        serde_json::json!({ "trials": rows.len() }),
    )?;
    let (cells, table) = summary(&rows);
    let json = serde_json::json!({ "run": opts.out, "status": "done", "trials": rows.len(),
        "summary": cells });
    Ok(Said::new(
        json,
        format!("{table}results: {}\n", opts.out.display()),
    ))
}

pub use forkd_sys::clock::{now_ms, now_secs};

pub fn write_csv(path: &Path, rows: &[TrialRow]) -> anyhow::Result<()> {
    let mut out = String::from(
        "run_id,trial_id,task,condition,start_state,predecessor,agent,replicate,outcome,submitted,tests_passed,tests_failed,steps,wall_ms,infra_attempts,tests\n",
    );
    for r in rows {
        let v = serde_json::to_value(r)?;
        let passed = r
            .tests
            .values()
            .filter(|t| **t == forkd_analysis::TestResult::Pass)
            .count();
        let fields = [
            r.run_id.clone(),
            r.trial_id.clone(),
            r.task.clone(),
            v["condition"].as_str().unwrap_or_default().to_string(),
            r.start_state.clone(),
            r.predecessor.clone().unwrap_or_default(),
            r.agent.clone(),
            r.replicate.to_string(),
            v["outcome"].as_str().unwrap_or_default().to_string(),
            r.submitted.to_string(),
            passed.to_string(),
            (r.tests.len() - passed).to_string(),
            r.steps.to_string(),
            r.wall_ms.to_string(),
            r.infra_attempts.to_string(),
            serde_json::to_string(&v["tests"])?,
        ];
        out.push_str(
            &fields
                .iter()
                .map(|f| forkd_analysis::csv_field(f))
                .collect::<Vec<_>>()
                .join(","),
        );
        out.push('\n');
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// Trials per condition and agent: passes, failures, infrastructure failures and the
/// success rate among graded trials; as JSON cells and as a table.
pub fn summary(rows: &[TrialRow]) -> (serde_json::Value, String) {
    let mut cells: BTreeMap<(String, String), (u32, u32, u32)> = BTreeMap::new();
    for r in rows {
        let cond = serde_json::to_value(r.condition)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let e = cells.entry((cond, r.agent.clone())).or_default();
        match r.outcome {
            Outcome::Pass => e.0 += 1,
            Outcome::InfraError => e.2 += 1,
            _ => e.1 += 1,
        }
    }
    let mut text = format!(
        "{:<18} {:<20} {:>6} {:>6} {:>6} {:>8}\n",
        "CONDITION", "AGENT", "PASS", "FAIL", "INFRA", "SUCCESS"
    );
    let mut json = Vec::new();
    for ((cond, agent), (p, f, i)) in cells {
        let rate = (p + f > 0).then(|| p as f64 / (p + f) as f64);
        let shown = rate
            .map(|r| format!("{:.0}%", 100.0 * r))
            .unwrap_or_else(|| "-".into());
        text.push_str(&format!(
            "{cond:<18} {agent:<20} {p:>6} {f:>6} {i:>6} {shown:>8}\n"
        ));
        json.push(
            serde_json::json!({ "condition": cond, "agent": agent, "pass": p,
            "fail": f, "infra_error": i, "success": rate }),
        );
    }
    (serde_json::Value::Array(json), text)
}

/// The residual states a run goes on with. With review: those whose candidates were
/// accepted. Rejections are recorded as losses (stage `review`, once). While a candidate
/// awaits a decision the run stops before its trials (`Err`: the candidates pending),
/// saying what to do; when the trials start, the decisions are fingerprinted into the
/// manifest, and a later resume whose decisions differ is refused.
fn reviewed(
    run_dir: &Path,
    policy: review::Policy,
    states: Vec<records::StateRecord>,
    states_only: bool,
) -> anyhow::Result<Result<Vec<records::StateRecord>, Vec<String>>> {
    if policy.reviewers == 0 {
        return Ok(Ok(states));
    }
    let names: Vec<String> = states.iter().map(|s| s.state_id.clone()).collect();
    // Once trials have started from reviewed states, their decisions are fixed.
    let fp = review::fingerprint(run_dir, &names);
    let path = run_dir.join("manifest.json");
    let mut m: records::Manifest = serde_json::from_slice(&std::fs::read(&path)?)?;
    if let Some(old) = &m.review_fingerprint {
        anyhow::ensure!(
            *old == fp,
            "the review decisions of run {} changed after its trials started (fingerprint {old} then, {fp} now): start a new run",
            run_dir.display()
        );
    }
    let verdicts = review::verdicts(run_dir, policy, &names);
    let lines =
        std::fs::read_to_string(run_dir.join("states/candidates.jsonl")).unwrap_or_default();
    let recorded = |c: &str| {
        lines
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|v| v["candidate"] == c && v["stage"] == "review")
    };
    let mut pending = Vec::new();
    let mut accepted = Vec::new();
    for st in states {
        match &verdicts[&st.state_id] {
            review::Verdict::Accepted => {
                if !recorded(&st.state_id) {
                    records::append_jsonl(
                        &run_dir.join("states/candidates.jsonl"),
                        &serde_json::json!({ "candidate": st.state_id, "task": st.task, "predecessor": st.predecessor,
                            "kept": true, "stage": "review", "reason": "accepted by review" }),
                    )?;
                }
                accepted.push(st);
            }
            review::Verdict::Rejected { criteria, reasons } => {
                if !recorded(&st.state_id) {
                    records::append_jsonl(
                        &run_dir.join("states/candidates.jsonl"),
                        &serde_json::json!({ "candidate": st.state_id, "task": st.task, "predecessor": st.predecessor,
                            "kept": false, "stage": "review", "criteria": criteria,
                            "reason": format!("rejected by review ({}): {}", criteria.join(", "), reasons.join("; ")) }),
                    )?;
                }
            }
            review::Verdict::Pending { decided, needed } => {
                pending.push(format!("{} ({decided} of {needed} reviews)", st.state_id))
            }
        }
    }
    if !pending.is_empty() {
        eprintln!(
            "[eval] {} candidate(s) await review: {}
[eval] write the sheets and decide with `forkd eval review {}`, then `forkd eval resume {}`",
            pending.len(),
            pending.join(", "),
            run_dir.display(),
            run_dir.display()
        );
        return Ok(Err(pending));
    }
    if states_only {
        return Ok(Ok(accepted));
    }
    // The trials start from these states: fix the decisions that chose them.
    if m.review_fingerprint.is_none() {
        m.review_fingerprint = Some(fp.clone());
        std::fs::write(&path, serde_json::to_vec_pretty(&m)?)?;
        records::decision(
            run_dir,
            "review-fixed",
            serde_json::json!({ "fingerprint": fp, "states": accepted.len() }),
        )?;
    }
    Ok(Ok(accepted))
}

/// `forkd eval review RUN [--candidate C --reviewer R --accept|--reject ...]`.
#[allow(clippy::too_many_arguments)]
pub fn review_command(
    run_dir: &Path,
    candidate: Option<String>,
    reviewer: Option<String>,
    accept: bool,
    reject: bool,
    criteria: Vec<String>,
    reason: String,
) -> anyhow::Result<Said> {
    let m: Manifest = serde_json::from_slice(
        &std::fs::read(run_dir.join("manifest.json"))
            .map_err(|e| anyhow::anyhow!("{} is not a run directory: {e}", run_dir.display()))?,
    )?;
    let policy = m.config.review;
    let mut json = serde_json::json!({ "run": run_dir });
    if let (Some(c), Some(r)) = (candidate, reviewer) {
        anyhow::ensure!(accept || reject, "say --accept or --reject");
        anyhow::ensure!(
            policy.reviewers > 0,
            "run {} was started without review (--reviewers): its candidates are not reviewed",
            run_dir.display()
        );
        let decision = review::Decision {
            candidate: c.clone(),
            reviewer: r,
            accept,
            criteria,
            reason,
        };
        review::record(run_dir, policy, m.review_fingerprint.is_some(), &decision)?;
        json["recorded"] = serde_json::to_value(&decision)?;
        eprintln!(
            "[eval] recorded; continue the run with `forkd eval resume {}`",
            run_dir.display()
        );
    } else {
        anyhow::ensure!(
            !accept && !reject && criteria.is_empty(),
            "a decision needs --candidate and --reviewer"
        );
        let tasks = task::load_suite(&m.config.suite).unwrap_or_default();
        let instructions = tasks
            .iter()
            .map(|t| (t.name.clone(), t.instruction.clone()))
            .collect();
        let sheets = review::write_sheets(run_dir, &instructions)?;
        json["sheets"] = serde_json::to_value(&sheets)?;
        eprintln!(
            "[eval] {} review sheet(s) in {}",
            sheets.len(),
            run_dir.join("review").display()
        );
    }
    let names: Vec<String> = review::candidates(run_dir)?
        .into_iter()
        .map(|r| r.state_id)
        .collect();
    let mut text = format!("{:<48} VERDICT\n", "CANDIDATE");
    let mut listed = Vec::new();
    for (c, v) in review::verdicts(run_dir, policy, &names) {
        let (shown, entry) = match v {
            review::Verdict::Accepted => (
                "accepted".to_string(),
                serde_json::json!({ "candidate": c, "verdict": "accepted" }),
            ),
            review::Verdict::Rejected { criteria, reasons } => (
                format!("rejected ({})", criteria.join(", ")),
                serde_json::json!({ "candidate": c, "verdict": "rejected",
                    "criteria": criteria, "reasons": reasons }),
            ),
            review::Verdict::Pending { decided, needed } => (
                format!("pending ({decided} of {needed})"),
                serde_json::json!({ "candidate": c, "verdict": "pending",
                    "decided": decided, "needed": needed }),
            ),
        };
        text.push_str(&format!("{c:<48} {shown}\n"));
        listed.push(entry);
    }
    json["candidates"] = serde_json::Value::Array(listed);
    Ok(Said::new(json, text))
}

/// Reconstructs the options of an existing run from its manifest (for `resume`).
pub fn options_of(run_dir: &Path, parallel: usize) -> anyhow::Result<RunOptions> {
    let m: Manifest = serde_json::from_slice(
        &std::fs::read(run_dir.join("manifest.json"))
            .map_err(|e| anyhow::anyhow!("{}: {e}", run_dir.join("manifest.json").display()))?,
    )?;
    Ok(RunOptions {
        suite: m.config.suite,
        out: run_dir.to_path_buf(),
        agents: m.config.agents,
        predecessors: m.config.predecessors,
        conditions: m.config.conditions,
        replicates: m.config.replicates,
        parallel,
        retries: m.config.retries,
        states_only: m.states_only,
        reconstruct: m.config.reconstruct,
        review: m.config.review,
        shard: None,
    })
}
