//! The system-call filter every sandbox runs under unless it is made without one.
//!
//! An allow-list in the spirit of the default profile of Docker and podman, which is
//! what task software already runs under: everything an ordinary program uses is
//! allowed; what reaches the kernel's wider surface is refused with `EPERM` (a program
//! that probes for a feature goes on). Refused, notably: new user namespaces (through
//! `clone`, `unshare` or `clone3`), `setns`, the key-ring calls, `bpf`,
//! `perf_event_open`, `userfaultfd`, `io_uring`, kernel modules, `kexec`,
//! `open_by_handle_at`, every mount call (old and new API), `swapon`/`swapoff`,
//! `reboot`, clock setting, `acct`, `quotactl`, `iopl`/`ioperm`, `pidfd_getfd`, `kcmp`,
//! `AF_VSOCK` sockets and personalities beyond the usual ones. `ptrace` stays (gdb and
//! strace work): the sandbox's processes are all it can see. Calls Docker's profile
//! allows only with a capability are allowed where the sandbox keeps that capability
//! (`chroot`, with CAP_SYS_CHROOT) and refused where it does not.
//!
//! Every x86-64 system call up to [`LAST_KNOWN`] is classified here: [`ALLOWED`],
//! [`UNIMPLEMENTED`] (the kernel answers `ENOSYS` itself), [`REFUSED`], or one of the four
//! whose arguments decide (`clone`, `unshare`, `personality`, `socket`); a unit test holds
//! the table complete. The filter is built by `seccompiler` (no hand-written BPF) as two
//! programs, stacked:
//! 1. `EPERM` for the refused calls and the refused arguments, everything else allowed:
//!    with the table complete this is the allow-list above, and its program is a fifth of
//!    the length of an allow-list's (seccompiler's programs are linear, and the kernel
//!    walks each once per system call number when it installs it, to cache which calls
//!    are always allowed: 0.8 ms per create for the allow-list's 1,600 instructions);
//! 2. `ENOSYS` for `clone3` (its flags are in memory, out of a filter's reach, and glibc
//!    falls back to `clone` only on `ENOSYS`) and for system calls newer than this table
//!    (so a program falls back as it would on an older kernel), everything else allowed.
//!
//! When two filters answer with an errno, the kernel keeps the one installed last, so
//! the second program's `ENOSYS` wins over the first's `EPERM`. System calls of another
//! architecture (i386's `int 0x80`, x32) are refused with `EPERM` too, never killed.
//! Both programs are installed by the set-up helper right before it execs the init,
//! after `no_new_privs`: every process of the sandbox inherits them, and CRIU saves and
//! restores them with the process tree (docs/DESIGN.md, "The system-call filter").

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether a sandbox runs under the filter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Seccomp {
    /// The default filter of this module.
    #[default]
    Default,
    /// No filter (`--security-opt seccomp=unconfined`).
    Unconfined,
}

impl Seccomp {
    pub fn as_str(self) -> &'static str {
        match self {
            Seccomp::Default => "default",
            Seccomp::Unconfined => "unconfined",
        }
    }
}

impl std::fmt::Display for Seccomp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// x86-64 numbers the libc crate does not name yet.
const SYS_IO_PGETEVENTS: i64 = 333;
const SYS_CACHESTAT: i64 = 451;
const SYS_MAP_SHADOW_STACK: i64 = 453;
const SYS_FUTEX_WAKE: i64 = 454;
const SYS_FUTEX_WAIT: i64 = 455;
const SYS_FUTEX_REQUEUE: i64 = 456;
const SYS_STATMOUNT: i64 = 457;
const SYS_LISTMOUNT: i64 = 458;
const SYS_LSM_GET_SELF_ATTR: i64 = 459;
const SYS_LSM_SET_SELF_ATTR: i64 = 460;
const SYS_LSM_LIST_MODULES: i64 = 461;
const SYS_SETXATTRAT: i64 = 463;
const SYS_GETXATTRAT: i64 = 464;
const SYS_LISTXATTRAT: i64 = 465;
const SYS_REMOVEXATTRAT: i64 = 466;
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// The highest system-call number this table knows (allowed or refused); newer ones
/// answer `ENOSYS`.
pub const LAST_KNOWN: i64 = SYS_OPEN_TREE_ATTR;
/// How many numbers past [`LAST_KNOWN`] answer `ENOSYS`: up to 531, past which x86-64's
/// numbers are x32's (native calls would have to pass 511 first).
const NEWER: i64 = 64;

/// Allowed whatever their arguments.
#[rustfmt::skip]
pub const ALLOWED: &[i64] = {
    use libc::*;
    &[
        SYS_accept, SYS_accept4, SYS_access, SYS_adjtimex, SYS_alarm, SYS_arch_prctl,
        SYS_bind, SYS_brk, SYS_CACHESTAT, SYS_capget, SYS_capset, SYS_chdir, SYS_chmod, SYS_chroot,
        SYS_chown, SYS_clock_adjtime, SYS_clock_getres, SYS_clock_gettime,
        SYS_clock_nanosleep, SYS_close, SYS_close_range, SYS_connect, SYS_copy_file_range,
        SYS_creat, SYS_dup, SYS_dup2, SYS_dup3, SYS_epoll_create, SYS_epoll_create1,
        SYS_epoll_ctl, SYS_epoll_ctl_old, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_epoll_wait,
        SYS_epoll_wait_old, SYS_eventfd,
        SYS_eventfd2, SYS_execve, SYS_execveat, SYS_exit, SYS_exit_group, SYS_faccessat,
        SYS_faccessat2, SYS_fadvise64, SYS_fallocate, SYS_fanotify_mark, SYS_fchdir,
        SYS_fchmod, SYS_fchmodat, SYS_fchmodat2, SYS_fchown, SYS_fchownat, SYS_fcntl,
        SYS_fdatasync, SYS_fgetxattr, SYS_flistxattr, SYS_flock, SYS_fork,
        SYS_fremovexattr, SYS_fsetxattr, SYS_fstat, SYS_fstatfs, SYS_fsync, SYS_ftruncate,
        SYS_futex, SYS_FUTEX_REQUEUE, SYS_FUTEX_WAIT, SYS_futex_waitv, SYS_FUTEX_WAKE,
        SYS_futimesat, SYS_get_mempolicy, SYS_get_thread_area, SYS_getcpu, SYS_getcwd, SYS_getdents, SYS_getdents64, SYS_getegid,
        SYS_geteuid, SYS_getgid, SYS_getgroups, SYS_getitimer, SYS_getpeername,
        SYS_getpgid, SYS_getpgrp, SYS_getpid, SYS_getppid, SYS_getpriority, SYS_getrandom,
        SYS_getresgid, SYS_getresuid, SYS_getrlimit, SYS_get_robust_list, SYS_getrusage,
        SYS_getsid, SYS_getsockname, SYS_getsockopt, SYS_gettid, SYS_gettimeofday,
        SYS_getuid, SYS_getxattr, SYS_GETXATTRAT, SYS_inotify_add_watch, SYS_inotify_init,
        SYS_inotify_init1, SYS_inotify_rm_watch, SYS_io_cancel, SYS_ioctl, SYS_io_destroy,
        SYS_io_getevents, SYS_IO_PGETEVENTS, SYS_ioprio_get, SYS_ioprio_set, SYS_io_setup,
        SYS_io_submit, SYS_kill, SYS_landlock_add_rule, SYS_landlock_create_ruleset,
        SYS_landlock_restrict_self, SYS_lchown, SYS_lgetxattr, SYS_link, SYS_linkat,
        SYS_listen, SYS_listxattr, SYS_LISTXATTRAT, SYS_llistxattr, SYS_lremovexattr,
        SYS_lseek, SYS_lsetxattr, SYS_mbind, SYS_LSM_GET_SELF_ATTR, SYS_LSM_LIST_MODULES,
        SYS_LSM_SET_SELF_ATTR, SYS_lstat, SYS_madvise, SYS_MAP_SHADOW_STACK,
        SYS_membarrier, SYS_memfd_create, SYS_memfd_secret, SYS_mincore, SYS_mkdir,
        SYS_mkdirat, SYS_mknod, SYS_mknodat, SYS_mlock, SYS_mlock2, SYS_mlockall,
        SYS_mmap, SYS_modify_ldt, SYS_mprotect, SYS_mq_getsetattr, SYS_mq_notify,
        SYS_mq_open, SYS_mq_timedreceive, SYS_mq_timedsend, SYS_mq_unlink, SYS_mremap,
        SYS_mseal, SYS_msgctl, SYS_msgget, SYS_msgrcv, SYS_msgsnd, SYS_msync,
        SYS_munlock, SYS_munlockall, SYS_munmap, SYS_name_to_handle_at, SYS_nanosleep,
        SYS_newfstatat, SYS_open, SYS_openat, SYS_openat2, SYS_pause, SYS_pidfd_open,
        SYS_pidfd_send_signal, SYS_pipe, SYS_pipe2, SYS_pkey_alloc, SYS_pkey_free,
        SYS_pkey_mprotect, SYS_poll, SYS_ppoll, SYS_prctl, SYS_pread64, SYS_preadv,
        SYS_preadv2, SYS_prlimit64, SYS_process_madvise, SYS_process_mrelease, SYS_process_vm_readv,
        SYS_process_vm_writev, SYS_pselect6, SYS_ptrace, SYS_pwrite64, SYS_pwritev,
        SYS_pwritev2, SYS_read, SYS_readahead, SYS_readlink, SYS_readlinkat, SYS_readv,
        SYS_recvfrom, SYS_recvmmsg, SYS_recvmsg, SYS_remap_file_pages, SYS_removexattr,
        SYS_REMOVEXATTRAT, SYS_rename, SYS_renameat, SYS_renameat2, SYS_restart_syscall,
        SYS_rmdir, SYS_rseq, SYS_rt_sigaction, SYS_rt_sigpending, SYS_rt_sigprocmask,
        SYS_rt_sigqueueinfo, SYS_rt_sigreturn, SYS_rt_sigsuspend, SYS_rt_sigtimedwait,
        SYS_rt_tgsigqueueinfo, SYS_sched_getaffinity, SYS_sched_getattr,
        SYS_sched_getparam, SYS_sched_get_priority_max, SYS_sched_get_priority_min,
        SYS_sched_getscheduler, SYS_sched_rr_get_interval, SYS_sched_setaffinity,
        SYS_sched_setattr, SYS_sched_setparam, SYS_sched_setscheduler, SYS_sched_yield,
        SYS_seccomp, SYS_select, SYS_semctl, SYS_semget, SYS_semop, SYS_semtimedop,
        SYS_sendfile, SYS_sendmmsg, SYS_sendmsg, SYS_sendto, SYS_setfsgid, SYS_setfsuid,
        SYS_setgid, SYS_setgroups, SYS_setitimer, SYS_setpgid, SYS_setpriority,
        SYS_setregid, SYS_setresgid, SYS_setresuid, SYS_setreuid, SYS_setrlimit,
        SYS_set_mempolicy, SYS_set_mempolicy_home_node, SYS_set_robust_list,
        SYS_set_thread_area, SYS_setsid, SYS_setsockopt, SYS_set_tid_address, SYS_setuid,
        SYS_setxattr, SYS_SETXATTRAT, SYS_shmat, SYS_shmctl, SYS_shmdt, SYS_shmget,
        SYS_shutdown, SYS_sigaltstack, SYS_signalfd, SYS_signalfd4, SYS_socketpair,
        SYS_splice, SYS_stat, SYS_statfs, SYS_statx, SYS_symlink, SYS_symlinkat,
        SYS_sync, SYS_sync_file_range, SYS_syncfs, SYS_sysinfo, SYS_tee, SYS_tgkill,
        SYS_time, SYS_timer_create, SYS_timer_delete, SYS_timer_getoverrun,
        SYS_timer_gettime, SYS_timer_settime, SYS_timerfd_create, SYS_timerfd_gettime,
        SYS_timerfd_settime, SYS_times, SYS_tkill, SYS_truncate, SYS_umask, SYS_uname,
        SYS_unlink, SYS_unlinkat, SYS_utime, SYS_utimensat, SYS_utimes, SYS_vfork,
        SYS_vmsplice, SYS_wait4, SYS_waitid, SYS_write, SYS_writev,
    ]
};

/// Numbers the kernel no longer (or never did) implement on x86-64: let through, the
/// kernel answers `ENOSYS`.
#[rustfmt::skip]
pub const UNIMPLEMENTED: &[i64] = {
    use libc::*;
    &[
        SYS__sysctl, 174 /* create_module */, 177 /* get_kernel_syms */, 178 /* query_module */,
        SYS_nfsservctl, SYS_getpmsg, SYS_putpmsg, SYS_afs_syscall, SYS_tuxcall, SYS_security,
        SYS_vserver,
    ]
};

/// Refused (each returns `EPERM`).
pub const REFUSED: &[(&str, i64)] = {
    use libc::*;
    &[
        ("acct", SYS_acct),
        ("add_key", SYS_add_key),
        ("bpf", SYS_bpf),
        ("clock_settime", SYS_clock_settime),
        ("delete_module", SYS_delete_module),
        ("finit_module", SYS_finit_module),
        ("fanotify_init", SYS_fanotify_init),
        ("fsconfig", SYS_fsconfig),
        ("fsmount", SYS_fsmount),
        ("fsopen", SYS_fsopen),
        ("fspick", SYS_fspick),
        ("init_module", SYS_init_module),
        ("io_uring_enter", SYS_io_uring_enter),
        ("io_uring_register", SYS_io_uring_register),
        ("io_uring_setup", SYS_io_uring_setup),
        ("ioperm", SYS_ioperm),
        ("iopl", SYS_iopl),
        ("kcmp", SYS_kcmp),
        ("kexec_file_load", SYS_kexec_file_load),
        ("kexec_load", SYS_kexec_load),
        ("keyctl", SYS_keyctl),
        ("listmount", SYS_LISTMOUNT),
        ("lookup_dcookie", SYS_lookup_dcookie),
        ("migrate_pages", SYS_migrate_pages),
        ("mount", SYS_mount),
        ("mount_setattr", SYS_mount_setattr),
        ("move_mount", SYS_move_mount),
        ("move_pages", SYS_move_pages),
        ("open_by_handle_at", SYS_open_by_handle_at),
        ("open_tree", SYS_open_tree),
        ("open_tree_attr", SYS_OPEN_TREE_ATTR),
        ("perf_event_open", SYS_perf_event_open),
        ("pidfd_getfd", SYS_pidfd_getfd),
        ("pivot_root", SYS_pivot_root),
        ("quotactl", SYS_quotactl),
        ("quotactl_fd", SYS_quotactl_fd),
        ("reboot", SYS_reboot),
        ("request_key", SYS_request_key),
        ("setdomainname", SYS_setdomainname),
        ("sethostname", SYS_sethostname),
        ("setns", SYS_setns),
        ("settimeofday", SYS_settimeofday),
        ("statmount", SYS_STATMOUNT),
        ("swapoff", SYS_swapoff),
        ("swapon", SYS_swapon),
        ("syslog", SYS_syslog),
        ("sysfs", SYS_sysfs),
        ("umount2", SYS_umount2),
        ("uselib", SYS_uselib),
        ("userfaultfd", SYS_userfaultfd),
        ("ustat", SYS_ustat),
        ("vhangup", SYS_vhangup),
    ]
};

/// Namespace flags of `clone` and `unshare`: a new user namespace is what would give a
/// process every capability again; the others need `CAP_SYS_ADMIN`, which no sandbox
/// holds, and are refused here as well so the refusal does not depend on that.
const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// `CLONE_NEWTIME` (Linux 5.6).
const CLONE_NEWTIME: u64 = 0x80;

/// `personality` values programs use: Linux, `PER_LINUX32`, `UNAME26`, both (Docker's
/// list), `ADDR_NO_RANDOMIZE` alone and with `PER_LINUX32` (gdb and `setarch -R`), and the
/// query `0xffffffff`; others (`READ_IMPLIES_EXEC`, say) are refused.
const PERSONALITIES: &[u64] = &[
    0,
    0x0008,
    0x0002_0000,
    0x0002_0008,
    0x0004_0000,
    0x0004_0008,
    0xffff_ffff,
];

fn cond(arg: u8, len: Len, op: Op, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, len, op, value).expect("a valid seccomp condition")
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).expect("a valid seccomp rule")
}

/// The `EPERM` program (the first one installed): the refused calls, and the refused
/// arguments of the four that depend on them.
fn refusals() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|&(_, nr)| (nr, Vec::new())).collect();
    // Any namespace flag: one rule a flag (a rule is a conjunction; the rules of a call
    // are alternatives).
    let any_namespace = |flags: u64| {
        (0..64)
            .map(|bit| 1u64 << bit)
            .filter(|f| flags & f != 0)
            .map(|f| rule(vec![cond(0, Len::Qword, Op::MaskedEq(f), f)]))
            .collect::<Vec<_>>()
    };
    rules.insert(libc::SYS_clone, any_namespace(NAMESPACE_FLAGS));
    // A time namespace only through unshare (in clone's flags that bit is the exit
    // signal's).
    rules.insert(
        libc::SYS_unshare,
        any_namespace(NAMESPACE_FLAGS | CLONE_NEWTIME),
    );
    // A personality other than the usual ones.
    rules.insert(
        libc::SYS_personality,
        vec![rule(
            PERSONALITIES
                .iter()
                .map(|&p| cond(0, Len::Dword, Op::Ne, p))
                .collect(),
        )],
    );
    // AF_VSOCK: the host's hypervisor sockets.
    rules.insert(
        libc::SYS_socket,
        vec![rule(vec![cond(
            0,
            Len::Dword,
            Op::Eq,
            libc::AF_VSOCK as u64,
        )])],
    );
    program(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
}

/// The `ENOSYS` program (the second one installed).
fn not_implemented() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_clone3, Vec::new());
    for nr in LAST_KNOWN + 1..=LAST_KNOWN + NEWER {
        rules.insert(nr, Vec::new());
    }
    program(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )
}

fn program(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(rules, mismatch, matched, TargetArch::x86_64)
        .map_err(|e| format!("build the system-call filter: {e}"))?;
    let mut prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("compile the system-call filter: {e}"))?;
    // The program starts by checking the architecture and kills the process on another
    // one (seccompiler's choice). Refuse the call instead: a 32-bit program gets EPERM.
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let mut patched = 0;
    for ins in prog.iter_mut().take(3) {
        if ins.code == (libc::BPF_RET | libc::BPF_K) as u16 && ins.k == kill {
            ins.k = eperm;
            patched += 1;
        }
    }
    if patched != 1 {
        return Err("compile the system-call filter: no architecture check where expected".into());
    }
    // x32 calls carry x86-64's architecture and their number with bit 30 set: no rule
    // names them, so without this they would take the default action (allow, in the
    // first program). Right after the number is loaded, refuse any at or past that bit.
    // Every jump of seccompiler's programs is forward and relative, and none crosses
    // this point, so inserting here moves nothing.
    let load_nr = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    if prog.get(3).map(|i| (i.code, i.k)) != Some((load_nr, 0)) {
        return Err(
            "compile the system-call filter: no load of the call's number where expected".into(),
        );
    }
    let x32 = [
        seccompiler::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        seccompiler::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: eperm,
        },
    ];
    prog.splice(4..4, x32);
    Ok(prog)
}

/// The bit x32's system-call numbers carry (`__X32_SYSCALL_BIT`).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The default filter's programs, in the order they are installed.
pub fn default_programs() -> Result<Vec<BpfProgram>, String> {
    Ok(vec![refusals()?, not_implemented()?])
}

/// Installs the default filter on the calling thread (which must be the only one, or
/// the others go unfiltered). Sets `no_new_privs` if it is not set.
pub fn install_default() -> Result<(), String> {
    for (i, p) in default_programs()?.iter().enumerate() {
        seccompiler::apply_filter(p)
            .map_err(|e| format!("install the system-call filter (program {}): {e}", i + 1))?;
    }
    Ok(())
}

/// [`install_default`] without `no_new_privs`, for a sandbox whose setuid programs take
/// effect: the caller still holds `CAP_SYS_ADMIN`.
pub fn install_default_keeping_privileges() -> Result<(), String> {
    for (i, p) in default_programs()?.iter().enumerate() {
        let insns: Vec<libc::sock_filter> = p
            .iter()
            .map(|f| libc::sock_filter {
                code: f.code,
                jt: f.jt,
                jf: f.jf,
                k: f.k,
            })
            .collect();
        forkd_sys::install_seccomp_keeping_privileges(&insns)
            .map_err(|e| format!("install the system-call filter (program {}): {e}", i + 1))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers of x86-64 system calls up to LAST_KNOWN (none between 335 and 423).
    fn every_number() -> impl Iterator<Item = i64> {
        (0..=334).chain(424..=LAST_KNOWN)
    }

    #[test]
    fn every_system_call_up_to_the_last_known_is_classified_once() {
        let special = [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_unshare,
            libc::SYS_personality,
            libc::SYS_socket,
        ];
        for nr in every_number() {
            let places = [
                ALLOWED.contains(&nr),
                UNIMPLEMENTED.contains(&nr),
                REFUSED.iter().any(|(_, r)| *r == nr),
                special.contains(&nr),
            ];
            assert_eq!(
                places.iter().filter(|p| **p).count(),
                1,
                "system call {nr} is in {} of the tables (allowed, unimplemented, refused, special)",
                places.iter().filter(|p| **p).count()
            );
        }
    }

    #[test]
    fn tables_do_not_overlap_and_stay_below_the_last_known_number() {
        for (name, nr) in REFUSED {
            assert!(!ALLOWED.contains(nr), "{name} is both allowed and refused");
            assert!(*nr <= LAST_KNOWN, "{name} is past LAST_KNOWN");
        }
        for nr in ALLOWED {
            assert!(*nr <= LAST_KNOWN, "{nr} is past LAST_KNOWN");
            for special in [
                libc::SYS_clone,
                libc::SYS_clone3,
                libc::SYS_unshare,
                libc::SYS_socket,
            ] {
                assert_ne!(*nr, special, "{nr} has rules of its own");
            }
        }
        let mut sorted = ALLOWED.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ALLOWED.len(), "a number is listed twice");
    }

    #[test]
    fn programs_compile_and_refuse_other_architectures_without_killing() {
        let progs = default_programs().unwrap();
        assert_eq!(progs.len(), 2);
        for p in &progs {
            assert!(
                p.len() < 4096,
                "a BPF program holds at most 4096 instructions"
            );
            assert!(p.iter().all(|i| i.k != libc::SECCOMP_RET_KILL_PROCESS
                || i.code != (libc::BPF_RET | libc::BPF_K) as u16));
        }
    }

    #[test]
    fn x32_numbers_are_refused_right_after_the_number_is_loaded() {
        for p in default_programs().unwrap() {
            let jge = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
            assert_eq!(
                (p[4].code, p[4].k, p[4].jt, p[4].jf),
                (jge, X32_SYSCALL_BIT, 0, 1)
            );
            assert_eq!(p[5].k, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
        }
    }
}
