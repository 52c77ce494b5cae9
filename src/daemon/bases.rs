//! Bases: a layer stack merged into one btrfs subvolume, the one lower layer of every
//! sandbox over that stack, so that no two different files in a sandbox share a device
//! and inode number.
//!
//! # Why
//!
//! overlayfs reports a file's own inode number when every layer is on one filesystem,
//! trusting that filesystem to number its files uniquely. btrfs numbers each subvolume's
//! inodes on its own (from 256), and its subvolumes share one superblock, so a stack of
//! store layers, checkpoint snapshots and a fresh writable subvolume showed different
//! files under one `(st_dev, st_ino)`: glibc's loader took one library for another, `cp`
//! refused to copy "the same file", `tar` made hard links of strangers.
//!
//! # How
//!
//! A base is `<data>/bases/<id>/`, a read-only subvolume holding `tree/`, the merged
//! view of a stack (store layers and checkpoint layers, topmost first), and `base.json`
//! (the stack). It is made once from the base of the stack below its top (a snapshot of
//! it, O(1)) with the top layer applied ([`forkd_layers::copy::apply_layer`]: contents
//! reflinked), or from an empty subvolume for a stack of one; its id is a hash of the
//! stack. A sandbox's writable layer is then a *snapshot of its base*, not an empty
//! subvolume: btrfs numbers new inodes of a subvolume above the highest it holds, so
//! every file the sandbox makes is numbered above every file of its lower layer, and
//! all of them are in one numbering. The copy of `tree/` in the sandbox's layer is never
//! read (the overlay's lower is the base's own `tree/`, so the page cache holds one copy
//! of an image's files for every sandbox); it only keeps that floor across remounts,
//! which renumber from the highest inode a subvolume holds. A checkpoint's snapshot of
//! the layer keeps the numbers too, so a branch whose layer is a snapshot of it sees
//! every file under the number it had in the checkpointed sandbox.
//!
//! Bases are shared: every sandbox of an image, and every branch of its checkpoints,
//! stands on the same one. A base is removed by `gc` once no sandbox or checkpoint
//! names it.

use super::{log, Lock};
use crate::api::ApiError;
use forkd_layers::LayerId;
use forkd_sandbox::CheckpointId;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Instant;

/// One layer of an overlay stack: a layer of the content-addressed store, or the
/// filesystem snapshot of a checkpoint. Written as `layer:<hex>` / `checkpoint:<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Lower {
    Layer(LayerId),
    Checkpoint(CheckpointId),
}

impl FromStr for Lower {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("layer", id)) => id.parse().map(Lower::Layer).map_err(|e| format!("{e}")),
            Some(("checkpoint", id)) => {
                id.parse().map(Lower::Checkpoint).map_err(|e| e.to_string())
            }
            _ => Err(format!("invalid layer reference {s:?}")),
        }
    }
}

impl TryFrom<String> for Lower {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Lower> for String {
    fn from(l: Lower) -> String {
        l.to_string()
    }
}

impl std::fmt::Display for Lower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lower::Layer(id) => write!(f, "layer:{id}"),
            Lower::Checkpoint(id) => write!(f, "checkpoint:{id}"),
        }
    }
}

const RECORD_VERSION: u32 = 1;
const TREE: &str = "tree";
const RECORD: &str = "base.json";
const STAGE_PREFIX: &str = ".stage-";

/// A base's id: the SHA-256 of its stack (`forkd-base-v1`, then each layer reference on
/// a line of its own, topmost first), as 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BaseId(String);

impl BaseId {
    /// The id of the base of `stack`.
    pub fn of(stack: &[Lower]) -> BaseId {
        let mut h = Sha256::new();
        h.update(b"forkd-base-v1\n");
        for l in stack {
            h.update(l.to_string().as_bytes());
            h.update(b"\n");
        }
        BaseId(format!("{:x}", h.finalize()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for BaseId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(BaseId(s))
        } else {
            Err(format!(
                "invalid base id {s:?}: want 64 lowercase hex digits"
            ))
        }
    }
}

impl From<BaseId> for String {
    fn from(b: BaseId) -> String {
        b.0
    }
}

impl std::fmt::Display for BaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What `base.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BaseRecord {
    version: u32,
    id: BaseId,
    /// The merged stack, topmost first.
    stack: Vec<Lower>,
    created: u64,
}

/// The bases of a state root.
pub struct Bases {
    dir: PathBuf,
    /// Held while a base is made, so that two requests for one stack make it once.
    making: Mutex<()>,
    /// Bases that requests in flight are making sandboxes on, before any record names
    /// them: `gc` leaves them alone (see [`Pinned`]).
    pins: Mutex<std::collections::HashMap<BaseId, usize>>,
}

/// A base a request stands on until its sandbox's record is in the table; while it is
/// held, `gc` does not remove the base.
pub struct Pinned<'a> {
    bases: &'a Bases,
    pub id: BaseId,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        let mut pins = self.bases.pins.locked();
        if let Some(n) = pins.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.id);
            }
        }
    }
}

impl Bases {
    /// Opens `<data>/bases`, removing the stages of bases an earlier daemon left half
    /// made.
    pub fn open(dir: PathBuf, volume: &forkd_volume::Volume) -> Result<Bases, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(STAGE_PREFIX)
            {
                let path = entry.path();
                log::info(&format!("removing half-made base {}", path.display()));
                if let Err(e) = volume.delete_subvolume(&path) {
                    log::warn(&format!("remove {}: {e}", path.display()));
                }
            }
        }
        Ok(Bases {
            dir,
            making: Mutex::new(()),
            pins: Mutex::new(Default::default()),
        })
    }

    /// The subvolume of base `id` (a sandbox's layer is a snapshot of it).
    pub fn subvolume(&self, id: &BaseId) -> PathBuf {
        self.dir.join(id.as_str())
    }

    /// The merged tree of base `id`: the overlay's lower layer.
    pub fn tree(&self, id: &BaseId) -> PathBuf {
        self.subvolume(id).join(TREE)
    }

    pub fn exists(&self, id: &BaseId) -> bool {
        self.subvolume(id).join(RECORD).is_file()
    }

    /// The stack base `id` merges, topmost first.
    pub fn stack(&self, id: &BaseId) -> Result<Vec<Lower>, ApiError> {
        let path = self.subvolume(id).join(RECORD);
        let bytes = std::fs::read(&path)
            .map_err(|e| ApiError::internal(format!("base {id}: read {}: {e}", path.display())))?;
        let rec: BaseRecord = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::internal(format!("base {id}: {}: {e}", path.display())))?;
        Ok(rec.stack)
    }

    /// The base of `stack`, made now if it does not exist yet (with the bases of the
    /// stacks below it, each from the one below), pinned for the caller. `path_of`
    /// gives a layer's directory.
    pub fn ensure(
        &self,
        volume: &forkd_volume::Volume,
        stack: &[Lower],
        path_of: &dyn Fn(&Lower) -> PathBuf,
    ) -> Result<Pinned<'_>, ApiError> {
        // Pinned before it is looked for: `remove` checks the pins and deletes under one
        // lock, so a base found here stays.
        let pinned = self.pin(BaseId::of(stack));
        if !self.exists(&pinned.id) {
            let _making = self.making.locked();
            self.make(volume, stack, path_of)?;
        }
        Ok(pinned)
    }

    /// Pins base `id` (which may not exist yet).
    pub fn pin(&self, id: BaseId) -> Pinned<'_> {
        *self.pins.locked().entry(id.clone()).or_default() += 1;
        Pinned { bases: self, id }
    }

    /// Makes the base of `stack` unless it exists; `making` is held.
    fn make(
        &self,
        volume: &forkd_volume::Volume,
        stack: &[Lower],
        path_of: &dyn Fn(&Lower) -> PathBuf,
    ) -> Result<BaseId, ApiError> {
        let id = BaseId::of(stack);
        if self.exists(&id) {
            return Ok(id);
        }
        let Some((top, below)) = stack.split_first() else {
            return Err(ApiError::internal("a base needs at least one layer"));
        };
        let started = Instant::now();
        let stage = self.dir.join(format!("{STAGE_PREFIX}{id}"));
        let fail = |step: &str, e: &dyn std::fmt::Display| {
            ApiError::internal(format!("base {id} (top layer {top}): {step}: {e}"))
        };
        // A stage left by a failure of this daemon.
        volume
            .delete_subvolume(&stage)
            .map_err(|e| fail("remove the old stage", &e))?;
        let res = (|| {
            if below.is_empty() {
                volume
                    .create_subvolume(&stage)
                    .map_err(|e| fail("create subvolume", &e))?;
                let tree = stage.join(TREE);
                std::fs::create_dir(&tree)
                    .map_err(|e| fail(&format!("create {}", tree.display()), &e))?;
            } else {
                let parent = self.make(volume, below, path_of)?;
                volume
                    .snapshot(&self.subvolume(&parent), &stage)
                    .map_err(|e| fail(&format!("snapshot base {parent}"), &e))?;
                let old = stage.join(RECORD);
                std::fs::remove_file(&old)
                    .map_err(|e| fail(&format!("remove {}", old.display()), &e))?;
            }
            let src = path_of(top);
            let mut entries = 0u64;
            let mut report = |p: forkd_layers::Progress| {
                if let forkd_layers::Progress::Files(n) = p {
                    entries = n;
                    if n > 0 && n % forkd_layers::REPORT_EVERY == 0 {
                        log::info(&format!(
                            "base {}: applying {top}: {n} entries",
                            &id.0[..12]
                        ));
                    }
                }
            };
            forkd_layers::copy::apply_layer(&src, &stage.join(TREE), &mut report)
                .map_err(|e| ApiError::from_chain(&format!("base {id}: apply {top}"), &e))?;
            let rec = BaseRecord {
                version: RECORD_VERSION,
                id: id.clone(),
                stack: stack.to_vec(),
                created: super::now_secs(),
            };
            super::write_json_atomic(&stage, RECORD, &rec, super::Survive::DaemonCrash)?;
            volume
                .set_readonly(&stage)
                .map_err(|e| fail("make read-only", &e))?;
            std::fs::rename(&stage, self.subvolume(&id))
                .map_err(|e| fail(&format!("rename {} into place", stage.display()), &e))?;
            Ok(entries)
        })();
        match res {
            Ok(entries) => {
                log::info(&format!(
                    "base {}: {} layer(s), {top} applied ({entries} entries) in {} ms",
                    &id.0[..12],
                    stack.len(),
                    started.elapsed().as_millis()
                ));
                Ok(id)
            }
            Err(e) => {
                if let Err(c) = volume.delete_subvolume(&stage) {
                    log::warn(&format!("remove {}: {c}", stage.display()));
                }
                Err(e)
            }
        }
    }

    /// Every base on disk.
    pub fn list(&self) -> Vec<BaseId> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| BaseId::try_from(e.file_name().to_string_lossy().to_string()).ok())
            .collect()
    }

    /// Removes base `id` unless a request in flight has it pinned or `named(id)` says a
    /// record names it (`Ok(false)`). Both are asked under the lock a pin takes, so a
    /// request that made its sandbox on the base since the caller last looked is seen
    /// either way. Sandboxes made from a base keep their own snapshots, but its tree is
    /// their lower layer: only a base nothing names may go.
    pub fn remove(
        &self,
        volume: &forkd_volume::Volume,
        id: &BaseId,
        named: impl Fn(&BaseId) -> bool,
    ) -> Result<bool, ApiError> {
        let _making = self.making.locked();
        let pins = self.pins.locked();
        if pins.contains_key(id) || named(id) {
            return Ok(false);
        }
        volume
            .delete_subvolume(&self.subvolume(id))
            .map_err(|e| ApiError::from_chain(&format!("remove base {id}"), &e))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_the_stack_in_order() {
        let a: Lower = "layer:0000000000000000000000000000000000000000000000000000000000000001"
            .parse()
            .unwrap();
        let b: Lower = "layer:0000000000000000000000000000000000000000000000000000000000000002"
            .parse()
            .unwrap();
        let ab = BaseId::of(&[a.clone(), b.clone()]);
        assert_eq!(ab, BaseId::of(&[a.clone(), b.clone()]));
        assert_ne!(ab, BaseId::of(&[b.clone(), a.clone()]));
        assert_ne!(ab, BaseId::of(&[a]));
        assert_eq!(ab.as_str().len(), 64);
        assert!(BaseId::try_from("../x".to_string()).is_err());
        assert!(BaseId::try_from(ab.to_string()).is_ok());
    }
}
