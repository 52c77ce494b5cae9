//! Part 2 of the density bench: branches of one live checkpoint of the QEMU guest that
//! share memory through KSM, what they hold, and the guest checks of tests/guest.rs.

use crate::common::{self, DaemonGuard, Report};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

fn ksm(name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time of ksmd, in clock ticks.
fn ksmd_ticks() -> u64 {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return 0;
    };
    rd.flatten()
        .find(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "ksmd"))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .and_then(|pid| common::cpu_ticks(pid).ok())
        .unwrap_or(0)
}

fn guest_counter(pid: i32) -> Option<u64> {
    common::read_guest_counter(Path::new(&format!("/proc/{pid}/root/guest/serial.log")))
}

fn guest_serial(pid: i32) -> Option<common::GuestSerial> {
    common::read_guest_serial(Path::new(&format!("/proc/{pid}/root/guest/serial.log")))
}

/// Kills QEMU in the first branch: its log must stop while every other branch's goes on
/// (branches are separate machines, whatever pages they share). "yes", or what failed.
fn diverging(d: &DaemonGuard, ids: &[String]) -> Result<String> {
    let pids: Vec<i32> = ids
        .iter()
        .map(|id| Ok(d.inspect(id)?.init_pid.unwrap_or(0)))
        .collect::<Result<_>>()?;
    d.sh_ok(&ids[0], "pkill -KILL -x qemu-system-x86; while pgrep -x qemu-system-x86 >/dev/null; do sleep 0.1; done")?;
    let frozen = guest_counter(pids[0]).unwrap_or(0);
    let was: Vec<u64> = pids[1..]
        .iter()
        .map(|&p| guest_counter(p).unwrap_or(0))
        .collect();
    // The others' progress is the clock: once each has written a line more, the killed
    // branch would have too, had its QEMU run on.
    let mut stalled = 0;
    for (&p, &w) in pids[1..].iter().zip(&was) {
        if !common::wait_until(Duration::from_secs(60), || {
            guest_counter(p).is_some_and(|c| c > w)
        }) {
            stalled += 1;
        }
    }
    let now = guest_counter(pids[0]).unwrap_or(0);
    Ok(match (now == frozen, stalled) {
        (true, 0) => "yes".into(),
        (false, _) => format!("no: the killed branch went on ({frozen} -> {now})"),
        (true, n) => format!("no: {n} others stopped"),
    })
}

/// Part 2.
pub(crate) fn qemu(d: &DaemonGuard, counts: &[usize], report: &mut Report) -> Result<()> {
    let guest_mib = common::env_usize("FORKD_DENSITY_QEMU_MIB", 1024)?.to_string();
    eprintln!("[2] branches of a {guest_mib} MiB QEMU guest, {counts:?}");
    let cache = common::cache_dir().join("qemu");
    let (kernel, initrd) = (cache.join("vmlinuz"), cache.join("initrd.gz"));
    if !kernel.is_file() || !initrd.is_file() {
        return common::skip(
            "density: QEMU part",
            "guest fixture missing (fixtures/setup.sh qemu)",
        );
    }
    let sb = d.create("debian")?;
    d.put_files(&sb.id, "/guest", &[&kernel, &initrd])?;
    let mut argv = common::qemu_argv();
    let m = argv
        .iter()
        .position(|a| *a == "-m")
        .context("the guest's argv sets no -m")?
        + 1;
    argv[m] = &guest_mib;
    d.exec_detached(&sb.id, &argv, "qemu")?;
    let pid = sb.init_pid.unwrap_or(0);
    if !common::wait_until(Duration::from_secs(120), || {
        guest_counter(pid).is_some_and(|c| c >= 5)
    }) {
        bail!("the guest printed no counter within 120 s");
    }
    // The counter at the checkpoint is at least the one read just before it; the secret
    // is the one the guest drew at boot, which every branch must keep.
    let at_ck = guest_counter(pid).unwrap_or(0);
    let secret = guest_serial(pid)
        .and_then(|s| s.counters.first().map(|c| c.1.clone()))
        .context("the guest's serial log has no secret")?;
    let ck = d.checkpoint(&sb.id, true, true)?;
    let state_kib = ck.images_bytes / 1024;
    let mut rows = Vec::new();
    for &n in counts {
        // Let memory freed by the previous round come back first.
        std::thread::sleep(Duration::from_secs(3));
        let avail0 = common::mem_available_kib()?;
        let ticks0 = ksmd_ticks();
        let t = Instant::now();
        let ids: Vec<String> = d
            .fork_with(
                &ck.id,
                &forkd::api::ForkRequest {
                    count: Some(n),
                    share_memory: Some(true),
                    ..Default::default()
                },
            )?
            .branches
            .into_iter()
            .map(|b| b.id)
            .collect();
        let forked = t.elapsed();
        let unshared_kib = avail0.saturating_sub(common::mem_available_kib()?);
        // Settled: ksmd has been over every mergeable page twice since the fork (a page
        // that matches no merged one is merged only once its checksum held over two
        // passes, so a lull in the first pass is not the end), and pages_sharing has not
        // grown for 5 s (at most 180 s).
        let t = Instant::now();
        let passes0 = ksm("full_scans");
        let (mut last, mut since) = (ksm("pages_sharing"), Instant::now());
        while t.elapsed() < Duration::from_secs(180)
            && (since.elapsed() < Duration::from_secs(5) || ksm("full_scans") < passes0 + 2)
        {
            std::thread::sleep(Duration::from_millis(500));
            let now = ksm("pages_sharing");
            if now > last + 64 {
                last = now;
                since = Instant::now();
            }
        }
        // The settle time is until the last growth.
        let settle = since.duration_since(t);
        let cpu_s = ksmd_ticks().saturating_sub(ticks0) as f64 / 100.0;
        let total_kib = avail0.saturating_sub(common::mem_available_kib()?);
        let mut charged = 0u64;
        let (mut going, mut kept) = (0, 0);
        for id in &ids {
            let info = d.inspect(id)?;
            if info.memory_counted != Some(forkd::api::MemoryCounted::Cgroup) {
                bail!("branch {id} has no memory cgroup of its own to report the charge of");
            }
            charged += info.memory_bytes.unwrap_or(0);
            let p = info.init_pid.unwrap_or(0);
            if common::wait_until(Duration::from_secs(30), || {
                guest_counter(p).is_some_and(|c| c > at_ck)
            }) {
                going += 1;
            }
            match guest_serial(p).map(|s| s.not_one_run_of(&secret)) {
                Some(None) => kept += 1,
                Some(Some(why)) => eprintln!("  branch {id}: {why}"),
                None => eprintln!("  branch {id}: no serial log"),
            }
        }
        let diverge = if ids.len() > 1 {
            diverging(d, &ids)?
        } else {
            "-".to_string()
        };
        eprintln!("  {n} branches: {} MiB after KSM ({} before), settled in {:.1} s, ksmd {cpu_s:.1} s CPU; {going}/{n} guests counting, {kept}/{n} one run with the boot secret, diverge: {diverge}", total_kib / 1024, unshared_kib / 1024, settle.as_secs_f64());
        rows.push(vec![
            n.to_string(),
            common::fmt_us(forked.as_micros() as u64),
            format!("{} MiB", unshared_kib / 1024),
            format!("{} MiB", total_kib / 1024),
            format!("{} MiB", total_kib / 1024 / n as u64),
            format!("{} MiB", charged >> 20),
            format!("{:.1} s", settle.as_secs_f64()),
            format!("{cpu_s:.1} s"),
            format!("{} ({} sharing)", ksm("pages_shared"), ksm("pages_sharing")),
            format!("{going}/{n}"),
            format!("{kept}/{n}"),
            diverge,
        ]);
        for id in &ids {
            d.remove(id)?;
        }
    }
    report.tables.push(common::Table::new(
        &format!("QEMU {guest_mib} MiB TCG guest ({} MiB of it in the checkpoint): branches of one checkpoint, from its restore template, with KSM (memory = MemAvailable drop)", state_kib / 1024),
        &[
            "branches",
            "fork",
            "host memory right after the fork",
            "host memory, settled",
            "a branch, settled",
            "branches' cgroup charge",
            "settle time",
            "ksmd CPU",
            "KSM pages shared",
            "guests counting on",
            "one run, the boot secret kept",
            "branches diverge",
        ],
        rows,
    ));
    let _ = d.remove(&sb.id);
    let _ = d.remove_checkpoint(&ck.id);
    Ok(())
}
