//! What this kernel has, asked of the kernel itself rather than read from its version.
//! Distribution kernels carry features back to older versions (RHEL's above all), and a
//! version says nothing of a feature left out of the build. Each answer is `Some(has)`,
//! or `None` where the kernel cannot be asked from here (no privilege, a filesystem not
//! loaded yet): the caller then goes by the version.
//!
//! Every probe is cheap and leaves nothing behind; `forkd doctor` shows their answers and
//! the daemon asks the same ones where it decides.

use crate::check;
use std::io;

fn errno(ret: libc::c_long) -> Option<i32> {
    check(ret).err().and_then(|e| e.raw_os_error())
}

/// The answer of a call that returns a new descriptor: it has the call if the descriptor
/// came (closed at once), not if the call is unknown (`ENOSYS`); any other error (a
/// privilege, a seccomp filter) tells nothing.
fn new_fd_answer(ret: libc::c_long) -> Option<bool> {
    match errno(ret) {
        None => {
            // SAFETY: the descriptor was just returned to us and is closed once.
            unsafe { libc::close(ret as i32) };
            Some(true)
        }
        Some(libc::ENOSYS) => Some(false),
        Some(_) => None,
    }
}

/// The new mount API (Linux 5.2): `fsopen("tmpfs")` gives a context.
pub fn mount_api() -> Option<bool> {
    // SAFETY: fsopen reads a NUL-terminated name and returns a new descriptor or -1.
    new_fd_answer(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), libc::O_CLOEXEC) })
}

/// `pidfd_open` (Linux 5.3), on this process.
pub fn pidfd() -> Option<bool> {
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new descriptor.
    new_fd_answer(unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) })
}

/// `close_range` (Linux 5.9) with `flags`, on a range that holds no descriptor.
fn close_range_takes(flags: libc::c_uint) -> Option<bool> {
    let last = libc::c_uint::MAX;
    // SAFETY: the range [MAX, MAX] holds no open descriptor: nothing is closed or changed.
    match errno(unsafe { libc::syscall(libc::SYS_close_range, last, last, flags) }) {
        None => Some(true),
        Some(libc::ENOSYS) | Some(libc::EINVAL) => Some(false),
        Some(_) => None,
    }
}

/// `close_range` (Linux 5.9).
pub fn close_range() -> Option<bool> {
    close_range_takes(0)
}

/// `close_range`'s `CLOSE_RANGE_CLOEXEC` (Linux 5.11).
pub fn cloexec_range() -> Option<bool> {
    close_range_takes(1 << 2)
}

/// cgroup2's `favordynmods` mount option (Linux 6.0), as `/sys/kernel/cgroup/features`
/// lists it.
pub fn cgroup_favordynmods() -> Option<bool> {
    let features = std::fs::read_to_string("/sys/kernel/cgroup/features").ok()?;
    Some(features.lines().any(|l| l.trim() == "favordynmods"))
}

/// A backing device's `max_bytes` dirty limit (Linux 6.2), on the first device listed.
pub fn bdi_max_bytes() -> Option<bool> {
    let first = std::fs::read_dir("/sys/class/bdi").ok()?.flatten().next()?;
    Some(first.path().join("max_bytes").exists())
}

/// btrfs simple quotas (Linux 6.7), as btrfs's sysfs lists them; `None` while btrfs is a
/// module not loaded yet.
pub fn btrfs_simple_quotas() -> Option<bool> {
    let features = std::path::Path::new("/sys/fs/btrfs/features");
    features
        .is_dir()
        .then(|| features.join("simple_quota").exists())
}

pub use crate::mount::lowerdir_plus;

/// `PR_SET_MEMORY_MERGE` (Linux 6.4): `PR_GET_MEMORY_MERGE` answers rather than failing
/// `EINVAL`.
pub fn memory_merge() -> bool {
    const PR_GET_MEMORY_MERGE: libc::c_int = 68;
    // SAFETY: a prctl with integer arguments that only reads the caller's own flag.
    unsafe { libc::prctl(PR_GET_MEMORY_MERGE, 0 as libc::c_ulong, 0, 0, 0) >= 0 }
}

/// Whether the kernel's random pool is ready: `getrandom(GRND_NONBLOCK)` answers instead of
/// `EAGAIN`. Until it is, every program that asks for random bytes without blocking and
/// retries (util-linux's libuuid sleeps 125 ms, up to 8 times) waits: CRIU spends some
/// 3-4 s a run there on a virtual machine that offers neither RDRAND nor virtio-rng.
pub fn random_ready() -> io::Result<bool> {
    let mut byte = 0u8;
    // SAFETY: getrandom writes at most one byte into `byte`, which outlives the call.
    let n = unsafe { libc::getrandom((&mut byte as *mut u8).cast(), 1, libc::GRND_NONBLOCK) };
    if n >= 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EAGAIN) {
        Ok(false)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This kernel (Linux 6.18 on these machines, 5.10 at the oldest anywhere forkd runs)
    /// has every call the probes ask for; the answers must say so wherever they can ask.
    #[test]
    fn the_running_kernel_answers_yes() {
        let release = crate::mount::kernel_release();
        let Some(v) = crate::mount::kernel_version(&release) else {
            return;
        };
        assert_eq!(pidfd(), Some(true));
        assert_eq!(close_range(), Some(true));
        assert_eq!(cloexec_range(), Some(v >= (5, 11)), "{release}");
        assert_eq!(memory_merge(), v >= (6, 4), "{release}");
        if let Some(has) = cgroup_favordynmods() {
            assert_eq!(has, v >= (6, 0), "{release}");
        }
        if let Some(has) = bdi_max_bytes() {
            assert_eq!(has, v >= (6, 2), "{release}");
        }
        if let Some(has) = mount_api() {
            assert!(has, "{release}");
        }
        assert!(random_ready().is_ok());
    }
}
