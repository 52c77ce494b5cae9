//! Checkpoints and forks.
//!
//! A checkpoint seals a sandbox's state without copying it:
//! - the filesystem: the sandbox's upper layer is a btrfs subvolume; a read-only
//!   snapshot of it (O(1), whatever its size) becomes the checkpoint's own layer, taken
//!   while every process of the sandbox is frozen. The sandbox goes on writing into its
//!   upper, which from then on holds exactly what a fresh upper over the snapshot would;
//! - with `live`, the process tree: CRIU dumps it (frozen through the cgroup freezer) and
//!   the snapshot is taken in CRIU's post-dump notification, while the tree is still
//!   frozen, so memory and files are of the same instant.
//!
//! On disk: `<data>/checkpoints/<id>/{meta.json, fs/ (the snapshot of the sandbox's
//! writable layer; `fs/upper` is the checkpoint's overlay layer), criu/ (images)}`.
//! A checkpoint is assembled in `.stage-<id>` and renamed into place at the end, so a
//! failed checkpoint leaves nothing; recovery removes stale stages.
//!
//! A fork makes N branch sandboxes: each gets a fresh upper subvolume over the
//! checkpoint's layer stack and, for a live checkpoint, the process tree restored by CRIU
//! into new namespaces and its own cgroup (eagerly, or lazily through userfaultfd).
//!
//! One file per verb: `create.rs` (checkpoint a sandbox), `fork.rs`, `remove.rs`,
//! `delta.rs` (what a checkpoint's sandbox changed);
//! `tree.rs` reads what a process tree must not be doing when it is dumped; `hash.rs`
//! computes a checkpoint's tree hash after it is made. This file holds the record, the
//! table and what the verbs share (lookups, recovery at start-up, the squash).

pub use super::bases::Lower;
use super::{log, Daemon, Lock};
use crate::api::{ApiError, CheckpointInfo, Limits};
use forkd_layers::LayerId;
use forkd_sandbox::{CheckpointId, SandboxId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const RECORD_VERSION: u32 = 1;

/// The key under which a dump marks a sandbox's `/sys` as external and a restore binds
/// the daemon's sysfs there (`Daemon::sysfs`).
const SYSFS_KEY: &str = "forkd-sysfs";

mod create;
mod delta;
mod fork;
mod hash;
mod remove;
mod resume;
mod tree;

/// The deepest layer stack a checkpoint may have before it is squashed (overlayfs takes
/// at most 500 lower layers; `FORKD_MAX_LAYERS`, `max_layers` here, lowers the bound). On a
/// kernel without `lowerdir+` one overlay takes at most
/// [`forkd_sys::lowerdir::MAX_LINKED_LOWERS`], which then bounds it too.
fn max_stack(max_layers: usize) -> usize {
    let n = max_layers;
    match forkd_sys::mount::lower_mode() {
        forkd_sys::mount::LowerMode::Links => n.min(forkd_sys::lowerdir::MAX_LINKED_LOWERS),
        forkd_sys::mount::LowerMode::Append => n,
    }
}

/// What `meta.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub version: u32,
    pub id: CheckpointId,
    pub parent: Option<CheckpointId>,
    pub sandbox: SandboxId,
    pub image: String,
    pub hostname: String,
    pub limits: Limits,
    /// The checkpointed root's layers, topmost first; the first is this checkpoint's own.
    pub lowers: Vec<Lower>,
    /// The checkpointed sandbox's base (see `super::bases`): the stack below this
    /// checkpoint's own layer, which that layer was made over. None for a checkpoint made
    /// before bases, or imported: its branches stand on the base of its whole stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<crate::daemon::bases::BaseId>,
    pub live: bool,
    pub created: u64,
    pub labels: BTreeMap<String, String>,
    /// The API key that made it (its id); none when the node's operator did, or it was
    /// imported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Tree hash of this checkpoint's own layer (computed after creation).
    #[serde(default)]
    pub fs_hash: Option<String>,
    /// SHA-256 over the tree hashes of all layers, topmost first.
    #[serde(default)]
    pub tree_hash: Option<String>,
    pub phases_us: BTreeMap<String, u64>,
    pub images_bytes: u64,
    /// The source sandbox's image config, which its branches keep.
    #[serde(default)]
    pub config: forkd_layers::ImageConfig,
    /// The source sandbox's network mode and lease when it was checkpointed: its branches
    /// get the same policy, each with an address of its own.
    #[serde(default)]
    pub network: forkd_net::Network,
    #[serde(default)]
    pub lease: Option<forkd_net::Lease>,
    /// The source sandbox's system-call filter, which its branches keep.
    #[serde(default = "crate::daemon::record::made_without_filter")]
    pub seccomp: forkd_sandbox::Seccomp,
    /// Whether its setuid programs took effect, which its branches keep.
    #[serde(default)]
    pub setuid: bool,
}

pub struct Checkpoint {
    pub id: CheckpointId,
    pub dir: PathBuf,
    pub record: Mutex<CheckpointRecord>,
    /// Set (under the record's lock) when the checkpoint is being removed.
    pub removed: std::sync::atomic::AtomicBool,
    /// Requests reading its files (forks, exports), and whether a removal has begun:
    /// both changed under the record's lock, so that a removal never deletes files a
    /// fork is restoring from (see [`Checkpoint::use_for`]).
    users: std::sync::atomic::AtomicUsize,
    removing: std::sync::atomic::AtomicBool,
}

/// A request reading a checkpoint's files; the checkpoint cannot be removed while one
/// is held.
pub struct InUse<'a>(&'a Checkpoint);

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        self.0
            .users
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Checkpoint {
    pub fn new(dir: PathBuf, record: CheckpointRecord) -> Checkpoint {
        Checkpoint {
            id: record.id.clone(),
            dir,
            record: Mutex::new(record),
            removed: Default::default(),
            users: Default::default(),
            removing: Default::default(),
        }
    }

    /// Marks the checkpoint as read by a request (`what`: "fork", "export") until the
    /// guard is dropped; refused once its removal has begun.
    pub fn use_for(&self, what: &str) -> Result<InUse<'_>, ApiError> {
        use std::sync::atomic::Ordering::SeqCst;
        let _rec = self.record.locked();
        if self.removing.load(SeqCst) {
            return Err(ApiError::conflict(format!(
                "checkpoint {} is being removed: no {what} of it can start",
                self.id
            )));
        }
        self.users.fetch_add(1, SeqCst);
        Ok(InUse(self))
    }

    /// Begins a removal: refused while a request reads the checkpoint's files.
    fn begin_removal(&self) -> Result<(), ApiError> {
        use std::sync::atomic::Ordering::SeqCst;
        let _rec = self.record.locked();
        let users = self.users.load(SeqCst);
        if users > 0 {
            return Err(ApiError::conflict(format!(
                "checkpoint {} is in use by {users} fork or export request(s) in flight: remove it once they return",
                self.id
            )));
        }
        if self.removing.swap(true, SeqCst) {
            return Err(ApiError::conflict(format!(
                "checkpoint {} is already being removed",
                self.id
            )));
        }
        Ok(())
    }

    /// The checkpoint's own overlay layer.
    pub fn fs(&self) -> PathBuf {
        self.dir.join("fs/upper")
    }
    pub fn images(&self) -> PathBuf {
        self.dir.join("criu")
    }

    /// The tasks (threads) a branch of it starts with: one CRIU core image each; one (an
    /// init) for a checkpoint without processes.
    pub fn tasks(&self) -> usize {
        std::fs::read_dir(self.images())
            .map(|rd| {
                rd.flatten()
                    .filter(|e| {
                        let n = e.file_name();
                        let n = n.to_string_lossy();
                        n.starts_with("core-") && n.ends_with(".img")
                    })
                    .count()
            })
            .unwrap_or(0)
            .max(1)
    }
}

impl Daemon {
    /// The directory of a layer of an overlay stack.
    pub fn lower_path(&self, l: &Lower) -> PathBuf {
        match l {
            Lower::Layer(id) => self.images.layers.path(id),
            Lower::Checkpoint(id) => self
                .node
                .data
                .join("checkpoints")
                .join(id.as_str())
                .join("fs/upper"),
        }
    }

    /// Sandboxes whose layer stack uses checkpoint `id`.
    fn branches_of(&self, id: &CheckpointId) -> Vec<String> {
        self.sandboxes.table.locked().over_checkpoint(id)
    }

    /// Checkpoints stacked on checkpoint `id`.
    fn children_of(&self, id: &CheckpointId) -> Vec<String> {
        let mut out: Vec<String> = self
            .checkpoints
            .table
            .locked()
            .values()
            .filter(|c| {
                c.id != *id
                    && c.record
                        .locked()
                        .lowers
                        .contains(&Lower::Checkpoint(id.clone()))
            })
            .map(|c| c.id.to_string())
            .collect();
        out.sort();
        out
    }

    pub fn checkpoint_info(&self, c: &Checkpoint) -> CheckpointInfo {
        let r = c.record.locked().clone();
        CheckpointInfo {
            branches: self.branches_of(&c.id),
            id: r.id.to_string(),
            parent: r.parent.map(|p| p.to_string()),
            sandbox: r.sandbox.to_string(),
            image: r.image,
            live: r.live,
            created: r.created,
            labels: r.labels,
            layers: r.lowers.iter().map(|l| l.to_string()).collect(),
            tree_hash: r.tree_hash,
            phases_us: r.phases_us,
            images_bytes: r.images_bytes,
        }
    }

    pub fn list_checkpoints(&self, viewer: Option<&str>) -> Vec<CheckpointInfo> {
        let all: Vec<Arc<Checkpoint>> = self
            .checkpoints
            .table
            .locked()
            .values()
            .filter(|c| crate::daemon::visible(viewer, c.record.locked().owner.as_deref()))
            .cloned()
            .collect();
        let mut out: Vec<CheckpointInfo> = all.iter().map(|c| self.checkpoint_info(c)).collect();
        out.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        out
    }

    /// The error of a CRIU dump or restore, by what went wrong, the same for both: CRIU
    /// ran and refused this process tree (what it holds, or where it is brought back),
    /// which the caller can act on, is `bad_request`, as the API documents; CRIU that hung,
    /// crashed or could not be driven is the host's problem, `internal`. The log is copied
    /// where it outlives the operation (`log` as `kept_as` in the data directory's
    /// `logs/`) and named in the message.
    fn criu_failed(
        &self,
        what: String,
        e: &forkd_criu::CriuError,
        log: &Path,
        kept_as: &str,
    ) -> ApiError {
        let dest = self.node.data.join("logs").join(kept_as);
        // The log is named where it is kept: the staging directory is gone by now.
        let message = match std::fs::copy(log, &dest) {
            Ok(_) => format!(
                "{what}: {}",
                e.to_string().replace(
                    &format!("(log {})", log.display()),
                    &format!("(log kept at {})", dest.display())
                )
            ),
            Err(_) => format!("{what}: {e}"),
        };
        match e {
            forkd_criu::CriuError::Failed { .. } => ApiError::bad_request(message),
            _ => ApiError::internal(message),
        }
    }

    fn delete_checkpoint_dir(&self, dir: &Path) {
        if let Some(id) = dir.file_name().and_then(|n| n.to_str()) {
            self.checkpoints.templates.forget(id);
        }
        self.images.spare_layers.forget(&dir.join("fs"));
        if let Err(e) = self.node.volume.delete_subvolume(&dir.join("fs")) {
            log::warn(&format!("delete {}: {e}", dir.join("fs").display()));
        }
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn(&format!("remove {}: {e}", dir.display()));
            }
        }
    }

    /// Loads checkpoints at start-up; removes stages of checkpoints never finished.
    pub fn recover_checkpoints(self: &Arc<Self>) -> Result<(), ApiError> {
        let dir = self.node.data.join("checkpoints");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| ApiError::internal(format!("read {}: {e}", dir.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with(".stage-") {
                log::info(&format!(
                    "removing unfinished checkpoint {}",
                    path.display()
                ));
                self.delete_checkpoint_dir(&path);
                continue;
            }
            let Ok(id) = name.parse::<CheckpointId>() else {
                continue;
            };
            let rec = std::fs::read(path.join("meta.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<CheckpointRecord>(&b).ok())
                .filter(|r| r.id == id && r.version == RECORD_VERSION);
            let Some(rec) = rec else {
                log::warn(&format!("ignoring {}: no valid meta.json", path.display()));
                continue;
            };
            let missing_hash = rec.tree_hash.is_none();
            let c = Arc::new(Checkpoint::new(path, rec));
            self.checkpoints.table.locked().insert(id, c.clone());
            if missing_hash {
                self.hash_in_background(c);
            }
        }
        Ok(())
    }

    /// Flattens a layer stack into one layer of the store: the merged view of the stack,
    /// mounted read-only, is copied in (its whiteouts are already applied there).
    fn squash(&self, lowers: &[Lower]) -> Result<LayerId, ApiError> {
        let paths: Vec<PathBuf> = lowers.iter().map(|l| self.lower_path(l)).collect();
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        // The stack as a detached mount, read through its descriptor: it never appears
        // in a mount table.
        let mnt = if refs.len() == 1 {
            None
        } else {
            Some(
                forkd_sys::mount::overlay(&refs, None)
                    .map_err(|e| ApiError::internal(format!("mount stack to squash: {e}")))?,
            )
        };
        let src = match &mnt {
            Some(m) => forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(m)),
            None => paths[0].clone(),
        };
        self.images
            .layers
            .import_dir(&src, &mut |_| {})
            .map_err(|e| ApiError::from_chain("squash layers", &e))
    }
}
