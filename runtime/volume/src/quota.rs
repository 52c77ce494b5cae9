//! Disk limits of single subvolumes: btrfs's simple quotas (Linux 6.7).
//!
//! With simple quotas every extent is charged to the subvolume that wrote it, for as long
//! as the extent exists, whoever shares it later. That is the charge forkd wants: a
//! sandbox's writable layer pays for what its processes wrote; a checkpoint (a snapshot,
//! or reflinked copies) and the layers under the overlay cost it nothing, and a branch's
//! layer pays only for what the branch writes (a copy-up from a lower layer is a reflink
//! on the same volume). Data a sandbox wrote stays charged to it while a checkpoint of it
//! still holds the data, even once the sandbox deleted its copy.
//!
//! Full qgroups (older kernels) account by walking every extent's back-references on
//! each commit, which slows snapshot creation and removal with the number of snapshots;
//! simple quotas only add the charge where an extent is allocated or freed. forkd uses
//! simple quotas only; without them a disk limit is refused by name.
//!
//! Past its limit a write fails with `EDQUOT` ("Disk quota exceeded"), btrfs's errno for
//! a quota, in that subvolume only.

use crate::{Volume, VolumeError};
use std::fs::{self, File};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// The first Linux with btrfs simple quotas.
pub const SIMPLE_QUOTAS_KERNEL: (u32, u32) = (6, 7);

/// A subvolume's charge and limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUse {
    pub used_bytes: u64,
    pub limit_bytes: Option<u64>,
}

impl Volume {
    /// Turns simple quotas on (idempotent), or says why they cannot be.
    pub fn enable_quotas(&self) -> Result<(), String> {
        // btrfs's own list of features is asked (a distribution kernel may carry simple
        // quotas back); the version names what is missing.
        let release = forkd_sys::mount::kernel_release();
        let old =
            forkd_sys::mount::kernel_version(&release).is_some_and(|v| v < SIMPLE_QUOTAS_KERNEL);
        let lacking = || {
            format!(
                "disk limits need Linux {}.{} (btrfs simple quotas); this kernel is {release}",
                SIMPLE_QUOTAS_KERNEL.0, SIMPLE_QUOTAS_KERNEL.1
            )
        };
        let listed = forkd_sys::probe::btrfs_simple_quotas();
        if !listed.unwrap_or(!old) {
            return Err(lacking());
        }
        if self.quota_mode().as_deref() == Some("squota") {
            return Ok(());
        }
        if let Some(mode) = self.quota_mode().filter(|m| m != "disabled") {
            return Err(format!(
                "disk limits need btrfs simple quotas, and {} has quotas in mode {mode}",
                self.root.display()
            ));
        }
        let dir =
            File::open(&self.root).map_err(|e| format!("open {}: {e}", self.root.display()))?;
        forkd_sys::btrfs::enable_simple_quotas(dir.as_fd()).map_err(|e| {
            if old && listed.is_none() {
                return lacking();
            }
            format!(
                "disk limits are unavailable: enabling btrfs simple quotas on {} failed: {e}",
                self.root.display()
            )
        })
    }

    /// Sets (or, with `None`, clears) the disk limit of the subvolume at `path`.
    pub fn set_disk_limit(&self, path: &Path, bytes: Option<u64>) -> Result<(), VolumeError> {
        let dir = File::open(path).map_err(VolumeError::io("open", path))?;
        forkd_sys::btrfs::set_quota_limit(dir.as_fd(), bytes)
            .map_err(VolumeError::io("set the disk limit of", path))
    }

    /// Writes the volume's dirty data out and commits its transaction (`syncfs`), so that
    /// the charges `disk_use` reads are current: btrfs charges a write to its subvolume
    /// only once the data is allocated and the transaction that allocated it commits, up
    /// to 30 seconds later, and a fast writer can fill gigabytes in that time.
    pub fn settle_charges(&self) -> Result<(), VolumeError> {
        let dir = File::open(&self.root).map_err(VolumeError::io("open", &self.root))?;
        nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir))
            .map_err(|e| VolumeError::io("sync", &self.root)(e.into()))
    }

    /// What the subvolume at `path` is charged, and its limit; `None` without quotas.
    pub fn disk_use(&self, path: &Path) -> Option<DiskUse> {
        let dir = File::open(path).ok()?;
        let id = forkd_sys::btrfs::subvolume_id(dir.as_fd()).ok()?;
        let q = self.sysfs_dir()?.join("qgroups").join(format!("0_{id}"));
        let read = |name: &str| -> Option<u64> {
            fs::read_to_string(q.join(name)).ok()?.trim().parse().ok()
        };
        let used_bytes = read("exclusive")?;
        let limit_bytes = read("max_exclusive").filter(|&l| l != 0 && l != u64::MAX);
        Some(DiskUse {
            used_bytes,
            limit_bytes,
        })
    }

    /// btrfs's quota mode here (`squota`, `qgroup`, `disabled`), from sysfs.
    fn quota_mode(&self) -> Option<String> {
        let dir = self.sysfs_dir()?.join("qgroups");
        if !dir.exists() {
            return Some("disabled".into());
        }
        Some(
            fs::read_to_string(dir.join("mode"))
                .map(|m| m.trim().to_string())
                .unwrap_or_else(|_| "qgroup".into()),
        )
    }

    /// `/sys/fs/btrfs/<uuid>` of this volume's filesystem.
    pub(crate) fn sysfs_dir(&self) -> Option<PathBuf> {
        self.sysfs
            .get_or_init(|| crate::sysfs_dir_of(&self.root))
            .clone()
    }
}
