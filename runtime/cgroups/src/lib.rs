//! Per-sandbox cgroups on either hierarchy.
//!
//! Mechanism: a sandbox gets one cgroup named `forkd/<sandbox id>`. On cgroup v1 (one
//! mount per controller under `/sys/fs/cgroup/<controller>`) that is one directory per
//! controller forkd uses (memory, pids, cpu, freezer); on cgroup v2 it is a single
//! directory in the unified tree, with the controllers enabled in the parents'
//! `cgroup.subtree_control`. Callers see one [`Cgroup`] either way.
//!
//! Limits: memory (hard limit, no swap on v2), number of tasks, and CPU as a quota in
//! thousandths of a CPU. A memory hog is killed by the kernel's OOM killer inside its own
//! cgroup; a fork bomb stops at `pids.max`.
//!
//! On v1 a cgroup without a memory limit may share its memory controller's directory
//! with other sandboxes ([`Cgroup::sharing_memory`]): every memory cgroup costs the
//! kernel a record per superblock on the host, so one each makes a sandbox's memory grow
//! with the number of sandboxes (see [`Pool`]). Such a cgroup reports no memory use and
//! no OOM kills of its own, and is never given a memory limit.

#![forbid(unsafe_code)]

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod hierarchy;
pub mod pool;
pub use hierarchy::{bound_memory, favor_dynamic_changes, Hierarchy};
pub use pool::Pool;

const V1_CONTROLLERS: &[&str] = &["memory", "pids", "cpu", "freezer"];
const V2_CONTROLLERS: &[&str] = &["memory", "pids", "cpu"];

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup {path}: {step}")]
    Io {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "no usable cgroup hierarchy under {0} (need cgroup v2 or v1 memory and pids controllers)"
    )]
    NoHierarchy(PathBuf),
    #[error("cgroup {0} still has processes after killing them")]
    Busy(PathBuf),
}

fn io_err<'a>(path: &'a Path, step: &'static str) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        step,
        source,
    }
}

/// What one sandbox's cgroups hold it to. `None` means unlimited. Checked against the
/// kernel's ranges by the caller (the API's `Limits::validate`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Hard memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks (processes and threads).
    pub pids: Option<u64>,
    /// CPU quota in thousandths of one CPU (1000 = one full core).
    pub cpu_millis: Option<u64>,
}

/// One sandbox's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroup {
    hierarchy: Hierarchy,
    name: String,
    /// The memory cgroup it shares with other sandboxes instead of its own (v1 only).
    #[serde(default)]
    shared_memory: Option<String>,
}

fn write(path: &Path, value: &str, step: &'static str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(io_err(path, step))
}

impl Cgroup {
    /// A handle on the cgroup `name` (relative, such as `forkd/<id>`); nothing is created.
    pub fn new(hierarchy: &Hierarchy, name: &str) -> Self {
        Cgroup {
            hierarchy: hierarchy.clone(),
            name: name.to_string(),
            shared_memory: None,
        }
    }

    /// The same cgroup, with its memory controller's directory replaced by the memory
    /// cgroup `shared` (a name such as `forkd/shared-<tag>`) that other sandboxes use
    /// too. Only cgroup v1 has controllers in separate directories: on v2 `shared` is
    /// ignored and the cgroup has memory of its own.
    pub fn sharing_memory(mut self, shared: Option<&str>) -> Self {
        self.shared_memory = match self.hierarchy {
            Hierarchy::V1 { .. } => shared.map(str::to_string),
            Hierarchy::V2 { .. } => None,
        };
        self
    }

    /// The same kind of cgroup (sharing the same memory cgroup, if any) named `name`.
    pub fn renamed(&self, name: &str) -> Cgroup {
        Cgroup {
            name: name.to_string(),
            ..self.clone()
        }
    }

    /// The memory cgroup this cgroup shares, if it has none of its own.
    pub fn shared_memory(&self) -> Option<&str> {
        self.shared_memory.as_deref()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// This cgroup's directories, with whether each is its own (not a shared one).
    fn dirs(&self) -> Vec<(Option<String>, PathBuf, bool)> {
        self.hierarchy
            .dirs(&self.name)
            .into_iter()
            .map(
                |(c, dir)| match (&self.shared_memory, c.as_deref(), &self.hierarchy) {
                    (Some(shared), Some("memory"), Hierarchy::V1 { root, .. }) => {
                        (c, root.join("memory").join(shared), false)
                    }
                    _ => (c, dir, true),
                },
            )
            .collect()
    }

    /// The directory of its memory controller, when it is its own.
    fn own_memory_dir(&self) -> Option<PathBuf> {
        match &self.hierarchy {
            _ if self.shared_memory.is_some() => None,
            Hierarchy::V1 { root, .. } => Some(root.join("memory").join(&self.name)),
            Hierarchy::V2 { root, .. } => Some(root.join(&self.name)),
        }
    }

    pub fn hierarchy(&self) -> &Hierarchy {
        &self.hierarchy
    }

    /// Creates the cgroup (idempotently) and applies `limits`.
    pub fn create(&self, limits: &Limits) -> Result<(), CgroupError> {
        if let Hierarchy::V2 { root, controllers } = &self.hierarchy {
            // Enable our controllers on every ancestor, top-down.
            let wanted: Vec<&str> = V2_CONTROLLERS
                .iter()
                .copied()
                .filter(|c| controllers.iter().any(|h| h == c))
                .collect();
            let mut dir = root.clone();
            for part in Path::new(&self.name)
                .parent()
                .into_iter()
                .flat_map(|p| p.components())
            {
                let control = dir.join("cgroup.subtree_control");
                let line: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
                write(&control, &line.join(" "), "enable controllers")?;
                dir = dir.join(part);
                fs::create_dir_all(&dir).map_err(io_err(&dir, "create"))?;
            }
            let control = dir.join("cgroup.subtree_control");
            let line: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
            write(&control, &line.join(" "), "enable controllers")?;
        }
        // A shared memory cgroup is made by the first sandbox that needs it.
        for (_, dir, _) in self.dirs() {
            fs::create_dir_all(&dir).map_err(io_err(&dir, "create"))?;
        }
        self.set_limits(limits)
    }

    /// Applies `limits` to an existing cgroup; an absent limit is not written.
    pub fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        self.write_limits(limits, false)
    }

    /// Sets every limit to what `limits` says, an absent one to unlimited, and clears
    /// the counters the kernel lets a writer clear (v1's memory high-water mark and
    /// failure count): what a cgroup taken over from an earlier sandbox needs
    /// ([`Pool`]).
    pub fn reset(&self, limits: &Limits) -> Result<(), CgroupError> {
        self.write_limits(limits, true)
    }

    /// Writes `limits`; an absent one is written as unlimited when `reset`, along with
    /// the clearing of v1's memory counters, and left as it is otherwise.
    fn write_limits(&self, limits: &Limits, reset: bool) -> Result<(), CgroupError> {
        // The value to write for a limit, if any: the limit, or unlimited on a reset.
        let value = |limit: Option<String>, unlimited: &str| match limit {
            Some(v) => Some(v),
            None if reset => Some(unlimited.to_string()),
            None => None,
        };
        let memory = limits.memory_bytes.map(|b| b.to_string());
        let pids = limits.pids.map(|n| n.to_string());
        let quota = limits.cpu_millis.map(|m| (m * 100).to_string());
        match &self.hierarchy {
            Hierarchy::V1 { root, controllers } => {
                let dir = |c: &str| root.join(c).join(&self.name);
                match self.own_memory_dir() {
                    Some(mem) => {
                        if let Some(v) = value(memory, "-1") {
                            write(&mem.join("memory.limit_in_bytes"), &v, "set memory limit")?;
                        }
                        if reset {
                            write(
                                &mem.join("memory.max_usage_in_bytes"),
                                "0",
                                "clear memory peak",
                            )?;
                            write(&mem.join("memory.failcnt"), "0", "clear memory failures")?;
                        }
                    }
                    // Other sandboxes' limit is not this one's to set.
                    None if memory.is_some() => {
                        return Err(CgroupError::Io {
                            path: dir("memory"),
                            step: "set memory limit",
                            source: io::Error::new(
                                io::ErrorKind::InvalidInput,
                                format!(
                                    "its memory cgroup {} is shared with other sandboxes",
                                    self.shared_memory.as_deref().unwrap_or_default()
                                ),
                            ),
                        })
                    }
                    None => {}
                }
                if let Some(v) = value(pids, "max") {
                    write(&dir("pids").join("pids.max"), &v, "set pids limit")?;
                }
                if let (Some(v), true) =
                    (value(quota, "-1"), controllers.iter().any(|c| c == "cpu"))
                {
                    // Each write of the CPU bandwidth takes the kernel ~2 ms (measured
                    // here), so only a value that differs is written.
                    let d = dir("cpu");
                    for (file, value, step) in [
                        ("cpu.cfs_period_us", "100000", "set cpu period"),
                        ("cpu.cfs_quota_us", v.as_str(), "set cpu quota"),
                    ] {
                        let path = d.join(file);
                        if fs::read_to_string(&path).map_or(true, |now| now.trim() != value) {
                            write(&path, value, step)?;
                        }
                    }
                }
            }
            Hierarchy::V2 { root, .. } => {
                let d = root.join(&self.name);
                let limited = memory.is_some();
                if let Some(v) = value(memory, "max") {
                    write(&d.join("memory.max"), &v, "set memory limit")?;
                    // Without swap off, a hog would page out instead of being killed.
                    let _ = fs::write(d.join("memory.swap.max"), if limited { "0" } else { "max" });
                }
                if let Some(v) = value(pids, "max") {
                    write(&d.join("pids.max"), &v, "set pids limit")?;
                }
                if let Some(v) = value(quota, "max") {
                    write(&d.join("cpu.max"), &format!("{v} 100000"), "set cpu quota")?;
                }
            }
        }
        Ok(())
    }

    /// Whether the cgroup's freezer (if it has one) is thawed.
    fn thawed(&self) -> bool {
        match (&self.hierarchy, self.freezer_dir()) {
            (Hierarchy::V1 { .. }, Some(dir)) => {
                fs::read_to_string(dir.join("freezer.state")).is_ok_and(|s| s.trim() == "THAWED")
            }
            (Hierarchy::V2 { .. }, Some(dir)) => fs::read_to_string(dir.join("cgroup.events"))
                .is_ok_and(|s| s.lines().any(|l| l.trim() == "frozen 0")),
            (_, None) => true,
        }
    }

    /// Moves process `pid` into the cgroup (all controllers).
    pub fn add_pid(&self, pid: i32) -> Result<(), CgroupError> {
        for (_, dir, _) in self.dirs() {
            write(&dir.join("cgroup.procs"), &pid.to_string(), "add process")?;
        }
        Ok(())
    }

    /// The processes in the cgroup (from the pids controller on v1).
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let dir = match &self.hierarchy {
            Hierarchy::V1 { root, .. } => root.join("pids").join(&self.name),
            Hierarchy::V2 { root, .. } => root.join(&self.name),
        };
        let path = dir.join("cgroup.procs");
        match fs::read_to_string(&path) {
            Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io_err(&path, "list processes")(e)),
        }
    }

    /// The `cgroup.procs` file of every directory of this cgroup: writing a pid to all
    /// of them moves that process in.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|(_, d, _)| d.join("cgroup.procs"))
            .collect()
    }

    /// (controller, path from the hierarchy's root) of each directory of this cgroup; the
    /// controller is empty on cgroup v2.
    pub fn roots(&self) -> Vec<(String, String)> {
        self.dirs()
            .into_iter()
            .map(|(c, _, own)| {
                let name = match (&self.shared_memory, own) {
                    (Some(shared), false) => shared,
                    _ => &self.name,
                };
                (c.unwrap_or_default(), format!("/{name}"))
            })
            .collect()
    }

    /// The directory whose freezer CRIU uses (`--freeze-cgroup`), if there is a freezer.
    pub fn freezer_dir(&self) -> Option<PathBuf> {
        match &self.hierarchy {
            Hierarchy::V1 { root, controllers } => controllers
                .iter()
                .any(|c| c == "freezer")
                .then(|| root.join("freezer").join(&self.name)),
            Hierarchy::V2 { root, .. } => Some(root.join(&self.name)),
        }
    }

    /// Freezes (`true`) or thaws every process of the cgroup and waits until the kernel
    /// reports the new state.
    pub fn set_frozen(&self, frozen: bool, timeout: Duration) -> Result<(), CgroupError> {
        let dir = self
            .freezer_dir()
            .ok_or_else(|| CgroupError::NoHierarchy(PathBuf::from("freezer")))?;
        let deadline = Instant::now() + timeout;
        let (file, value, check_file): (&str, &str, &str) = match (&self.hierarchy, frozen) {
            (Hierarchy::V1 { .. }, true) => ("freezer.state", "FROZEN", "freezer.state"),
            (Hierarchy::V1 { .. }, false) => ("freezer.state", "THAWED", "freezer.state"),
            (Hierarchy::V2 { .. }, true) => ("cgroup.freeze", "1", "cgroup.events"),
            (Hierarchy::V2 { .. }, false) => ("cgroup.freeze", "0", "cgroup.events"),
        };
        let step = if frozen { "freeze" } else { "thaw" };
        write(&dir.join(file), value, step)?;
        let mut asked = Instant::now();
        loop {
            let state = fs::read_to_string(dir.join(check_file))
                .map_err(io_err(&dir, "read freezer state"))?;
            let done = match &self.hierarchy {
                Hierarchy::V1 { .. } => state.trim() == value,
                Hierarchy::V2 { .. } => {
                    state.lines().any(|l| l.trim() == format!("frozen {value}"))
                }
            };
            if done {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(CgroupError::Io {
                    path: dir,
                    step: "wait for freezer",
                    source: io::Error::new(io::ErrorKind::TimedOut, format!("still not {value}")),
                });
            }
            // The v1 freezer tries each task once per request: a task that went to
            // sleep after that try (a `vfork` parent starting to wait for its child,
            // which the first try caught before its `exec`) would keep the cgroup
            // FREEZING for good. Asking again tries every task again.
            if frozen && asked.elapsed() > Duration::from_millis(5) {
                write(&dir.join(file), value, step)?;
                asked = Instant::now();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Whether any of its own directories exists.
    pub fn exists(&self) -> bool {
        self.dirs().iter().any(|(_, d, own)| *own && d.exists())
    }

    /// How many times the OOM killer fired inside this cgroup; `None` when its memory
    /// cgroup is shared (a kill there may have been another sandbox's) or unreadable.
    pub fn oom_kills(&self) -> Option<u64> {
        let path = match &self.hierarchy {
            Hierarchy::V1 { .. } => self.own_memory_dir()?.join("memory.oom_control"),
            Hierarchy::V2 { root, .. } => root.join(&self.name).join("memory.events"),
        };
        stat_sum(&fs::read_to_string(path).ok()?, &["oom_kill"])
    }

    /// How many times a fork in this cgroup was refused at its task limit.
    pub fn pids_refusals(&self) -> u64 {
        let path = match &self.hierarchy {
            Hierarchy::V1 { root, .. } => root.join("pids").join(&self.name).join("pids.events"),
            Hierarchy::V2 { root, .. } => root.join(&self.name).join("pids.events"),
        };
        fs::read_to_string(path)
            .ok()
            .and_then(|t| stat_sum(&t, &["max"]))
            .unwrap_or(0)
    }

    /// Current memory use in bytes, if the memory controller reports it for this cgroup
    /// alone (not when its memory cgroup is shared).
    pub fn memory_current(&self) -> Option<u64> {
        let dir = self.own_memory_dir()?;
        let path = match &self.hierarchy {
            Hierarchy::V1 { .. } => dir.join("memory.usage_in_bytes"),
            Hierarchy::V2 { .. } => dir.join("memory.current"),
        };
        fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// CPU time its processes used, microseconds: cgroup v2's `cpu.stat` (every process
    /// it ever held), v1's `cpuacct` where the cgroup has one, else the user and system
    /// time of the processes it holds now (from `/proc`, where v1 keeps `cpuacct` apart).
    pub fn cpu_usage_us(&self) -> Option<u64> {
        match &self.hierarchy {
            Hierarchy::V2 { root, .. } => {
                let text = fs::read_to_string(root.join(&self.name).join("cpu.stat")).ok()?;
                stat_sum(&text, &["usage_usec"])
            }
            Hierarchy::V1 { root, .. } => {
                let acct = root.join("cpuacct").join(&self.name).join("cpuacct.usage");
                if let Ok(ns) = fs::read_to_string(acct) {
                    return ns.trim().parse::<u64>().ok().map(|n| n / 1000);
                }
                let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                    .ok()
                    .flatten()
                    .filter(|t| *t > 0)? as u64;
                let ticks: u64 = self
                    .pids()
                    .ok()?
                    .into_iter()
                    .filter_map(|pid| {
                        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                        // After the command's name, which may hold spaces: state is
                        // field 3, utime 14 and stime 15.
                        let rest = &stat[stat.rfind(')')? + 2..];
                        let f: Vec<&str> = rest.split(' ').collect();
                        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
                    })
                    .sum();
                Some(ticks * 1_000_000 / tick)
            }
        }
    }

    /// Bytes of file data the cgroup's processes dirtied that are not yet on disk (dirty
    /// or under writeback), if the memory controller reports them. When its memory
    /// cgroup is shared, those of every sandbox in it: at least this one's.
    pub fn unwritten_bytes(&self) -> Option<u64> {
        let dir = match (&self.shared_memory, &self.hierarchy) {
            (Some(shared), Hierarchy::V1 { root, .. }) => root.join("memory").join(shared),
            _ => self.own_memory_dir()?,
        };
        let path = dir.join("memory.stat");
        let keys = match &self.hierarchy {
            Hierarchy::V1 { .. } => ["dirty", "writeback"],
            Hierarchy::V2 { .. } => ["file_dirty", "file_writeback"],
        };
        stat_sum(&fs::read_to_string(path).ok()?, &keys)
    }

    /// Kills every process in the cgroup and waits (up to `timeout`) until it is empty.
    pub fn kill_all(&self, timeout: Duration) -> Result<(), CgroupError> {
        let deadline = Instant::now() + timeout;
        if let Hierarchy::V2 { root, .. } = &self.hierarchy {
            let _ = fs::write(root.join(&self.name).join("cgroup.kill"), "1");
        }
        // Killed processes are usually gone within a fraction of a millisecond: poll
        // from 200 us, doubling up to 5 ms, rather than sleeping 5 ms each time.
        let mut pause = Duration::from_micros(200);
        loop {
            let pids = self.pids()?;
            if pids.is_empty() {
                return Ok(());
            }
            for pid in pids {
                // The pids were read from our own cgroup a moment ago; a pid that exited
                // since then makes kill fail with ESRCH, which is fine.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            if Instant::now() > deadline {
                return Err(CgroupError::Busy(PathBuf::from(&self.name)));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Removes the cgroup (its own directories, not a shared one); it must be empty.
    /// Missing directories are not an error, so removal is idempotent.
    pub fn remove(&self) -> Result<(), CgroupError> {
        for (_, dir, _) in self.dirs().into_iter().filter(|(_, _, own)| *own) {
            // About a second in all, in pauses from 200 us up to 10 ms.
            let deadline = Instant::now() + Duration::from_secs(1);
            let mut pause = Duration::from_micros(200);
            loop {
                match fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // EBUSY right after the last task exits: the kernel frees it lazily.
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline =>
                    {
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(10));
                    }
                    Err(e) => return Err(io_err(&dir, "remove")(e)),
                }
            }
        }
        Ok(())
    }
}

/// The sum of the named `key value` lines of a cgroup file (`memory.stat`,
/// `pids.events`); `None` if one is missing or not a number.
fn stat_sum(text: &str, keys: &[&str]) -> Option<u64> {
    keys.iter()
        .map(|k| {
            text.lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(' ')?;
                    (name == *k).then(|| value.trim().parse::<u64>().ok())
                })
                .flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests;
