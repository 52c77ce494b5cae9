//! Sharded evaluator runs over Slurm, on this machine: the bundled suites run on one node
//! (one daemon) and as shards over a three-node Slurm cluster (fixtures/slurm/cluster.sh:
//! Debian's slurmctld and three slurmd, all on the same two cores), with the results
//! checked equal row for row. Since the nodes share the cores, wall time says little
//! about scaling; what is reported is what a shard costs beyond its trials:
//! - queue: sbatch returned -> the shard's process started (Slurm's scheduling and launch);
//! - daemon: finding the node's daemon, or starting one (cold nodes);
//! - tail: the last shard finished -> `forkd eval run` returned (the wait loop's poll and
//!   the merge); merge alone, timed as `forkd eval merge` on the finished run;
//! - start-state archives per state: size, export (the daemon's export and the file's
//!   SHA-256), import and verification (the file's SHA-256, the daemon's import with
//!   every member and tree hash checked), next to the generic peer on the same contents
//!   (tar | zstd -T0 -3 plus sha256 to ship; sha256 plus zstd -d | tar -x to unpack,
//!   which verifies nothing inside).
//!
//! Rounds: one cold sharded run (node daemons started by the shards), then
//! FORKD_BENCH_ROUNDS (default 3) one-node and warm sharded runs, alternating.
//! Results: target/bench/slurm.json and slurm.md.

#![forbid(unsafe_code)]

mod common;
mod peers;

use anyhow::{Context, Result};
use common::{summarize, DaemonGuard};
use peers::tar_zstd;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_forkd");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cache() -> PathBuf {
    forkd::api::defaults::cache()
}

/// The one-machine cluster; stopped (and the node daemons the shards started with it)
/// when dropped.
struct Cluster {
    dir: PathBuf,
    nodes: PathBuf,
}

impl Cluster {
    fn start(dir: &Path, nodes: &Path) -> Result<Cluster> {
        let out = Command::new(repo().join("fixtures/slurm/cluster.sh"))
            .args(["start", dir.to_str().unwrap(), "3"])
            .stdout(Stdio::null())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "cluster start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Cluster {
            dir: dir.to_path_buf(),
            nodes: nodes.to_path_buf(),
        })
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// Daemons whose state root is under the node roots.
    fn node_daemons(&self) -> Vec<i32> {
        let want = format!("FORKD_ROOT={}", self.nodes.display());
        let mut pids = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
            if env
                .split(|b| *b == 0)
                .any(|v| String::from_utf8_lossy(v).starts_with(&want))
            {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("fixtures/slurm/cluster.sh"))
            .args(["stop", self.dir.to_str().unwrap()])
            .stdout(Stdio::null())
            .status();
        for pid in self.node_daemons() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
        let t = Instant::now();
        while !self.node_daemons().is_empty() && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `forkd eval run SUITE` (oracle and noop); returns its wall time in milliseconds.
fn eval_run(
    d: &DaemonGuard,
    c: &Cluster,
    suite: &Path,
    conditions: &str,
    out: &Path,
    extra: &[&str],
) -> Result<u64> {
    let t = Instant::now();
    let mut cmd = Command::new(BIN);
    cmd.args(["--socket", d.socket.to_str().unwrap(), "eval", "run"])
        .arg(suite)
        .args(["--out", out.to_str().unwrap()])
        .args(["--agents", "oracle,noop", "--conditions", conditions])
        .args(extra)
        .env("SLURM_CONF", c.conf())
        .stdout(Stdio::null());
    let o = cmd.output()?;
    anyhow::ensure!(
        o.status.success(),
        "{}: {}",
        common::describe(&cmd),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(t.elapsed().as_millis() as u64)
}

/// trial id -> (outcome, per-test results)
fn rows(run: &Path) -> Result<BTreeMap<String, (Value, Value)>> {
    let text = std::fs::read_to_string(run.join("results.jsonl"))
        .with_context(|| format!("{}/results.jsonl", run.display()))?;
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let v: Value = serde_json::from_str(l)?;
        let id = v["trial_id"].as_str().unwrap_or_default().to_string();
        anyhow::ensure!(
            m.insert(id.clone(), (v["outcome"].clone(), v["tests"].clone()))
                .is_none(),
            "trial {id} twice in {}",
            run.display()
        );
    }
    Ok(m)
}

fn read_json(p: &Path) -> Result<Value> {
    serde_json::from_slice(&std::fs::read(p).with_context(|| p.display().to_string())?)
        .with_context(|| p.display().to_string())
}

fn jsonl(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Per-shard costs of a finished sharded run that returned at `returned_ms`.
#[derive(Default)]
struct ShardCosts {
    queue_ms: Vec<u64>,
    daemon_ms: Vec<u64>,
    run_ms: Vec<u64>,
    /// The run's own: sbatch returned -> the run command returned, and the tail.
    span_ms: u64,
    tail_ms: u64,
}

fn shard_costs(run: &Path, returned_ms: u64) -> Result<ShardCosts> {
    let subs = jsonl(&run.join("slurm/jobs.jsonl"));
    anyhow::ensure!(subs.len() == 1, "{}: one submission", run.display());
    let submitted = subs[0]["t_ms"].as_u64().unwrap_or(0);
    let plan = read_json(&run.join("shards/plan.json"))?;
    let mut c = ShardCosts::default();
    let mut last = 0;
    for s in plan["shards"].as_array().into_iter().flatten() {
        let k = s["index"].as_u64().unwrap_or(0);
        let done = read_json(&run.join(format!("shards/{k}/done.json")))?;
        let get = |f: &str| done[f].as_u64().unwrap_or(0);
        c.queue_ms.push(get("started_ms").saturating_sub(submitted));
        c.daemon_ms.push(get("daemon_ms"));
        c.run_ms.push(get("run_ms"));
        last = last.max(get("finished_ms"));
    }
    c.span_ms = returned_ms.saturating_sub(submitted);
    c.tail_ms = returned_ms.saturating_sub(last);
    Ok(c)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Archive costs of every state of a run: the recorded export, an import with
/// verification into the bench's daemon, and the tar+zstd peer on the same contents.
fn archive_costs(d: &DaemonGuard, run: &Path, scratch: &Path) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let exports: Vec<Value> = std::fs::read_dir(run.join("shards"))?
        .flatten()
        .flat_map(|e| jsonl(&e.path().join("transfers.jsonl")))
        .filter(|t| t["kind"] == "export")
        .collect();
    for e in std::fs::read_dir(run.join("archives"))?.flatten() {
        let task = e.file_name().to_string_lossy().to_string();
        let mut recs: Vec<PathBuf> = std::fs::read_dir(e.path())?
            .flatten()
            .map(|f| f.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        recs.sort();
        for rec_path in recs {
            let rec = read_json(&rec_path)?;
            let state = rec["state"].as_str().unwrap_or_default().to_string();
            let archive = rec_path.with_extension("forkd");
            let export_ms = exports
                .iter()
                .find(|t| t["task"] == task.as_str() && t["state"] == state.as_str())
                .and_then(|t| t["ms"].as_u64())
                .unwrap_or(rec["export_ms"].as_u64().unwrap_or(0));
            // Import as a shard does: the whole file's hash, then the daemon's import.
            let t = Instant::now();
            let (sha, bytes) = forkd::eval::archives::file_sha256(&archive)?;
            anyhow::ensure!(sha == rec["sha256"].as_str().unwrap_or_default());
            let info: forkd::api::CheckpointInfo = d
                .client()
                .call(
                    "POST",
                    "/v1/checkpoints/import",
                    Some(&json!({ "path": archive })),
                )
                .with_context(|| format!("import {}", archive.display()))?;
            let import_ms = t.elapsed().as_millis() as u64;
            anyhow::ensure!(info.tree_hash.as_deref() == rec["tree_hash"].as_str());
            let resp = d.client().raw(
                "DELETE",
                &format!("/v1/checkpoints/{}?force=true", info.id),
                &[],
            )?;
            anyhow::ensure!(
                resp.status < 400,
                "remove checkpoint {}: {}",
                info.id,
                resp.status
            );
            // The peer, on the archive's own contents.
            let dir = scratch.join(format!("{task}-{state}"));
            let back = scratch.join(format!("{task}-{state}-back"));
            let tarball = scratch.join(format!("{task}-{state}.tar.zst"));
            std::fs::create_dir_all(&dir)?;
            std::fs::create_dir_all(&back)?;
            tar_zstd::unpack(&archive, &dir)?;
            let peer_export_ms = tar_zstd::export(&dir, &tarball)?;
            let peer_import_ms = tar_zstd::import(&tarball, &back)?;
            let peer_bytes = std::fs::metadata(&tarball)?.len();
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::remove_dir_all(&back);
            let _ = std::fs::remove_file(&tarball);
            out.push(json!({
                "task": task, "state": state, "live": info.live,
                "bytes": bytes, "export_ms": export_ms, "import_verify_ms": import_ms,
                "peer_bytes": peer_bytes, "peer_export_ms": peer_export_ms,
                "peer_import_ms": peer_import_ms,
            }));
        }
    }
    Ok(out)
}

fn p50(v: &[u64]) -> u64 {
    summarize(v).p50
}

fn main() -> Result<()> {
    common::install_interrupt_handler();
    let rounds = common::env_usize("FORKD_BENCH_ROUNDS", 3)?;
    if !Path::new("/usr/sbin/slurmctld").exists() || !Path::new("/usr/bin/sbatch").exists() {
        common::skip(
            "slurm bench",
            "Slurm is not installed (fixtures/setup.sh slurm)",
        )?;
        return Ok(());
    }
    let d = DaemonGuard::start(Path::new(BIN))?;
    let nodes = d.dir.join("nodes");
    let c = Cluster::start(&d.dir.join("cluster"), &nodes)?;
    let work = d.dir.join("work");
    std::fs::create_dir_all(&work)?;
    let mut suites = vec![(
        "mini",
        repo().join("fixtures/suites/mini"),
        "clean,residual",
    )];
    let bundled = cache().join("suite");
    if bundled.join("mi-windowed-step").is_dir() {
        suites.push(("bundled", bundled, "clean"));
    } else {
        common::skip("bundled suite", "not built (fixtures/setup.sh suite)")?;
    }
    let mut report = json!({ "machine": common::machine(), "git": common::git_revision().0,
        "load_average": common::load_average(), "rounds": rounds, "nodes": 3 });
    let mut md_runs = Vec::new();
    let mut md_shards = Vec::new();
    let mut md_archives = Vec::new();
    for (label, suite, conditions) in &suites {
        let template = format!("{}/{label}/%n", nodes.display());
        let sharded_args = ["--slurm", "--node-root", template.as_str()];
        let mut one = Vec::new();
        let mut warm = Vec::new();
        let mut costs = Vec::new();
        // Cold: the shards start the nodes' daemons.
        eprintln!("[bench] {label}: sharded over 3 nodes, cold");
        let cold_run = work.join(format!("{label}-sharded-cold"));
        let cold = eval_run(&d, &c, suite, conditions, &cold_run, &sharded_args)?;
        costs.push(("cold", shard_costs(&cold_run, now_ms())?));
        let want = rows(&cold_run)?;
        for r in 0..rounds {
            common::check_interrupted()?;
            eprintln!("[bench] {label}: round {}/{rounds}: one node", r + 1);
            let out = work.join(format!("{label}-one-{r}"));
            one.push(eval_run(&d, &c, suite, conditions, &out, &[])?);
            anyhow::ensure!(
                rows(&out)? == want,
                "{label}: the one-node run's rows differ from the sharded run's"
            );
            eprintln!("[bench] {label}: round {}/{rounds}: sharded, warm", r + 1);
            let out = work.join(format!("{label}-sharded-{r}"));
            warm.push(eval_run(&d, &c, suite, conditions, &out, &sharded_args)?);
            costs.push(("warm", shard_costs(&out, now_ms())?));
            anyhow::ensure!(rows(&out)? == want, "{label}: a sharded run's rows differ");
        }
        // Merge alone, on the cold run (a re-merge writes the same files).
        let mut merge = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let o = Command::new(BIN)
                .args(["eval", "merge", cold_run.to_str().unwrap()])
                .output()?;
            anyhow::ensure!(
                o.status.success(),
                "merge: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            merge.push(t.elapsed().as_millis() as u64);
        }
        anyhow::ensure!(
            rows(&cold_run)? == want,
            "{label}: a re-merge changed the rows"
        );
        let archives = archive_costs(&d, &cold_run, &work.join("scratch"))?;
        let shards = read_json(&cold_run.join("shards/plan.json"))?["shards"]
            .as_array()
            .map(|a| a.len())
            .unwrap_or(0);
        let one_p50 = p50(&one);
        let warm_p50 = p50(&warm);
        md_runs.push(format!(
            "| {label} | {} | {shards} | {:.1} | {:.1} | {:.1} | {:.2} |",
            want.len(),
            one_p50 as f64 / 1000.0,
            cold as f64 / 1000.0,
            warm_p50 as f64 / 1000.0,
            warm_p50 as f64 / one_p50.max(1) as f64
        ));
        let mut shard_json = Vec::new();
        for kind in ["cold", "warm"] {
            let of: Vec<&ShardCosts> = costs
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, c)| c)
                .collect();
            let flat = |f: fn(&ShardCosts) -> &Vec<u64>| -> Vec<u64> {
                of.iter().flat_map(|c| f(c).iter().copied()).collect()
            };
            let (q, dm, rm) = (
                flat(|c| &c.queue_ms),
                flat(|c| &c.daemon_ms),
                flat(|c| &c.run_ms),
            );
            let tails: Vec<u64> = of.iter().map(|c| c.tail_ms).collect();
            let (sq, sd, st) = (summarize(&q), summarize(&dm), summarize(&tails));
            md_shards.push(format!(
                "| {label} | {kind} | {} | {} / {} | {} / {} | {} / {} | {} |",
                q.len(),
                sq.p50,
                sq.max,
                sd.p50,
                sd.max,
                st.p50,
                st.max,
                p50(&merge)
            ));
            shard_json.push(
                json!({ "kind": kind, "queue_ms": q, "daemon_ms": dm, "run_ms": rm,
                "tail_ms": tails, "span_ms": of.iter().map(|c| c.span_ms).collect::<Vec<_>>() }),
            );
        }
        for a in &archives {
            let g = |k: &str| a[k].as_u64().unwrap_or(0);
            md_archives.push(format!(
                "| {label} | {}/{}{} | {:.2} | {} | {} | {:.2} | {} | {} | {:.2} | {:.2} |",
                a["task"].as_str().unwrap_or(""),
                a["state"].as_str().unwrap_or(""),
                if a["live"] == true { " (live)" } else { "" },
                g("bytes") as f64 / 1048576.0,
                g("export_ms"),
                g("import_verify_ms"),
                g("peer_bytes") as f64 / 1048576.0,
                g("peer_export_ms"),
                g("peer_import_ms"),
                g("export_ms") as f64 / g("peer_export_ms").max(1) as f64,
                g("import_verify_ms") as f64 / g("peer_import_ms").max(1) as f64,
            ));
        }
        report[*label] = json!({
            "trials": want.len(), "shards": shards, "equal_rows": true,
            "one_node_ms": one, "sharded_cold_ms": cold, "sharded_warm_ms": warm,
            "per_shard": shard_json, "merge_ms": merge, "archives": archives,
        });
    }
    drop(c);
    let cleanup = d.stop();
    report["cleanup_problems"] = json!(cleanup.problems);
    let md = format!(
        "# forkd benchmark: sharded runs over Slurm\n\n{}\n\nThree slurmd nodes and the controller on this one machine (2 cores): the nodes share the cores, so wall time shows the cost of sharding, not its gain. Agents oracle and noop; rows equal to the one-node run's in every round.\n\n## Wall time, seconds (p50 over {rounds} rounds; cold: one run whose shards started the nodes' daemons)\n\n| suite | trials | shards | one node | sharded, cold | sharded, warm p50 | warm / one node |\n|---|---:|---:|---:|---:|---:|---:|\n{}\n\n## Per shard, ms (p50 / max): queue = sbatch returned to the shard started; daemon = finding or starting the node's daemon; tail = last shard finished to the run returned (poll + merge); merge = `forkd eval merge` alone, p50 of 5\n\n| suite | nodes | shards | queue | daemon | tail | merge |\n|---|---|---:|---:|---:|---:|---:|\n{}\n\n## Start-state archives, per state: forkd (export = daemon export + SHA-256; import = SHA-256 + daemon import verifying every member and tree hash) vs tar+zstd -3 of the same contents (+ sha256sum; unpack verifies nothing inside)\n\n| suite | state | MiB | export ms | import+verify ms | peer MiB | peer export ms | peer import ms | export / peer | import / peer |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n{}\n",
        report["load_average"].as_str().unwrap_or(""),
        md_runs.join("\n"),
        md_shards.join("\n"),
        md_archives.join("\n"),
    );
    common::write_outputs("slurm", &report, &md)?;
    anyhow::ensure!(
        cleanup.problems.is_empty(),
        "clean-up problems: {:?}",
        cleanup.problems
    );
    Ok(())
}
