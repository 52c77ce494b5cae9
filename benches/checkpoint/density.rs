//! Part 4: the branches of the largest fork of part 2, alive at once: host memory, the
//! branches' cgroup charge and PSS, the daemon's RSS, then their removal.

use crate::common::{self, fmt_kib, fmt_us};
use crate::config::Tree;
use crate::{Ctx, Out};
use anyhow::{bail, Result};
use forkd::api::{BranchInfo, SandboxStatus};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Part 4: the branches of the largest fork, alive at once.
pub fn density(
    ctx: &Ctx,
    out: &mut Out,
    tree: &Tree,
    branches: &[BranchInfo],
    (avail_before, rss_before): (u64, u64),
    fork_wall_us: u64,
) -> Result<()> {
    let d = ctx.d;
    let n = branches.len();
    eprintln!("[4/4] {n} live branches of {} alive at once", tree.name);
    let settle = Duration::from_secs(2);
    std::thread::sleep(settle);
    let avail_alive = common::mem_available_kib()?;
    let rss_alive = d.rss_kib()?;
    let ids: BTreeSet<&str> = branches.iter().map(|b| b.id.as_str()).collect();
    let listed: Vec<forkd::api::SandboxInfo> = d.client().call("GET", "/v1/sandboxes", None)?;
    let mine: Vec<&forkd::api::SandboxInfo> = listed
        .iter()
        .filter(|s| ids.contains(s.id.as_str()))
        .collect();
    let running = mine
        .iter()
        .filter(|s| s.status == SandboxStatus::Running)
        .count();
    let charged: Vec<u64> = mine.iter().filter_map(|s| s.memory_bytes).collect();
    let with_tree = tree.count_in(branches);
    let mut pss_total = 0u64;
    let mut procs = 0usize;
    for b in branches {
        for pid in common::cgroup_pids(&format!("forkd/{}", b.id)) {
            if let Ok(k) = common::pss_kib(pid) {
                pss_total += k;
                procs += 1;
            }
        }
    }
    let t = Instant::now();
    for b in branches {
        common::check_interrupted()?;
        d.remove(&b.id)?;
    }
    let remove_us = t.elapsed().as_micros() as u64;
    std::thread::sleep(settle);
    let avail_end = common::mem_available_kib()?;
    let rss_end = d.rss_kib()?;
    eprintln!("  removed all {n} in {}", fmt_us(remove_us));

    let host_used = avail_before as i64 - avail_alive as i64;
    let charged_kib = charged.iter().sum::<u64>() as f64 / 1024.0;
    let per = |kib: f64| fmt_kib(kib / n as f64);
    out.report.sections.push((
        format!("Part 4: {n} live branches of {} alive at once", tree.name),
        vec![
            (
                "branches running (listed by the daemon) / with the tree running".into(),
                format!("{running} / {with_tree} of {n}"),
            ),
            (
                "fork request (all branches)".into(),
                format!(
                    "{:.2} s ({} per branch)",
                    fork_wall_us as f64 / 1e6,
                    fmt_us(fork_wall_us / n as u64)
                ),
            ),
            (
                "host memory used by all (MemAvailable delta)".into(),
                fmt_kib(host_used as f64),
            ),
            (
                "host memory per branch (MemAvailable delta / N)".into(),
                per(host_used as f64),
            ),
            (
                format!("cgroup memory charged, sum ({} of {n} read)", charged.len()),
                fmt_kib(charged_kib),
            ),
            ("cgroup memory charged per branch".into(), per(charged_kib)),
            (
                format!("PSS of the branches' processes, sum ({procs} processes)"),
                fmt_kib(pss_total as f64),
            ),
            ("PSS per branch".into(), per(pss_total as f64)),
            (
                "daemon RSS before -> with all alive -> after removing all".into(),
                format!(
                    "{} -> {} -> {}",
                    fmt_kib(rss_before as f64),
                    fmt_kib(rss_alive as f64),
                    fmt_kib(rss_end as f64)
                ),
            ),
            (
                "remove all (sequential, rm -f)".into(),
                format!("{:.2} s", remove_us as f64 / 1e6),
            ),
            (
                "host memory still used after removing all (MemAvailable vs before)".into(),
                fmt_kib(avail_before as f64 - avail_end as f64),
            ),
        ],
    ));
    let entry = json!({
        "tree": tree.name,
        "branches": n,
        "running": running,
        "with_tree_running": with_tree,
        "fork_wall_us": fork_wall_us,
        "mem_available_kib": { "before": avail_before, "alive": avail_alive, "after_remove": avail_end },
        "daemon_rss_kib": { "before": rss_before, "alive": rss_alive, "after_remove": rss_end },
        "host_memory_per_branch_kib": host_used as f64 / n as f64,
        "cgroup_memory_bytes": charged,
        "pss_total_kib": pss_total,
        "processes": procs,
        "remove_total_us": remove_us,
    });
    if !out.report.notes.iter().any(|n| n.starts_with("part 4:")) {
        out.report.notes.push(format!(
            "part 4: host memory is the drop of MemAvailable over the whole machine while the \
             branches were alive (settled {} ms), so other activity on the machine adds noise \
             (it can even come out negative); the cgroup charge and PSS are per branch",
            settle.as_millis()
        ));
    }
    match out.report.extra.get_mut("density") {
        Some(Value::Array(a)) => a.push(entry),
        _ => {
            out.report
                .extra
                .insert("density".into(), Value::Array(vec![entry]));
        }
    }
    if running != n {
        bail!("density: only {running} of {n} branches were listed as running");
    }
    Ok(())
}
