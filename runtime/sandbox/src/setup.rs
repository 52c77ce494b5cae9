//! Building a sandbox around its init.
//!
//! The daemon runs `forkd-init __setup` (a fresh, single-threaded process) with a
//! [`SetupSpec`] and its descriptors ([`Handed`]) on stdin. That process:
//! 1. joins the sandbox's cgroup, so everything after it is accounted and limited;
//! 2. joins the network namespace it was handed (or unshares a new one), enters a copy
//!    of an empty mount namespace (the daemon's: one read-only tmpfs and nothing else, so
//!    nothing of the host is in it), and unshares UTS, IPC, cgroup and pid namespaces;
//! 3. forks: the child is PID 1 of the new pid namespace. It stacks the overlay root on
//!    the empty tmpfs and `chroot`s into it (no `pivot_root`, which walks every task on
//!    the host), mounts `/proc`, makes a minimal `/dev` in the root filesystem (the
//!    standard device nodes, and a private devpts instance), a read-only `/sys`, sets
//!    the hostname, brings up loopback, becomes a session leader, gives itself stdio
//!    inside the sandbox, closes every other descriptor, shrinks the capability
//!    bounding set, sets no_new_privs, installs the system-call filter
//!    ([`crate::seccomp`], unless the sandbox is unconfined) and execs `/.forkd/init`;
//! 4. reports the child's host pid on stdout (or the child's error, sent through a
//!    close-on-exec pipe that exec closes) and exits. The daemon is a child subreaper,
//!    so the init becomes the daemon's child.
//!
//! Nothing from the host reaches the init but its memory image: no descriptor, no
//! mount. That is what lets CRIU checkpoint the whole tree later.

use crate::id::SandboxId;
use forkd_cgroups::Cgroup;
use nix::fcntl::OFlag;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::stat::{makedev, Mode, SFlag};
use nix::unistd::{chdir, sethostname, setsid};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::layout::{CONTROL_SOCKET, FORKD_DIR, INIT_PATH, LOG_DIR, SPEC_LIMIT};

/// Capabilities kept in the bounding set of every sandbox (others are dropped before
/// the init runs, so no process in the sandbox can ever hold them). This is the set
/// container runtimes commonly grant, less MKNOD; notably absent: SYS_ADMIN (mount),
/// SYS_MODULE, SYS_PTRACE, SYS_TIME, SYS_BOOT, NET_ADMIN, SYS_RAWIO, BPF, PERFMON,
/// CHECKPOINT_RESTORE. MKNOD is dropped because nothing else would stop a device node
/// made in the sandbox from opening the host's device (runtimes that keep it rely on a
/// device cgroup allow-list, which cgroup v2 only offers through BPF); the nodes a
/// sandbox needs are in its `/dev` (see [`make_dev`]) before the capabilities go.
pub const KEPT_CAPS: &[caps::Capability] = &[
    caps::Capability::CAP_CHOWN,
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_FSETID,
    caps::Capability::CAP_FOWNER,
    caps::Capability::CAP_NET_RAW,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_SETFCAP,
    caps::Capability::CAP_SETPCAP,
    caps::Capability::CAP_NET_BIND_SERVICE,
    caps::Capability::CAP_SYS_CHROOT,
    caps::Capability::CAP_KILL,
    caps::Capability::CAP_AUDIT_WRITE,
];

/// Everything the set-up process needs to know, besides the descriptors that come with
/// it ([`Handed`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetupSpec {
    pub id: SandboxId,
    /// The directory on the host that stands for the sandbox's root (named in errors; the
    /// root itself comes as `root_fd`).
    pub rootfs: PathBuf,
    pub hostname: String,
    /// The sandbox's cgroup, created and limited by the caller.
    pub cgroup: Option<Cgroup>,
    /// Bind `/.forkd/net/{resolv.conf,hosts}` read-only over the same names in `/etc`
    /// (a sandbox with egress; the daemon wrote the files).
    #[serde(default)]
    pub name_files: bool,
    /// A sysfs mount to bind read-only as `/sys` (`forkd_sys::mount_quiet_sysfs`, visible
    /// where the set-up starts); without one, a sysfs is mounted for the sandbox.
    #[serde(default)]
    pub sysfs: Option<PathBuf>,
    /// The system-call filter installed right before the init runs.
    #[serde(default)]
    pub seccomp: crate::Seccomp,
    /// Leave `no_new_privs` unset, so setuid programs (sudo) take effect: a process can
    /// become the sandbox's root, whose capabilities the bounding set still limits.
    #[serde(default)]
    pub setuid: bool,
}

/// The descriptors the set-up receives with its spec, on its stdin (a Unix socket, in one
/// `SCM_RIGHTS` message, in this order): none is inherited, so the daemon starts the
/// set-up with `posix_spawn` (a `vfork`), not a `fork` that copies the daemon's page
/// tables (1.2-1.6 ms with 20 MB of the daemon's memory resident, and more as it grows).
pub struct Handed {
    /// The root as a detached mount, attached in the sandbox's own mount namespace only.
    pub root: OwnedFd,
    /// The mount namespace the sandbox's is copied from: one whose only mount is an empty
    /// tmpfs (`forkd_sys::mount::empty_namespace`).
    pub mntns: OwnedFd,
    /// The network namespace the sandbox joins (one made ahead with loopback up, or one
    /// with egress, already given its veth); without one, the set-up makes a new one.
    pub netns: Option<OwnedFd>,
}

/// Reads the spec and its descriptors from `conn` until the sender shuts it down.
fn receive(conn: &std::os::unix::net::UnixStream) -> StepResult<(SetupSpec, Handed)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut body = vec![0u8; SPEC_LIMIT];
    let mut len = 0;
    let mut fds: Vec<OwnedFd> = Vec::new();
    loop {
        let mut space = nix::cmsg_space!([RawFd; 3]);
        let mut iov = [std::io::IoSliceMut::new(&mut body[len..])];
        let msg = step(
            "read spec",
            recvmsg::<()>(
                conn.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ),
        )?;
        let n = msg.bytes;
        for c in msg.cmsgs().map_err(|e| ("read spec", e.to_string()))? {
            if let ControlMessageOwned::ScmRights(got) = c {
                fds.extend(got.into_iter().map(forkd_sys::own_fd));
            }
        }
        if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
            return Err(("read spec", "more descriptors than expected".into()));
        }
        if n == 0 {
            break;
        }
        len += n;
        if len == body.len() {
            return Err(("read spec", format!("longer than {SPEC_LIMIT} bytes")));
        }
    }
    let spec = step(
        "parse spec",
        serde_json::from_slice::<SetupSpec>(&body[..len]),
    )?;
    let count = fds.len();
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next(), fds.next()) {
        (Some(root), Some(mntns), netns) if count <= 3 => Ok((spec, Handed { root, mntns, netns })),
        _ => Err((
            "read spec",
            format!("expected 2 or 3 descriptors with the spec, got {count}"),
        )),
    }
}

/// What the set-up process prints on stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SetupReply {
    Ok { pid: i32 },
    Error { step: String, message: String },
}

/// Entry point of `forkd-init __setup`. Never returns.
pub fn setup_main() -> ! {
    // Stdin is the daemon's socket (see [`Handed`]).
    let conn = step("read spec", std::io::stdin().as_fd().try_clone_to_owned())
        .map(std::os::unix::net::UnixStream::from);
    let reply = match conn
        .and_then(|c| receive(&c))
        .and_then(|(spec, handed)| run(&spec, handed))
    {
        Ok(pid) => SetupReply::Ok { pid },
        Err((step, message)) => SetupReply::Error {
            step: step.into(),
            message,
        },
    };
    let ok = matches!(reply, SetupReply::Ok { .. });
    let mut out = std::io::stdout();
    let _ = serde_json::to_writer(&mut out, &reply);
    let _ = out.flush();
    std::process::exit(if ok { 0 } else { 1 })
}

type StepResult<T> = Result<T, (&'static str, String)>;

fn step<T, E: std::fmt::Display>(name: &'static str, r: Result<T, E>) -> StepResult<T> {
    r.map_err(|e| (name, e.to_string()))
}

/// The OOM killer's adjustment of every sandbox's processes: they go before the daemon
/// and the host's own services when memory runs out. Raising it needs no privilege; a
/// sandbox may lower it back to 0 at most (below that needs CAP_SYS_RESOURCE).
pub const OOM_SCORE_ADJ: i32 = 500;

fn run(spec: &SetupSpec, handed: Handed) -> StepResult<i32> {
    // Still in the host's /proc; inherited by the init and all it starts.
    step(
        "oom_score_adj",
        std::fs::write("/proc/self/oom_score_adj", OOM_SCORE_ADJ.to_string()),
    )?;
    if let Some(cg) = &spec.cgroup {
        step("join cgroup", cg.add_pid(std::process::id() as i32))?;
    }
    let mut flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWCGROUP
        | CloneFlags::CLONE_NEWPID;
    match &handed.netns {
        Some(ns) => step(
            "join network namespace",
            nix::sched::setns(ns, CloneFlags::CLONE_NEWNET),
        )?,
        None => flags |= CloneFlags::CLONE_NEWNET,
    }
    drop(handed.netns);
    let mounts = Mounts {
        root: handed.root,
        sysfs: match &spec.sysfs {
            Some(p) => Some(step(
                "open the shared sysfs",
                forkd_sys::mount::clone_tree(p),
            )?),
            None => None,
        },
    };
    // The sandbox's mount namespace is a copy of the empty one, not of this process's:
    // nothing of the host is in it, and the root needs no `pivot_root` (which walks
    // every task on the host; see docs/DESIGN.md, "Many sandboxes").
    let empty = handed.mntns;
    step(
        "enter the empty mount namespace",
        nix::sched::setns(&empty, CloneFlags::CLONE_NEWNS),
    )?;
    drop(empty);
    step("unshare namespaces", unshare(flags))?;
    let (rd, wr) = step(
        "create pipe",
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC),
    )?;
    // The init says on this pipe that it listens on its control socket: the daemon can
    // then use the sandbox at once, without trying to connect until it can.
    let (ready_rd, ready_wr) = step(
        "create pipe",
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC),
    )?;
    // This process is a fresh exec of forkd that started no threads.
    let pid = step("fork init", forkd_sys::fork_single_threaded())?;
    if pid == 0 {
        drop(rd);
        drop(ready_rd);
        let err = match child(spec, mounts, ready_wr.as_raw_fd()) {
            Ok(never) => match never {},
            Err((s, m)) => format!("{s}: {m}"),
        };
        let mut f = std::fs::File::from(wr);
        let _ = f.write_all(err.as_bytes());
        forkd_sys::exit_immediately(1)
    }
    drop(wr);
    drop(ready_wr);
    let mut msg = String::new();
    let mut f = std::fs::File::from(rd);
    let _ = f.read_to_string(&mut msg);
    if !msg.is_empty() {
        // The child's message starts with its own step name.
        return Err(("prepare init", msg));
    }
    wait_listening(ready_rd, INIT_READY_WITHIN)?;
    Ok(pid)
}

/// How long an init that has started may take to listen on its control socket.
const INIT_READY_WITHIN: Duration = Duration::from_secs(10);

/// Waits for the init's byte on the ready pipe (see [`crate::init`]).
fn wait_listening(ready: OwnedFd, within: Duration) -> StepResult<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut fds = [PollFd::new(ready.as_fd(), PollFlags::POLLIN)];
        // Rounded up, so that the wait is never cut short by a fraction of a millisecond.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) if std::time::Instant::now() < deadline => continue,
            Ok(0) => {
                return Err((
                    "wait for init",
                    format!(
                        "{INIT_PATH} did not listen on its control socket within {} s",
                        within.as_secs_f64()
                    ),
                ))
            }
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(("wait for init", format!("poll: {e}"))),
        }
    }
    let mut byte = [0u8; 1];
    match nix::unistd::read(ready.as_raw_fd(), &mut byte) {
        Ok(1) => Ok(()),
        Ok(_) => Err((
            "wait for init",
            format!("{INIT_PATH} exited before it listened on its control socket (its log: /.forkd/logs/init.log)"),
        )),
        Err(e) => Err(("wait for init", format!("read: {e}"))),
    }
}

fn mnt(
    src: &str,
    target: &Path,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> StepResult<()> {
    mount(Some(src), target, Some(fstype), flags, data)
        .map_err(|e| ("mount", format!("{fstype} on {}: {e}", target.display())))
}

/// Binds forkd's name-service files over `/etc/resolv.conf` and `/etc/hosts`, read-only.
/// Runs inside the root, so a symlink at either path resolves inside the sandbox. A
/// missing file is created empty as the mount point; a dangling symlink (an image that
/// expects a resolver daemon) or an image without `/etc` is left alone.
fn bind_name_files() -> StepResult<()> {
    for name in ["resolv.conf", "hosts"] {
        let src = Path::new("/")
            .join(FORKD_DIR.trim_start_matches('/'))
            .join("net")
            .join(name);
        let dst = Path::new("/etc").join(name);
        if !src.is_file() || !Path::new("/etc").is_dir() {
            continue;
        }
        if std::fs::symlink_metadata(&dst).is_err() {
            std::fs::write(&dst, b"")
                .map_err(|e| ("network", format!("create {}: {e}", dst.display())))?;
        } else if !dst.exists() {
            continue;
        }
        mount(
            Some(&src),
            &dst,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| {
            (
                "network",
                format!("bind {} over {}: {e}", src.display(), dst.display()),
            )
        })?;
        let ro = MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC;
        mount(None::<&str>, &dst, None::<&str>, ro, None::<&str>)
            .map_err(|e| ("network", format!("make {} read-only: {e}", dst.display())))?;
    }
    Ok(())
}

/// The mounts the set-up takes into the sandbox's mount namespace, opened before it
/// enters it (where they are not visible).
struct Mounts {
    /// The root, a detached mount.
    root: OwnedFd,
    /// A copy of the shared sysfs, when there is one.
    sysfs: Option<OwnedFd>,
}

/// Runs as PID 1 of the new namespaces; only returns on error.
fn child(spec: &SetupSpec, mounts: Mounts, ready: RawFd) -> StepResult<std::convert::Infallible> {
    // The namespace is a copy of the empty one: a read-only tmpfs at its root and
    // nothing else. The root is stacked on it and becomes this process's root; every
    // path from here on resolves inside the sandbox.
    forkd_sys::mount::attach(mounts.root.as_fd(), Path::new("/")).map_err(|e| {
        (
            "root",
            format!("attach the root ({}) on /: {e}", spec.rootfs.display()),
        )
    })?;
    nix::unistd::fchdir(mounts.root.as_raw_fd())
        .map_err(|e| ("root", format!("enter the root: {e}")))?;
    nix::unistd::chroot(".").map_err(|e| ("root", format!("chroot: {e}")))?;
    chdir("/").map_err(|e| ("root", e.to_string()))?;
    drop(mounts.root);
    let root = Path::new("/");
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    for d in ["proc", "sys", "tmp", ".forkd/run", ".forkd/logs"] {
        std::fs::create_dir_all(root.join(d)).map_err(|e| ("mount", format!("mkdir {d}: {e}")))?;
    }
    mnt("proc", &root.join("proc"), "proc", nosuid, None)?;
    // Parts of /proc that act on the whole host rather than on the sandbox: writable, a
    // sandbox's root could change global sysctls or IRQ affinities, or crash the host
    // through sysrq. Read-only binds; this also leaves a branch's new network namespace
    // identical to the checkpointed one (net sysctls cannot have been changed).
    for p in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        let path = root.join("proc").join(p);
        if !path.exists() {
            continue;
        }
        mount(
            Some(&path),
            &path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| ("mount", format!("bind /proc/{p}: {e}")))?;
        let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid;
        mount(None::<&str>, &path, None::<&str>, ro, None::<&str>)
            .map_err(|e| ("mount", format!("make /proc/{p} read-only: {e}")))?;
    }
    let sys = root.join("sys");
    match mounts.sysfs {
        Some(sysfs) => {
            forkd_sys::mount::attach(sysfs.as_fd(), &sys)
                .map_err(|e| ("mount", format!("attach the shared sysfs as /sys: {e}")))?;
            let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | nosuid;
            mount(None::<&str>, &sys, None::<&str>, ro, None::<&str>)
                .map_err(|e| ("mount", format!("make /sys read-only: {e}")))?;
        }
        None => mnt("sysfs", &sys, "sysfs", nosuid | MsFlags::MS_RDONLY, None)?,
    }
    make_dev(root)?;
    mnt(
        "devpts",
        &root.join("dev/pts"),
        "devpts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=620,gid=5"),
    )?;
    chmod(&root.join(".forkd/run"), 0o700)
        .map_err(|e| ("mount", format!("chmod .forkd/run: {e}")))?;

    if spec.name_files {
        bind_name_files()?;
    }
    sethostname(&spec.hostname).map_err(|e| ("hostname", e.to_string()))?;
    forkd_sys::interface_up(c"lo").map_err(|e| ("network", format!("bring up lo: {e}")))?;
    setsid().map_err(|e| ("stdio", format!("setsid: {e}")))?;

    // Stdio of the init lives inside the sandbox.
    let null = open_fd("/dev/null", OFlag::O_RDWR)?;
    let log = open_fd(
        "/.forkd/logs/init.log",
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND,
    )?;
    for (fd, target) in [(&null, 0), (&log, 1), (&log, 2)] {
        nix::unistd::dup2(fd.as_raw_fd(), target).map_err(|e| ("stdio", e.to_string()))?;
    }
    drop(null);
    drop(log);
    // Everything else the set-up process had open disappears at exec; the error pipe
    // is close-on-exec too, which is how the parent learns that exec succeeded.
    forkd_sys::cloexec_fds_from(3).map_err(|e| ("stdio", format!("close descriptors: {e}")))?;
    // Except the ready pipe, which the init writes to and closes once it listens.
    nix::fcntl::fcntl(
        ready,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|e| ("stdio", format!("keep the ready pipe: {e}")))?;

    if spec.setuid {
        // Without no_new_privs a filter is installed with CAP_SYS_ADMIN, so before the
        // bounding set is cut (the filter allows the calls that cut it).
        if spec.seccomp == crate::Seccomp::Default {
            crate::seccomp::install_default_keeping_privileges().map_err(|e| ("seccomp", e))?;
        }
        drop_capabilities()?;
    } else {
        drop_capabilities()?;
        nix::sys::prctl::set_no_new_privs()
            .map_err(|e| ("capabilities", format!("no_new_privs: {e}")))?;
        // Last: from here on this process makes only the calls the filter allows.
        if spec.seccomp == crate::Seccomp::Default {
            crate::seccomp::install_default().map_err(|e| ("seccomp", e))?;
        }
    }

    let path = CString::new(INIT_PATH).unwrap();
    let argv = [
        CString::new("forkd-init").unwrap(),
        CString::new("__init").unwrap(),
    ];
    let mut env = vec![
        CString::new("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").unwrap(),
        CString::new(format!("FORKD_SANDBOX_ID={}", spec.id)).unwrap(),
        CString::new(format!("{}={ready}", crate::layout::READY_FD_ENV)).unwrap(),
    ];
    if crate::rseq_off() {
        let (k, v) = crate::RSEQ_OFF;
        env.push(CString::new(format!("{k}={v}")).unwrap());
    }
    let e = nix::unistd::execve(&path, &argv, &env).unwrap_err();
    Err(("exec init", format!("{INIT_PATH}: {e}")))
}

fn open_fd(path: &str, flags: OFlag) -> StepResult<OwnedFd> {
    nix::fcntl::open(
        path,
        flags | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map(forkd_sys::own_fd)
    .map_err(|e| ("stdio", format!("open {path}: {e}")))
}

fn drop_capabilities() -> StepResult<()> {
    let all = caps::all();
    for cap in all {
        if !KEPT_CAPS.contains(&cap) {
            match caps::drop(None, caps::CapSet::Bounding, cap) {
                Ok(()) => {}
                // Capabilities newer than this kernel are simply absent.
                Err(e) if !caps::has_cap(None, caps::CapSet::Bounding, cap).unwrap_or(false) => {
                    drop(e)
                }
                Err(e) => return Err(("capabilities", format!("drop {cap}: {e}"))),
            }
        }
    }
    // Nothing is inherited across exec from the inheritable or ambient sets either.
    caps::clear(None, caps::CapSet::Inheritable).map_err(|e| ("capabilities", e.to_string()))?;
    let _ = caps::clear(None, caps::CapSet::Ambient);
    Ok(())
}

fn chmod(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

mod dev;
use dev::make_dev;
pub use dev::populate_dev;

#[cfg(test)]
mod tests;
