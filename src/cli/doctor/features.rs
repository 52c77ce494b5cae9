//! The kernel features forkd uses that are newer than the oldest kernel it supports
//! (Linux 5.10): what each needs, whether this kernel has it, and what is lost without
//! it. Features whose absence stops forkd are required; the others have a fallback or
//! are refused by name where they are asked for (`forkd_sys::lowerdir`,
//! `forkd_sys::cloexec_each_from`, the daemon's `sharing` and cgroup set-up).

use super::{Check, Status};

pub(super) struct Feature {
    pub name: &'static str,
    pub since: (u32, u32),
    pub used_for: &'static str,
    /// What happens on a kernel without it.
    pub without: &'static str,
    pub required: bool,
    /// Asks the running kernel itself (`forkd_sys::probe`): distribution kernels carry
    /// features back to older versions. Where there is no probe, or it cannot tell (no
    /// privilege, a module not loaded yet), the version decides.
    pub probe: Option<fn() -> Option<bool>>,
}

pub(super) const FEATURES: &[Feature] = &[
    Feature {
        name: "mount-api",
        since: (5, 2),
        used_for: "sandbox roots as detached mounts (fsopen, fsmount, open_tree, move_mount)",
        without: "no sandbox can start",
        required: true,
        probe: Some(forkd_sys::probe::mount_api),
    },
    Feature {
        name: "pidfd-calls",
        since: (5, 3),
        used_for: "watching and signalling every sandbox's init (pidfd_open, pidfd_send_signal)",
        without: "no sandbox can be watched",
        required: true,
        probe: Some(forkd_sys::probe::pidfd),
    },
    Feature {
        name: "close_range",
        since: (5, 9),
        used_for: "the exit watcher's descriptor table",
        without: "the exit watcher cannot start",
        required: true,
        probe: Some(forkd_sys::probe::close_range),
    },
    Feature {
        name: "cloexec-range",
        since: (5, 11),
        used_for: "closing every descriptor before a sandbox's init runs, in one call (CLOSE_RANGE_CLOEXEC)",
        without: "descriptors are marked one at a time",
        required: false,
        probe: Some(forkd_sys::probe::cloexec_range),
    },
    Feature {
        name: "rseq-dump",
        since: (5, 13),
        used_for: "live checkpoints of programs that register rseq areas (glibc 2.35+; PTRACE_GET_RSEQ_CONFIGURATION)",
        without: "sandboxes run with glibc's rseq turned off (GLIBC_TUNABLES=glibc.pthread.rseq=0)",
        required: false,
        probe: None,
    },
    Feature {
        name: "favordynmods",
        since: (6, 0),
        used_for: "moving processes into cgroups without an RCU wait (cgroup2 favordynmods)",
        without: "each create and fork may wait 7-19 ms for RCU",
        required: false,
        probe: Some(forkd_sys::probe::cgroup_favordynmods),
    },
    Feature {
        name: "bdi-max-bytes",
        since: (6, 2),
        used_for: "bounding the volume's dirty data (FORKD_DIRTY_LIMIT)",
        without: "the volume is left untuned: a checkpoint after a large write waits for it",
        required: false,
        probe: Some(forkd_sys::probe::bdi_max_bytes),
    },
    Feature {
        name: "memory-merge",
        since: (6, 4),
        used_for: "memory shared between branches (KSM, PR_SET_MEMORY_MERGE)",
        without: "forks that ask share_memory are refused by name",
        required: false,
        probe: Some(|| Some(forkd_sys::probe::memory_merge())),
    },
    Feature {
        name: "simple-quotas",
        since: (6, 7),
        used_for: "disk limits of sandboxes, each charged what it writes (btrfs simple quotas)",
        without: "a sandbox with a disk limit is refused by name",
        required: false,
        probe: Some(forkd_sys::probe::btrfs_simple_quotas),
    },
    Feature {
        name: "lowerdir+",
        since: (6, 8),
        used_for: "overlay layer stacks of any depth (one fsconfig lowerdir+ per layer)",
        without: "layers are handed over as one-byte links, at most 128 a stack",
        required: false,
        probe: Some(forkd_sys::probe::lowerdir_plus),
    },
];

/// Each feature against the kernel of `release`.
pub(super) fn check_features(release: &str) -> Vec<Check> {
    let version = forkd_sys::mount::kernel_version(release);
    // Probes ask the running kernel: only for its own release.
    let running = release == forkd_sys::mount::kernel_release();
    FEATURES
        .iter()
        .map(|f| {
            let needs = format!("Linux {}.{}+", f.since.0, f.since.1);
            // The kernel's own answer where there is a probe, else its version.
            let asked = f.probe.filter(|_| running).and_then(|probe| probe());
            let has = asked.or(version.map(|v| v >= f.since));
            match has {
                Some(true) => {
                    let how = if version.is_some_and(|v| v < f.since) {
                        format!("yes, carried back by {release}")
                    } else {
                        "yes".to_string()
                    };
                    Check::ok(
                        f.name,
                        f.required,
                        format!("{needs}: {how}; {}", f.used_for),
                    )
                }
                Some(false) => Check::not_ok(
                    f.name,
                    f.required,
                    format!(
                        "{needs}: not on {release}; {}; without it {}",
                        f.used_for, f.without
                    ),
                ),
                None => Check::new(
                    f.name,
                    Status::Warn,
                    f.required,
                    format!("{needs}: unknown for kernel {release:?}; {}", f.used_for),
                ),
            }
        })
        .collect()
}
