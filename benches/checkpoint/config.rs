//! What the checkpoint benchmark measures and against which goals: the images, the
//! process trees of parts 2 and 4, the configuration from the environment, and sizes.

use crate::common;
use crate::peers::podman::PodmanTree;
use anyhow::{anyhow, bail, Context, Result};
use forkd::api::BranchInfo;
use std::time::{Duration, Instant};

pub const BUSYBOX: &str = "busybox";
pub const DEBIAN: &str = "debian";

/// Goals, checked under the table.
pub const FS_CHECKPOINT_GOAL_MS: f64 = 20.0;
pub const PODMAN_RATIO_GOAL: f64 = 1.0 / 8.0;
pub const RAW_CRIU_RATIO_GOAL: f64 = 1.5;
pub const LAZY_RUNNING_GOAL_MS: f64 = 200.0;

/// A small process tree to checkpoint and fork.
pub struct Tree {
    pub name: &'static str,
    pub image: &'static str,
    /// The sandbox's command (`/bin/sh -c`), started by its init so it is in the
    /// init's process tree, which is what a live checkpoint dumps.
    pub shell: &'static str,
    /// Process names that every restored copy must have running.
    pub expect: &'static [&'static str],
    /// The fixture rootfs archive (under the cache's images/) and the name podman's
    /// peer imports it under.
    pub fixture: &'static str,
    pub podman_image: &'static str,
}

impl Tree {
    /// Waits until the processes the tree needs are running in a sandbox's cgroup.
    pub fn wait_in(&self, cgroup: &str, limit: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            let names = common::comms(&common::cgroup_pids(cgroup));
            if self.expect.iter().all(|e| names.iter().any(|n| n == e)) {
                return Ok(());
            }
            if t.elapsed() > limit {
                bail!(
                    "{}: processes {:?} not all running in cgroup {cgroup} after {limit:?} (found {names:?})",
                    self.name,
                    self.expect
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Does a branch run the whole tree (read from its cgroup)?
    fn runs_in_branch(&self, id: &str) -> bool {
        let names = common::comms(&common::cgroup_pids(&format!("forkd/{id}")));
        self.expect.iter().all(|e| names.iter().any(|n| n == e))
    }

    /// How many of the branches run the whole tree (read before they are removed).
    pub fn count_in(&self, branches: &[BranchInfo]) -> usize {
        branches
            .iter()
            .filter(|b| self.runs_in_branch(&b.id))
            .count()
    }

    /// The same tree for podman's peer.
    pub fn podman(&self) -> PodmanTree {
        PodmanTree {
            fixture: self.fixture,
            image: self.podman_image,
            shell: self.shell,
            expect: self.expect,
        }
    }
}

pub const BUSYBOX_TREE: Tree = Tree {
    name: "busybox sh+sleep",
    image: BUSYBOX,
    shell: "while true; do sleep 1; done & exec sleep 100000",
    expect: &["sh", "sleep"],
    fixture: "busybox.tar",
    podman_image: "localhost/forkd-bench-busybox",
};

pub const DEBIAN_TREE: Tree = Tree {
    name: "debian sh+python3",
    image: DEBIAN,
    shell: "python3 -c 'import time\nwhile True: time.sleep(1)' & while true; do sleep 1; done",
    expect: &["sh", "python3"],
    fixture: "debian.tar.zst",
    podman_image: "localhost/forkd-bench-debian",
};

pub const GUEST_SERIAL: &str = "guest/serial.log";

pub struct Config {
    pub samples: usize,
    /// Branch counts of the fork requests of part 2; the last is the largest.
    pub branch_counts: Vec<usize>,
    pub sizes: Vec<u64>,
    pub qemu: bool,
}

impl Config {
    pub fn from_env() -> Result<Config> {
        let samples = crate::common::env_usize("FORKD_BENCH_SAMPLES", 10)?;
        let max = crate::common::env_usize("FORKD_BENCH_BRANCHES", 100)?;
        let mut branch_counts: Vec<usize> = [1, 10, 100].into_iter().filter(|&n| n < max).collect();
        branch_counts.push(max);
        let sizes = match std::env::var("FORKD_BENCH_SIZES") {
            Ok(v) if !v.trim().is_empty() => v
                .split(',')
                .map(|s| parse_size(s.trim()))
                .collect::<Result<Vec<u64>>>()
                .with_context(|| format!("FORKD_BENCH_SIZES={v:?}"))?,
            _ => vec![1 << 20, 16 << 20, 256 << 20, 1 << 30],
        };
        let qemu = !std::env::var("FORKD_BENCH_QEMU").is_ok_and(|v| v == "0");
        Ok(Config {
            samples,
            branch_counts,
            sizes,
            qemu,
        })
    }
}

/// `1M`, `16M`, `1G`, `512K` (also `1MiB`) or plain bytes; binary multiples.
fn parse_size(s: &str) -> Result<u64> {
    let upper = s.to_ascii_uppercase();
    let t = upper.trim_end_matches("IB").trim_end_matches('B');
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K')) => (&t[..i], 10),
        Some((i, 'M')) => (&t[..i], 20),
        Some((i, 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow!("{s:?}: expected a size such as 16M or 1G"))?;
    if n == 0 {
        bail!("{s:?}: the size must be positive");
    }
    Ok(n << shift)
}

pub fn size_label(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes & ((1 << shift) - 1) == 0 {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}
