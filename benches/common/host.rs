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

pub fn rss_kib(pid: u32) -> Result<u64> {
    proc_kib(&format!("/proc/{pid}/status"), "VmRSS")
}

/// Proportional set size of a process (shared pages split among their users), KiB.
pub fn pss_kib(pid: u32) -> Result<u64> {
    proc_kib(&format!("/proc/{pid}/smaps_rollup"), "Pss")
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
