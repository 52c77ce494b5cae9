//! The volume's error type. Every I/O error carries the step that failed and the path it
//! failed on; a failed program carries its command line and standard error. Messages
//! never repeat their `#[source]`, because callers print the whole chain.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use thiserror::Error;

/// Errors of opening, using and unmounting a [`crate::Volume`].
#[derive(Debug, Error)]
pub enum VolumeError {
    #[error("{step} {}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{program} not found: run `fixtures/setup.sh packages` (it installs {package})")]
    MissingTool {
        program: &'static str,
        package: &'static str,
    },
    #[error("cannot start `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Program {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error(
        "the volume image {} is not allocated under its filesystem ({} MiB missing, {} MiB free on the disk): a full disk would make the volume read-only; free space on that disk or set FORKD_VOLUME_SIZE lower for a new volume",
        image.display(), missing >> 20, free >> 20
    )]
    Unbacked {
        image: PathBuf,
        missing: u64,
        free: u64,
    },
    #[error(
        "the disk under {} can give the volume {} MiB (its free space less FORKD_HOST_RESERVE); a new volume needs {} MiB",
        dir.display(), budget >> 20, need >> 20
    )]
    NoRoom {
        dir: PathBuf,
        budget: u64,
        need: u64,
    },
    #[error("{} is a {fstype} mount, not btrfs", path.display())]
    NotBtrfs { path: PathBuf, fstype: String },
    #[error("{} is not in the volume at {}", path.display(), volume.display())]
    OutsideVolume { path: PathBuf, volume: PathBuf },
    #[error("{} is not a btrfs subvolume", path.display())]
    NotSubvolume { path: PathBuf },
    #[error(
        "cannot unmount {}: mounts below it are still active: {}",
        path.display(),
        join_paths(mounts)
    )]
    Busy { path: PathBuf, mounts: Vec<PathBuf> },
    #[error("loop device {device} still holds {} after unmounting", image.display())]
    LoopStillAttached { device: String, image: PathBuf },
}

impl VolumeError {
    pub(crate) fn io(
        step: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| VolumeError::Io { step, path, source }
    }
}

fn join_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
