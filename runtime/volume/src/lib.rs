//! The btrfs volume that holds forkd's writable layers and checkpoints.
//!
//! A filesystem checkpoint must cost the same whatever a sandbox has written. So every
//! writable overlay layer lives in a btrfs subvolume, and a checkpoint is a read-only
//! snapshot of it: the kernel shares the tree copy-on-write, in constant time. A branch
//! then mounts an overlay whose lower layers are the snapshot and the older layers under
//! it, with a fresh subvolume on top.
//!
//! Where the volume comes from, in the order [`Volume::open`] tries:
//! 1. `<state root>/vol` is already a btrfs mount (a second open, or a restart): reuse it.
//! 2. The state root itself is on btrfs: use it directly.
//! 3. Otherwise an image `<state root>/volume.img` as long as the most the volume may
//!    grow to (`FORKD_VOLUME_SIZE`, default 256G), formatted with `mkfs.btrfs` at a
//!    smaller size and allocated up to it, then loop-mounted at `<state root>/vol` with
//!    `loop,nodiscard,noatime`; the filesystem grows as the image is allocated further,
//!    and only while the disk under it has room (`space`), so a full disk gives
//!    writers `ENOSPC` instead of turning the volume read-only.
//!
//! The image is formatted under a temporary name and renamed into place only after
//! `mkfs.btrfs` succeeded and the file was synced, so an image left by a crash half-way
//! is never mounted: it is found by its name (or by a missing btrfs signature) and
//! made again.
//!
//! Overlayfs copies a file up by creating it in the work directory and renaming it into
//! the upper directory, and btrfs refuses renames between subvolumes (`EXDEV`). So an
//! overlay's upper and work directories must be two directories inside one subvolume
//! (e.g. `<layer>/upper` and `<layer>/work`), and the branch above a checkpoint uses
//! `<snapshot>/upper` as its lower layer.

#![forbid(unsafe_code)]

mod error;
mod image;
pub mod mountinfo;
mod quota;
mod space;

use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use forkd_sys::btrfs;
use nix::fcntl::{Flock, FlockArg};

pub use error::VolumeError;
use image::{
    bdi_of_device, image_is_formatted, loop_backing_file, loop_devices_of, make_image, sysfs_dir_of,
};
pub use image::{bdi_of_mount, device_errors};
pub use quota::{DiskUse, SIMPLE_QUOTAS_KERNEL};
pub use space::{mib, Ahead, Space, HOST_RESERVE_ENV, INITIAL_SIZE};

/// Environment variable with the size of a new volume image.
pub const SIZE_ENV: &str = "FORKD_VOLUME_SIZE";
/// Size of a new volume image when [`SIZE_ENV`] is not set.
pub const DEFAULT_SIZE: &str = "256G";
/// Environment variable bounding the volume's dirty data (see [`Volume::tune`]).
pub const DIRTY_ENV: &str = "FORKD_DIRTY_LIMIT";
/// The bound when [`DIRTY_ENV`] is not set.
pub const DEFAULT_DIRTY: &str = "32M";

/// What the caller decides about the volume (the daemon from its settings:
/// `FORKD_VOLUME_SIZE`, `FORKD_DIRTY_LIMIT`, `FORKD_HOST_RESERVE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The most a new image may grow to.
    pub size: u64,
    /// The dirty data the loop device may hold (0: no bound).
    pub dirty: u64,
    /// The disk space left free under the image; `None`: 5% of the disk, at most 1 GiB.
    pub host_reserve: Option<u64>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            size: parse_size(DEFAULT_SIZE).expect("the default size parses"),
            dirty: parse_size(DEFAULT_DIRTY).expect("the default bound parses"),
            host_reserve: None,
        }
    }
}

const IMAGE_NAME: &str = "volume.img";
const MOUNT_DIR: &str = "vol";
const LOCK_NAME: &str = "volume.lock";
/// The btrfs signature `_BHRfS_M` sits at offset 0x40 of the superblock, which sits at
/// 64 KiB.
const SIGNATURE_OFFSET: u64 = 0x1_0040;
const SIGNATURE: &[u8; 8] = b"_BHRfS_M";

/// The btrfs filesystem under a state root.
#[derive(Debug, Clone)]
pub struct Volume {
    /// Where the btrfs filesystem is: `<state root>/vol`, or the state root itself.
    root: PathBuf,
    /// The image behind the loop mount at `root`, when forkd made that mount.
    loop_image: Option<PathBuf>,
    /// `/sys/fs/btrfs/<uuid>` of the filesystem, found once (`quota`).
    sysfs: std::sync::OnceLock<Option<PathBuf>>,
    settings: Settings,
}

impl Volume {
    /// Opens (and if needed creates and mounts) the btrfs volume for `state_root`.
    /// Idempotent: opening again reuses the mount.
    pub fn open(state_root: &Path, settings: &Settings) -> Result<Volume, VolumeError> {
        fs::create_dir_all(state_root).map_err(VolumeError::io("create", state_root))?;
        // mountinfo lists canonical paths.
        let state_root =
            fs::canonicalize(state_root).map_err(VolumeError::io("resolve", state_root))?;
        let lock_path = state_root.join(LOCK_NAME);
        let lock_file = File::create(&lock_path).map_err(VolumeError::io("create", &lock_path))?;
        // Two opens of one state root must not both format and mount the image.
        let _lock = Flock::lock(lock_file, FlockArg::LockExclusive).map_err(|(_, errno)| {
            VolumeError::io("lock", &lock_path)(io::Error::from_raw_os_error(errno as i32))
        })?;

        let mount_dir = state_root.join(MOUNT_DIR);
        let image = state_root.join(IMAGE_NAME);
        if let Some(mount) = mountinfo::mount_at(&mount_dir)? {
            if mount.fstype != "btrfs" {
                return Err(VolumeError::NotBtrfs {
                    path: mount_dir,
                    fstype: mount.fstype,
                });
            }
            let ours = loop_backing_file(&mount.source).as_deref() == Some(image.as_path());
            return Ok(Volume {
                root: mount_dir,
                loop_image: ours.then_some(image),
                sysfs: Default::default(),
                settings: settings.clone(),
            });
        }
        if btrfs::is_btrfs(&state_root).map_err(VolumeError::io("statfs", &state_root))? {
            return Ok(Volume {
                root: state_root,
                loop_image: None,
                sysfs: Default::default(),
                settings: settings.clone(),
            });
        }

        if !image_is_formatted(&image)? {
            make_image(&image, settings.size, settings.host_reserve)?;
        }
        fs::create_dir_all(&mount_dir).map_err(VolumeError::io("create", &mount_dir))?;
        run(
            Path::new("mount"),
            &[
                "-t".as_ref(),
                "btrfs".as_ref(),
                "-o".as_ref(),
                "loop,nodiscard,noatime,commit=5".as_ref(),
                image.as_os_str(),
                mount_dir.as_os_str(),
            ],
        )?;
        Ok(Volume {
            root: mount_dir,
            loop_image: Some(image),
            sysfs: Default::default(),
            settings: settings.clone(),
        })
    }

    /// Bounds what a checkpoint costs, whatever was just written, on a volume forkd
    /// loop-mounted (a volume that is the state root's own filesystem is left alone):
    ///
    /// - the loop device does direct I/O, so data is cached once (in the volume, not
    ///   again in the image file's page cache) and the flush a btrfs commit ends with
    ///   does not have to push out everything written since the last one;
    /// - btrfs commits every 5 s, not 30: a snapshot commits the running transaction,
    ///   whose metadata grows with all that was written since the last commit;
    /// - the volume may hold at most [`DIRTY_ENV`] (default [`DEFAULT_DIRTY`]) of dirty
    ///   data, enforced even while the machine as a whole is below its dirty limits
    ///   (`strict_limit`). A snapshot must write out the subvolume's dirty data first,
    ///   so without a bound a checkpoint right after a 1 GiB write waits for 1 GiB;
    ///   with it, writers are paced at the disk's speed instead. `0` turns this off;
    /// - no discards: the image stays allocated under the filesystem (see [`space`]).
    ///
    /// Idempotent. Returns what it set, for the daemon's log.
    pub fn tune(&self) -> Result<Vec<String>, VolumeError> {
        let Some(image) = &self.loop_image else {
            return Ok(Vec::new());
        };
        let mut done = Vec::new();
        // Volumes mounted by older builds: discards (which would punch holes in the
        // allocated image, see `space`), 30 s commits.
        run(
            Path::new("mount"),
            &[
                "-o".as_ref(),
                "remount,nodiscard,commit=5".as_ref(),
                self.root.as_os_str(),
            ],
        )?;
        let devices = loop_devices_of(image);
        for device in &devices {
            let name = device.trim_start_matches("/dev/");
            let dio = fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap_or_default();
            if dio.trim() != "1" {
                run(
                    Path::new("losetup"),
                    &["--direct-io=on".as_ref(), device.as_ref()],
                )?;
            }
            done.push(format!("direct I/O on {device}"));
        }
        let limit = self.settings.dirty;
        let Some(bdi) = devices.iter().find_map(|d| bdi_of_device(d)) else {
            return Ok(done);
        };
        let write = |file: &str, value: String| {
            let path = bdi.join(file);
            fs::write(&path, &value).map_err(VolumeError::io("write", &path))
        };
        if limit == 0 {
            write("strict_limit", "0".into())?;
            return Ok(done);
        }
        write("max_bytes", limit.to_string())?;
        write("strict_limit", "1".into())?;
        done.push(format!(
            "dirty data limited to {} MiB ({})",
            limit >> 20,
            bdi.display()
        ));
        Ok(done)
    }

    /// Where the btrfs filesystem is; subvolumes are made below this path.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The image file behind the volume, when it is a loop mount that forkd made.
    pub fn loop_image(&self) -> Option<&Path> {
        self.loop_image.as_deref()
    }

    /// Creates an empty subvolume at `path` (absolute inside the volume, or relative to
    /// [`Volume::path`]); its parent directory must exist.
    pub fn create_subvolume(&self, path: &Path) -> Result<(), VolumeError> {
        let (path, parent, name) = self.split(path)?;
        let parent_dir = open_dir(&parent)?;
        btrfs::create_subvolume(parent_dir.as_fd(), &name)
            .map_err(VolumeError::io("create subvolume", path))
    }

    /// Makes a read-only snapshot of the subvolume `src` at `dst`, in constant time
    /// whatever `src` holds (btrfs first writes out `src`'s dirty data). Paths as for
    /// [`Volume::create_subvolume`].
    pub fn snapshot_readonly(&self, src: &Path, dst: &Path) -> Result<(), VolumeError> {
        self.snapshot_as(src, dst, true)
    }

    /// Makes a writable snapshot of the subvolume `src` (read-only or not) at `dst`, as
    /// [`Volume::snapshot_readonly`]. Its files keep their inode numbers, and files made
    /// in it later get numbers above every number `src` holds: btrfs numbers each
    /// subvolume's inodes on from the highest it holds.
    pub fn snapshot(&self, src: &Path, dst: &Path) -> Result<(), VolumeError> {
        self.snapshot_as(src, dst, false)
    }

    /// Marks the subvolume at `path` read-only.
    pub fn set_readonly(&self, path: &Path) -> Result<(), VolumeError> {
        let path = self.resolve(path)?;
        let dir = open_dir(&path)?;
        btrfs::set_readonly(dir.as_fd(), true).map_err(VolumeError::io("set read-only", path))
    }

    /// Whether `path` is the root of a subvolume.
    pub fn is_subvolume(&self, path: &Path) -> bool {
        self.resolve(path)
            .ok()
            .is_some_and(|p| btrfs::is_subvolume(&p).unwrap_or(false))
    }

    fn snapshot_as(&self, src: &Path, dst: &Path, readonly: bool) -> Result<(), VolumeError> {
        let src = self.resolve(src)?;
        let (dst, parent, name) = self.split(dst)?;
        if !btrfs::is_subvolume(&src).map_err(VolumeError::io("stat", &src))? {
            return Err(VolumeError::NotSubvolume { path: src });
        }
        let src_dir = open_dir(&src)?;
        let parent_dir = open_dir(&parent)?;
        btrfs::snapshot(src_dir.as_fd(), parent_dir.as_fd(), &name, readonly)
            .map_err(VolumeError::io("snapshot", dst))
    }

    /// Deletes the subvolume or snapshot at `path` with all it holds, subvolumes nested
    /// in it included. A plain directory is removed recursively; a missing path is
    /// not an error.
    pub fn delete_subvolume(&self, path: &Path) -> Result<(), VolumeError> {
        let (path, _, _) = self.split(path)?;
        delete_tree(&path)
    }

    /// Unmounts the volume if forkd loop-mounted it, and checks that the loop device was
    /// released. Refuses while anything is still mounted below the volume. A volume
    /// that is the state root's own filesystem stays as it is.
    pub fn unmount(self) -> Result<(), VolumeError> {
        let Some(image) = self.loop_image else {
            return Ok(());
        };
        let busy = mountinfo::mounts_below(&self.root)?;
        if !busy.is_empty() {
            return Err(VolumeError::Busy {
                path: self.root,
                mounts: busy,
            });
        }
        let devices = loop_devices_of(&image);
        if mountinfo::mount_at(&self.root)?.is_some() {
            nix::mount::umount2(&self.root, nix::mount::MntFlags::empty()).map_err(|errno| {
                let step = if errno == nix::errno::Errno::EBUSY {
                    "unmount (files in it are still open)"
                } else {
                    "unmount"
                };
                VolumeError::io(step, &self.root)(io::Error::from_raw_os_error(errno as i32))
            })?;
        }
        // `mount -o loop` sets autoclear, so the kernel detaches the device when the last
        // mount goes; detach by hand what it did not.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !loop_devices_of(&image).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for device in loop_devices_of(&image) {
            let _ = run(Path::new("losetup"), &["-d".as_ref(), device.as_ref()]);
        }
        match devices
            .into_iter()
            .find(|d| loop_devices_of(&image).contains(d))
        {
            Some(device) => Err(VolumeError::LoopStillAttached { device, image }),
            None => Ok(()),
        }
    }

    /// `path` made absolute inside the volume, without `..` or `.` components.
    fn resolve(&self, path: &Path) -> Result<PathBuf, VolumeError> {
        let full = self.root.join(path);
        let outside = || VolumeError::OutsideVolume {
            path: path.to_path_buf(),
            volume: self.root.clone(),
        };
        let tail = full.strip_prefix(&self.root).map_err(|_| outside())?;
        if tail
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(outside());
        }
        Ok(full)
    }

    /// `path` resolved, its parent directory and its last component; never the volume
    /// root itself.
    fn split(&self, path: &Path) -> Result<(PathBuf, PathBuf, CString), VolumeError> {
        let full = self.resolve(path)?;
        let (Some(parent), Some(name)) = (full.parent(), full.file_name()) else {
            return Err(VolumeError::OutsideVolume {
                path: path.to_path_buf(),
                volume: self.root.clone(),
            });
        };
        if full == self.root {
            return Err(VolumeError::OutsideVolume {
                path: path.to_path_buf(),
                volume: self.root.clone(),
            });
        }
        let name = CString::new(name.as_bytes()).map_err(|_| {
            VolumeError::io("use", &full)(io::Error::new(
                io::ErrorKind::InvalidInput,
                "path contains a NUL byte",
            ))
        })?;
        Ok((full.clone(), parent.to_path_buf(), name))
    }
}

/// Checks that the programs the volume needs are installed.
pub fn require_tools() -> Result<(), VolumeError> {
    find_program("mkfs.btrfs").ok_or(VolumeError::MissingTool {
        program: "mkfs.btrfs",
        package: "btrfs-progs",
    })?;
    find_program("mount").ok_or(VolumeError::MissingTool {
        program: "mount",
        package: "mount",
    })?;
    Ok(())
}

/// Parses `4096`, `512M`, `256G`, `1TiB` and the like (binary units).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .or_else(|| unit.strip_suffix('B'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "P" => 50,
        _ => return None,
    };
    number.checked_mul(1 << shift).filter(|&n| n > 0)
}

/// Deletes `path` whatever it is: a subvolume with one ioctl (after the subvolumes
/// nested in it), a directory recursively, anything else with unlink.
fn delete_tree(path: &Path) -> Result<(), VolumeError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(VolumeError::io("stat", path)(e)),
    };
    if !meta.is_dir() {
        return fs::remove_file(path).map_err(VolumeError::io("remove", path));
    }
    let subvolume = btrfs::is_subvolume(path).map_err(VolumeError::io("stat", path))?;
    if subvolume {
        match delete_one_subvolume(path) {
            Ok(()) => return Ok(()),
            // Subvolumes nested inside: delete them first, then try again.
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {}
            Err(e) => return Err(VolumeError::io("delete subvolume", path)(e)),
        }
    }
    let entries = fs::read_dir(path).map_err(VolumeError::io("list", path))?;
    for entry in entries {
        let entry = entry.map_err(VolumeError::io("list", path))?;
        delete_tree(&entry.path())?;
    }
    if subvolume {
        delete_one_subvolume(path).map_err(VolumeError::io("delete subvolume", path))
    } else {
        fs::remove_dir(path).map_err(VolumeError::io("remove", path))
    }
}

fn delete_one_subvolume(path: &Path) -> io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = CString::new(path.file_name().unwrap_or_default().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    let parent = File::open(parent)?;
    btrfs::delete_subvolume(parent.as_fd(), &name)
}

fn open_dir(path: &Path) -> Result<File, VolumeError> {
    let file = File::open(path).map_err(VolumeError::io("open", path))?;
    let meta = file.metadata().map_err(VolumeError::io("stat", path))?;
    if !meta.is_dir() {
        return Err(VolumeError::io("open", path)(io::Error::from_raw_os_error(
            libc::ENOTDIR,
        )));
    }
    Ok(file)
}

/// Finds `program` in the system's program directories.
fn find_program(program: &str) -> Option<PathBuf> {
    forkd_sys::find_program(program)
}

/// Runs `program` to completion; a failure carries its command line and stderr.
fn run(program: &Path, args: &[&OsStr]) -> Result<(), VolumeError> {
    let name = program.to_string_lossy().into_owned();
    let command = std::iter::once(name.clone())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let resolved = find_program(&name).unwrap_or_else(|| program.to_path_buf());
    let output = Command::new(resolved)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| VolumeError::Spawn {
            command: command.clone(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(VolumeError::Program {
        command,
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

#[cfg(test)]
mod tests;
