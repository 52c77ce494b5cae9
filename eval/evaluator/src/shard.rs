//! Sharded runs: one run's trials split over nodes by task, each shard run by
//! `forkd eval shard` against the daemon of the node it lands on, the results merged
//! back into one run directory. The scheduler (Slurm, `super::slurm`; Kubernetes,
//! `super::slurm::kube_job`) only starts shards; everything a shard needs is in the run
//! directory, which every node sees at the same path (a shared filesystem).
//!
//! ```text
//! RUN/manifest.json            the run's configuration and fingerprint (all tasks)
//! RUN/shards/plan.json         which tasks each shard runs, the node daemons, the binary
//! RUN/shards/<k>/              shard k: a run directory of its own (its tasks' manifest,
//!                              decisions, results, states, trials)
//! RUN/shards/<k>/owner.json    the attempt that owns the shard (a newer attempt takes it
//!                              over; the older one stops writing)
//! RUN/shards/<k>/done.json     written when an attempt finished every trial
//! RUN/archives/<task>/         the task's start states as verified archives (`archives`)
//! RUN/results.jsonl, .csv      merged: every shard's rows, ordered by trial id
//! RUN/states/, RUN/trials/     merged: state records copied, trial directories linked
//! ```
//!
//! All conditions and replicates of a task are in one shard, so every fork of a state
//! happens on the node that holds it. A task's start states are built by the first
//! attempt that needs them and exported; a later attempt (a retry, on any node) imports
//! them instead of building them again.

use super::archives::{write_atomic, StateArchives};
use super::records::{decision, Manifest, RunConfig, StateRecord};
use super::session::Session;
use super::task::Task;
use super::{now_secs, RunOptions};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod node;
pub use node::{attempt_name, index_from_env, node_daemon, node_name};

/// Which tasks each shard runs, and how a shard finds its node's daemon.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Plan {
    pub run_id: String,
    pub fingerprint: String,
    pub shards: Vec<ShardPlan>,
    /// The per-node daemon's state root, `%n` standing for the node's name (its socket
    /// is `<root>.sock`, its log `<root>.log`). None: the node's own daemon (`FORKD_SOCKET` or the
    /// default socket), started on the default root if none answers.
    pub node_root: Option<String>,
    /// Trials a shard runs at once.
    pub parallel: usize,
    /// The forkd binary the shards run (the submitter's, by absolute path).
    pub forkd: PathBuf,
    /// Who starts the shards: `slurm` or `kube`.
    pub scheduler: String,
    pub created: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShardPlan {
    pub index: usize,
    pub tasks: Vec<String>,
}

pub fn plan_path(top: &Path) -> PathBuf {
    top.join("shards").join("plan.json")
}

pub fn shard_dir(top: &Path, index: usize) -> PathBuf {
    top.join("shards").join(index.to_string())
}

/// The plan of the sharded run at `top`, if it is one.
pub fn load_plan(top: &Path) -> anyhow::Result<Option<Plan>> {
    let p = plan_path(top);
    match std::fs::read(&p) {
        Ok(b) => Ok(Some(serde_json::from_slice(&b).map_err(|e| {
            anyhow::anyhow!("{}: not a shard plan: {e}", p.display())
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!("{}: {e}", p.display())),
    }
}

/// Splits tasks (in suite order) into at most `n` shards of whole tasks, dealt round
/// robin so that shards differ by at most one task.
pub fn split(tasks: &[String], n: usize) -> Vec<ShardPlan> {
    let n = n.clamp(1, tasks.len().max(1));
    let mut shards: Vec<ShardPlan> = (0..n)
        .map(|index| ShardPlan {
            index,
            tasks: Vec::new(),
        })
        .collect();
    for (i, t) in tasks.iter().enumerate() {
        shards[i % n].tasks.push(t.clone());
    }
    shards.retain(|s| !s.tasks.is_empty());
    shards
}

/// Writes a sharded run: the run's manifest (as `forkd eval run` does), the plan, and
/// each shard's directory with a manifest of its own over its tasks (same run id). The
/// shards are then started by a scheduler.
pub fn plan_run(
    socket: &Path,
    opts: &RunOptions,
    shards: Option<usize>,
    node_root: Option<String>,
    scheduler: &str,
) -> anyhow::Result<Plan> {
    anyhow::ensure!(
        opts.review.reviewers == 0,
        "a sharded run cannot stop for human review yet: review the states of a run on one node (`forkd eval residualize --reviewers N`), or run without --reviewers"
    );
    anyhow::ensure!(
        !opts.states_only,
        "residualize runs on one node; shard the trials with `forkd eval run`"
    );
    if let Some(r) = &node_root {
        anyhow::ensure!(
            Path::new(r).is_absolute(),
            "--node-root {r:?}: must be an absolute path (with %n for the node's name)"
        );
    }
    let begun = super::begin(socket, opts, false)?;
    let names: Vec<String> = begun.tasks.iter().map(|t| t.name.clone()).collect();
    let plan = Plan {
        run_id: begun.run_id.clone(),
        fingerprint: begun.fingerprint.clone(),
        shards: split(&names, shards.unwrap_or(names.len())),
        node_root,
        parallel: opts.parallel.max(1),
        forkd: std::env::current_exe()?,
        scheduler: scheduler.into(),
        created: now_secs(),
    };
    for sp in &plan.shards {
        let dir = shard_dir(&opts.out, sp.index);
        std::fs::create_dir_all(dir.join("trials"))?;
        let config = shard_config(&begun.config, &sp.tasks, &begun.tasks);
        let m = Manifest {
            run_id: begun.run_id.clone(),
            fingerprint: config.fingerprint(),
            created: plan.created,
            config,
            review_fingerprint: None,
            states_only: false,
        };
        std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&m)?)?;
        decision(
            &dir,
            "start",
            serde_json::json!({ "fingerprint": m.fingerprint, "shard": sp.index, "tasks": sp.tasks }),
        )?;
    }
    write_atomic(&plan_path(&opts.out), &serde_json::to_vec_pretty(&plan)?)?;
    decision(
        &opts.out,
        "shards",
        serde_json::json!({ "shards": plan.shards, "node_root": plan.node_root }),
    )?;
    eprintln!(
        "[eval] {} task(s) in {} shard(s): {}",
        names.len(),
        plan.shards.len(),
        shard_dir(&opts.out, 0)
            .parent()
            .unwrap_or(&opts.out)
            .display()
    );
    Ok(plan)
}

/// The configuration a shard runs: the run's, over the shard's tasks and their images.
fn shard_config(run: &RunConfig, names: &[String], tasks: &[Task]) -> RunConfig {
    let mut c = run.clone();
    c.tasks.retain(|n, _| names.contains(n));
    let images: std::collections::BTreeSet<&String> = tasks
        .iter()
        .filter(|t| names.contains(&t.name))
        .map(|t| &t.config.task.image)
        .collect();
    c.images.retain(|n, _| images.contains(n));
    c
}

/// Who holds a shard: the attempt that last took it. An attempt takes the shard when it
/// starts; an older attempt still running (a node the scheduler gave up on, a requeued
/// job) finds it taken and stops before its next trial and before its next row.
pub struct Fence {
    path: PathBuf,
    pub attempt: String,
}

#[derive(Serialize, Deserialize)]
struct Owner {
    attempt: String,
    node: String,
    pid: u32,
    since: u64,
}

impl Fence {
    pub fn take(dir: &Path, attempt: &str, node: &str) -> anyhow::Result<Fence> {
        let path = dir.join("owner.json");
        let o = Owner {
            attempt: attempt.into(),
            node: node.into(),
            pid: std::process::id(),
            since: now_secs(),
        };
        write_atomic(&path, &serde_json::to_vec_pretty(&o)?)?;
        Ok(Fence {
            path,
            attempt: attempt.into(),
        })
    }

    /// The attempt that took the shard over, if another did.
    pub fn lost(&self) -> Option<String> {
        let o: Owner = serde_json::from_slice(&std::fs::read(&self.path).ok()?).ok()?;
        (o.attempt != self.attempt).then_some(o.attempt)
    }
}

/// The shard an invocation of `execute` runs.
pub struct Sharding {
    /// The run's directory (the shard's is `shards/<index>` inside it).
    pub top: PathBuf,
    pub index: usize,
    pub tasks: Vec<String>,
    pub archives: StateArchives,
    pub fence: Fence,
    pub node: String,
}

impl Sharding {
    /// The clean start state of `task` on this node: imported from its archive when one
    /// was exported (by any attempt, on any node), else built and exported.
    pub fn clean_state(
        &self,
        s: &Session,
        task: &Task,
        image_layers: &[String],
        shard_dir: &Path,
    ) -> anyhow::Result<String> {
        match self.archives.resolve(s, &task.name, "clean")? {
            Ok(Some(id)) => return Ok(id),
            Ok(None) => {}
            Err(refused) => {
                decision(
                    shard_dir,
                    "archive-refused",
                    serde_json::json!({ "task": task.name, "state": "clean", "node": self.node,
                        "archive": refused.archive, "reason": refused.reason, "then": "rebuilt" }),
                )?;
            }
        }
        let id = super::clean::clean_state(s, task, image_layers)?;
        self.archives.publish(s, &task.name, "clean", &id)?;
        Ok(id)
    }

    /// Makes the residual states an earlier attempt kept usable here: each one's
    /// checkpoint is the node's own (its record rewritten to name it), imported from its
    /// archive if need be. A state without a usable archive or checkpoint is forgotten
    /// (its record and its line in `candidates.jsonl` removed), so it is built again.
    pub fn settle_states(
        &self,
        s: &Session,
        shard_dir: &Path,
        kept: &mut Vec<StateRecord>,
    ) -> anyhow::Result<()> {
        let states_dir = shard_dir.join("states");
        let held: Vec<String> = s
            .checkpoints()
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .into_iter()
            .map(|c| c.id)
            .collect();
        let mut forget = Vec::new();
        for r in kept.iter_mut() {
            let local = match self.archives.resolve(s, &r.task, &r.state_id)? {
                Ok(Some(id)) => Some(id),
                // Kept here by an attempt that stopped before exporting it.
                Ok(None) if held.contains(&r.checkpoint) => {
                    self.archives
                        .publish(s, &r.task, &r.state_id, &r.checkpoint)?;
                    Some(r.checkpoint.clone())
                }
                Ok(None) => None,
                Err(refused) => {
                    decision(
                        shard_dir,
                        "archive-refused",
                        serde_json::json!({ "task": r.task, "state": r.state_id, "node": self.node,
                            "archive": refused.archive, "reason": refused.reason, "then": "rebuilt" }),
                    )?;
                    None
                }
            };
            match local {
                Some(id) if id != r.checkpoint => {
                    r.checkpoint = id;
                    write_atomic(
                        &states_dir.join(format!("{}.json", r.state_id)),
                        &serde_json::to_vec_pretty(r)?,
                    )?;
                }
                Some(_) => {}
                None => forget.push(r.state_id.clone()),
            }
        }
        if forget.is_empty() {
            return Ok(());
        }
        kept.retain(|r| !forget.contains(&r.state_id));
        for c in &forget {
            for ext in ["json", "patch", "note.md"] {
                let _ = std::fs::remove_file(states_dir.join(format!("{c}.{ext}")));
            }
        }
        let cands = states_dir.join("candidates.jsonl");
        let lines = std::fs::read_to_string(&cands).unwrap_or_default();
        let left: String = lines
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["candidate"].as_str().map(String::from))
                    .is_none_or(|c| !forget.contains(&c))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        write_atomic(&cands, left.as_bytes())?;
        decision(
            shard_dir,
            "states-forgotten",
            serde_json::json!({ "states": forget, "node": self.node,
                "why": "no usable archive or checkpoint on this node; built again" }),
        )?;
        Ok(())
    }
}

/// What `done.json` says. Times in milliseconds since the epoch, durations in
/// milliseconds: what a shard costs beyond its trials is read from them.
#[derive(Debug, Serialize, Deserialize)]
pub struct Done {
    pub attempt: String,
    pub node: String,
    pub trials: usize,
    pub finished: u64,
    /// When the attempt began (the array task's process started).
    #[serde(default)]
    pub started_ms: u64,
    /// Finding the node's daemon, or starting it.
    #[serde(default)]
    pub daemon_ms: u64,
    #[serde(default)]
    pub daemon_started: bool,
    /// The evaluator's run of the shard (states, trials, grading).
    #[serde(default)]
    pub run_ms: u64,
    #[serde(default)]
    pub finished_ms: u64,
}

/// `forkd eval shard RUN [--index K]`: runs shard K of the run at `top` on this node.
pub fn run_shard(top: &Path, index: Option<usize>) -> anyhow::Result<super::Said> {
    let plan = load_plan(top)?.ok_or_else(|| {
        anyhow::anyhow!(
            "{} is not a sharded run (no {})",
            top.display(),
            plan_path(top).display()
        )
    })?;
    let index = index.or_else(index_from_env).ok_or_else(|| {
        anyhow::anyhow!(
            "which shard? give --index (or run as a Slurm array task or an Indexed Job)"
        )
    })?;
    let sp = plan
        .shards
        .iter()
        .find(|s| s.index == index)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "run {} has no shard {index} (it has {})",
                top.display(),
                plan.shards.len()
            )
        })?
        .clone();
    let started_ms = super::now_ms();
    let dir = shard_dir(top, index);
    let node = node_name();
    let attempt = attempt_name();
    let fence = Fence::take(&dir, &attempt, &node)?;
    let _ = std::fs::remove_file(dir.join("done.json"));
    let t = std::time::Instant::now();
    let (socket, started) = node_daemon(&plan, &node)?;
    let daemon_ms = t.elapsed().as_millis() as u64;
    decision(
        &dir,
        "attempt",
        serde_json::json!({ "attempt": attempt, "node": node, "socket": socket, "daemon_started": started }),
    )?;
    eprintln!(
        "[eval] shard {index} ({}) on {node}, attempt {attempt}",
        sp.tasks.join(", ")
    );
    let mut opts = super::options_of(&dir, plan.parallel)?;
    opts.shard = Some(Sharding {
        top: top.to_path_buf(),
        index,
        tasks: sp.tasks.clone(),
        archives: StateArchives::new(top, &node, &dir.join("transfers.jsonl")),
        fence,
        node: node.clone(),
    });
    let t = std::time::Instant::now();
    let mut said = super::execute(&socket, &opts, true)?;
    let run_ms = t.elapsed().as_millis() as u64;
    let trials = super::load_results(&dir.join("results.jsonl")).len();
    write_atomic(
        &dir.join("done.json"),
        &serde_json::to_vec_pretty(&Done {
            attempt,
            node: node.clone(),
            trials,
            finished: now_secs(),
            started_ms,
            daemon_ms,
            daemon_started: started,
            run_ms,
            finished_ms: super::now_ms(),
        })?,
    )?;
    said.json["shard"] = index.into();
    said.json["node"] = node.into();
    Ok(said)
}

/// Where each shard stands, from its files.
#[derive(Debug, Clone, PartialEq)]
pub enum ShardFiles {
    /// Every trial finished, none an infrastructure failure.
    Done { trials: usize },
    /// Finished, with trials that ended as infrastructure failures (a resume runs them).
    DoneWithInfra { trials: usize, infra: usize },
    /// Not finished: the rows written so far.
    Open { rows: usize },
}

pub fn shard_files(top: &Path, index: usize) -> ShardFiles {
    let dir = shard_dir(top, index);
    let rows = super::load_results(&dir.join("results.jsonl"));
    if !dir.join("done.json").exists() {
        return ShardFiles::Open { rows: rows.len() };
    }
    let infra = rows
        .iter()
        .filter(|r| r.outcome == forkd_analysis::Outcome::InfraError)
        .count();
    if infra > 0 {
        ShardFiles::DoneWithInfra {
            trials: rows.len(),
            infra,
        }
    } else {
        ShardFiles::Done { trials: rows.len() }
    }
}

/// `forkd eval merge RUN`: every shard's rows into `RUN/results.jsonl` and `.csv` (one
/// row per trial, ordered by trial id, so the merge is the same whatever order the
/// shards finished in), the state records and candidates into `RUN/states/`, each trial
/// directory linked as `RUN/trials/<id>`. Returns (trials merged, shards not finished).
pub fn merge(top: &Path) -> anyhow::Result<(usize, Vec<usize>)> {
    let plan =
        load_plan(top)?.ok_or_else(|| anyhow::anyhow!("{} is not a sharded run", top.display()))?;
    let mut rows: Vec<forkd_analysis::TrialRow> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut open = Vec::new();
    let mut candidates: Vec<(String, String)> = Vec::new();
    std::fs::create_dir_all(top.join("states"))?;
    std::fs::create_dir_all(top.join("trials"))?;
    for sp in &plan.shards {
        let dir = shard_dir(top, sp.index);
        if !matches!(shard_files(top, sp.index), ShardFiles::Done { .. }) {
            open.push(sp.index);
        }
        for r in super::load_results(&dir.join("results.jsonl")) {
            // A trial is counted once: the first row a shard wrote for it.
            if !seen.insert(r.trial_id.clone()) {
                continue;
            }
            let link = top.join("trials").join(&r.trial_id);
            let target = PathBuf::from("../shards")
                .join(sp.index.to_string())
                .join("trials")
                .join(&r.trial_id);
            if std::fs::read_link(&link).ok().as_ref() != Some(&target) {
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&target, &link)
                    .map_err(|e| anyhow::anyhow!("link {}: {e}", link.display()))?;
            }
            rows.push(r);
        }
        if let Ok(rd) = std::fs::read_dir(dir.join("states")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name == "candidates.jsonl" {
                    let text = std::fs::read_to_string(e.path())?;
                    for l in text.lines() {
                        let c = serde_json::from_str::<serde_json::Value>(l)
                            .ok()
                            .and_then(|v| v["candidate"].as_str().map(String::from))
                            .unwrap_or_default();
                        candidates.push((c, l.to_string()));
                    }
                } else if !name.starts_with('.') && e.path().is_file() {
                    std::fs::copy(e.path(), top.join("states").join(&name))?;
                }
            }
        }
    }
    rows.sort_by(|a, b| a.trial_id.cmp(&b.trial_id));
    // Stable: a candidate's lines keep their order.
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    let body: String = rows
        .iter()
        .map(|r| format!("{}\n", serde_json::to_string(r).expect("rows serialise")))
        .collect();
    write_atomic(&top.join("results.jsonl"), body.as_bytes())?;
    super::write_csv(&top.join("results.csv"), &rows)?;
    let cands: String = candidates.iter().map(|(_, l)| format!("{l}\n")).collect();
    write_atomic(
        &top.join("states").join("candidates.jsonl"),
        cands.as_bytes(),
    )?;
    Ok((rows.len(), open))
}

#[cfg(test)]
mod tests;
