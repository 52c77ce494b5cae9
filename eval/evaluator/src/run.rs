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

use super::agent::{run_agent, AgentSpec, Brief};
use super::grade::{grade, Grade};
use super::session::{Infra, InfraResult, Session};
use super::task::Task;
use forkd_analysis::{Condition, Outcome, TestResult, TrialRow};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The fixed notice of a rescue (the pilot study's "V0" prompt).
pub const NOTICE: &str = "A previous coding agent attempted this task but did not solve it. Independently inspect \
the current repository state and complete the original task. Existing modifications may be correct, partially \
correct, or wrong.";

/// Everything that decides what a run measures; its hash is the run's fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub suite: PathBuf,
    /// Task name -> checksum of the task directory.
    pub tasks: BTreeMap<String, String>,
    /// Agent specs as given on the command line, and their fingerprints.
    pub agents: Vec<String>,
    pub agent_fingerprints: Vec<String>,
    /// Predecessor specs; empty means each task's own scripted predecessors.
    pub predecessors: Vec<String>,
    pub conditions: Vec<Condition>,
    pub replicates: u32,
    pub retries: u32,
    /// Image name -> its layers.
    pub images: BTreeMap<String, Vec<String>>,
    pub forkd_version: String,
    /// `--reconstruct` for every task, over their own `[residual] reconstruct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconstruct: Option<super::reconstruct::Reconstruct>,
    /// Human review of the residual candidates (none by default).
    #[serde(default, skip_serializing_if = "review_off")]
    pub review: super::review::Policy,
}

fn review_off(p: &super::review::Policy) -> bool {
    p.reviewers == 0
}

impl RunConfig {
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let body = serde_json::to_vec(self).expect("json");
        sha2::Sha256::digest(&body)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub run_id: String,
    pub fingerprint: String,
    pub created: u64,
    pub config: RunConfig,
    /// With review: the fingerprint of the decisions that chose the start states, fixed
    /// when the trials first start ([`super::review::fingerprint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_fingerprint: Option<String>,
    /// Started by `residualize`: a resume builds start states only, too (so that one
    /// stopped for review continues with them, not with trials).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub states_only: bool,
}

/// A residual start state, as written to `states/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateRecord {
    pub state_id: String,
    pub task: String,
    pub predecessor: Option<String>,
    pub failing_tests: Vec<String>,
    pub patch: String,
    pub checkpoint: String,
    pub tree_hash: Option<String>,
    pub changed_files: Vec<String>,
    pub content_key: String,
    /// How the state was built from the predecessor's work.
    #[serde(default)]
    pub reconstruct: super::reconstruct::Reconstruct,
}

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

/// Records the commit the clean state of a SWE task is at (see [`Task::base_commit`]),
/// from a fresh fork of it.
pub fn record_base_commit(s: &Session, task: &Task, clean: &str) -> anyhow::Result<()> {
    if task.config.task.kind != "swe" || task.base_commit.get().is_some() {
        return Ok(());
    }
    let sb = s
        .fork(clean, true)
        .map_err(|e| anyhow::anyhow!("task {}: {e}", task.name))?;
    let r = s.sh(
        &sb,
        "git rev-parse --verify HEAD 2>/dev/null || true",
        task.workdir(),
        Some(60),
    );
    s.remove(&sb);
    let head = r
        .map_err(|e| anyhow::anyhow!("task {}: {e}", task.name))?
        .out();
    let head = head.trim();
    if head.len() >= 40 && head.bytes().all(|b| b.is_ascii_hexdigit()) {
        let _ = task.base_commit.set(head.to_string());
    }
    Ok(())
}

pub fn append_jsonl(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(f, "{}", serde_json::to_string(value)?)?;
    f.sync_data()?;
    Ok(())
}

pub fn decision(run_dir: &Path, event: &str, detail: serde_json::Value) -> anyhow::Result<()> {
    append_jsonl(
        &run_dir.join("decisions.jsonl"),
        &serde_json::json!({ "t": super::now_secs(), "event": event, "detail": detail }),
    )
}

/// Imports image `name` from the fixture cache (`images/NAME.tar*`) if it is there and
/// the daemon lacks it.
fn import_from_cache(s: &Session, name: &str) -> anyhow::Result<()> {
    let images = forkd_api::defaults::cache().join("images");
    let src = ["tar.zst", "tar.gz", "tar"]
        .iter()
        .map(|e| images.join(format!("{name}.{e}")))
        .find(|p| p.exists());
    if let Some(src) = src {
        s.ensure_image(name, &src)?;
    }
    Ok(())
}

/// The images a Dockerfile starts from (stage references and `scratch` left out).
fn dockerfile_bases(dockerfile: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dockerfile) else {
        return Vec::new();
    };
    let Ok(plan) = forkd_build::plan(&text) else {
        return Vec::new();
    };
    let mut args = forkd_build::words::Vars::new();
    for (_, raw) in &plan.global_args {
        if let Ok((k, Some(v))) = forkd_build::words::arg(raw, &args, '\\') {
            args.insert(k, v);
        }
    }
    plan.stages
        .iter()
        .enumerate()
        .filter_map(|(i, st)| {
            let base = forkd_build::words::expand(&st.base, &args, '\\').ok()?;
            (base != "scratch" && plan.stage_named(&base, i).is_none()).then_some(base)
        })
        .collect()
}

/// Whether the daemon holds image `name`.
fn have_image(s: &Session, name: &str) -> bool {
    s.client
        .call::<serde_json::Value>(
            "GET",
            &format!("/v1/images/{}", forkd_api::url::encode_segment(name)),
            None,
        )
        .is_ok()
}

/// Pulls `name` from its registry (a task's prebuilt `docker_image`), kept under the name
/// the task gives it.
fn pull_image(s: &Session, name: &str) -> anyhow::Result<()> {
    eprintln!("pull {name}");
    let body = serde_json::json!({ "reference": name, "name": name });
    let img: forkd_api::ImageInfo = s
        .client
        .call("POST", "/v1/images/pull", Some(&body))
        .map_err(|e| anyhow::anyhow!("pull {name}: {e}"))?;
    eprintln!(
        "pulled {name}: {} layers, {}",
        img.layers.len(),
        img.digest.as_deref().unwrap_or("-")
    );
    Ok(())
}

/// Makes every image the suite needs exist: a task's prebuilt image pulled from its
/// registry when the daemon lacks it (as Harbor's own backends do with `docker_image`),
/// else built from the task's Dockerfile (its base images imported from the fixture
/// cache first, or pulled), or imported from the fixture cache. Builds have egress
/// unless the task's network is `none`. Returns each image's layers.
pub fn ensure_images(s: &Session, tasks: &[Task]) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    // Images built from a task's Dockerfile: always when the task asks to rebuild,
    // otherwise only when the daemon lacks the image.
    let mut built = std::collections::BTreeSet::new();
    for t in tasks {
        let Some(ctx) = &t.config.task.build else {
            continue;
        };
        let name = &t.config.task.image;
        if built.contains(name) {
            continue;
        }
        let have = have_image(s, name);
        if have && !t.config.task.rebuild {
            continue;
        }
        // A prebuilt image named by the task comes from its registry when it can.
        if t.config.task.pull {
            match pull_image(s, name) {
                Ok(()) => continue,
                Err(e) => eprintln!("task {}: {e:#}; building it from its Dockerfile", t.name),
            }
        }
        let context = t.dir.join(ctx);
        for base in dockerfile_bases(&context.join("Dockerfile")) {
            import_from_cache(s, &base)?;
        }
        let network = t.config.environment.network.as_deref().unwrap_or("none") != "none";
        eprintln!(
            "build {name} from {}{}",
            context.join("Dockerfile").display(),
            if network { " (with network)" } else { "" }
        );
        let body = serde_json::json!({ "context": context, "name": name, "network": network });
        let r: forkd_api::BuildResult = s
            .client
            .call("POST", "/v1/images/build", Some(&body))
            .map_err(|e| anyhow::anyhow!("task {}: build {name}: {e}", t.name))?;
        let ran = r.steps.iter().filter(|x| x.cache == "miss").count();
        eprintln!(
            "built {name}: {ran} steps run, {} layers",
            r.image.layers.len()
        );
        built.insert(name.clone());
    }
    for name in tasks
        .iter()
        .map(|t| t.config.task.image.clone())
        .collect::<std::collections::BTreeSet<_>>()
    {
        import_from_cache(s, &name)?;
        let pull = tasks
            .iter()
            .any(|t| t.config.task.image == name && t.config.task.pull);
        if pull && !have_image(s, &name) {
            pull_image(s, &name).map_err(|e| {
                e.context(format!(
                    "image {name} is not in the daemon nor in {}",
                    forkd_api::defaults::cache().join("images").display()
                ))
            })?;
        }
        let info: serde_json::Value = s
            .client
            .call(
                "GET",
                &format!("/v1/images/{}", forkd_api::url::encode_segment(&name)),
                None,
            )
            .map_err(|e| {
                anyhow::anyhow!(
                    "image {name} is not in the daemon and not in {}: {e}",
                    forkd_api::defaults::cache().join("images").display()
                )
            })?;
        let layers = info["layers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        out.insert(name, layers);
    }
    Ok(out)
}

/// The clean start state of a task: built once (environment copied, set-up run,
/// background processes started) and cached as a checkpoint labelled with a key over the
/// task's files and image.
pub fn clean_state(s: &Session, task: &Task, image_layers: &[String]) -> anyhow::Result<String> {
    use sha2::Digest;
    // Whether it is live is part of what the state is.
    let key: String = sha2::Sha256::digest(
        format!(
            "{}|{}|{}|live={}",
            task.checksum,
            task.config.task.image,
            image_layers.join(","),
            task.config.live()
        )
        .as_bytes(),
    )
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect();
    for c in s.checkpoints()? {
        if c.labels.get("forkd.eval.clean").map(String::as_str) == Some(key.as_str()) {
            return Ok(c.id);
        }
    }
    let env = &task.config.environment;
    let wd = task.workdir();
    let sb = s.create(
        &task.config.task.image,
        &[("forkd.eval.task", &task.name)],
        env,
    )?;
    let built = (|| -> anyhow::Result<String> {
        // A build context went into the image; other environment files are copied in.
        if task.dir.join("environment").is_dir() && task.config.task.build.is_none() {
            s.put_dir(&sb, &task.dir.join("environment"), wd)?;
        } else {
            s.sh(&sb, &format!("mkdir -p {wd}"), "/", Some(60))?;
        }
        for line in &env.setup {
            let r = s.sh(&sb, line, wd, Some(1800))?;
            anyhow::ensure!(
                r.code == 0,
                "task {}: set-up step {line:?} exited {}: {}",
                task.name,
                r.code,
                r.err().trim()
            );
        }
        for (i, line) in env.background.iter().enumerate() {
            let req = forkd_sandbox::proto::ExecRequest {
                shell: Some(line.clone()),
                cwd: Some(wd.into()),
                detach: true,
                log: Some(format!("background-{i}")),
                ..Default::default()
            };
            s.exec(&sb, &req, None)?;
        }
        let mut started = !env.background.is_empty();
        if env.entrypoint {
            let name = forkd_api::url::encode_segment(&task.config.task.image);
            let img: forkd_api::ImageInfo = s
                .client
                .call("GET", &format!("/v1/images/{name}"), None)
                .map_err(|e| anyhow::anyhow!("task {}: image {name}: {e}", task.name))?;
            if !img.config.entrypoint.is_empty() {
                let mut argv = img.config.entrypoint.clone();
                argv.extend(["sh", "-c", "sleep infinity"].map(String::from));
                let req = forkd_sandbox::proto::ExecRequest {
                    argv,
                    detach: true,
                    log: Some("entrypoint".into()),
                    ..Default::default()
                };
                s.exec(&sb, &req, None)?;
                started = true;
            }
        }
        if let Some(check) = &env.ready {
            let deadline = std::time::Instant::now() + Duration::from_secs(env.ready_timeout_secs);
            loop {
                let r = s.sh(&sb, check, wd, Some(30))?;
                if r.code == 0 {
                    break;
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "task {}: the environment never became ready: {check:?} exited {} for {} s: {}",
                    task.name,
                    r.code,
                    env.ready_timeout_secs,
                    r.err().trim()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        } else if started {
            // Give the processes a moment to reach their steady state.
            std::thread::sleep(Duration::from_millis(500));
        }
        let c = s
            .checkpoint(
                &sb,
                task.config.live(),
                &[("forkd.eval.clean", &key), ("forkd.eval.task", &task.name)],
            )
            .map_err(|e| anyhow::anyhow!("task {}: the clean state: {}", task.name, e.0))?;
        Ok(c.id)
    })();
    s.remove(&sb);
    built
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
