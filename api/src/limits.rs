//! A sandbox's resource limits and the ranges the kernel takes.

use serde::{Deserialize, Serialize};

/// A sandbox's resource limits, as requests give them and records keep them. `None` means
/// unlimited. The memory, task and CPU limits are its cgroups'; the disk limit is held on
/// its writable layer (btrfs simple quotas).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Hard memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks (processes and threads).
    pub pids: Option<u64>,
    /// CPU quota in thousandths of one CPU (1000 = one full core).
    pub cpu_millis: Option<u64>,
    /// What the sandbox's writable layer may hold, in bytes: what its processes write,
    /// not the layers under it.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
}

impl Limits {
    /// The smallest CPU quota: the kernel refuses a quota under 1 ms, and the period is
    /// 100 ms.
    pub const MIN_CPU_MILLIS: u64 = 10;
    /// The largest: a thousand CPUs.
    pub const MAX_CPU_MILLIS: u64 = 1_000_000;
    /// The smallest disk limit: room for a few files' metadata.
    pub const MIN_DISK_BYTES: u64 = 1 << 20;
    /// The largest task count the kernel takes as a limit (`PID_MAX_LIMIT` on 64-bit
    /// machines; `pids.max` refuses more).
    pub const MAX_PIDS: u64 = 4 * 1024 * 1024;

    /// Checks values the kernel would refuse, before anything is made; the error names
    /// the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(m) = self.cpu_millis {
            if !(Self::MIN_CPU_MILLIS..=Self::MAX_CPU_MILLIS).contains(&m) {
                return Err(format!(
                    "cpu_millis {m} is out of range: from {} (1% of a CPU, the kernel's shortest quota) to {} (1000 CPUs)",
                    Self::MIN_CPU_MILLIS,
                    Self::MAX_CPU_MILLIS
                ));
            }
        }
        if let Some(d) = self.disk_bytes {
            if d < Self::MIN_DISK_BYTES {
                return Err(format!(
                    "disk_bytes {d} is too small: at least {} (1 MiB)",
                    Self::MIN_DISK_BYTES
                ));
            }
        }
        if let Some(p) = self.pids {
            if p > Self::MAX_PIDS {
                return Err(format!(
                    "pids {p} is out of range: at most {} (the kernel's largest number of tasks)",
                    Self::MAX_PIDS
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quotas_the_kernel_refuses_are_refused_first() {
        let cpu = |m| Limits {
            cpu_millis: Some(m),
            ..Limits::default()
        };
        assert!(cpu(10).validate().is_ok());
        assert!(cpu(1_000_000).validate().is_ok());
        assert!(Limits::default().validate().is_ok());
        for bad in [0, 9, 1_000_001, u64::MAX] {
            let e = cpu(bad).validate().unwrap_err();
            assert!(
                e.contains("cpu_millis") && e.contains(&bad.to_string()),
                "{e}"
            );
        }
    }

    #[test]
    fn task_limits_the_kernel_refuses_are_refused_first() {
        let pids = |p| Limits {
            pids: Some(p),
            ..Limits::default()
        };
        assert!(pids(1).validate().is_ok());
        assert!(pids(Limits::MAX_PIDS).validate().is_ok());
        for bad in [Limits::MAX_PIDS + 1, 1 << 40, i64::MAX as u64] {
            let e = pids(bad).validate().unwrap_err();
            assert!(e.contains("pids") && e.contains(&bad.to_string()), "{e}");
        }
    }
}
