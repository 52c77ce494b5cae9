//! Part 3: a 256 MiB QEMU guest (TCG) in a Debian sandbox: dump time, eager and lazy
//! time to running of its forks, and memory per branch 10 s after its fork.

use crate::common::{self, fmt_kib, fmt_ms, fmt_us, sample, Check, DaemonGuard, Table};
use crate::config::{DEBIAN, GUEST_SERIAL, LAZY_RUNNING_GOAL_MS};
use crate::forks::{fork_cells, fork_timed, ForkSeries, FORK_COLUMNS};
use crate::fs::{live_checkpoint_sample, wait_tree_hash, DirtyBound};
use crate::{Ctx, Out};
use anyhow::{anyhow, bail, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a branch of the guest uses: its cgroup's charge, and the PSS and RSS summed
/// over its processes.
struct GuestMemory {
    cgroup_bytes: Option<u64>,
    pss_kib: u64,
    rss_kib: u64,
}

fn branch_memory(d: &DaemonGuard, id: &str) -> Result<GuestMemory> {
    let info = d.inspect(id)?;
    let (mut pss, mut rss) = (0, 0);
    for pid in common::cgroup_pids(&info.cgroup) {
        pss += common::pss_kib(pid).unwrap_or(0);
        rss += common::rss_kib(pid).unwrap_or(0);
    }
    Ok(GuestMemory {
        cgroup_bytes: info.memory_bytes,
        pss_kib: pss,
        rss_kib: rss,
    })
}

pub fn qemu_guest(ctx: &Ctx, out: &mut Out) -> Result<()> {
    let d = ctx.d;
    eprintln!("[3/4] QEMU guest (256 MiB, TCG) in a Debian sandbox");
    let cache = common::cache_dir();
    let kernel = cache.join("qemu/vmlinuz");
    let initrd = cache.join("qemu/initrd.gz");
    if let Some(f) = [&kernel, &initrd].iter().find(|f| !f.is_file()) {
        let why = format!(
            "fixture {} is missing (run fixtures/setup.sh qemu)",
            f.display()
        );
        out.report
            .notes
            .push(format!("part 3 (QEMU guest) skipped: {why}"));
        return common::skip("QEMU guest (part 3)", &why);
    }
    let sb = d.create(DEBIAN)?;
    out.created.push(sb.id.clone());
    if d.sh_ok(&sb.id, "command -v qemu-system-x86_64").is_err() {
        d.remove(&sb.id)?;
        let why =
            "the Debian image has no qemu-system-x86_64 (rebuild it: fixtures/setup.sh debian)";
        out.report
            .notes
            .push(format!("part 3 (QEMU guest) skipped: {why}"));
        return common::skip("QEMU guest (part 3)", why);
    }
    d.put_files(&sb.id, "/guest", &[&kernel, &initrd])?;
    let booted = Instant::now();
    d.exec_detached(&sb.id, &common::qemu_argv(), "qemu")?;
    let serial = Path::new(&sb.rootfs).join(GUEST_SERIAL);
    loop {
        if common::read_guest_counter(&serial).is_some_and(|c| c >= 5) {
            break;
        }
        if booted.elapsed() > Duration::from_secs(90) {
            let log = d
                .client()
                .raw(
                    "GET",
                    &format!("/v1/sandboxes/{}/logs?name=qemu", sb.id),
                    b"",
                )
                .map(|r| String::from_utf8_lossy(&r.body).to_string())
                .unwrap_or_default();
            bail!(
                "the guest printed no counter within 90 s; serial:\n{}\nqemu log:\n{log}",
                std::fs::read_to_string(&serial).unwrap_or_default()
            );
        }
        common::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "  guest counting after {}",
        fmt_us(booted.elapsed().as_micros() as u64)
    );
    let q = ctx.cfg.samples.min(5);

    // Dumps: a fresh checkpoint per sample, the guest running on.
    let row = "QEMU 256 MiB guest: live checkpoint, API";
    let mut phases = Vec::new();
    let dumps = sample(row, 0, q, || live_checkpoint_sample(d, &sb.id, &mut phases))?;
    out.report.row(row, dumps);
    let dump: Vec<u64> = phases
        .iter()
        .filter_map(|p: &BTreeMap<String, u64>| p.get("dump").copied())
        .collect();
    out.report
        .row("QEMU 256 MiB guest: live checkpoint, daemon dump", dump);
    // The same with the volume's dirty bound lifted for the sample: CRIU writes the
    // guest's memory into the volume, so the bound paces it (see part 1b).
    if let Some(bound) = DirtyBound::of(ctx) {
        let row = "QEMU 256 MiB guest: live checkpoint with the dirty bound off, API";
        let unbounded = sample(row, 0, q, || {
            let (us, c) = bound.lifted(|| {
                let t = Instant::now();
                let c = d.checkpoint(&sb.id, true, false)?;
                Ok((t.elapsed().as_micros() as u64, c))
            })?;
            wait_tree_hash(d, &c.id, Instant::now())?;
            d.remove_checkpoint(&c.id)?;
            Ok(us)
        })?;
        out.report.row(row, unbounded);
    }
    // The checkpoint to fork; the source stops with it, so that the branches measured
    // next do not share the 2 CPUs with a running source guest.
    let ck = d.checkpoint(&sb.id, true, true)?;
    wait_tree_hash(d, &ck.id, Instant::now())?;
    let ck_serial = ctx
        .data
        .join("checkpoints")
        .join(&ck.id)
        .join("fs/upper")
        .join(GUEST_SERIAL);
    let at_checkpoint = common::read_guest_counter(&ck_serial)
        .ok_or_else(|| anyhow!("no counter in the checkpoint's {}", ck_serial.display()))?;
    eprintln!(
        "  checkpoint {}: CRIU images {}, counter {at_checkpoint} in its serial log",
        ck.id,
        fmt_kib(ck.images_bytes as f64 / 1024.0)
    );

    let mut mem_items = Vec::new();
    let mut mem_json = Vec::new();
    let mut table = Table {
        title: "Part 3: QEMU 256 MiB guest, one branch per fork request (ms)".into(),
        header: ["mode", "requests", "time to running p50"]
            .into_iter()
            .chain(FORK_COLUMNS[..FORK_COLUMNS.len() - 1].iter().copied())
            .map(String::from)
            .collect(),
        rows: Vec::new(),
    };
    for (mode, lazy) in [("eager", false), ("lazy", true)] {
        let row = format!("QEMU guest fork, {mode}: time to running (request to next serial line)");
        let mut series = ForkSeries::default();
        let mut mems = Vec::new();
        let ttr = sample(&row, 0, q, || {
            let t0 = Instant::now();
            let (b, wall) = fork_timed(ctx, out, &ck.id, 1, lazy)?;
            series.add(&b, wall, 0);
            let b = &b[0];
            // A branch's root is attached in its own mount namespace only.
            let path =
                PathBuf::from(format!("/proc/{}/root", b.init_pid.unwrap_or(0))).join(GUEST_SERIAL);
            let running = loop {
                if common::read_guest_counter(&path).is_some_and(|c| c > at_checkpoint) {
                    break t0.elapsed();
                }
                if t0.elapsed() > Duration::from_secs(60) {
                    bail!(
                        "{mode} branch {}: the guest's counter did not pass {at_checkpoint} within 60 s",
                        b.id
                    );
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            let at = t0 + Duration::from_secs(10);
            while Instant::now() < at {
                common::check_interrupted()?;
                std::thread::sleep(Duration::from_millis(50));
            }
            mems.push(branch_memory(d, &b.id)?);
            d.remove(&b.id)?;
            Ok(running.as_micros() as u64)
        })?;
        let running = out.report.row(&row, ttr);
        out.report.row(
            &format!("QEMU guest fork, {mode}: branch total (daemon)"),
            series.totals.clone(),
        );
        out.report.row(
            &format!("QEMU guest fork, {mode}: branch restore phase"),
            series.phase("restore"),
        );
        let mut cells = vec![
            mode.to_string(),
            series.requests.to_string(),
            fmt_ms(running.p50 as f64),
        ];
        cells.extend(fork_cells(&series));
        cells.pop();
        table.rows.push(cells);
        let mean = |f: &dyn Fn(&GuestMemory) -> Option<f64>| {
            let v: Vec<f64> = mems.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let cg = mean(&|m| m.cgroup_bytes.map(|b| b as f64 / 1024.0));
        let pss = mean(&|m| Some(m.pss_kib as f64));
        let rss = mean(&|m| Some(m.rss_kib as f64));
        let shown = |v: Option<f64>| v.map(fmt_kib).unwrap_or_else(|| "n/a".into());
        mem_items.push((
            format!("{mode} branch, 10 s after its fork: cgroup memory charged (mean)"),
            shown(cg),
        ));
        mem_items.push((
            format!("{mode} branch, 10 s after its fork: PSS of its processes (mean)"),
            shown(pss),
        ));
        mem_items.push((
            format!("{mode} branch, 10 s after its fork: RSS of its processes (mean)"),
            shown(rss),
        ));
        mem_json.push(json!({
            "mode": mode,
            "branch_phases_us": series.phases,
            "cgroup_kib": mems.iter().map(|m| m.cgroup_bytes.map(|b| b / 1024)).collect::<Vec<_>>(),
            "pss_kib": mems.iter().map(|m| m.pss_kib).collect::<Vec<_>>(),
            "rss_kib": mems.iter().map(|m| m.rss_kib).collect::<Vec<_>>(),
        }));
    }
    out.report.tables.push(table);
    mem_items.insert(
        0,
        (
            "CRIU images of the checkpoint".into(),
            fmt_kib(ck.images_bytes as f64 / 1024.0),
        ),
    );
    out.report.sections.push((
        "Part 3: QEMU 256 MiB guest memory per branch".into(),
        mem_items,
    ));
    out.report.extra.insert(
        "qemu".into(),
        json!({ "images_bytes": ck.images_bytes, "counter_at_checkpoint": at_checkpoint, "memory": mem_json }),
    );
    d.remove_checkpoint(&ck.id)?;
    d.remove(&sb.id)?;

    let lazy = out
        .report
        .p50("QEMU guest fork, lazy: time to running (request to next serial line)")
        .map(|us| us as f64 / 1000.0);
    out.report.checks.push(Check {
        name: "QEMU guest lazy fork: time to running p50".into(),
        value: lazy,
        shown: lazy
            .map(|v| format!("{v:.0} ms"))
            .unwrap_or_else(|| "n/a".into()),
        goal: format!("< {LAZY_RUNNING_GOAL_MS} ms"),
        met: lazy.map(|v| v < LAZY_RUNNING_GOAL_MS),
    });
    out.report.notes.push(
        "part 3: the guest prints a counter line about every 100 ms, so time to running \
         includes up to one interval of waiting for the next line; the serial log is read \
         on the host through the branch's root every 2 ms; memory is read 10 s after the \
         fork request (a lazy branch's lazy-pages daemon runs in forkd's cgroup, not the \
         branch's)"
            .into(),
    );
    Ok(())
}
