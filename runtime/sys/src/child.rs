//! What a command does between fork and exec: descriptors installed at given numbers,
//! the mount namespace a CRIU runs in (its own `/run`, the restored tree's root, the
//! namespace base), memory merging, and death with its parent. Each is a `pre_exec` hook
//! on a `std::process::Command`, async-signal safe.

use crate::mount;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// Makes `cmd` start with the descriptors in `fds` (source, number in the child)
/// installed at the given numbers, without the close-on-exec flag. The sources may stay
/// close-on-exec in the parent, so no other child started concurrently inherits them.
pub fn inherit_fds(cmd: &mut std::process::Command, fds: Vec<(RawFd, RawFd)>) {
    use std::os::unix::process::CommandExt;
    let mut fds = fds;
    // SAFETY: the hook runs between fork and exec; it only calls dup2/fcntl (async-signal
    // safe) and changes, without allocating, a Vec allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            // First move every source out of the way (to 64 and up), so that placing one
            // descriptor never overwrites another's source.
            for (src, dst) in fds.iter_mut() {
                if *src != *dst {
                    let moved = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 64);
                    if moved < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    *src = moved;
                }
            }
            for &(src, dst) in &fds {
                if src == dst {
                    let flags = libc::fcntl(src, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(src, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(src, dst) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Makes `cmd` run in a mount namespace of its own: a copy of the caller's, turned into a
/// slave of it (mounts made by the caller later still appear in it, none made in it ever
/// leak back), with `dir` bind-mounted over `/run`, then each `(source, target)` of
/// `binds` bind-mounted (targets must exist; they are seen in that namespace only).
///
/// CRIU keeps what it learns about the kernel (`/run/criu.kdat`, some 40 ms of probing
/// per invocation) only when `/run` is a tmpfs; handing every CRIU the same tmpfs
/// directory as its `/run` lets all of them share that cache, whatever the host's `/run`.
pub fn with_own_run(
    cmd: &mut std::process::Command,
    dir: &std::path::Path,
    binds: &[(std::path::PathBuf, std::path::PathBuf)],
) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let src = mount::c_path(dir)?;
    let binds = binds
        .iter()
        .map(|(s, t)| Ok((mount::c_path(s)?, mount::c_path(t)?)))
        .collect::<io::Result<Vec<_>>>()?;
    // SAFETY: the hook runs between fork and exec in the single-threaded child and makes
    // only system calls (unshare, mount) on C strings allocated before the fork; it
    // allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if own_mount_namespace() < 0 {
                return Err(io::Error::last_os_error());
            }
            let none = std::ptr::null::<libc::c_char>();
            let bind = libc::MS_BIND | libc::MS_REC;
            if libc::mount(src.as_ptr(), c"/run".as_ptr(), none, bind, std::ptr::null()) < 0 {
                return Err(io::Error::last_os_error());
            }
            for (s, t) in &binds {
                if libc::mount(
                    s.as_ptr(),
                    t.as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ) < 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(())
}

/// Makes `cmd` run with `PR_SET_MEMORY_MERGE` (Linux 6.4+): every anonymous mapping it
/// and the processes it forks make from then on is open to KSM, across `exec` too.
pub fn memory_merge_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    const PR_SET_MEMORY_MERGE: libc::c_int = 67;
    // SAFETY: the hook runs between fork and exec and makes one system call with integer
    // arguments.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(PR_SET_MEMORY_MERGE, 1 as libc::c_ulong, 0, 0, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes `cmd` get SIGKILL when the thread that started it exits (`PR_SET_PDEATHSIG`):
/// a helper such as CRIU, which seizes a sandbox's processes, must not outlive a daemon
/// killed in the middle of its work. The thread waits for the helper, so it lives as
/// long as the helper is wanted.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs between fork and exec and makes one system call with integer
    // arguments.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Moves the calling process into a mount namespace of its own: a copy of its current
/// one, made a slave of it, with a procfs instance of its own on `/proc` (see
/// [`fresh_proc`]). Returns 0, or -1 with `errno` set. Async-signal safe.
fn own_mount_namespace() -> libc::c_int {
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: integer flags and constant NUL-terminated strings; no pointer is kept past
    // the calls.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) < 0
            || libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) < 0
        {
            return -1;
        }
    }
    fresh_proc()
}

/// Mounts a procfs instance of its own on `/proc` (in a mount namespace the caller has
/// just made). Returns what `mount(2)` returns. Async-signal safe.
///
/// Why: a lookup under `/proc/sys/net` walks one dentry per network namespace that has
/// been looked up through the same procfs instance (they share a parent and a name, and
/// only the compare tells them apart), and every sandbox has a network namespace of its
/// own. CRIU looks up sysctls on every restore; through the host's `/proc`, after
/// thousands of sandboxes, each lookup walks thousands of dentries. A fresh instance
/// starts with an empty cache and goes with the namespace.
fn fresh_proc() -> libc::c_int {
    // SAFETY: constant NUL-terminated strings; no pointer is kept past the call.
    unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    }
}

/// Makes `cmd` attach the detached mount `mnt` (see [`mount::overlay`]) at `target`
/// before it runs, in its own mount namespace: with `own_namespace` one is made here (a
/// slave copy of the caller's, as [`with_own_run`] makes), otherwise the command must
/// already get one from a hook added before this one. The mount then exists in that
/// namespace (and in the namespaces the command makes from it) and never in the caller's.
/// `mnt` stays open in the caller; a mount can be attached once.
pub fn attach_in_child(
    cmd: &mut std::process::Command,
    mnt: BorrowedFd<'_>,
    target: &std::path::Path,
    own_namespace: bool,
) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let fd = mnt.as_raw_fd();
    let target = mount::c_path(target)?;
    // SAFETY: the hook runs between fork and exec in the single-threaded child and makes
    // only system calls (unshare, mount, move_mount) on a C string allocated before the
    // fork; it allocates nothing. `fd` is open in the child until exec (the caller keeps
    // it open for the duration of the spawn).
    unsafe {
        cmd.pre_exec(move || {
            if own_namespace && own_mount_namespace() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::syscall(
                libc::SYS_move_mount,
                fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                mount::MOVE_MOUNT_F_EMPTY_PATH,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Makes `cmd` (a restore's CRIU) run on the namespace `base` made by
/// [`mount::base_namespace`]: it enters a copy of `base`, attaches there a copy of the
/// caller's whole tree on [`mount::BASE_SENTINEL`] and `chroot`s into it, so that it sees
/// the host's files as before while the namespace's bottom is the empty tmpfs. It also
/// sets `FORKD_CRIU_MOVE_ROOT`, by which CRIU's root shim gives the restored namespace
/// its root by moving it onto that tmpfs rather than by `pivot_root`, which walks every
/// task on the host (fixtures/criu/root-shim.c). Must come before the hooks that make
/// CRIU's own namespace ([`with_own_run`], [`attach_in_child`]): they copy this one.
pub fn on_namespace_base(
    cmd: &mut std::process::Command,
    base: BorrowedFd<'_>,
    base_dev: u64,
) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let base = base.as_raw_fd();
    let host = mount::c_path(&std::path::Path::new("/").join(mount::BASE_SENTINEL))?;
    // The shim knows the base's tmpfs by its device number.
    cmd.env("FORKD_CRIU_MOVE_ROOT", base_dev.to_string());
    // SAFETY: the hook runs between fork and exec in the single-threaded child and makes
    // only system calls on a C string allocated before the fork; it allocates nothing.
    // `base` is open in the child until exec (the caller keeps it open).
    unsafe {
        cmd.pre_exec(move || {
            let tree = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                c"/".as_ptr(),
                mount::OPEN_TREE_CLONE
                    | mount::OPEN_TREE_CLOEXEC
                    | libc::AT_RECURSIVE as libc::c_uint,
            );
            if tree < 0
                || libc::setns(base, libc::CLONE_NEWNS) < 0
                || libc::unshare(libc::CLONE_NEWNS) < 0
                || libc::syscall(
                    libc::SYS_move_mount,
                    tree as libc::c_int,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    host.as_ptr(),
                    mount::MOVE_MOUNT_F_EMPTY_PATH,
                ) < 0
                || libc::chdir(host.as_ptr()) < 0
                || libc::chroot(c".".as_ptr()) < 0
            {
                return Err(io::Error::last_os_error());
            }
            libc::close(tree as libc::c_int);
            Ok(())
        });
    }
    Ok(())
}
