//! A sandbox's record (`state.json`), and the record behind its lock, with the description a list shows of it kept,
//! serialised, until the record changes.
//!
//! A list of thousands of sandboxes spent nearly all its time building and serialising
//! descriptions that had not changed since the last list (9 ms at 5,000). Every change
//! to a record goes through [`RecordGuard`]'s mutable access, which drops the kept
//! description there and then, under the same lock that a list takes to read it, so a
//! list never shows a description older than the record.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::bases::BaseId;
use super::checkpoints::Lower;
use crate::api::Limits;
use crate::api::SandboxStatus;
use forkd_cgroups::Cgroup;
use forkd_layers::ImageConfig;
use forkd_sandbox::{CheckpointId, SandboxId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The version of `state.json`; a record of another version is not loaded.
pub const RECORD_VERSION: u32 = 1;

/// What `state.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub version: u32,
    pub id: SandboxId,
    pub image: String,
    /// The layers the sandbox stands on, topmost first: its image's (with the runtime
    /// layer on top), or its checkpoint's. A checkpoint named here cannot be removed
    /// while the sandbox exists.
    pub lowers: Vec<Lower>,
    /// The base whose tree is the overlay's one lower layer (see [`super::bases`]): the
    /// writable layer, a snapshot of it, holds what the sandbox changed over that stack.
    /// A record without one was made before bases: its `lowers` are stacked as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseId>,
    /// The API key that made it (its id); none when the node's operator did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The checkpoint this sandbox was forked from.
    #[serde(default)]
    pub parent: Option<CheckpointId>,
    pub created: u64,
    pub hostname: String,
    pub limits: Limits,
    pub labels: BTreeMap<String, String>,
    pub status: SandboxStatus,
    pub init_pid: Option<i32>,
    /// Start time of the init (clock ticks since boot), to tell it from a reused pid.
    pub init_start: Option<u64>,
    pub cgroup: String,
    /// The memory cgroup its processes share with other sandboxes (cgroup v1, a daemon
    /// with `FORKD_MEMCG=limited`, no memory limit); without one it has its own, at
    /// `cgroup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_cgroup: Option<String>,
    pub create_us: u64,
    /// The image's run configuration: defaults (env, working directory, user) for
    /// every exec the API runs in this sandbox.
    #[serde(default)]
    pub config: ImageConfig,
    /// The network the sandbox asked for.
    #[serde(default)]
    pub network: forkd_net::Network,
    /// Its lease while it runs with egress.
    #[serde(default)]
    pub lease: Option<forkd_net::Lease>,
    /// Its system-call filter (a record without this field was made before there was
    /// one, so its processes run without).
    #[serde(default = "made_without_filter")]
    pub seccomp: forkd_sandbox::Seccomp,
    /// Setuid programs take effect (no `no_new_privs`).
    #[serde(default)]
    pub setuid: bool,
    /// When the daemon removes it (seconds since the epoch), if it expires.
    #[serde(default)]
    pub expires_at: Option<u64>,
}

/// Where a new sandbox comes from: what its record takes from its image (a create) or
/// its checkpoint (a fork).
pub struct Origin {
    pub image: String,
    pub lowers: Vec<Lower>,
    pub base: BaseId,
    pub parent: Option<CheckpointId>,
    pub hostname: String,
    pub limits: Limits,
    pub labels: BTreeMap<String, String>,
    pub config: ImageConfig,
    pub network: forkd_net::Network,
    pub seccomp: forkd_sandbox::Seccomp,
    pub setuid: bool,
    pub expires_at: Option<u64>,
    /// The key that asked for it.
    pub owner: Option<String>,
}

impl SandboxRecord {
    /// The record of sandbox `id`, starting now from `origin`; its processes' memory
    /// cgroup is `memory_cgroup` when shared, its own otherwise.
    pub fn starting(id: SandboxId, origin: Origin, memory_cgroup: Option<String>) -> SandboxRecord {
        SandboxRecord {
            version: RECORD_VERSION,
            cgroup: format!("forkd/{id}"),
            id,
            image: origin.image,
            lowers: origin.lowers,
            base: Some(origin.base),
            owner: origin.owner,
            parent: origin.parent,
            created: super::now_secs(),
            hostname: origin.hostname,
            limits: origin.limits,
            labels: origin.labels,
            status: SandboxStatus::Running,
            init_pid: None,
            init_start: None,
            memory_cgroup,
            create_us: 0,
            config: origin.config,
            network: origin.network,
            lease: None,
            seccomp: origin.seccomp,
            setuid: origin.setuid,
            expires_at: origin.expires_at,
        }
    }
}

/// What a record written before the system-call filter existed says.
pub(crate) fn made_without_filter() -> forkd_sandbox::Seccomp {
    forkd_sandbox::Seccomp::Unconfined
}

impl SandboxRecord {
    /// Its cgroup in `hierarchy`.
    pub fn cgroup_in(&self, hierarchy: &forkd_cgroups::Hierarchy) -> Cgroup {
        Cgroup::new(hierarchy, &self.cgroup).sharing_memory(self.memory_cgroup.as_deref())
    }
}

struct Entry {
    rec: SandboxRecord,
    /// The record's description in a list (JSON), if made since it last changed.
    shown: Option<Arc<[u8]>>,
}

/// A sandbox's record and the description kept of it.
pub struct Record(Mutex<Entry>);

/// The record, locked. Reading it keeps the kept description; changing it drops it.
pub struct RecordGuard<'a>(MutexGuard<'a, Entry>);

impl Record {
    pub fn new(rec: SandboxRecord) -> Record {
        Record(Mutex::new(Entry { rec, shown: None }))
    }

    pub fn locked(&self) -> RecordGuard<'_> {
        RecordGuard(self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl RecordGuard<'_> {
    /// Waits on `cv` (the sandbox's `changed`), with the lock given up meanwhile.
    pub fn wait(self, cv: &Condvar) -> Self {
        RecordGuard(cv.wait(self.0).unwrap_or_else(PoisonError::into_inner))
    }

    /// The description kept for the record as it is now, or the one `describe` makes
    /// of it (then kept).
    pub fn shown(&mut self, describe: impl FnOnce(&SandboxRecord) -> Vec<u8>) -> Arc<[u8]> {
        let entry = &mut *self.0;
        entry
            .shown
            .get_or_insert_with(|| describe(&entry.rec).into())
            .clone()
    }
}

impl Deref for RecordGuard<'_> {
    type Target = SandboxRecord;
    fn deref(&self) -> &SandboxRecord {
        &self.0.rec
    }
}

impl DerefMut for RecordGuard<'_> {
    fn deref_mut(&mut self) -> &mut SandboxRecord {
        self.0.shown = None;
        &mut self.0.rec
    }
}

/// A running sandbox's record for unit tests: `id`, `image`, its stack `lowers`
/// (`layer:<hex>` / `checkpoint:<id>`) and its init's pid.
#[cfg(test)]
pub(crate) fn test_record(
    id: &str,
    image: &str,
    lowers: &[String],
    init_pid: Option<i32>,
) -> SandboxRecord {
    serde_json::from_value(serde_json::json!({
        "version": super::sandboxes::RECORD_VERSION,
        "id": id,
        "image": image,
        "lowers": lowers,
        "created": 1,
        "hostname": "h",
        "limits": {},
        "labels": {},
        "parent": null,
        "status": "running",
        "init_pid": init_pid,
        "init_start": init_pid.map(|_| 1),
        "cgroup": format!("forkd/{id}"),
        "create_us": 0
    }))
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> SandboxRecord {
        test_record("0123456789abcdef", "busybox", &[], Some(7))
    }

    #[test]
    fn a_description_is_kept_until_the_record_changes() {
        let r = Record::new(record());
        let made = std::cell::Cell::new(0);
        let describe = |rec: &SandboxRecord| {
            made.set(made.get() + 1);
            format!("{:?}", rec.init_pid).into_bytes()
        };
        assert_eq!(&*r.locked().shown(describe), b"Some(7)");
        // Read again, and read through the guard: kept.
        assert_eq!(r.locked().init_pid, Some(7));
        assert_eq!(&*r.locked().shown(describe), b"Some(7)");
        assert_eq!(made.get(), 1);
        // Changed: made again, once.
        r.locked().init_pid = None;
        assert_eq!(&*r.locked().shown(describe), b"None");
        assert_eq!(&*r.locked().shown(describe), b"None");
        assert_eq!(made.get(), 2);
        // A change through a `&mut` taken from the guard counts too.
        let mut g = r.locked();
        let rec: &mut SandboxRecord = &mut g;
        rec.init_pid = Some(9);
        drop(g);
        assert_eq!(&*r.locked().shown(describe), b"Some(9)");
        assert_eq!(made.get(), 3);
    }
}
