//! The schedulers a sharded run uses (never one of forkd's own). Slurm: the shards are
//! one sbatch array job (array task k runs `forkd eval shard RUN` for shard k), watched
//! through `squeue` and `scontrol` and the shards' own files; shards that end without
//! finishing are recorded and submitted again. Kubernetes: the same shards as an Indexed
//! Job manifest ([`kube_job`]), written for the user to apply.
//!
//! ```text
//! RUN/slurm/shard.sh       the batch script
//! RUN/slurm/jobs.jsonl     every submission: job id, shards, sbatch options
//! RUN/slurm/logs/          the array tasks' output (%A_%a.out)
//! ```

use super::archives::write_atomic;
use super::now_secs;
use super::records::decision;
use super::shard::{self, Plan, ShardFiles};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How a sharded run is submitted and followed.
#[derive(Debug, Clone, Default)]
pub struct SlurmOptions {
    /// Options for sbatch, split at white space (e.g. `-p batch --time=2:00:00`).
    pub sbatch: String,
    /// Return after submitting (follow with `forkd eval status`, finish with `resume`).
    pub no_wait: bool,
    /// Rounds of resubmission of shards that ended unfinished, while waiting.
    pub retries: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Submission {
    pub job: String,
    pub shards: Vec<usize>,
    pub sbatch: String,
    pub t: u64,
    /// When sbatch returned, in milliseconds since the epoch.
    #[serde(default)]
    pub t_ms: u64,
    /// Why: `run`, `retry` (shards lost while waiting) or `resume`.
    pub reason: String,
}

fn slurm_dir(top: &Path) -> PathBuf {
    top.join("slurm")
}

pub fn submissions(top: &Path) -> Vec<Submission> {
    std::fs::read_to_string(slurm_dir(top).join("jobs.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Runs a Slurm command; its stdout, or an error naming the command and its stderr.
fn slurm_cmd(prog: &str, args: &[String]) -> anyhow::Result<String> {
    let out = std::process::Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("{prog}: {e} (is Slurm's client installed and on PATH?)"))?;
    anyhow::ensure!(
        out.status.success(),
        "{prog} {}: exit {}: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes the batch script and submits `shards` as one array job; returns the job id.
pub fn submit(
    top: &Path,
    plan: &Plan,
    shards: &[usize],
    sbatch: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let top = std::path::absolute(top)?;
    let dir = slurm_dir(&top);
    std::fs::create_dir_all(dir.join("logs"))?;
    let script = dir.join("shard.sh");
    let q = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    write_atomic(
        &script,
        format!(
            "#!/bin/sh\n# One shard of forkd run {} (the array index is the shard).\nexec {} eval shard {}\n",
            plan.run_id,
            q(&plan.forkd),
            q(&top)
        )
        .as_bytes(),
    )?;
    let array: Vec<String> = shards.iter().map(|s| s.to_string()).collect();
    let mut args = vec![
        "--parsable".to_string(),
        format!("--array={}", array.join(",")),
        format!("--job-name=forkd-{}", plan.run_id),
        format!("--output={}/logs/%A_%a.out", dir.display()),
    ];
    args.extend(sbatch.split_whitespace().map(String::from));
    args.push(script.display().to_string());
    let out = slurm_cmd("sbatch", &args)?;
    // `--parsable` prints `jobid` or `jobid;cluster`.
    let job = out.trim().split(';').next().unwrap_or_default().to_string();
    anyhow::ensure!(
        !job.is_empty() && job.bytes().all(|b| b.is_ascii_digit()),
        "sbatch printed {out:?}, not a job id"
    );
    let sub = Submission {
        job: job.clone(),
        shards: shards.to_vec(),
        sbatch: sbatch.to_string(),
        t: now_secs(),
        t_ms: super::now_ms(),
        reason: reason.into(),
    };
    super::records::append_jsonl(&dir.join("jobs.jsonl"), &sub)?;
    decision(
        &top,
        "slurm-submit",
        serde_json::json!({ "job": job, "shards": shards, "sbatch": sbatch, "reason": reason }),
    )?;
    eprintln!(
        "[eval] submitted shard(s) {} as Slurm array job {job}",
        array.join(",")
    );
    Ok(job)
}

/// A shard's array task as `squeue` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Queued {
    pub job: String,
    pub shard: usize,
    pub state: String,
    pub node: String,
}

/// The array tasks of `jobs` still known to squeue (pending, running, completing,
/// requeued, ...).
pub fn queued(jobs: &[String]) -> anyhow::Result<Vec<Queued>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let out = slurm_cmd(
        "squeue",
        &[
            "-h".into(),
            "-r".into(),
            "-j".into(),
            jobs.join(","),
            "-o".into(),
            "%A|%F|%K|%T|%N".into(),
        ],
    );
    // squeue exits non-zero when every job it was asked about has left its tables.
    let out = match out {
        Ok(o) => o,
        Err(e) if e.to_string().contains("Invalid job id") => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(parse_squeue(&out))
}

/// Parses `squeue -h -r -o "%A|%F|%K|%T|%N"` lines (job id, array job id, array index,
/// state, nodes).
pub fn parse_squeue(out: &str) -> Vec<Queued> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split('|').collect();
            if f.len() < 5 {
                return None;
            }
            Some(Queued {
                job: f[1].to_string(),
                shard: f[2].parse().ok()?,
                state: f[3].to_string(),
                node: f[4].to_string(),
            })
        })
        .collect()
}

/// What Slurm still says about an array task that left the queue: its state and reason
/// (`scontrol show job`, while the controller keeps it), else "unknown".
fn ended_as(job: &str, shard: usize) -> String {
    match slurm_cmd(
        "scontrol",
        &[
            "-o".into(),
            "show".into(),
            "job".into(),
            format!("{job}_{shard}"),
        ],
    ) {
        Ok(o) => {
            let field = |k: &str| {
                o.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .unwrap_or("?")
                    .to_string()
            };
            format!("{} ({})", field("JobState"), field("Reason"))
        }
        Err(_) => "unknown (no longer known to the controller)".into(),
    }
}

/// Waits for the shards of the given submissions to leave the queue, printing progress
/// when it changes. Returns the shards that left the queue without finishing, each
/// recorded in the decision log as infrastructure (`shard-lost`).
fn wait(top: &Path, plan: &Plan, subs: &[Submission]) -> anyhow::Result<Vec<usize>> {
    let jobs: Vec<String> = subs.iter().map(|s| s.job.clone()).collect();
    let mut last = String::new();
    let mut failing_since: Option<Instant> = None;
    loop {
        let q = match queued(&jobs) {
            Ok(q) => {
                failing_since = None;
                q
            }
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                anyhow::ensure!(
                    since.elapsed() < Duration::from_secs(300),
                    "Slurm has not answered for 5 minutes: {e}"
                );
                eprintln!("[eval] squeue: {e} (trying again)");
                std::thread::sleep(Duration::from_secs(5));
                continue;
            }
        };
        let line = progress_line(top, plan, &q);
        if line != last {
            eprintln!("[eval] {line}");
            last = line;
        }
        if q.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
    let mut lost = Vec::new();
    for sub in subs {
        for &k in &sub.shards {
            if matches!(shard::shard_files(top, k), ShardFiles::Open { .. }) && !lost.contains(&k) {
                let how = ended_as(&sub.job, k);
                decision(
                    top,
                    "shard-lost",
                    serde_json::json!({ "shard": k, "job": sub.job, "slurm": how,
                        "counted_as": "infrastructure", "then": "submitted again" }),
                )?;
                eprintln!(
                    "[eval] shard {k} (job {}_{k}) ended unfinished: {how}",
                    sub.job
                );
                lost.push(k);
            }
        }
    }
    Ok(lost)
}

/// One line: shards pending, running (where), done, and trials written so far.
pub fn progress_line(top: &Path, plan: &Plan, q: &[Queued]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut running = Vec::new();
    let mut rows = 0;
    for sp in &plan.shards {
        let files = shard::shard_files(top, sp.index);
        rows += match files {
            ShardFiles::Done { trials } | ShardFiles::DoneWithInfra { trials, .. } => trials,
            ShardFiles::Open { rows } => rows,
        };
        let word = match q.iter().find(|x| x.shard == sp.index) {
            Some(x) if x.state == "RUNNING" => {
                running.push(format!("{}@{}", sp.index, x.node));
                "running"
            }
            Some(x) if x.state == "PENDING" => "pending",
            Some(_) => "other",
            None => match files {
                ShardFiles::Done { .. } => "done",
                ShardFiles::DoneWithInfra { .. } => "done with infra",
                ShardFiles::Open { .. } => "unfinished",
            },
        };
        *counts.entry(word).or_default() += 1;
    }
    let mut parts: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    if !running.is_empty() {
        parts.push(format!("on {}", running.join(" ")));
    }
    format!(
        "shards: {} of {}; {rows} trial(s) written",
        parts.join(", "),
        plan.shards.len()
    )
}

/// Shards that must run (again): not finished, or finished with infrastructure
/// failures, and not in the queue now.
fn to_run(top: &Path, plan: &Plan, in_queue: &[Queued]) -> Vec<usize> {
    plan.shards
        .iter()
        .map(|s| s.index)
        .filter(|&k| !matches!(shard::shard_files(top, k), ShardFiles::Done { .. }))
        .filter(|k| !in_queue.iter().any(|q| q.shard == *k))
        .collect()
}

/// Submits what must run, waits (unless `no_wait`), resubmits lost shards up to
/// `retries` rounds, then merges. Used by `run --slurm` and by `resume` of such a run.
pub fn drive(
    top: &Path,
    plan: &Plan,
    o: &SlurmOptions,
    reason: &str,
) -> anyhow::Result<super::Said> {
    let known: Vec<String> = submissions(top).into_iter().map(|s| s.job).collect();
    let in_queue = queued(&known)?;
    let mut subs: Vec<Submission> = Vec::new();
    // Shards still queued from an earlier submission are waited for, not submitted.
    for s in submissions(top) {
        if in_queue.iter().any(|q| q.job == s.job) {
            subs.push(s);
        }
    }
    let todo = to_run(top, plan, &in_queue);
    // Shards submitted before that left the queue unfinished: recorded as lost.
    for k in &todo {
        if let Some(prev) = submissions(top)
            .into_iter()
            .rev()
            .find(|s| s.shards.contains(k))
        {
            if matches!(shard::shard_files(top, *k), ShardFiles::Open { .. }) {
                decision(
                    top,
                    "shard-lost",
                    serde_json::json!({ "shard": k, "job": prev.job, "slurm": ended_as(&prev.job, *k),
                        "counted_as": "infrastructure", "then": "submitted again" }),
                )?;
            }
        }
    }
    if !todo.is_empty() {
        let job = submit(top, plan, &todo, &o.sbatch, reason)?;
        subs.push(
            submissions(top)
                .into_iter()
                .find(|s| s.job == job)
                .expect("just recorded"),
        );
    }
    if o.no_wait {
        let json = serde_json::json!({ "run": top, "status": "submitted",
            "jobs": subs.iter().map(|s| &s.job).collect::<Vec<_>>() });
        return Ok(super::Said::new(json, format!("{}\n", top.display())));
    }
    let mut round = 0;
    loop {
        let lost = wait(top, plan, &subs)?;
        if lost.is_empty() || round >= o.retries {
            break;
        }
        round += 1;
        let job = submit(top, plan, &lost, &o.sbatch, "retry")?;
        subs = submissions(top)
            .into_iter()
            .filter(|s| s.job == job)
            .collect();
    }
    finish(top)
}

/// Merges and reports; exit 0 when every shard finished, 3 when some did not.
pub fn finish(top: &Path) -> anyhow::Result<super::Said> {
    let (n, open) = shard::merge(top)?;
    let rows = super::load_results(&top.join("results.jsonl"));
    let (cells, table) = super::summary(&rows);
    let json = serde_json::json!({ "run": top,
        "status": if open.is_empty() { "done" } else { "unfinished" },
        "trials": n, "summary": cells, "unfinished_shards": open });
    if open.is_empty() {
        decision(top, "finish", serde_json::json!({ "trials": n }))?;
        Ok(super::Said::new(
            json,
            format!("{table}results: {}\n", top.display()),
        ))
    } else {
        decision(
            top,
            "merge",
            serde_json::json!({ "trials": n, "unfinished_shards": open }),
        )?;
        eprintln!(
            "[eval] {} shard(s) unfinished ({}): `forkd eval resume {}` submits them again",
            open.len(),
            open.iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(","),
            top.display()
        );
        Ok(super::Said::new(json, table).with_code(3))
    }
}

/// `forkd eval status RUN`: the shards' state from the queue and their files.
pub fn status(top: &Path) -> anyhow::Result<super::Said> {
    let plan = shard::load_plan(top)?
        .ok_or_else(|| anyhow::anyhow!("{} is not a sharded run", top.display()))?;
    let subs = submissions(top);
    let jobs: Vec<String> = subs.iter().map(|s| s.job.clone()).collect();
    let q = queued(&jobs).unwrap_or_else(|e| {
        eprintln!("[eval] squeue: {e}");
        Vec::new()
    });
    let mut text = format!(
        "{:<6} {:<12} {:<14} {:<10} {:>7}  TASKS\n",
        "SHARD", "JOB", "STATE", "NODE", "TRIALS"
    );
    let mut shards = Vec::new();
    for sp in &plan.shards {
        let files = shard::shard_files(top, sp.index);
        let job = subs
            .iter()
            .rev()
            .find(|s| s.shards.contains(&sp.index))
            .map(|s| format!("{}_{}", s.job, sp.index))
            .unwrap_or_else(|| "-".into());
        let (state, node) = match q.iter().find(|x| x.shard == sp.index) {
            Some(x) => (x.state.to_lowercase(), x.node.clone()),
            None => (
                match files {
                    ShardFiles::Done { .. } => "done".into(),
                    ShardFiles::DoneWithInfra { infra, .. } => format!("done, {infra} infra"),
                    ShardFiles::Open { .. } => "unfinished".into(),
                },
                "-".into(),
            ),
        };
        let n = match files {
            ShardFiles::Done { trials } | ShardFiles::DoneWithInfra { trials, .. } => trials,
            ShardFiles::Open { rows } => rows,
        };
        text.push_str(&format!(
            "{:<6} {:<12} {:<14} {:<10} {:>7}  {}\n",
            sp.index,
            job,
            state,
            node,
            n,
            sp.tasks.join(",")
        ));
        shards.push(
            serde_json::json!({ "shard": sp.index, "job": job, "state": state,
            "node": node, "trials": n, "tasks": sp.tasks }),
        );
    }
    let progress = progress_line(top, &plan, &q);
    text.push_str(&format!("{progress}\n"));
    let json = serde_json::json!({ "run": top, "shards": shards, "progress": progress });
    Ok(super::Said::new(json, text))
}

/// The shards of a planned run as a Kubernetes Indexed Job (JSON, which `kubectl apply
/// -f` reads as it reads YAML): one pod per shard, privileged, on the host's network,
/// with the node's daemon socket directory, the forkd binary and the run's shared
/// directory mounted from the host at the same paths, and the completion index as the
/// shard. Each index is retried `retries` times on its own (`backoffLimitPerIndex`).
pub fn kube_job(
    top: &Path,
    plan: &Plan,
    image: &str,
    retries: u32,
) -> anyhow::Result<serde_json::Value> {
    let top = std::path::absolute(top)?;
    let socket = forkd_api::client::Client::default_socket();
    let socket_dir = socket.parent().unwrap_or(Path::new("/run/forkd"));
    let suite = {
        let m: super::records::Manifest =
            serde_json::from_slice(&std::fs::read(top.join("manifest.json"))?)?;
        m.config.suite
    };
    let n = plan.shards.len();
    let host = |name: &str, path: &Path, kind: &str| serde_json::json!({ "name": name, "hostPath": { "path": path, "type": kind } });
    let mount = |name: &str, path: &Path, ro: bool| serde_json::json!({ "name": name, "mountPath": path, "readOnly": ro });
    let name = format!("forkd-{}", plan.run_id.to_lowercase());
    Ok(serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": { "name": name, "labels": { "app.kubernetes.io/name": "forkd-eval", "forkd.run": plan.run_id } },
        "spec": {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "backoffLimitPerIndex": retries,
            "maxFailedIndexes": n,
            "template": {
                "metadata": { "labels": { "forkd.run": plan.run_id } },
                "spec": {
                    "restartPolicy": "Never",
                    "hostNetwork": true,
                    "containers": [{
                        "name": "shard",
                        "image": image,
                        "command": [plan.forkd, "eval", "shard", top],
                        "env": [
                            { "name": "NODE_NAME", "valueFrom": { "fieldRef": { "fieldPath": "spec.nodeName" } } },
                            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
                            { "name": "FORKD_SOCKET", "value": socket },
                        ],
                        "securityContext": { "privileged": true },
                        "volumeMounts": [
                            mount("forkd-socket", socket_dir, false),
                            mount("forkd-bin", &plan.forkd, true),
                            mount("run", &top, false),
                            mount("suite", &suite, true),
                        ],
                    }],
                    "volumes": [
                        host("forkd-socket", socket_dir, "Directory"),
                        host("forkd-bin", &plan.forkd, "File"),
                        host("run", &top, "Directory"),
                        host("suite", &suite, "Directory"),
                    ],
                },
            },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_lines_name_the_array_index_state_and_node() {
        let out = "41|40|0|RUNNING|n1\n42|40|2|PENDING|\n\ngarbage\n43|40|x|RUNNING|n2\n";
        let q = parse_squeue(out);
        assert_eq!(
            q,
            vec![
                Queued {
                    job: "40".into(),
                    shard: 0,
                    state: "RUNNING".into(),
                    node: "n1".into()
                },
                Queued {
                    job: "40".into(),
                    shard: 2,
                    state: "PENDING".into(),
                    node: "".into()
                },
            ]
        );
    }
}
