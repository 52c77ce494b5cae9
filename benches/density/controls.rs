//! Part 1's controls: what the machine itself charges for what thousands of branches
//! bring to it, measured apart from forkd.
//!
//! At the smallest N, with those branches alive, one more fork and create are sampled
//! three ways in a row: as they are; beside idle processes outside forkd, as many as
//! the largest N's branches have (two each: the init and the shell); and beside that
//! many network namespaces, each held by one idle process (`unshare --net sleep`), as
//! every branch has one of its own. Whatever the host does per process or per network
//! namespace then shows at the smallest N, where forkd's own tables are small. The
//! difference between a row here and the largest N's row is what forkd's own growth
//! can be, at most.

use super::{fork, space, us, LOOP};
use crate::common::{self, DaemonGuard, Report, Table};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Processes,
    NetNamespaces,
}

/// Idle processes outside forkd (each in a network namespace of its own, for
/// `Kind::NetNamespaces`); killed and reaped when dropped.
struct Idlers(Vec<Child>);

impl Idlers {
    fn spawn(kind: Kind, n: usize) -> Result<Idlers> {
        let mut idlers = Idlers(Vec::with_capacity(n));
        for i in 0..n {
            common::check_interrupted()?;
            let mut c = match kind {
                Kind::Processes => Command::new("sleep"),
                Kind::NetNamespaces => {
                    let mut c = Command::new("unshare");
                    c.args(["--net", "sleep"]);
                    c
                }
            };
            c.arg("infinity")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = c
                .spawn()
                .with_context(|| format!("start idle process {} of {n}", i + 1))?;
            idlers.0.push(child);
            if i % 500 == 499 {
                eprint!("\r    {} idle processes", i + 1);
            }
        }
        eprintln!("\r    {n} idle processes");
        if kind == Kind::NetNamespaces {
            // Each is in a network namespace of its own once `unshare` has execed sleep.
            let ours = std::fs::read_link("/proc/self/ns/net").context("read our netns")?;
            let in_own = || {
                idlers
                    .0
                    .iter()
                    .filter(|c| {
                        std::fs::read_link(format!("/proc/{}/ns/net", c.id()))
                            .is_ok_and(|l| l != ours)
                    })
                    .count()
            };
            if !common::wait_until(Duration::from_secs(60), || in_own() == n) {
                bail!(
                    "{} of {n} idle processes are in a network namespace of their own after 60 s",
                    in_own()
                );
            }
        }
        Ok(idlers)
    }
}

impl Drop for Idlers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// The three conditions at `alive.len()` branches, `extra` being the largest N's
/// branches less the smallest N's. Forks add to `alive`.
pub(super) fn controls(
    d: &DaemonGuard,
    ck: &str,
    samples: usize,
    settle: Duration,
    extra: usize,
    alive: &mut Vec<String>,
    report: &mut Report,
) -> Result<Table> {
    let n = alive.len();
    eprintln!(
        "[1c] controls at {n} alive: {} idle processes, then {extra} network namespaces",
        2 * extra
    );
    let mut rows = Vec::new();
    for (label, kind, count) in [
        (format!("{n} branches"), None, 0),
        (
            format!("{n} branches + {} idle processes", 2 * extra),
            Some(Kind::Processes),
            2 * extra,
        ),
        (
            format!("{n} branches + {extra} network namespaces, an idle process in each"),
            Some(Kind::NetNamespaces),
            extra,
        ),
    ] {
        let idlers = kind.map(|k| Idlers::spawn(k, count)).transpose()?;
        let (busy, init_cpu) = common::host_cpu_over(settle)?;
        let mut forks = Vec::new();
        for _ in 0..samples {
            space();
            let t = Instant::now();
            alive.extend(fork(d, ck, 1)?);
            forks.push(us(t));
        }
        let mut creates = Vec::new();
        for _ in 0..samples {
            space();
            let t = Instant::now();
            let sb = d.create_with(&json!({ "image": "busybox", "command": { "shell": LOOP } }))?;
            creates.push(us(t));
            d.remove(&sb.id)?;
        }
        let f = report.row(&format!("control, {label}: fork of one branch"), forks);
        let c = report.row(&format!("control, {label}: create"), creates);
        drop(idlers);
        eprintln!(
            "  {label}: fork p50 {} create p50 {}; host {busy:.0}% busy, its PID 1 {init_cpu:.0}% of a CPU",
            common::fmt_us(f.p50),
            common::fmt_us(c.p50)
        );
        rows.push(vec![
            label,
            common::fmt_us(f.p50),
            common::fmt_us(c.p50),
            format!("{busy:.0}% ({init_cpu:.0}%)"),
        ]);
    }
    Ok(Table::new(
        &format!(
            "Controls: one more fork and create at {n} alive, beside what {} branches would add to the host (p50)",
            n + extra
        ),
        &[
            "condition",
            "fork of one",
            "create",
            "host CPU busy while settling (its PID 1, % of a CPU)",
        ],
        rows,
    ))
}
