//! Cgroups kept for the next sandbox instead of being removed.
//!
//! Removing a memory cgroup is not cheap on a host with many sandboxes. The kernel
//! offlines it in a worker that goes through every memcg-aware list of every superblock
//! on the host (a sandbox brings four superblocks, each with two such lists) to hand the
//! cgroup's entries to its parent, under a mutex that mounting a new superblock takes
//! too. With 5,000 sandboxes alive that is about 4 ms of a kernel worker for a cgroup
//! that never charged a file-system object and up to ~29 ms for one that did, on every
//! removal, and a create beside it waits for the mutex. Making a memory cgroup allocates
//! its records for every shrinker on the host as well.
//!
//! A sandbox that ends without running into a limit leaves a cgroup that can serve the
//! next one. cgroup v1 can rename a cgroup within its parent, so the pool keeps such
//! cgroups under names of its own (`<parent>/free-<tag>-<n>`, which no sandbox id can
//! be; the tag is the daemon's) and renames one to the next sandbox's name, its limits
//! set afresh ([`super::Cgroup::reset`]). Nothing is offlined, and nothing is made while the pool
//! holds a cgroup. A cgroup is kept only when it is empty and thawed, its OOM-kill and
//! task-refusal counters (which the kernel never clears, and which a sandbox's
//! description reports) are zero, and it still charges at most [`KEEP_BYTES`]: pages of
//! files its processes read that are still cached (among them those of forkd's own
//! init, several MiB, charged to the first sandbox that runs it), and file-system
//! objects. Those stay
//! charged to the cgroup, so to its next sandbox, as a page stays charged to the first
//! cgroup that touched it. A cgroup that charges more is removed, as before.
//!
//! cgroup v2 cannot rename a cgroup: there the pool keeps nothing and every cgroup is
//! made and removed with its sandbox.
//!
//! The same per-superblock records make every memory cgroup cost more the more
//! sandboxes are alive: one 520-byte record (a `kmalloc-1k` object) per 64 shrinker ids,
//! and every superblock holds one, so with N sandboxes of four superblocks each a memory
//! cgroup takes ~N/16 KiB, about as much as all the rest of a small sandbox at N = 5,000.
//! A pool made [`Pool::sharing_memory`] (cgroup v1 only) gives every sandbox without a
//! memory limit the one memory cgroup `<parent>/shared-<tag>` instead of its own
//! ([`Pool::shared_memory_for`]); its other controllers stay its own. Free cgroups of
//! that kind are kept apart and serve only sandboxes that share memory too.
//!
//! Free cgroups outlive a daemon that stops; [`Pool::sweep`] removes those with its tag
//! when the next daemon of the same state root starts. A [`Pool::take`] that finds a
//! free cgroup gone (someone removed it) makes what is missing.

use super::{io_err, Cgroup, CgroupError, Hierarchy, Limits};
use std::fs;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The most a kept cgroup may still charge: 8 MiB.
pub const KEEP_BYTES: u64 = 16 << 20;

const FREE_PREFIX: &str = "free-";
const SHARED_PREFIX: &str = "shared-";

pub struct Pool {
    hierarchy: Hierarchy,
    parent: String,
    capacity: usize,
    /// `free-<tag>-`: the start of the names of this pool's free cgroups.
    prefix: String,
    /// Free cgroups with a memory cgroup of their own, and those sharing one.
    free: Mutex<[Vec<String>; 2]>,
    named: AtomicU64,
    /// `<parent>/shared-<tag>`, when sandboxes without a memory limit share it.
    shared_memory: Option<String>,
    tag: String,
}

/// Which free list a cgroup of this kind goes to.
fn kind(cg: &Cgroup) -> usize {
    usize::from(cg.shared_memory().is_some())
}

/// Makes the memory cgroup `cg` shares if it is missing (a sweep removes it when empty);
/// whether it is there.
fn shared_memory_made(cg: &Cgroup) -> bool {
    cg.dirs()
        .into_iter()
        .filter(|(_, _, own)| !own)
        .all(|(_, d, _)| fs::create_dir_all(d).is_ok())
}

impl Pool {
    /// A pool of at most `capacity` free cgroups under `parent` (such as `forkd`), named
    /// with `tag` (its owner's, so that owners sharing a parent keep apart); none on
    /// cgroup v2.
    pub fn new(hierarchy: &Hierarchy, parent: &str, tag: &str, capacity: usize) -> Pool {
        let capacity = match hierarchy {
            Hierarchy::V1 { .. } => capacity,
            Hierarchy::V2 { .. } => 0,
        };
        Pool {
            hierarchy: hierarchy.clone(),
            parent: parent.trim_end_matches('/').to_string(),
            capacity,
            prefix: format!("{FREE_PREFIX}{tag}-"),
            free: Mutex::new([Vec::new(), Vec::new()]),
            named: AtomicU64::new(0),
            shared_memory: None,
            tag: tag.to_string(),
        }
    }

    /// The same pool, giving every sandbox without a memory limit the one memory cgroup
    /// `<parent>/shared-<tag>` (cgroup v1; on v2 every sandbox keeps its own).
    pub fn sharing_memory(mut self) -> Pool {
        if let Hierarchy::V1 { .. } = self.hierarchy {
            self.shared_memory = Some(format!("{}/{SHARED_PREFIX}{}", self.parent, self.tag));
        }
        self
    }

    /// The memory cgroup a sandbox with `limits` shares, if it gets none of its own.
    pub fn shared_memory_for(&self, limits: &Limits) -> Option<String> {
        match limits.memory_bytes {
            Some(_) => None,
            None => self.shared_memory.clone(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many free cgroups the pool holds now.
    pub fn len(&self) -> usize {
        self.free_list().iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn free_list(&self) -> std::sync::MutexGuard<'_, [Vec<String>; 2]> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The cgroup `name` with `limits`: a free one renamed, or a new one. With
    /// `shared_memory` (from [`Pool::shared_memory_for`]) its memory controller is that
    /// shared cgroup, made if missing, and a free one is taken only among those sharing.
    pub fn take(
        &self,
        name: &str,
        shared_memory: Option<&str>,
        limits: &Limits,
    ) -> Result<Cgroup, CgroupError> {
        let cg = Cgroup::new(&self.hierarchy, name).sharing_memory(shared_memory);
        let free = self.free_list()[kind(&cg)].pop();
        if let Some(free) = free {
            let free = cg.renamed(&free);
            // A limit below what the free cgroup still charges makes the kernel reclaim
            // it first; if it cannot (`EBUSY`), or the rename fails, the free cgroup is
            // not used: whatever is left of it, under either name, goes.
            if self.rename(&free, &cg).is_ok()
                && shared_memory_made(&cg)
                && cg.reset(limits).is_ok()
            {
                return Ok(cg);
            }
            let _ = free.remove();
            let _ = cg.remove();
        }
        cg.create(limits)?;
        Ok(cg)
    }

    /// Takes back the cgroup of a sandbox whose processes are all gone: kept for the
    /// next sandbox when it qualifies (see the module header) and the pool has room,
    /// removed otherwise.
    pub fn give_back(&self, cg: &Cgroup) -> Result<(), CgroupError> {
        if self.keeps(cg) {
            let n = self.named.fetch_add(1, Ordering::Relaxed);
            let free = cg.renamed(&format!("{}/{}{n}", self.parent, self.prefix));
            match self.rename(cg, &free) {
                Ok(()) => {
                    let mut lists = self.free_list();
                    let list = &mut lists[kind(cg)];
                    if list.len() < self.capacity {
                        list.push(free.name().to_string());
                        return Ok(());
                    }
                    drop(lists);
                    return free.remove();
                }
                Err(_) => {
                    let _ = free.remove();
                }
            }
        }
        cg.remove()
    }

    fn keeps(&self, cg: &Cgroup) -> bool {
        self.free_list()[kind(cg)].len() < self.capacity
            && cg.pids().is_ok_and(|p| p.is_empty())
            && cg.thawed()
            && cg.pids_refusals() == 0
            // What a shared memory cgroup charges stays there, whoever comes next.
            && (cg.shared_memory().is_some()
                || cg.oom_kills() == Some(0)
                    && cg.memory_current().is_some_and(|b| b <= KEEP_BYTES))
    }

    /// Renames cgroup `from` to `to` (the same but for its name) in every hierarchy
    /// where it has a directory of its own; a directory of `from` that is missing is
    /// made as `to`. An error leaves the renamed part under `to`.
    fn rename(&self, from: &Cgroup, to: &Cgroup) -> Result<(), CgroupError> {
        let own = |cg: &Cgroup| -> Vec<std::path::PathBuf> {
            cg.dirs()
                .into_iter()
                .filter(|(_, _, own)| *own)
                .map(|(_, d, _)| d)
                .collect()
        };
        let (froms, tos) = (own(from), own(to));
        for (a, b) in froms.iter().zip(&tos) {
            match fs::rename(a, b) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(b).map_err(io_err(b, "create"))?
                }
                Err(e) => return Err(io_err(a, "rename")(e)),
            }
        }
        Ok(())
    }

    /// Removes every free cgroup with this pool's tag under the parent, also those an
    /// earlier owner with the same tag left when it stopped, and the shared memory
    /// cgroup of that tag when no process is in it; returns how many free ones went.
    pub fn sweep(&self) -> usize {
        if let Hierarchy::V1 { root, .. } = &self.hierarchy {
            let shared = root
                .join("memory")
                .join(&self.parent)
                .join(format!("{SHARED_PREFIX}{}", self.tag));
            let empty =
                fs::read_to_string(shared.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty());
            // Left if a process is in it; one that enters meanwhile makes rmdir fail.
            if empty {
                let _ = fs::remove_dir(&shared);
            }
        }
        for list in self.free_list().iter_mut() {
            list.clear();
        }
        let mut names = std::collections::BTreeSet::new();
        for (_, dir) in self.hierarchy.dirs(&self.parent) {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with(&self.prefix) && e.path().is_dir() {
                    names.insert(name);
                }
            }
        }
        let mut gone = 0;
        for name in names {
            let cg = Cgroup::new(&self.hierarchy, &format!("{}/{name}", self.parent));
            // A free cgroup has no processes; one that does is not the pool's to end.
            if cg.pids().is_ok_and(|p| p.is_empty()) && cg.remove().is_ok() {
                gone += 1;
            }
        }
        gone
    }
}
