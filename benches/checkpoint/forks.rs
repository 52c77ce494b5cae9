//! Part 2: live forks of a small process tree (N = 1 eager and lazy, N > 1 eager), with
//! the raw CRIU and podman peers' restores interleaved with forkd's N = 1 samples, and
//! the names of their rows; the largest fork goes on to part 4 (density.rs). The
//! per-branch series and the fork table's columns are shared with part 3.

use crate::common::{self, fmt_kib, fmt_ms, fmt_us, sample, Table};
use crate::config::Tree;
use crate::density::density;
use crate::fs::{live_checkpoint_sample, wait_tree_hash};
use crate::peers::podman::PodmanPeer;
use crate::peers::raw_criu::RawCriuPeer;
use crate::{Ctx, Out};
use anyhow::{bail, Result};
use forkd::api::BranchInfo;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub fn row_fork(tree: &Tree, n: usize, mode: &str, what: &str) -> String {
    format!("live fork N={n} {mode}, {}: {what}", tree.name)
}

pub fn row_raw(tree: &Tree, with_mount: bool) -> String {
    if with_mount {
        format!(
            "raw CRIU: overlay mount + criu restore -d, {} (peer)",
            tree.name
        )
    } else {
        format!("raw CRIU: criu restore -d, {} (peer)", tree.name)
    }
}

pub fn row_podman_checkpoint(tree: &Tree) -> String {
    format!(
        "podman container checkpoint --leave-running --export, {} (peer)",
        tree.name
    )
}

pub fn row_podman_restore(tree: &Tree) -> String {
    format!("podman container restore --import, {} (peer)", tree.name)
}

pub fn row_podman_restore_concurrent(tree: &Tree, parallel: usize) -> String {
    format!(
        "podman container restore --import, {parallel} at a time, {} (peer)",
        tree.name
    )
}

/// How many restores of podman's run concurrently (at most): enough for a p50.
const PODMAN_CONCURRENT_COPIES: usize = 20;

/// Per-branch numbers of one or more fork requests.
#[derive(Default)]
pub struct ForkSeries {
    pub totals: Vec<u64>,
    /// Every branch's phases as the daemon reported them.
    pub phases: Vec<BTreeMap<String, u64>>,
    /// The request's wall time divided by its branch count, one per request.
    pub wall_per_branch: Vec<u64>,
    pub requests: usize,
    pub branches: usize,
    pub with_tree: usize,
}

impl ForkSeries {
    /// Adds one request's branches, `with_tree` of which were seen running the tree.
    pub fn add(&mut self, branches: &[BranchInfo], wall_us: u64, with_tree: usize) {
        self.requests += 1;
        self.branches += branches.len();
        self.with_tree += with_tree;
        self.wall_per_branch
            .push(wall_us / branches.len().max(1) as u64);
        for b in branches {
            self.totals
                .push(b.phases_us.get("total").copied().unwrap_or(0));
            self.phases.push(b.phases_us.clone());
        }
    }

    /// One phase across branches; `other` is what the named phases leave of the total
    /// (for a lazy branch: starting its lazy-pages daemon).
    pub fn phase(&self, name: &str) -> Vec<u64> {
        self.phases
            .iter()
            .filter_map(|p| {
                if name == "other" {
                    let named: u64 = ["prepare", "restore", "ready"]
                        .iter()
                        .filter_map(|k| p.get(*k))
                        .sum();
                    p.get("total").map(|t| t.saturating_sub(named))
                } else {
                    p.get(name).copied()
                }
            })
            .collect()
    }
}

/// The columns of a fork table, after the first ones.
pub const FORK_COLUMNS: [&str; 9] = [
    "per-branch p50",
    "p90",
    "p99",
    "prepare p50",
    "restore p50",
    "ready p50",
    "other p50",
    "request wall / N p50",
    "branches with the tree running",
];

pub fn fork_cells(s: &ForkSeries) -> Vec<String> {
    let t = common::summarize(&s.totals);
    let p50 = |name: &str| fmt_ms(common::summarize(&s.phase(name)).p50 as f64);
    vec![
        fmt_ms(t.p50 as f64),
        fmt_ms(t.p90 as f64),
        fmt_ms(t.p99 as f64),
        p50("prepare"),
        p50("restore"),
        p50("ready"),
        p50("other"),
        fmt_ms(common::summarize(&s.wall_per_branch).p50 as f64),
        format!("{} of {}", s.with_tree, s.branches),
    ]
}

pub fn fork_timed(
    ctx: &Ctx,
    out: &mut Out,
    ck: &str,
    n: usize,
    lazy: bool,
) -> Result<(Vec<BranchInfo>, u64)> {
    let t = Instant::now();
    let r = ctx.d.fork(ck, n, lazy)?;
    let wall = t.elapsed().as_micros() as u64;
    out.created.extend(r.branches.iter().map(|b| b.id.clone()));
    if r.branches.len() != n {
        bail!("asked for {n} branches of {ck}, got {}", r.branches.len());
    }
    Ok((r.branches, wall))
}

pub fn live_forks(
    ctx: &Ctx,
    out: &mut Out,
    tree: &Tree,
    criu: &forkd_criu::Criu,
    mut podman: Option<&mut PodmanPeer>,
) -> Result<()> {
    let (d, n) = (ctx.d, ctx.cfg.samples);
    eprintln!("[2/4] live checkpoint and forks of {}", tree.name);
    let sb = d.create_with(&json!({ "image": tree.image, "command": { "shell": tree.shell } }))?;
    out.created.push(sb.id.clone());
    tree.wait_in(&sb.cgroup, Duration::from_secs(20))?;

    // Live checkpoints: a fresh one per sample.
    let ck_row = format!("live checkpoint, {}: API", tree.name);
    let mut phases: Vec<BTreeMap<String, u64>> = Vec::new();
    let api = sample(&ck_row, 1, n, || {
        live_checkpoint_sample(d, &sb.id, &mut phases)
    })?;
    // The warm-up's phases are not kept.
    phases.drain(..1.min(phases.len()));
    out.report.row(&ck_row, api);
    for k in ["dump", "snapshot"] {
        // The layer is a snapshot, or for a small one a copy: one phase or the other.
        let v: Vec<u64> = phases
            .iter()
            .filter_map(|p| {
                p.get(k)
                    .or(if k == "snapshot" { p.get("copy") } else { None })
            })
            .copied()
            .collect();
        let what = if k == "snapshot" {
            "daemon snapshot or copy (tree frozen)".to_string()
        } else {
            format!("daemon {k}")
        };
        out.report
            .row(&format!("live checkpoint, {}: {what}", tree.name), v);
    }
    let ck = d.checkpoint(&sb.id, true, false)?;
    wait_tree_hash(d, &ck.id, Instant::now())?;
    eprintln!(
        "  checkpoint {} (CRIU images {})",
        ck.id,
        fmt_kib(ck.images_bytes as f64 / 1024.0)
    );

    // N = 1, eager: one request per sample, the branch removed after it. The peers
    // restore the same state in the same loop, one copy each per sample, so that all
    // of them see the same machine (load drifts on a shared one).
    let mut raw = RawCriuPeer::new(&ctx.data, &ctx.d.root, &ck, criu)?;
    let mut series: Vec<(usize, &str, ForkSeries)> = Vec::new();
    let mut s = ForkSeries::default();
    let (mut raw_restore, mut raw_total, mut podman_restore) = (Vec::new(), Vec::new(), Vec::new());
    let mut round = 0;
    let label = row_fork(tree, 1, "eager", "request wall");
    let walls = sample(&label, 1, n, || {
        // The order rotates, so that no one always follows the same one's clean-up.
        let (mut fork, mut raw_us, mut pod) = (None, None, None);
        for slot in 0..3 {
            match (slot + round) % 3 {
                0 => {
                    let (b, wall) = fork_timed(ctx, out, &ck.id, 1, false)?;
                    let alive = tree.count_in(&b);
                    d.remove(&b[0].id)?;
                    fork = Some((b, wall, alive));
                }
                1 => raw_us = Some(raw.restore_once(tree.expect, &mut out.raw_pids)?),
                _ => {
                    pod = podman
                        .as_deref_mut()
                        .map(|p| p.restore_once())
                        .transpose()?
                }
            }
        }
        let (b, wall, alive) = fork.expect("the fork ran");
        let (r, t) = raw_us.expect("the raw restore ran");
        // The first round is the warm-up: its numbers are not kept.
        if round > 0 {
            s.add(&b, wall, alive);
            raw_restore.push(r);
            raw_total.push(t);
            podman_restore.extend(pod);
        }
        round += 1;
        Ok(wall)
    })?;
    out.report.row(
        &row_fork(tree, 1, "eager", "branch total (daemon)"),
        s.totals.clone(),
    );
    out.report.row(
        &row_fork(tree, 1, "eager", "branch restore phase"),
        s.phase("restore"),
    );
    out.report.row(&label, walls);
    out.report.row(&row_raw(tree, false), raw_restore);
    out.report.row(&row_raw(tree, true), raw_total);
    if let Some(p) = podman.as_deref() {
        out.report.row(&row_podman_restore(tree), podman_restore);
        p.note_failures(&mut out.report);
    }
    raw.finish(tree.name, tree.expect, &mut out.report)?;
    series.push((1, "eager", s));

    // N = 1, lazy.
    let mut s = ForkSeries::default();
    let label = row_fork(tree, 1, "lazy", "request wall");
    let walls = sample(&label, 0, n, || {
        let (b, wall) = fork_timed(ctx, out, &ck.id, 1, true)?;
        s.add(&b, wall, tree.count_in(&b));
        d.remove(&b[0].id)?;
        Ok(wall)
    })?;
    out.report.row(
        &row_fork(tree, 1, "lazy", "branch total (daemon)"),
        s.totals.clone(),
    );
    out.report.row(
        &row_fork(tree, 1, "lazy", "branch restore phase"),
        s.phase("restore"),
    );
    out.report.row(&label, walls);
    series.push((1, "lazy", s));

    // N > 1 eager: one request each; the largest is also part 4 (all alive at once).
    let largest = *ctx.cfg.branch_counts.last().unwrap_or(&1);
    for &count in ctx.cfg.branch_counts.iter().filter(|&&c| c > 1) {
        common::check_interrupted()?;
        let settle = Duration::from_secs(1);
        std::thread::sleep(settle);
        let before = (common::mem_available_kib()?, d.rss_kib()?);
        eprintln!("  fork of {count} eager branches in one request ...");
        let (branches, wall) = fork_timed(ctx, out, &ck.id, count, false)?;
        let mut s = ForkSeries::default();
        s.add(&branches, wall, tree.count_in(&branches));
        eprintln!(
            "  {count} branches in {} ({} per branch), {} with the tree running",
            fmt_us(wall),
            fmt_us(wall / count as u64),
            s.with_tree
        );
        out.report.row(
            &row_fork(tree, count, "eager", "per-branch total (daemon)"),
            s.totals.clone(),
        );
        out.report.row(
            &row_fork(tree, count, "eager", "per-branch restore phase"),
            s.phase("restore"),
        );
        out.report.row(
            &row_fork(tree, count, "eager", "request wall / N"),
            s.wall_per_branch.clone(),
        );
        if count == largest {
            density(ctx, out, tree, &branches, before, wall)?;
        } else {
            for b in &branches {
                d.remove(&b.id)?;
            }
        }
        series.push((count, "eager", s));
    }

    // podman at the same concurrency as the daemon's restore workers, so that forkd's
    // per-branch latency at N > 1 (its branches restored that many at a time) has a peer
    // measured under the same load.
    if let Some(p) = podman {
        if largest > 1 {
            let parallel = forkd::daemon::config::Config::from_env()?.fork_parallel;
            let copies = largest.min(PODMAN_CONCURRENT_COPIES);
            eprintln!("  podman: {copies} restores, {parallel} at a time ...");
            let us = p.restore_concurrently(copies, parallel)?;
            out.report
                .row(&row_podman_restore_concurrent(tree, parallel), us);
            p.note_failures(&mut out.report);
        }
    }

    // The table for this tree.
    let mut table = Table {
        title: format!(
            "Part 2: live fork of {} (ms; per-branch = the branch's phases_us.total)",
            tree.name
        ),
        header: ["N", "mode", "requests"]
            .into_iter()
            .chain(FORK_COLUMNS)
            .map(String::from)
            .collect(),
        rows: Vec::new(),
    };
    let mut forks_json = Vec::new();
    for (count, mode, s) in &series {
        let mut cells = vec![count.to_string(), mode.to_string(), s.requests.to_string()];
        cells.extend(fork_cells(s));
        table.rows.push(cells);
        forks_json.push(json!({
            "tree": tree.name, "n": count, "mode": mode, "requests": s.requests,
            "branches": s.branches, "with_tree_running": s.with_tree,
            "branch_phases_us": s.phases, "wall_per_branch_us": s.wall_per_branch,
        }));
    }
    for name in [row_raw(tree, false), row_raw(tree, true)] {
        if let Some(s) = out.report.summary(&name) {
            let mut cells = vec![
                "1".into(),
                name.trim_end_matches(" (peer)")
                    .trim_end_matches(tree.name)
                    .trim_end_matches(", ")
                    .to_string(),
                s.n.to_string(),
                fmt_ms(s.p50 as f64),
                fmt_ms(s.p90 as f64),
                fmt_ms(s.p99 as f64),
            ];
            cells.resize(3 + FORK_COLUMNS.len(), "-".into());
            table.rows.push(cells);
        }
    }
    out.report.tables.push(table);
    let all_ok = series.iter().all(|(_, _, s)| s.with_tree == s.branches);
    match out.report.extra.get_mut("forks") {
        Some(Value::Array(a)) => a.extend(forks_json),
        _ => {
            out.report
                .extra
                .insert("forks".into(), Value::Array(forks_json));
        }
    }
    d.remove_checkpoint(&ck.id)?;
    d.remove(&sb.id)?;
    if !all_ok {
        out.report.notes.push(format!(
            "**{}: some branches did not have all of {:?} running right after the fork** (see the table)",
            tree.name, tree.expect
        ));
    }
    Ok(())
}
