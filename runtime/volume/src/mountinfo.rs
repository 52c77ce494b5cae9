//! Which mounts exist in this process's mount namespace: [`forkd_sys::mountinfo`], with
//! this crate's errors.

use std::path::{Path, PathBuf};

pub use forkd_sys::mountinfo::Mount;

use crate::VolumeError;

fn err(e: std::io::Error) -> VolumeError {
    VolumeError::io("read", "/proc/self/mountinfo")(e)
}

/// Every mount of this mount namespace, in mount order.
pub fn mounts() -> Result<Vec<Mount>, VolumeError> {
    forkd_sys::mountinfo::mounts().map_err(err)
}

/// The topmost mount at exactly `path` (which must be canonical), if any.
pub fn mount_at(path: &Path) -> Result<Option<Mount>, VolumeError> {
    forkd_sys::mountinfo::mount_at(path).map_err(err)
}

/// Mount points strictly below `path` (which must be canonical).
pub fn mounts_below(path: &Path) -> Result<Vec<PathBuf>, VolumeError> {
    forkd_sys::mountinfo::mounts_below(path).map_err(err)
}
