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
mod results;
pub mod review;
mod reviewing;
pub mod run;
pub mod session;
pub mod shard;
pub mod slurm;
pub mod task;
pub mod task_toml;
mod validate;

use agent::AgentSpec;
use forkd_analysis::{Condition, Outcome, TrialRow};
use records::{Manifest, RunConfig};
pub use results::{summary, write_csv};
pub use reviewing::review_command;
use reviewing::reviewed;
use run::{Ctx, TrialSpec};
use session::Session;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
pub use validate::{validate, Validity};

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
