//! Readings of the host: memory from `/proc`, mounts, and the cgroups and processes of
//! sandboxes.

use anyhow::{anyhow, Context, Result};
use std::path::Path;

/// A `kB` field of a `/proc` key-value file (`/proc/meminfo`, `/proc/PID/status`).
pub(super) fn proc_kib(path: &str, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse().ok()
        })
        .ok_or_else(|| anyhow!("{path} has no {key} field"))
}

pub fn mem_available_kib() -> Result<u64> {
    proc_kib("/proc/meminfo", "MemAvailable")
}

pub fn mem_total_kib() -> Result<u64> {
    proc_kib("/proc/meminfo", "MemTotal")
}

pub fn rss_kib(pid: u32) -> Result<u64> {
    proc_kib(&format!("/proc/{pid}/status"), "VmRSS")
}

/// Proportional set size of a process (shared pages split among their users), KiB.
pub fn pss_kib(pid: u32) -> Result<u64> {
    proc_kib(&format!("/proc/{pid}/smaps_rollup"), "Pss")
}

/// CPU time a process has used (user and system), in USER_HZ ticks of 1/100 s, from
/// `/proc/PID/stat` (fields 14 and 15, counted after the command's closing parenthesis).
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("{path}: no command field"))?;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    if f.len() != 2 {
        return Err(anyhow!("{path}: no utime and stime"));
    }
    Ok(f.iter().sum())
}

/// The host's CPU over `span`, slept through here: the share of all CPUs that was busy
/// and the share of one CPU the machine's own PID 1 used (in %). Both come from
/// `/proc` (`/proc/stat`, `/proc/1/stat`, in USER_HZ ticks of 1/100 s).
pub fn host_cpu_over(span: std::time::Duration) -> Result<(f64, f64)> {
    fn totals() -> Result<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
        let cpu: Vec<u64> = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("cpu "))
            .ok_or_else(|| anyhow!("/proc/stat has no cpu line"))?
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        if cpu.len() < 5 {
            return Err(anyhow!("/proc/stat: a short cpu line"));
        }
        // user nice system idle iowait irq softirq steal ...: idle and iowait are idle.
        let all: u64 = cpu.iter().take(8).sum();
        Ok((all, all - cpu[3] - cpu[4]))
    }
    let ((all0, busy0), init0, t) = (totals()?, cpu_ticks(1)?, std::time::Instant::now());
    std::thread::sleep(span);
    let ((all1, busy1), init1) = (totals()?, cpu_ticks(1)?);
    let busy = 100.0 * (busy1 - busy0) as f64 / (all1 - all0).max(1) as f64;
    let init = (init1 - init0) as f64 / t.elapsed().as_secs_f64();
    Ok((busy, init))
}

/// Mount points at or below `dir`, from this process's mount table.
#[allow(unused_imports)]
pub use forkd::private_daemon::mounts_below as mounts_under;

/// Cgroup directories still present for the given sandbox ids (forkd puts each
/// sandbox in `forkd/<id>` of every hierarchy, v1 controllers or v2).
pub fn cgroups_left(ids: &[String]) -> Vec<String> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots = vec![base.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir(base) {
        roots.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let mut left = Vec::new();
    for root in roots {
        for id in ids {
            let p = root.join("forkd").join(id);
            if p.exists() {
                left.push(p.display().to_string());
            }
        }
    }
    left
}

/// Host pids of the processes in cgroup `rel` (such as `forkd/<id>`): from the v2
/// directory, or from whichever v1 hierarchy lists the most (they should all agree).
pub fn cgroup_pids(rel: &str) -> Vec<u32> {
    let base = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![base.join(rel)];
    if let Ok(rd) = std::fs::read_dir(base) {
        dirs.extend(rd.flatten().map(|e| e.path().join(rel)));
    }
    dirs.iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .max_by_key(Vec::len)
        .unwrap_or_default()
}

/// The command names (`/proc/PID/comm`) of some processes; vanished ones are left out.
pub fn comms(pids: &[u32]) -> Vec<String> {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}
