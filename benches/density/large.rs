//! Part 3: many branches of one live state that holds much memory. A Debian sandbox
//! whose python3 holds `FORKD_DENSITY_LARGE_MIB` (default 1024) MiB of written,
//! incompressible memory and ticks every 10 s (`/tmp/count`) is checkpointed live;
//! `FORKD_DENSITY_LARGE` (default 1000) branches of it are forked 100 a request, and all
//! of them are kept alive at once.
//!
//! Reported: the first fork (it starts the checkpoint's restore template), the time a
//! branch in batches, single forks at 100 alive and at N, host memory a branch
//! (MemAvailable drop / alive) as the number grows, what a branch's processes hold
//! privately (`Private_Clean + Private_Dirty` of their `smaps_rollup`, p50 of 20), the
//! template's and the daemon's resident memory; a sample of 20 branches must answer with
//! their counter past the checkpoint's. Then every branch is removed, timed.
//!
//! The peer in the same run: a second daemon with `FORKD_TEMPLATES=off` (CRIU reads every
//! page into every branch) forks `FORKD_DENSITY_LARGE_PEER` (default 4) branches of the
//! same kind of state, one a request: its time and host memory a branch, and how many
//! such branches this host's memory would hold.

use super::{fork, space, us, Picker, BATCH};
use crate::common::{self, DaemonGuard, Report};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// The state: `mib` MiB of random bytes, then a tick every 10 s.
fn holder(mib: usize) -> String {
    format!(
        "exec python3 -c \"\nimport os, time\nb = [os.urandom(1 << 20) for _ in range({mib})]\n\
         i = 0\nwhile True:\n    i += 1\n    with open('/tmp/count', 'w') as f:\n        f.write(str(i))\n    time.sleep(10)\n\""
    )
}

/// A live checkpoint of the holder in a Debian sandbox of `d` (the source removed), and
/// the counter it held when checkpointed.
fn state(d: &DaemonGuard, mib: usize) -> Result<(String, u64)> {
    let sb = d.create_with(&json!({ "image": "debian", "command": { "shell": holder(mib) } }))?;
    if !common::wait_until(Duration::from_secs(300), || {
        d.sh_ok(&sb.id, "cat /tmp/count").is_ok()
    }) {
        bail!("the {mib} MiB holder wrote no /tmp/count within 300 s");
    }
    let count = d
        .sh_ok(&sb.id, "cat /tmp/count")?
        .trim()
        .parse()
        .unwrap_or(0);
    let ck = d.checkpoint(&sb.id, true, false)?;
    d.remove(&sb.id)?;
    Ok((ck.id, count))
}

/// The processes of the tree rooted at `pid` (from `/proc/PID/task/*/children`).
fn tree(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                out.extend(
                    kids.split_whitespace()
                        .filter_map(|k| k.parse::<i32>().ok()),
                );
            }
        }
        i += 1;
    }
    out
}

/// KiB a branch holds on its own: the private pages of its processes.
fn private_kib(d: &DaemonGuard, id: &str) -> Result<u64> {
    let pid = d
        .inspect(id)?
        .init_pid
        .context("a running branch has an init pid")?;
    let mut kib = 0;
    for p in tree(pid) {
        let path = format!("/proc/{p}/smaps_rollup");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for key in ["Private_Clean:", "Private_Dirty:"] {
            kib += text
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(kib)
}

/// Resident KiB of the daemon's restore templates (its children titled `criu template`).
fn templates_kib(d: &DaemonGuard) -> Result<u64> {
    let daemon = d.pid()? as i32;
    let mut kib = 0;
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|s| s.parse::<i32>().ok());
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let words: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if ppid == Some(daemon) && words.iter().any(|w| *w == b"template") {
            kib += common::rss_kib(pid).unwrap_or(0);
        }
    }
    Ok(kib)
}

/// Branches of `ck` picked by `pick` whose counter went past `at_ck`, of 20.
fn counting(d: &DaemonGuard, ids: &[String], pick: &mut Picker, at_ck: u64) -> usize {
    (0..20)
        .filter(|_| {
            let id = pick.one(ids);
            common::wait_until(Duration::from_secs(25), || {
                d.sh_ok(id, "cat /tmp/count")
                    .ok()
                    .and_then(|c| c.trim().parse::<u64>().ok())
                    .is_some_and(|c| c > at_ck)
            })
        })
        .count()
}

/// The peer: `n` branches read page by page, on a daemon without templates.
fn read_peer(bin: &Path, debian: &Path, mib: usize, n: usize) -> Result<(u64, f64)> {
    let d = DaemonGuard::start_with_env(bin, &[("FORKD_TEMPLATES", "off")])?;
    d.import(debian, "debian")?;
    let (ck, _) = state(&d, mib)?;
    std::thread::sleep(Duration::from_secs(2));
    let avail0 = common::mem_available_kib()?;
    let mut times = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        ids.extend(fork(&d, &ck, 1)?);
        times.push(us(t));
    }
    std::thread::sleep(Duration::from_secs(1));
    let per_kib = avail0.saturating_sub(common::mem_available_kib()?) as f64 / n.max(1) as f64;
    for id in &ids {
        d.remove(id)?;
    }
    d.remove_checkpoint(&ck)?;
    drop(d.stop());
    times.sort_unstable();
    Ok((times[times.len() / 2], per_kib))
}

pub(crate) fn large(bin: &Path, debian: &Path, samples: usize, report: &mut Report) -> Result<()> {
    let n = common::env_count("FORKD_DENSITY_LARGE", 1000)?;
    let mib = common::env_usize("FORKD_DENSITY_LARGE_MIB", 1024)?;
    let peer_n = common::env_count("FORKD_DENSITY_LARGE_PEER", 4)?;
    eprintln!("[3] {n} branches of one live state holding {mib} MiB");
    let host_kib = common::mem_total_kib()?;
    let peer = if peer_n > 0 {
        eprintln!("  peer: {peer_n} branches read page by page (FORKD_TEMPLATES=off)");
        Some(read_peer(bin, debian, mib, peer_n)?)
    } else {
        None
    };
    let d = DaemonGuard::start(bin)?;
    d.import(debian, "debian")?;
    let (ck, at_ck) = state(&d, mib)?;
    std::thread::sleep(Duration::from_secs(3));
    let avail0 = common::mem_available_kib()?;
    let t = Instant::now();
    let mut ids = fork(&d, &ck, 1)?;
    let first = us(t);
    // What a branch adds is counted from here: the template and the first branch made.
    std::thread::sleep(Duration::from_secs(3));
    let avail1 = common::mem_available_kib()?;
    let mut pick = Picker(0x9e3779b97f4a7c15);
    let mut rows = Vec::new();
    let (mut fork_at_100, mut last_p50) = (None, 0);
    let marks: Vec<usize> = [100, 250, 500, 1000, 2000, 5000]
        .into_iter()
        .filter(|m| *m < n)
        .chain([n])
        .collect();
    for &mark in &marks {
        let grow = Instant::now();
        let before = ids.len();
        while ids.len() < mark {
            common::check_interrupted()?;
            ids.extend(fork(&d, &ck, (mark - ids.len()).min(BATCH))?);
            eprint!("\r  {} alive", ids.len());
        }
        eprintln!();
        let batch = us(grow) / (ids.len() - before).max(1) as u64;
        // Let the batch's branches run their first ticks.
        std::thread::sleep(Duration::from_secs(10));
        let avail = common::mem_available_kib()?;
        let per_kib = avail1.saturating_sub(avail) as f64 / (ids.len() - 1).max(1) as f64;
        let total_kib = avail0.saturating_sub(avail);
        let mut private: Vec<u64> = (0..20)
            .map(|_| private_kib(&d, pick.one(&ids)))
            .collect::<Result<_>>()?;
        private.sort_unstable();
        let mut forks = Vec::new();
        for _ in 0..samples {
            space();
            let t = Instant::now();
            ids.extend(fork(&d, &ck, 1)?);
            forks.push(us(t));
        }
        let s = report.row(
            &format!("{mib} MiB state, {mark} alive: fork of one branch"),
            forks,
        );
        if mark == marks[0] {
            fork_at_100 = Some(s.p50);
        }
        last_p50 = s.p50;
        let answering = counting(&d, &ids, &mut pick, at_ck);
        let (tpl, rss) = (templates_kib(&d)?, d.rss_kib()?);
        eprintln!(
            "  {} alive: {} a branch in batches, fork of one p50 {}; {per_kib:.0} KiB of the host a branch, {} KiB private (p50); template {} MiB; {answering}/20 counting",
            ids.len(),
            common::fmt_us(batch),
            common::fmt_us(s.p50),
            private[10],
            tpl / 1024
        );
        rows.push(vec![
            ids.len().to_string(),
            common::fmt_us(batch),
            common::fmt_us(s.p50),
            common::fmt_us(s.p90),
            format!("{:.1} MiB", per_kib / 1024.0),
            format!("{:.2} GiB", total_kib as f64 / 1024.0 / 1024.0),
            format!("{:.1} MiB", private[10] as f64 / 1024.0),
            format!("{} MiB", tpl / 1024),
            format!("{} MiB", rss / 1024),
            format!("{:.1} GiB", avail as f64 / 1024.0 / 1024.0),
            format!("{answering}/20"),
        ]);
        if answering < 20 {
            bail!("{} of 20 sampled branches did not count on", 20 - answering);
        }
    }
    let removed = super::remove_all(&d, &ids)?;
    d.remove_checkpoint(&ck)?;
    drop(d.stop());
    report.tables.push(common::Table::new(
        &format!(
            "Branches of one live {mib} MiB python3 state, all alive (a branch's memory = MemAvailable drop since the first branch and its template / the others, 10 s after each batch)"
        ),
        &[
            "alive",
            "fork, per branch in batches of 100",
            "fork of one p50",
            "fork of one p90",
            "host memory a branch",
            "host memory in all (template included)",
            "private to a branch (p50 of 20)",
            "restore template RSS",
            "daemon RSS",
            "host MemAvailable",
            "sampled branches counting on",
        ],
        rows,
    ));
    let mut lines = vec![
        (
            "first fork (starts the restore template)".to_string(),
            common::fmt_us(first),
        ),
        (
            format!("fork of one at {} alive / at {}", ids.len(), marks[0]),
            match fork_at_100 {
                Some(a) if a > 0 => format!("{:.2}x", last_p50 as f64 / a as f64),
                _ => "-".into(),
            },
        ),
        (
            format!("remove all {} branches, one request each", ids.len()),
            format!(
                "{} ({} a branch)",
                common::fmt_us(removed),
                common::fmt_us(removed / ids.len().max(1) as u64)
            ),
        ),
    ];
    if let Some((p50, per_kib)) = peer {
        lines.push((
            format!(
                "peer: fork of one branch read page by page (FORKD_TEMPLATES=off), p50 of {peer_n}"
            ),
            format!(
                "{} ({:.2}x of the template's at {} alive)",
                common::fmt_us(p50),
                last_p50 as f64 / p50.max(1) as f64,
                ids.len()
            ),
        ));
        lines.push((
            "peer: host memory a branch read page by page".to_string(),
            format!(
                "{:.0} MiB: this host's {:.1} GiB would hold {} such branches",
                per_kib / 1024.0,
                host_kib as f64 / 1024.0 / 1024.0,
                (host_kib as f64 / per_kib.max(1.0)) as u64
            ),
        ));
    }
    report
        .sections
        .push((format!("Branches of a {mib} MiB state"), lines));
    Ok(())
}
