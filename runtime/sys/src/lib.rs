//! Thin, documented wrappers around the few system calls forkd needs that `nix` does not
//! offer (pidfds, `close_range`, bringing up loopback in a fresh network namespace, btrfs
//! ioctls, the new mount API, the private mount and network namespaces CRIU runs with),
//! and the mountinfo parser every crate that looks at mounts shares.
//!
//! This is the only crate in the workspace that contains `unsafe`. Every block says why it
//! is sound; every raw return code goes through [`check`].

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

pub mod btrfs;
pub mod ceilings;
mod child;
pub mod clock;
pub mod confine;
pub mod exits;
pub mod lowerdir;
pub mod mount;
pub mod mountinfo;
pub mod probe;
pub mod proc_events;

pub use child::{
    attach_in_child, die_with_parent, inherit_fds, memory_merge_in_child, on_namespace_base,
    with_own_run,
};

/// Turns a raw `-1`-on-error return code into an `io::Result`.
fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Installs a seccomp filter program on the calling thread without setting
/// `no_new_privs` first (which a filter library does): the caller needs `CAP_SYS_ADMIN`,
/// and setuid programs it runs later still take effect.
pub fn install_seccomp_keeping_privileges(program: &[libc::sock_filter]) -> io::Result<()> {
    if program.is_empty() || program.len() > u16::MAX as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a filter of {} instructions", program.len()),
        ));
    }
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies the
    // instructions and keeps no pointer to them.
    check(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    })?;
    Ok(())
}

/// Opens a pidfd for `pid`: a handle that keeps referring to that process even if the pid
/// number is later reused, and becomes readable when the process exits.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no
    // memory is passed.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `signal` to the process behind `pidfd` (race-free against pid reuse).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid descriptor, a signal number, a null siginfo and zero flags.
    check(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// Waits up to `timeout` for the process behind `pidfd` to exit (a pidfd turns readable
/// then); true if it has. Returns as soon as it exits, not at the next tick of a poll.
pub fn pidfd_wait_exit(pidfd: BorrowedFd<'_>, timeout: std::time::Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now().checked_add(timeout);
    loop {
        let left = deadline.map_or(-1, |d| {
            let ms = d
                .saturating_duration_since(std::time::Instant::now())
                .as_micros();
            // Rounded up, so that a wait never ends a little before its deadline.
            ms.div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int
        });
        let mut p = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd the kernel reads and fills.
        let n = unsafe { libc::poll(&mut p, 1, left) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Marks every descriptor numbered `first` and above close-on-exec: one
/// `close_range(CLOSE_RANGE_CLOEXEC)` on Linux 5.11 and later, else (`EINVAL` on 5.10)
/// `FD_CLOEXEC` on each descriptor `/proc/self/fd` lists.
pub fn cloexec_fds_from(first: libc::c_uint) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: only sets a flag on descriptors; ownership is unchanged.
    let ranged = check(unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    });
    match ranged {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) => {
            cloexec_each_from(first)
        }
        Err(e) => Err(e),
    }
}

/// [`cloexec_fds_from`] one descriptor at a time, for kernels without
/// `CLOSE_RANGE_CLOEXEC`.
pub fn cloexec_each_from(first: libc::c_uint) -> io::Result<()> {
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| io::Error::new(e.kind(), format!("reading /proc/self/fd: {e}")))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd: &RawFd| *fd >= first as RawFd)
        .collect();
    for fd in fds {
        // SAFETY: F_GETFD/F_SETFD only read and set a flag; a descriptor that the
        // directory listing itself held is gone by now and answers EBADF, ignored.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags >= 0 {
            // SAFETY: as above, a flag of a descriptor this process holds.
            check(
                unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } as libc::c_long,
            )?;
        }
    }
    Ok(())
}

/// Sets the IFF_UP flag on the interface `name` (used for `lo` in a new network
/// namespace, which starts down).
pub fn interface_up(name: &CStr) -> io::Result<()> {
    // SAFETY: a plain socket(2) call.
    let sock =
        check(
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }
                as libc::c_long,
        )?;
    // SAFETY: the descriptor was just returned to us.
    let sock = unsafe { OwnedFd::from_raw_fd(sock as RawFd) };
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.to_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq with a NUL-terminated name; SIOCGIFFLAGS fills the
    // flags member of the union.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } as libc::c_long)?;
    // SAFETY: the flags member was just initialised by the kernel.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    if flags & libc::IFF_UP as libc::c_short != 0 {
        // Already up (a namespace made ahead): setting it would only wait for the
        // kernel's network lock.
        return Ok(());
    }
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS reads the flags member.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } as libc::c_long)?;
    Ok(())
}

/// Takes ownership of a raw descriptor that a `nix` call just returned.
pub fn own_fd(fd: RawFd) -> OwnedFd {
    assert!(fd >= 0, "own_fd called with an invalid descriptor");
    // SAFETY: the callers pass descriptors freshly returned by a system call, which
    // nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `_exit(2)`: leaves at once, without running exit handlers or flushing buffers that
/// belong to a parent process (used in forked children that must not return).
pub fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no memory of ours.
    unsafe { libc::_exit(code) }
}

/// Creates the namespaces in `flags` (`CLONE_NEW*`) in a forked child that exits at
/// once, so the namespaces die with it; waits for it at most `limit`. Says whether
/// this process may make them here (seccomp, a missing capability or an exhausted
/// limit all show), without changing its own namespaces.
pub fn probe_unshare(flags: libc::c_int, limit: std::time::Duration) -> io::Result<()> {
    // SAFETY: the child only calls unshare(2), reads errno and calls _exit(2), all
    // async-signal-safe, so forking is sound even if other threads hold locks.
    let pid = unsafe { libc::fork() };
    check(pid as libc::c_long)?;
    if pid == 0 {
        // SAFETY: see above; _exit skips atexit handlers and stdio buffers inherited
        // from the parent, which must not be flushed twice.
        unsafe {
            let code = if libc::unshare(flags) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::_exit(code.clamp(0, 255));
        }
    }
    let deadline = std::time::Instant::now() + limit;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: `status` is a valid, writable int for the call.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        check(r as libc::c_long)?;
        if r == pid {
            if libc::WIFEXITED(status) {
                return match libc::WEXITSTATUS(status) {
                    0 => Ok(()),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                };
            }
            return Err(io::Error::other(format!(
                "probe child killed by signal {}",
                libc::WTERMSIG(status)
            )));
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: plain integer arguments; the child is ours and not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("probe child still running after {} s", limit.as_secs()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `userfaultfd(2)` with `flags` (`O_CLOEXEC`, `O_NONBLOCK`).
pub fn userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes flags by value and returns a new fd or -1; it touches no
    // memory of ours.
    let fd = check(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
    Ok(own_fd(fd as RawFd))
}

/// Forks the current process. The parent gets the child's pid, the child gets 0.
///
/// Used by forkd's in-sandbox init, which is single-threaded.
pub fn fork_single_threaded() -> io::Result<libc::pid_t> {
    // SAFETY: callers are single-threaded processes (the init and its relays, the set-up
    // helper), so the child inherits no lock held by another thread.
    let pid = unsafe { libc::fork() };
    check(pid as libc::c_long)?;
    Ok(pid)
}

/// Prepares `cmd` to run as the leader of a new session with a clean signal mask and,
/// when `controlling_tty` is set, with its standard input as its controlling terminal.
pub fn session_leader(cmd: &mut std::process::Command, controlling_tty: bool) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs between fork and exec and calls only async-signal-safe
    // functions (sigprocmask, setsid, ioctl), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sets the window size of the terminal behind `fd`.
pub fn set_window_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize that lives for the whole call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) } as libc::c_long)?;
    Ok(())
}

/// A `Key: N kB` line of a /proc file (`/proc/meminfo`, `/proc/PID/smaps_rollup`,
/// `/proc/PID/status`), in bytes; `key` with its colon, e.g. `"MemTotal:"`.
pub fn proc_kib_field(path: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib << 10)
}

/// What `/proc/<pid>/stat` says of process `pid`: its state (field 3: `R`, `S`, `Z`, ...)
/// and its start time in clock ticks since boot (field 22), when they can be read. The
/// error is the read's (`NotFound`: no such process).
pub fn process_stat(pid: libc::pid_t) -> io::Result<(Option<String>, Option<u64>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Ok((None, None));
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().map(str::to_string);
    Ok((state, fields.nth(18).and_then(|s| s.parse().ok())))
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`), which together with the pid identifies a process for good.
pub fn process_start_time(pid: libc::pid_t) -> Option<u64> {
    process_stat(pid).ok()?.1
}

/// Is `pid` a live process (not a zombie)?
pub fn process_alive(pid: libc::pid_t) -> bool {
    match process_stat(pid) {
        Ok((state, _)) => !matches!(state.as_deref(), None | Some("Z") | Some("X")),
        Err(_) => false,
    }
}

/// Mounts a small private tmpfs (mode 0700) on `dir` unless one is already there.
pub fn ensure_tmpfs(dir: &std::path::Path, size: &str) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[allow(clippy::unnecessary_cast)] // the constant's width differs between architectures
    if btrfs::filesystem_type(dir)? == libc::TMPFS_MAGIC as i64 {
        return Ok(());
    }
    let target = mount::c_path(dir)?;
    let opts = std::ffi::CString::new(format!("size={size},mode=0700"))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in size"))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            c"forkd-run".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            opts.as_ptr().cast(),
        )
    } as libc::c_long)?;
    Ok(())
}

/// Mounts at `dir`, read-only, the sysfs of a network namespace made for it that holds
/// nothing but its loopback, replacing whatever earlier mounts are stacked there.
/// Returns that namespace, which the caller keeps open: a superblock does not keep its
/// namespace's interfaces alive, and without it `/sys/class/net` would be empty.
///
/// Sandboxes bind this one mount as their `/sys` instead of each mounting a sysfs of its
/// own network namespace: every new sysfs mount looks through one superblock per network
/// namespace on the host (`sget_fc`), which at thousands of sandboxes was the largest
/// cost of a create that grew with the number alive. What the sandbox sees differs only
/// in `/sys/class/net` (this namespace's loopback, not the sandbox's interfaces).
pub fn mount_quiet_sysfs(dir: &std::path::Path) -> io::Result<OwnedFd> {
    std::fs::create_dir_all(dir)?;
    let target = mount::c_path(dir)?;
    // Detach what an earlier daemon left (a kill -9 leaves its mount in place).
    // SAFETY: `target` is a NUL-terminated path that outlives the call.
    while unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } == 0 {}
    // A thread of its own takes the new network namespace (namespaces of that kind are
    // per thread) and mounts sysfs from there; the superblock refers to that namespace,
    // the returned descriptor keeps its loopback listed.
    std::thread::scope(|s| {
        s.spawn(|| -> io::Result<OwnedFd> {
            // SAFETY: unshare takes flags only and affects this thread alone.
            check(unsafe { libc::unshare(libc::CLONE_NEWNET) } as libc::c_long)?;
            let ns = std::fs::File::open("/proc/thread-self/ns/net")?;
            // SAFETY: every pointer is a NUL-terminated string that outlives the call.
            check(unsafe {
                libc::mount(
                    c"sysfs".as_ptr(),
                    target.as_ptr(),
                    c"sysfs".as_ptr(),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                )
            } as libc::c_long)?;
            Ok(OwnedFd::from(ns))
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the sysfs thread panicked")))
    })
}

/// Makes `cmd` start with descriptor `child_fd` open on a new network namespace whose
/// loopback is up, while the child itself stays in the caller's namespace. A sandbox
/// gets exactly such a namespace when it is created; CRIU restores a branch into this
/// one instead of rebuilding the checkpointed namespace with `ip` and `iptables`.
pub fn fresh_netns_fd(cmd: &mut std::process::Command, child_fd: RawFd) {
    use std::os::unix::process::CommandExt;
    const NS: &CStr = c"/proc/thread-self/ns/net";
    // SAFETY: the hook runs between fork and exec in the single-threaded child and makes
    // only system calls (open, unshare, socket, ioctl, dup2, setns, close); nothing is
    // allocated on the paths taken for "lo".
    unsafe {
        cmd.pre_exec(move || {
            let own = libc::open(NS.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if own < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut result = Ok(());
            if libc::unshare(libc::CLONE_NEWNET) < 0 {
                result = Err(io::Error::last_os_error());
            } else {
                result = result.and(interface_up(c"lo"));
                let fresh = libc::open(NS.as_ptr(), libc::O_RDONLY);
                if fresh < 0 || libc::dup2(fresh, child_fd) < 0 {
                    result = result.and(Err(io::Error::last_os_error()));
                }
                if fresh >= 0 && fresh != child_fd {
                    libc::close(fresh);
                }
                if libc::setns(own, libc::CLONE_NEWNET) < 0 {
                    result = result.and(Err(io::Error::last_os_error()));
                }
            }
            libc::close(own);
            result
        });
    }
}

/// Remounts the filesystem mounted at `target` with the filesystem options `data`,
/// keeping the mount's own flags, given as mountinfo lists them (`rw,nosuid,relatime`):
/// a remount replaces those flags with the ones it is passed.
pub fn remount(target: &std::path::Path, mount_options: &str, data: &str) -> io::Result<()> {
    let mut flags = libc::MS_REMOUNT;
    for option in mount_options.split(',') {
        flags |= match option {
            "ro" => libc::MS_RDONLY,
            "nosuid" => libc::MS_NOSUID,
            "nodev" => libc::MS_NODEV,
            "noexec" => libc::MS_NOEXEC,
            "noatime" => libc::MS_NOATIME,
            "nodiratime" => libc::MS_NODIRATIME,
            "relatime" => libc::MS_RELATIME,
            "strictatime" => libc::MS_STRICTATIME,
            _ => 0,
        };
    }
    let target = mount::c_path(target)?;
    let data = std::ffi::CString::new(data)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in mount data"))?;
    // SAFETY: the strings are NUL-terminated and outlive the call; the source and type
    // may be null for a remount.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            data.as_ptr().cast(),
        )
    } as libc::c_long)?;
    Ok(())
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn note_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set a flag ([`interrupted`]) instead of ending the process,
/// so that a long run (a benchmark) can stop through its normal error path and clean up.
pub fn flag_interrupts() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid value (empty mask, no flags) that we then
        // fill in; the handler only stores to an atomic, which is async-signal-safe.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = note_interrupt as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        check(rc as libc::c_long)?;
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM arrived since [`flag_interrupts`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// The system's program directories, where the tools forkd runs (mount, losetup,
/// mkfs.btrfs, nft, criu) are looked for when no setting names them, after the
/// directories [`set_program_dirs`] gave (the daemon's `PATH`, read once at start).
pub const PROGRAM_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

static FIRST_DIRS: std::sync::OnceLock<Vec<std::path::PathBuf>> = std::sync::OnceLock::new();

/// Sets the directories looked in before [`PROGRAM_DIRS`], once, before any program is
/// looked for; false if they were set already.
pub fn set_program_dirs(dirs: Vec<std::path::PathBuf>) -> bool {
    FIRST_DIRS.set(dirs).is_ok()
}

/// Where programs are looked for, in order: the directories [`set_program_dirs`] gave,
/// then [`PROGRAM_DIRS`].
pub fn program_dirs() -> Vec<std::path::PathBuf> {
    FIRST_DIRS
        .get()
        .into_iter()
        .flatten()
        .cloned()
        .chain(PROGRAM_DIRS.iter().map(std::path::PathBuf::from))
        .collect()
}

/// `name` in the first of [`program_dirs`] that has it as an executable file.
pub fn find_program(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    program_dirs().into_iter().map(|d| d.join(name)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod cloexec_tests;
