//! Overlay mounts through the new mount API (`fsopen`, `fsconfig`, `fsmount`,
//! `move_mount`).
//!
//! A branch of a sandbox stacks one lower layer per checkpoint generation, and
//! `mount(2)` passes all of its options in a single page: about 4 KiB, so a few dozen
//! long layer paths. The new API hands the kernel one layer per `fsconfig` call
//! (`lowerdir+`, kernel 6.8 and later), which also needs no escaping of `:` or `,` in
//! paths. The steps are:
//!
//! 1. `fsopen("overlay")` creates a filesystem context;
//! 2. `fsconfig(SET_STRING, "lowerdir+", path)` once per lower layer, topmost first,
//!    then `upperdir` and `workdir` for a writable overlay;
//! 3. `fsconfig(CMD_CREATE)` builds the superblock;
//! 4. `fsmount` turns it into a detached mount, and `move_mount` attaches that at the
//!    target.
//!
//! A detached mount belongs to no mount namespace: it is in nobody's mount table until
//! it is attached, and it can be attached by another process, in another namespace, that
//! inherits the descriptor. That is how a sandbox's root reaches only the sandbox: the
//! daemon builds it detached ([`overlay`]) and the process that makes the sandbox's
//! mount namespace attaches it there ([`attach`], or [`crate::attach_in_child`] for a
//! program the daemon starts), so the daemon's own mount table never grows with the
//! number of sandboxes (every new namespace copies its creator's table, and every mount
//! and unmount on the host takes a lock whose hold time grows with it).
//!
//! Kernels before 6.8 have no `lowerdir+`, and `fsconfig` takes string values of at
//! most 255 bytes, so the whole stack cannot go in one `lowerdir` of paths either. There
//! the layers are named by one-byte links in a private directory ([`crate::lowerdir`]):
//! [`LowerMode::Links`]. Which mode is used is decided once ([`lower_mode`]): the
//! `FORKD_OVERLAY_LOWERS` setting (`append`, `links`), else `lowerdir+` on 6.8 and
//! later, else a probe (a kernel that backported `lowerdir+` gets it). `forkd doctor`
//! probes overlays through this same code.
//!
//! When a step fails, the kernel usually explains why in the context's message log
//! (read from the `fsopen` descriptor); the error carries those lines.
//!
//! Overlayfs copies a file up by creating it in the work directory and renaming (or
//! linking) it into the upper directory, so both must be on the same mount and, on
//! btrfs, in the same subvolume: btrfs refuses renames between subvolumes (`EXDEV`).

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::check;

mod namespace;
pub use namespace::{base_namespace, empty_namespace, namespace_mounts, BASE_SENTINEL};

const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const MOUNT_ATTR_RDONLY: libc::c_uint = 0x1;
pub(crate) const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
pub(crate) const OPEN_TREE_CLONE: libc::c_uint = 1;
pub(crate) const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;

/// A failed step of a mount, with what the kernel logged about it.
///
/// Carried inside the `io::Error` that [`mount_overlay`] returns (same
/// [`io::ErrorKind`] as the system call's error, which is this error's source).
#[derive(Debug)]
pub struct MountError {
    /// The step that failed, e.g. `fsconfig lowerdir+ /path/to/layer`.
    pub step: String,
    /// Lines from the filesystem context's message log, e.g.
    /// `e overlay: failed to resolve '/x': -2`.
    pub log: Vec<String>,
    source: io::Error,
}

impl MountError {
    /// The system call's `errno`, when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

impl From<MountError> for io::Error {
    fn from(e: MountError) -> io::Error {
        io::Error::new(e.source.kind(), e)
    }
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.step)?;
        if !self.log.is_empty() {
            write!(f, " (kernel: {})", self.log.join("; "))?;
        }
        Ok(())
    }
}

impl std::error::Error for MountError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Mounts an overlay at `target`.
///
/// `lowers` are the read-only layers, topmost first. With `upper = Some((upper, work))`
/// the overlay is writable and every change lands in `upper`; `work` must be an empty
/// directory on the same mount (and btrfs subvolume) as `upper`. With `None` the overlay
/// is read-only; overlayfs then needs at least two lower layers.
///
/// Errors name the failing step (`fsopen`, `fsconfig lowerdir+ <path>`, `fsconfig
/// upperdir <path>`, `fsconfig workdir <path>`, `fsconfig create`, `fsmount`,
/// `move_mount onto <target>`) and carry a [`MountError`].
pub fn mount_overlay(
    lowers: &[&Path],
    upper: Option<(&Path, &Path)>,
    target: &Path,
) -> io::Result<()> {
    let mnt = overlay(lowers, upper)?;
    attach(mnt.as_fd(), target)
}

/// Builds an overlay as a detached mount (steps 1 to 4 above, without attaching it):
/// the descriptor can be read through (`/proc/self/fd/N/...`) or handed to the process
/// that attaches it. Errors as for [`mount_overlay`].
pub fn overlay(lowers: &[&Path], upper: Option<(&Path, &Path)>) -> io::Result<OwnedFd> {
    overlay_with(lowers, upper, lower_mode())
}

/// How lower layers are handed to overlayfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowerMode {
    /// One `fsconfig lowerdir+` per layer (Linux 6.8 and later): any depth, any path.
    Append,
    /// One `lowerdir` of one-byte link names ([`crate::lowerdir`]): older kernels; at
    /// most [`crate::lowerdir::MAX_LINKED_LOWERS`] layers.
    Links,
}

impl LowerMode {
    pub fn name(self) -> &'static str {
        match self {
            LowerMode::Append => "lowerdir+",
            LowerMode::Links => "links",
        }
    }
}

static LOWER_MODE: std::sync::OnceLock<LowerMode> = std::sync::OnceLock::new();

/// The mode this process uses: the one [`set_lower_mode`] gave, else decided on first
/// use from the kernel: `lowerdir+` on Linux 6.8 and later, else whether a probe overlay
/// takes it.
pub fn lower_mode() -> LowerMode {
    *LOWER_MODE.get_or_init(|| {
        if kernel_version(&kernel_release()).is_some_and(|v| v >= LOWERDIR_PLUS_KERNEL)
            || lowerdir_plus() == Some(true)
        {
            LowerMode::Append
        } else {
            LowerMode::Links
        }
    })
}

/// Sets the mode before any overlay is made (the daemon's `FORKD_OVERLAY_LOWERS`). The
/// mode a process has used stays: false if one was already in use and differs.
pub fn set_lower_mode(mode: LowerMode) -> bool {
    *LOWER_MODE.get_or_init(|| mode) == mode
}

/// Whether overlayfs takes `lowerdir+` (Linux 6.8): a throw-away read-only overlay of two
/// empty directories is built with it. `None` without the privilege to mount.
pub fn lowerdir_plus() -> Option<bool> {
    // SAFETY: geteuid only reads this process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("forkd-lowerdir-probe-{}", std::process::id()));
    let (a, b) = (dir.join("a"), dir.join("b"));
    let made = std::fs::create_dir_all(&a).and_then(|()| std::fs::create_dir_all(&b));
    let works = made
        .and_then(|()| overlay_with(&[&a, &b], None, LowerMode::Append))
        .is_ok();
    let _ = std::fs::remove_dir_all(&dir);
    Some(works)
}

/// [`overlay`] with the lower layers handed over as `mode` says.
pub fn overlay_with(
    lowers: &[&Path],
    upper: Option<(&Path, &Path)>,
    mode: LowerMode,
) -> io::Result<OwnedFd> {
    if lowers.is_empty() || (upper.is_none() && lowers.len() < 2) {
        // Refused here because overlayfs explains it only in the kernel log.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an overlay needs a lower layer, and a read-only overlay at least two",
        ));
    }
    if mode == LowerMode::Links {
        return overlay_linked(lowers, upper);
    }
    let fs = FsContext::open(c"overlay").map_err(io::Error::from)?;
    for (i, lower) in lowers.iter().enumerate() {
        let set = fs.set_path("lowerdir+", lower);
        if let (0, Err(e)) = (i, &set) {
            // Kernels before 6.8 do not know the option (EINVAL, or ENOPARAM through
            // the legacy path); a path that does not resolve is ENOENT.
            let old_kernel =
                kernel_version(&kernel_release()).is_some_and(|v| v < LOWERDIR_PLUS_KERNEL);
            if old_kernel && e.kind() != io::ErrorKind::NotFound {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "overlayfs on this kernel ({}) lacks lowerdir+, which forkd needs for its layer stacks: Linux {}.{} or later ({e})",
                        kernel_release(),
                        LOWERDIR_PLUS_KERNEL.0,
                        LOWERDIR_PLUS_KERNEL.1
                    ),
                ));
            }
        }
        set?;
    }
    if let Some((upper, work)) = upper {
        fs.set_path("upperdir", upper)?;
        fs.set_path("workdir", work)?;
        fs.plain_upper()?;
    }
    fs.create()?;
    let attrs = if upper.is_none() {
        MOUNT_ATTR_RDONLY
    } else {
        0
    };
    fs.mount(attrs)
}

/// The overlay of [`LowerMode::Links`]: every path is a link in a private directory that
/// is the thread's working directory while the superblock is made.
fn overlay_linked(lowers: &[&Path], upper: Option<(&Path, &Path)>) -> io::Result<OwnedFd> {
    // A link to a missing layer fails only at the create, and overlayfs names it in the
    // kernel log only: each is looked at first, so that the error names it.
    for lower in lowers {
        std::fs::metadata(lower).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("fsconfig lowerdir {}: {e}", lower.display()),
            )
        })?;
    }
    let links = crate::lowerdir::LinkDir::new(lowers, upper)?;
    let _cwd = links.enter()?;
    let fs = FsContext::open(c"overlay").map_err(io::Error::from)?;
    let shown = format!(
        "fsconfig lowerdir ({} layers as links in {})",
        lowers.len(),
        links.path().display()
    );
    fs.set_bytes("lowerdir", &links.lowerdir, &shown)?;
    if upper.is_some() {
        fs.set_path("upperdir", Path::new(crate::lowerdir::UPPER_LINK))?;
        fs.set_path("workdir", Path::new(crate::lowerdir::WORK_LINK))?;
        fs.plain_upper()?;
    }
    fs.create()?;
    let attrs = if upper.is_none() {
        MOUNT_ATTR_RDONLY
    } else {
        0
    };
    fs.mount(attrs)
}

/// The first kernel whose overlayfs takes `lowerdir+`.
pub const LOWERDIR_PLUS_KERNEL: (u32, u32) = (6, 8);

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// (major, minor) of a kernel release such as `6.1.0-27-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()?;
    Some((major, minor))
}

/// Attaches the detached mount `mnt` at `target` in the caller's mount namespace. A
/// mount can be attached once.
pub fn attach(mnt: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    move_mount_onto(mnt, target).map_err(io::Error::from)
}

/// A copy of the mount at `path` as a detached mount (`open_tree` with
/// `OPEN_TREE_CLONE`, without the mounts below it): it can be attached in another mount
/// namespace, which `path` may not be visible from.
pub fn clone_tree(path: &Path) -> io::Result<OwnedFd> {
    let cpath = c_path(path)?;
    // SAFETY: `cpath` is a NUL-terminated string that lives for the whole call; the call
    // returns a new descriptor or -1.
    let fd = check(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            cpath.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
        )
    })
    .map_err(|e| io::Error::new(e.kind(), format!("open_tree {}: {e}", path.display())))?;
    Ok(crate::own_fd(fd as RawFd))
}

/// A path through which the caller reads what the descriptor `fd` refers to (for a
/// detached mount, its root directory).
pub fn fd_path(fd: BorrowedFd<'_>) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A filesystem context from `fsopen`.
struct FsContext {
    fd: OwnedFd,
}

impl FsContext {
    fn open(fstype: &CStr) -> Result<Self, MountError> {
        // SAFETY: `fstype` is NUL-terminated and lives for the whole call; the call
        // returns a new descriptor or -1.
        let fd = check(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) })
            .map_err(|source| MountError {
                step: format!("fsopen {}", fstype.to_string_lossy()),
                log: Vec::new(),
                source,
            })?;
        Ok(FsContext {
            fd: crate::own_fd(fd as RawFd),
        })
    }

    /// `fsconfig(FSCONFIG_SET_STRING, key, path)`.
    fn set_path(&self, key: &str, path: &Path) -> io::Result<()> {
        let step = format!("fsconfig {key} {}", path.display());
        self.set_bytes(key, path.as_os_str().as_bytes(), &step)
    }

    /// An upper directory that holds only whiteouts, opaque marks and whole files, whatever
    /// the kernel's defaults (`CONFIG_OVERLAY_FS_REDIRECT_DIR`, `_METACOPY`): what forkd
    /// reads from uppers (checkpoints' deltas and archives, bases made from them) knows
    /// no directory redirects and no metadata-only copies. Renaming a lower directory is
    /// then `EXDEV`, which `mv` answers by copying.
    fn plain_upper(&self) -> io::Result<()> {
        self.set_bytes("redirect_dir", b"off", "fsconfig redirect_dir off")?;
        self.set_bytes("metacopy", b"off", "fsconfig metacopy off")
    }

    /// `fsconfig(FSCONFIG_SET_STRING, key, value)`; `step` names it in errors.
    fn set_bytes(&self, key: &str, value: &[u8], step: &str) -> io::Result<()> {
        let step = || step.to_owned();
        let ckey = CString::new(key).expect("option names have no NUL");
        let value = CString::new(value).map_err(|_| MountError {
            step: step(),
            log: Vec::new(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the value"),
        })?;
        // SAFETY: key and value are NUL-terminated strings that live for the whole call;
        // SET_STRING takes no auxiliary descriptor.
        let ret = check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                FSCONFIG_SET_STRING,
                ckey.as_ptr(),
                value.as_ptr(),
                0,
            )
        });
        ret.map(drop).map_err(|source| self.failed(step(), source))
    }

    /// `fsconfig(FSCONFIG_CMD_CREATE)`: builds the superblock.
    fn create(&self) -> io::Result<()> {
        // SAFETY: CMD_CREATE takes no key, value or auxiliary descriptor.
        let ret = check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            )
        });
        ret.map(drop).map_err(|source| {
            let mut e = self.failed_with_log("fsconfig create".into(), source);
            if e.log.is_empty() {
                // Overlayfs reports most of its checks with printk, not in the context.
                e.step
                    .push_str(" (see the kernel log for the filesystem's reason)");
            }
            e.into()
        })
    }

    /// `fsmount`: a detached mount of the created superblock.
    fn mount(&self, attrs: libc::c_uint) -> io::Result<OwnedFd> {
        // SAFETY: plain integer arguments; returns a new descriptor or -1.
        let fd = check(unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.fd.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                attrs,
            )
        })
        .map_err(|source| self.failed("fsmount".into(), source))?;
        Ok(crate::own_fd(fd as RawFd))
    }

    fn failed(&self, step: String, source: io::Error) -> io::Error {
        self.failed_with_log(step, source).into()
    }

    fn failed_with_log(&self, step: String, source: io::Error) -> MountError {
        MountError {
            step,
            log: self.log(),
            source,
        }
    }

    /// Drains the context's message log: one message per `read`, until `ENODATA`.
    fn log(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut buf = [0u8; 4096];
        // The log holds at most a few dozen messages; the bound guards against a
        // kernel that would keep answering.
        for _ in 0..64 {
            // SAFETY: `buf` is writable for its whole length during the call.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                )
            };
            let Ok(n) = check(n as libc::c_long) else {
                break;
            };
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n as usize]);
            lines.push(text.trim_end().to_owned());
        }
        lines
    }
}

/// Attaches the detached mount `mnt` at `target`.
fn move_mount_onto(mnt: BorrowedFd<'_>, target: &Path) -> Result<(), MountError> {
    let failed = |source| MountError {
        step: format!("move_mount onto {}", target.display()),
        log: Vec::new(),
        source,
    };
    let ctarget = c_path(target).map_err(failed)?;
    // SAFETY: the empty from-path and the target are NUL-terminated strings that live
    // for the whole call; `mnt` is a mount descriptor from fsmount.
    check(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            ctarget.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map_err(failed)?;
    Ok(())
}

/// `path` as a C string, refusing interior NUL bytes.
pub(crate) fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {} contains a NUL byte", path.display()),
        )
    })
}

#[cfg(test)]
mod tests;
