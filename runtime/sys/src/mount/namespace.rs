//! Mount namespaces made from nothing: one empty read-only tmpfs (every sandbox's
//! namespace is a copy of it), and the base a restore's CRIU runs on.

use super::*;

/// Makes a mount namespace whose one mount is an empty read-only tmpfs at its root
/// (mounted on `dir` first, a directory the caller may see), and returns it.
///
/// A sandbox's set-up enters a copy of this namespace rather than copying the caller's
/// and then pivoting out of it: `pivot_root` walks every task on the host, which with
/// thousands of sandboxes alive was the largest part of a create that grew with their
/// number. The set-up stacks the sandbox's root on this tmpfs and `chroot`s into it (see
/// `forkd_sandbox::setup`); a walk up from the root of the stacked mount crosses to the
/// tmpfs and straight back up, so nothing of the tmpfs is reachable from the sandbox,
/// and nothing of the host is in the namespace at all.
///
/// The work happens on a thread of its own: `unshare(CLONE_NEWNS)` gives that thread
/// alone the new namespace and a root and working directory of its own, which the
/// `pivot_root` here moves; the caller's are untouched.
pub fn empty_namespace(dir: &Path) -> io::Result<OwnedFd> {
    bare_namespace(dir, None).map(|(ns, _)| ns)
}

/// The directory of [`base_namespace`]'s tmpfs on which CRIU finds the host's tree.
pub const BASE_SENTINEL: &str = ".forkd-host";

/// Like [`empty_namespace`], but its read-only tmpfs holds one empty directory,
/// [`BASE_SENTINEL`]: a restore's CRIU attaches a copy of the host's tree there and runs
/// chrooted into it (`crate::on_namespace_base`), so that the restore's copy of the
/// namespace has a tmpfs at its bottom, onto which CRIU's preloaded root shim
/// (fixtures/criu/root-shim.c) moves the restored root instead of pivoting into it.
/// Returns the namespace and the tmpfs's device number, by which the shim knows it.
pub fn base_namespace(dir: &Path) -> io::Result<(OwnedFd, u64)> {
    bare_namespace(dir, Some(BASE_SENTINEL))
}

fn bare_namespace(dir: &Path, sentinel: Option<&str>) -> io::Result<(OwnedFd, u64)> {
    std::fs::create_dir_all(dir)?;
    let target = c_path(dir)?;
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<(OwnedFd, u64)> {
            let none = std::ptr::null::<libc::c_char>();
            let step = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
            // SAFETY: integer flags; affects this thread alone (see above).
            check(unsafe { libc::unshare(libc::CLONE_NEWNS) } as libc::c_long)
                .map_err(|e| step("unshare a mount namespace", e))?;
            // SAFETY: constant NUL-terminated strings; no pointer is kept past the call.
            check(unsafe {
                libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            } as libc::c_long)
            .map_err(|e| step("make / private", e))?;
            // Opened while this thread still sees /proc; the pivot below changes the
            // namespace's root, not which namespace the descriptor names.
            let ns = std::fs::File::open("/proc/thread-self/ns/mnt")
                .map_err(|e| step("open /proc/thread-self/ns/mnt", e))?;
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            // Read-only from the start, or once the sentinel directory is made.
            let first = if sentinel.is_some() {
                flags
            } else {
                flags | libc::MS_RDONLY
            };
            // SAFETY: every pointer is a NUL-terminated string that outlives the call.
            check(unsafe {
                libc::mount(
                    c"forkd-empty".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    first,
                    c"size=4k,mode=0555".as_ptr().cast(),
                )
            } as libc::c_long)
            .map_err(|e| step(&format!("mount an empty tmpfs on {}", dir.display()), e))?;
            let dev = std::os::unix::fs::MetadataExt::dev(
                &std::fs::metadata(dir).map_err(|e| step(&format!("stat {}", dir.display()), e))?,
            );
            if let Some(name) = sentinel {
                let sub = dir.join(name);
                std::fs::create_dir(&sub)
                    .map_err(|e| step(&format!("mkdir {}", sub.display()), e))?;
                // SAFETY: NUL-terminated strings that outlive the call.
                check(unsafe {
                    libc::mount(
                        none,
                        target.as_ptr(),
                        none,
                        libc::MS_REMOUNT | libc::MS_RDONLY | flags,
                        c"size=4k,mode=0555".as_ptr().cast(),
                    )
                } as libc::c_long)
                .map_err(|e| step("make the tmpfs read-only", e))?;
            }
            // SAFETY: `target` and the constant strings are NUL-terminated and outlive
            // the calls. pivot_root(".", ".") stacks the old root under the new one, and
            // detaching "." removes it with every mount below it.
            unsafe {
                check(libc::chdir(target.as_ptr()) as libc::c_long)
                    .map_err(|e| step(&format!("chdir {}", dir.display()), e))?;
                check(libc::syscall(
                    libc::SYS_pivot_root,
                    c".".as_ptr(),
                    c".".as_ptr(),
                ))
                .map_err(|e| step("pivot_root", e))?;
                check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH) as libc::c_long)
                    .map_err(|e| step("detach the old root", e))?;
            }
            Ok((OwnedFd::from(ns), dev))
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the mount namespace thread panicked")))
    })
}

/// How many mounts the mount namespace `ns` (a `/proc/<pid>/ns/mnt` descriptor) holds,
/// whatever the root of the processes in it hides (`NS_MNT_GET_INFO`, Linux 6.12; older
/// kernels answer `ENOTTY`).
pub fn namespace_mounts(ns: BorrowedFd<'_>) -> io::Result<u32> {
    /// `struct mnt_ns_info` of `<linux/nsfs.h>`.
    #[repr(C)]
    struct MntNsInfo {
        size: u32,
        nr_mounts: u32,
        mnt_ns_id: u64,
    }
    // _IOR(NSIO = 0xb7, 10, struct mnt_ns_info)
    const NS_MNT_GET_INFO: libc::c_ulong =
        (2 << 30) | ((std::mem::size_of::<MntNsInfo>() as libc::c_ulong) << 16) | (0xb7 << 8) | 10;
    let mut info = MntNsInfo {
        size: std::mem::size_of::<MntNsInfo>() as u32,
        nr_mounts: 0,
        mnt_ns_id: 0,
    };
    // SAFETY: the kernel writes at most `size` bytes into `info`, which lives for the call.
    check(unsafe {
        libc::ioctl(
            ns.as_raw_fd(),
            NS_MNT_GET_INFO as _,
            &mut info as *mut MntNsInfo,
        )
    } as libc::c_long)?;
    Ok(info.nr_mounts)
}
