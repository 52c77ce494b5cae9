//! The host's ceilings on how many sandboxes may run: tasks (`kernel.pid_max`, every
//! thread takes a pid; `kernel.threads-max`), memory, and what raises each. Read from
//! `/proc` (a few small files, cheap enough for every create and fork); the checks are
//! plain functions of what was read, so a refusal can be tested without the host at its
//! limit.

use std::fmt;

/// Pids kept for the host and the daemon's own helpers (CRIU, set-ups, execs): a create
/// or fork that would leave fewer is refused.
pub const TASKS_KEPT: u64 = 1024;
/// Memory kept for the host: a create or fork that would leave less available is refused.
pub const MEMORY_KEPT: u64 = 256 << 20;
/// The least host memory a sandbox is counted to take when a create or fork is admitted:
/// an idle busybox branch takes about 0.5 MiB, a branch that shares a large checkpoint's
/// memory a few MiB more (docs/DESIGN.md, "What a small branch holds").
pub const SANDBOX_MEMORY_FLOOR: u64 = 512 << 10;
/// The largest `kernel.pid_max` on 64-bit Linux.
pub const PID_MAX_LIMIT: u64 = 4 << 20;

/// What was read of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    /// Tasks (threads) on the host now.
    pub tasks: u64,
    pub pid_max: u64,
    pub threads_max: u64,
    pub mem_available: u64,
    pub mem_total: u64,
}

/// One ceiling: its setting, its value, what is used of it, and how many more
/// sandboxes of a given size it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    /// The setting (`kernel.pid_max`).
    pub name: &'static str,
    pub value: u64,
    pub used: u64,
    /// Kept free of sandboxes.
    pub kept: u64,
    /// How many more sandboxes it allows, each taking `per` of it.
    pub allows: u64,
    pub per: u64,
    /// What raises it.
    pub raise: String,
}

impl fmt::Display for Ceiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is {} and {} of it is used ({} kept for the host): room for {} more at {} each; {}",
            self.name, self.value, self.used, self.kept, self.allows, self.per, self.raise
        )
    }
}

impl Host {
    pub fn read() -> std::io::Result<Host> {
        let num = |path: &str| -> std::io::Result<u64> {
            std::fs::read_to_string(path)?
                .trim()
                .parse()
                .map_err(|_| std::io::Error::other(format!("{path}: not a number")))
        };
        // The fourth field of /proc/loadavg is "running/total" scheduling entities.
        let loadavg = std::fs::read_to_string("/proc/loadavg")?;
        let tasks = loadavg
            .split_whitespace()
            .nth(3)
            .and_then(|f| f.split('/').nth(1))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| std::io::Error::other("/proc/loadavg: no task count"))?;
        let kib = |key| {
            crate::proc_kib_field("/proc/meminfo", key)
                .ok_or_else(|| std::io::Error::other(format!("/proc/meminfo: no {key}")))
        };
        Ok(Host {
            tasks,
            pid_max: num("/proc/sys/kernel/pid_max")?,
            threads_max: num("/proc/sys/kernel/threads-max")?,
            mem_available: kib("MemAvailable:")?,
            mem_total: kib("MemTotal:")?,
        })
    }

    /// The ceilings, for sandboxes of `tasks_per` tasks and `memory_per` bytes each.
    pub fn ceilings(&self, tasks_per: u64, memory_per: u64) -> Vec<Ceiling> {
        let tasks_per = tasks_per.max(1);
        let memory_per = memory_per.max(1);
        let room = |value: u64, used: u64, kept: u64, per: u64| {
            value.saturating_sub(used).saturating_sub(kept) / per
        };
        vec![
            Ceiling {
                name: "kernel.pid_max",
                value: self.pid_max,
                used: self.tasks,
                kept: TASKS_KEPT,
                allows: room(self.pid_max, self.tasks, TASKS_KEPT, tasks_per),
                per: tasks_per,
                raise: format!(
                    "raise it with `sysctl -w kernel.pid_max={}` (the daemon raises it at start where memory allows)",
                    self.pid_max_for_memory().max(self.pid_max)
                ),
            },
            Ceiling {
                name: "kernel.threads-max",
                value: self.threads_max,
                used: self.tasks,
                kept: TASKS_KEPT,
                allows: room(self.threads_max, self.tasks, TASKS_KEPT, tasks_per),
                per: tasks_per,
                raise: "raise it with `sysctl -w kernel.threads-max=N` (the kernel sizes it by memory)".into(),
            },
            Ceiling {
                name: "MemAvailable",
                value: self.mem_available,
                used: 0,
                kept: MEMORY_KEPT,
                allows: room(self.mem_available, 0, MEMORY_KEPT, memory_per),
                per: memory_per,
                raise: "free memory: remove sandboxes, or fork branches that share their checkpoint's memory".into(),
            },
        ]
    }

    /// Refuses `what`, which makes `n` sandboxes of `tasks_per` tasks and `memory_per`
    /// bytes each, when it would pass a ceiling; the error names the ceiling, its value
    /// and what raises it.
    pub fn admit(&self, what: &str, n: u64, tasks_per: u64, memory_per: u64) -> Result<(), String> {
        match self
            .ceilings(tasks_per, memory_per)
            .into_iter()
            .find(|c| c.allows < n)
        {
            None => Ok(()),
            Some(c) => Err(format!("{what} refused: it makes {n} sandboxes and {c}")),
        }
    }

    /// A `kernel.pid_max` this host's memory can carry: a task takes at least some 64
    /// KiB of kernel memory (its stack, its task structure), so more pids than memory /
    /// 64 KiB could never all be used.
    pub fn pid_max_for_memory(&self) -> u64 {
        (self.mem_total / (64 << 10)).clamp(32_768, PID_MAX_LIMIT)
    }
}

/// Raises `kernel.pid_max` to what this host's memory can carry, where it is lower;
/// returns (before, after) when it did.
pub fn raise_pid_max(host: &Host) -> std::io::Result<Option<(u64, u64)>> {
    let want = host.pid_max_for_memory();
    if want <= host.pid_max {
        return Ok(None);
    }
    std::fs::write("/proc/sys/kernel/pid_max", want.to_string())?;
    Ok(Some((host.pid_max, want)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host {
            tasks: 30_000,
            pid_max: 32_768,
            threads_max: 193_111,
            mem_available: 20 << 30,
            mem_total: 24 << 30,
        }
    }

    #[test]
    fn a_fork_past_pid_max_is_refused_by_name() {
        let h = host();
        // 32,768 - 30,000 - 1,024 = 1,744 pids: 872 sandboxes of two tasks.
        assert!(h.admit("fork of 800", 800, 2, 1 << 20).is_ok());
        let e = h.admit("fork of 900", 900, 2, 1 << 20).unwrap_err();
        assert!(e.contains("kernel.pid_max is 32768"), "{e}");
        assert!(e.contains("room for 872 more"), "{e}");
        assert!(e.contains("sysctl -w kernel.pid_max=393216"), "{e}");
    }

    #[test]
    fn memory_and_threads_are_ceilings_too() {
        let mut h = host();
        h.pid_max = PID_MAX_LIMIT;
        h.mem_available = (256 << 20) + (10 << 20);
        let e = h.admit("create", 11, 2, 1 << 20).unwrap_err();
        assert!(
            e.starts_with("create refused") && e.contains("MemAvailable"),
            "{e}"
        );
        h.mem_available = 20 << 30;
        h.threads_max = 31_030;
        let e = h.admit("create", 4, 2, 1 << 20).unwrap_err();
        assert!(e.contains("kernel.threads-max"), "{e}");
    }

    #[test]
    fn pid_max_for_memory_is_bounded() {
        let mut h = host();
        assert_eq!(h.pid_max_for_memory(), 393_216);
        h.mem_total = 1 << 30;
        assert_eq!(h.pid_max_for_memory(), 32_768);
        h.mem_total = 1 << 40;
        assert_eq!(h.pid_max_for_memory(), PID_MAX_LIMIT);
    }

    #[test]
    fn this_host_reads() {
        let h = Host::read().unwrap();
        assert!(h.tasks > 0 && h.pid_max > 0 && h.mem_total >= h.mem_available);
        // Bytes: more than 64 MiB, less than 64 TiB.
        assert!(h.mem_total > 64 << 20 && h.mem_total < 64 << 40, "{h:?}");
    }
}
