//! The CRIU driver.
//!
//! forkd talks to CRIU through its RPC: it starts `criu swrk 3` with one end of a
//! SOCK_SEQPACKET socket pair installed as descriptor 3, sends one `criu_req` (encoded
//! with the protobuf types of the `rust-criu` crate), answers `NOTIFY` messages (the
//! `post-dump` notification is where the caller seals the filesystem while the tree is
//! still frozen), and reads the final `criu_resp`. Compared with the command line this
//! gives structured errors, the restored init's pid, and hooks at the right instants.
//!
//! CRIU's exit status, not its log, is the verdict; the log is kept next to the images
//! and its tail is put into every error. Version gate: CRIU 4.0 or newer (3.17, as in
//! Debian 12, fails on current kernels).

#![forbid(unsafe_code)]

use protobuf::{Message, MessageField};
use rust_criu::rust_criu_protobuf::rpc;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The oldest CRIU that works on the kernels forkd targets.
/// 4.2: earlier CRIU asks every socket for SO_PASSCRED, which Linux 6.16 and later
/// answer only for Unix and netlink sockets, so no TCP or UDP socket could be dumped.
pub const MIN_VERSION: (u32, u32) = (4, 2);

#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error("no usable CRIU: {0}")]
    NotFound(String),
    #[error("CRIU {found} is too old: forkd needs {}.{} or newer (run fixtures/setup.sh criu)", MIN_VERSION.0, MIN_VERSION.1)]
    TooOld { found: String },
    #[error("{step}: {source}")]
    Io {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("CRIU RPC: {0}")]
    Rpc(String),
    #[error("criu {action} did not answer within {} s and was killed (FORKD_CRIU_TIMEOUT_SECS raises the limit; log {log})", limit.as_secs())]
    TimedOut {
        action: &'static str,
        limit: Duration,
        log: PathBuf,
    },
    #[error("criu {action} failed: {message} (log {log}){tail}")]
    Failed {
        action: &'static str,
        message: String,
        log: PathBuf,
        tail: String,
    },
}

fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> CriuError {
    move |source| CriuError::Io { step, source }
}

/// A located, version-checked CRIU.
#[derive(Debug, Clone)]
pub struct Criu {
    pub path: PathBuf,
    pub version: String,
    /// The private `/run` and cgroup yard; see [`Criu::use_private_run`].
    private_run: Option<PrivateRun>,
    /// How CRIU is started: a program and the arguments that precede CRIU's own.
    launch: (PathBuf, Vec<std::ffi::OsString>),
    /// How long one dump or restore may take before CRIU is killed
    /// (`FORKD_CRIU_TIMEOUT_SECS`, default [`DEFAULT_TIMEOUT`]): whatever the tree's
    /// processes do (a task in uninterruptible sleep, one CRIU waits on for ever), the
    /// request ends.
    pub timeout: Duration,
}

/// The default bound on one CRIU exchange: ten minutes, well above the dump of a
/// guest of several GiB here.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// `FORKD_CRIU_TIMEOUT_SECS`, or the default.
pub fn timeout_from_env() -> Duration {
    std::env::var("FORKD_CRIU_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// The tmpfs every CRIU sees as its `/run`, and the cgroup yard restores are given.
#[derive(Debug, Clone)]
struct PrivateRun {
    dir: PathBuf,
    yard: PathBuf,
    /// (hierarchy, place in the yard) bound inside CRIU's namespace; none when the
    /// host's cgroup root is laid out as a yard already.
    binds: Vec<(PathBuf, PathBuf)>,
}

/// What to dump.
#[derive(Debug, Clone)]
pub struct DumpOpts {
    /// Host pid of the tree's root (the sandbox's init).
    pub pid: i32,
    /// Where the images go (created by the caller, empty).
    pub images_dir: PathBuf,
    /// The tree's root filesystem as seen from the host.
    pub root: PathBuf,
    /// Keep the tree running after the dump.
    pub leave_running: bool,
    /// The cgroup (freezer on v1, unified on v2) used to freeze the tree.
    pub freeze_cgroup: Option<PathBuf>,
    /// File name of the log, inside `images_dir`.
    pub log_file: String,
    /// Leave the tree's network namespace out of the images (CRIU's external namespace,
    /// keyed [`NETNS_KEY`]): a restore puts the tree into a new namespace with loopback
    /// up. Exact only while nothing in the tree can change the namespace's
    /// configuration, which holds for forkd's sandboxes (no CAP_NET_ADMIN, `/proc/sys`
    /// read-only). Saves CRIU's `ip`/`iptables` save and restore (some 30 ms each way).
    pub external_net: bool,
}

/// The key under which a dump marks the tree's network namespace as external and a
/// restore supplies a new one.
pub const NETNS_KEY: &str = "forkd-netns";

/// The descriptor number under which a restoring CRIU finds the new network namespace.
const NETNS_FD: i32 = 4;

/// What to restore, and where.
#[derive(Debug, Clone)]
pub struct RestoreOpts {
    pub images_dir: PathBuf,
    /// Where the new root filesystem is (or is attached: see `root_mount`).
    pub root: PathBuf,
    /// The new root as a detached mount (`forkd_sys::mount::overlay`), attached at `root`
    /// in CRIU's own mount namespace, so that it appears only there and in the restored
    /// tree's namespace, never in the caller's. Without one, `root` must be mounted.
    pub root_mount: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// Open the restored tree's memory to KSM (`PR_SET_MEMORY_MERGE`, inherited by
    /// every process CRIU forks), so that branches of one checkpoint can share pages.
    pub mergeable: bool,
    /// A directory of this restore's own for its log (and lazy-pages socket).
    pub work_dir: PathBuf,
    pub log_file: String,
    /// Restore memory lazily from a `criu lazy-pages` daemon using `work_dir`.
    pub lazy_pages: bool,
    /// Processes added to this cgroup before CRIU forks the tree, so the restored tree
    /// lands in it (`cgroup.procs` files, one per hierarchy).
    pub join_cgroup_procs: Vec<PathBuf>,
    /// (controller, path) roots for the restored tree's cgroups (`--cgroup-root`); an
    /// empty controller means every controller (cgroup v2).
    pub cgroup_roots: Vec<(String, String)>,
    /// The network namespace the tree is restored into (one the caller has set up, e.g.
    /// with a veth); without one, a new namespace with only loopback up.
    pub netns: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// What the CRIU process of one exchange gets besides its request.
#[derive(Default)]
struct Child<'a> {
    /// `cgroup.procs` files it is moved into before the request is sent.
    join_cgroup_procs: &'a [PathBuf],
    /// A descriptor number at which it finds a network namespace to restore into.
    netns_fd: Option<i32>,
    /// That namespace, when the caller gives one; else a new one is made.
    netns: Option<&'a std::os::fd::OwnedFd>,
    /// A detached mount to attach at this path in CRIU's mount namespace.
    root_mount: Option<(&'a std::os::fd::OwnedFd, &'a Path)>,
    /// Run with `PR_SET_MEMORY_MERGE`.
    mergeable: bool,
}

/// The outcome of a dump.
#[derive(Debug, Clone)]
pub struct DumpReport {
    pub duration: Duration,
    /// Time spent in the caller's post-dump hook (tree frozen).
    pub hook: Duration,
}

/// The outcome of a restore.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// Host pid of the restored root task (a child of the caller: restored as sibling).
    pub pid: i32,
    pub duration: Duration,
}

impl Criu {
    /// Finds CRIU: `explicit`, then `$FORKD_CRIU`, then the bundle installed by
    /// `fixtures/setup.sh criu`, then `criu` on PATH; checks its version.
    pub fn locate(explicit: Option<&Path>) -> Result<Criu, CriuError> {
        let path = Self::candidates(explicit)
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| {
                CriuError::NotFound(
                    "criu not found (set FORKD_CRIU or run fixtures/setup.sh criu)".into(),
                )
            })?;
        Self::at(path)
    }

    /// Where [`Criu::locate`] looks, in order: `explicit`, `$FORKD_CRIU`, the bundle
    /// installed by `fixtures/setup.sh criu`, then `criu` in each `PATH` directory.
    pub fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
        explicit
            .map(Path::to_path_buf)
            .into_iter()
            .chain(std::env::var_os("FORKD_CRIU").map(PathBuf::from))
            .chain([PathBuf::from("/opt/forkd/criu/bin/criu")])
            .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("criu"))
                    .collect::<Vec<_>>()
            }))
            .collect()
    }

    /// CRIU at `path`, version-checked.
    fn at(path: PathBuf) -> Result<Criu, CriuError> {
        let out = Command::new(&path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| CriuError::NotFound(format!("{}: {e}", path.display())))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = parse_version(&text).ok_or_else(|| {
            CriuError::NotFound(format!("{} --version printed {text:?}", path.display()))
        })?;
        let (major, minor) = version;
        if (major, minor) < MIN_VERSION {
            return Err(CriuError::TooOld {
                found: format!("{major}.{minor}"),
            });
        }
        let launch = bundle_launch(&path).unwrap_or_else(|| (path.clone(), Vec::new()));
        Ok(Criu {
            path,
            version: format!("{major}.{minor}"),
            private_run: None,
            launch,
            timeout: timeout_from_env(),
        })
    }

    /// Makes every CRIU started from now on run in a mount namespace of its own whose
    /// `/run` is the tmpfs `dir` (mounted here if it is not one yet), and hands dumps and
    /// restores a ready cgroup yard.
    ///
    /// Why: CRIU probes the kernel on every start (some 40 ms) unless it finds the facts
    /// it saved last time in `/run/criu.kdat`, and it saves them only on a tmpfs, which
    /// `/run` is not on every host. The namespace is a slave of the caller's: mounts made
    /// later by the caller (a branch's root) appear in it, and nothing mounted in it
    /// leaks out. A dump or restore mounts every cgroup hierarchy in a "yard" unless
    /// given one; in its own namespace it could not mount into its work directory
    /// (reached through the caller's descriptor, so in the caller's namespace), and the
    /// mounts cost time
    /// (16 ms for cgroup2 here). The yard is the host's cgroup root when every hierarchy
    /// is mounted there under the name CRIU gives it (`cpu,cpuacct`, `systemd`,
    /// `unified`), as on hybrid hosts; otherwise (a pure v2 host) each CRIU binds the
    /// hierarchies into `/run/cgyard/<name>` inside its own namespace, so that no
    /// cgroup filesystem is ever reachable below `dir` on the host.
    pub fn use_private_run(&mut self, dir: &Path) -> Result<(), CriuError> {
        let fail = |step: &'static str, path: &Path, e: std::io::Error| CriuError::Io {
            step,
            source: std::io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        };
        forkd_sys::ensure_tmpfs(dir, "4m")
            .map_err(|e| fail("mount CRIU's private /run", dir, e))?;
        let hierarchies = cgroup_hierarchies()
            .map_err(|e| fail("list cgroup hierarchies", Path::new("/proc/self/cgroup"), e))?;
        let (yard, binds) = match host_yard(&hierarchies) {
            Some(root) => (root, Vec::new()),
            None => {
                let mut binds = Vec::new();
                for (name, mountpoint) in hierarchies {
                    let at = dir.join("cgyard").join(&name);
                    std::fs::create_dir_all(&at)
                        .map_err(|e| fail("make the cgroup yard", &at, e))?;
                    binds.push((mountpoint, Path::new("/run/cgyard").join(&name)));
                }
                (PathBuf::from("/run/cgyard"), binds)
            }
        };
        self.private_run = Some(PrivateRun {
            dir: dir.to_path_buf(),
            yard,
            binds,
        });
        Ok(())
    }

    /// Has CRIU probe the kernel once and keep the facts in the private `/run` (see
    /// [`Criu::use_private_run`]), so that the first dump or restore does not pay for the
    /// probe. Every CRIU command starts by loading (or probing and saving) them; checking
    /// the one feature `mnt_id` (a read of /proc/self/fdinfo) adds next to nothing.
    pub fn cache_kernel_facts(&self) -> Result<(), CriuError> {
        let status = self
            .command()?
            .args(["check", "--feature", "mnt_id"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(io("run criu check"))?;
        if !status.success() {
            return Err(CriuError::Io {
                step: "criu check --feature mnt_id",
                source: std::io::Error::other(status.to_string()),
            });
        }
        Ok(())
    }

    /// The private `/run` set by [`Criu::use_private_run`], if any.
    pub fn run_dir(&self) -> Option<&Path> {
        self.private_run.as_ref().map(|p| p.dir.as_path())
    }

    fn cgroup_yard(&self) -> Option<&Path> {
        self.private_run.as_ref().map(|p| p.yard.as_path())
    }

    fn command(&self) -> Result<Command, CriuError> {
        let mut cmd = Command::new(&self.launch.0);
        cmd.args(&self.launch.1);
        if let Some(p) = &self.private_run {
            forkd_sys::with_own_run(&mut cmd, &p.dir, &p.binds)
                .map_err(io("prepare CRIU's /run"))?;
        }
        Ok(cmd)
    }

    /// Dumps a process tree. `post_dump` runs while the tree is still frozen, after its
    /// state is written; if it fails the dump fails (and the tree is resumed).
    pub fn dump(
        &self,
        opts: &DumpOpts,
        post_dump: &mut dyn FnMut() -> Result<(), String>,
    ) -> Result<DumpReport, CriuError> {
        let start = Instant::now();
        let images = open_dir(&opts.images_dir)?;
        let mut o = base_opts(&images, &opts.log_file);
        o.set_pid(opts.pid);
        o.set_root(opts.root.display().to_string());
        o.set_leave_running(opts.leave_running);
        o.set_notify_scripts(true);
        // Without a yard a dump mounts every cgroup hierarchy to read the tree's cgroups,
        // and its cgroup2 mount clears `favordynmods` machine-wide (see forkd_cgroups).
        if let Some(yard) = self.cgroup_yard() {
            o.set_cgroup_yard(yard.display().to_string());
        }
        if opts.external_net {
            let ns = format!("/proc/{}/ns/net", opts.pid);
            let ino = std::fs::metadata(&ns)
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .map_err(|e| CriuError::Io {
                    step: "read the tree's network namespace",
                    source: std::io::Error::new(e.kind(), format!("{ns}: {e}")),
                })?;
            o.external.push(format!("net[{ino}]:{NETNS_KEY}"));
        }
        if let Some(cg) = &opts.freeze_cgroup {
            o.set_freeze_cgroup(cg.display().to_string());
        }
        let log = opts.images_dir.join(&opts.log_file);
        let mut hook = Duration::ZERO;
        let mut hook_error = None;
        let resp = self.call(
            rpc::Criu_req_type::DUMP,
            &log,
            o,
            &Child::default(),
            &mut |script| {
                if script == "post-dump" {
                    let t = Instant::now();
                    let r = post_dump();
                    hook = t.elapsed();
                    if let Err(e) = r {
                        hook_error = Some(e);
                        return false;
                    }
                }
                true
            },
        );
        if let Some(e) = hook_error {
            return Err(CriuError::Failed {
                action: "dump",
                message: format!("post-dump step: {e}"),
                log,
                tail: String::new(),
            });
        }
        check(resp?, "dump", &log)?;
        Ok(DumpReport {
            duration: start.elapsed(),
            hook,
        })
    }

    /// Restores a dumped tree into the root `opts.root`, in new namespaces.
    pub fn restore(&self, opts: &RestoreOpts) -> Result<RestoreReport, CriuError> {
        let start = Instant::now();
        let work = open_dir(&opts.work_dir)?;
        let images = open_dir(&opts.images_dir)?;
        let mut o = base_opts(&images, &opts.log_file);
        o.set_root(opts.root.display().to_string());
        o.set_rst_sibling(true);
        o.set_work_dir_fd(work.as_raw_fd());
        o.set_lazy_pages(opts.lazy_pages);
        // Soft mode with the branch's own cgroups as roots: the tree lands in them, and
        // threads whose cgroup sets CRIU recorded apart from their process's (it does so
        // inside a cgroup namespace) are placed there too; in "ignore" mode CRIU cannot
        // move such threads on cgroup v1.
        o.set_manage_cgroups(true);
        o.set_manage_cgroups_mode(rpc::Criu_cg_mode::SOFT);
        if let Some(yard) = self.cgroup_yard() {
            o.set_cgroup_yard(yard.display().to_string());
        }
        for (ctrl, path) in &opts.cgroup_roots {
            let mut r = rpc::Cgroup_root::new();
            if !ctrl.is_empty() {
                r.set_ctrl(ctrl.clone());
            }
            r.set_path(path.clone());
            o.cg_root.push(r);
        }
        let log = opts.work_dir.join(&opts.log_file);
        // Images whose network namespace is external take this one; others ignore it.
        let mut fd = rpc::Inherit_fd::new();
        fd.set_key(NETNS_KEY.to_string());
        fd.set_fd(NETNS_FD);
        o.inherit_fd.push(fd);
        let child = Child {
            join_cgroup_procs: &opts.join_cgroup_procs,
            netns_fd: Some(NETNS_FD),
            netns: opts.netns.as_deref(),
            root_mount: opts.root_mount.as_deref().map(|m| (m, opts.root.as_path())),
            mergeable: opts.mergeable,
        };
        let resp = self.call(rpc::Criu_req_type::RESTORE, &log, o, &child, &mut |_| true)?;
        let resp = check(resp, "restore", &log)?;
        let pid = resp.restore.as_ref().map(|r| r.pid()).unwrap_or(0);
        if pid <= 0 {
            return Err(CriuError::Rpc("restore reported no pid".into()));
        }
        Ok(RestoreReport {
            pid,
            duration: start.elapsed(),
        })
    }

    /// Starts `criu lazy-pages` serving the pages of `images_dir` to one lazy restore
    /// that uses the same `work_dir`. Returns once its socket is ready.
    pub fn start_lazy_pages(
        &self,
        images_dir: &Path,
        work_dir: &Path,
    ) -> Result<std::process::Child, CriuError> {
        let log = work_dir.join("lazy-pages.log");
        let child = self
            .command()?
            .arg("lazy-pages")
            .arg("--images-dir")
            .arg(images_dir)
            .arg("--work-dir")
            .arg(work_dir)
            .arg("--log-file")
            .arg("lazy-pages.log")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("start criu lazy-pages"))?;
        let sock = work_dir.join("lazy-pages.socket");
        let t = Instant::now();
        while !sock.exists() {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(CriuError::Failed {
                    action: "lazy-pages",
                    message: "its socket did not appear within 10 s".into(),
                    tail: log_tail(&log),
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(child)
    }

    /// One swrk exchange: request, notifications, response, within [`Criu::timeout`]
    /// (CRIU is killed when it passes, which also lets go of every task it had seized).
    fn call(
        &self,
        kind: rpc::Criu_req_type,
        log: &Path,
        opts: rpc::Criu_opts,
        child_setup: &Child<'_>,
        notify: &mut dyn FnMut(&str) -> bool,
    ) -> Result<rpc::Criu_resp, CriuError> {
        // CRIU expects SOCK_SEQPACKET: one message per read.
        let (mine, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| io("socketpair")(e.into()))?;
        let mut cmd = self.command()?;
        cmd.arg("swrk")
            .arg("3")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The descriptors are placed first (hooks run in the order they are added), so
        // that a fresh namespace made at its number next cannot land on a source.
        let mut fds = vec![(theirs.as_raw_fd(), 3)];
        if let (Some(fd), Some(ns)) = (child_setup.netns_fd, child_setup.netns) {
            fds.push((ns.as_raw_fd(), fd));
        }
        forkd_sys::inherit_fds(&mut cmd, fds);
        // A daemon killed mid-dump must not leave CRIU holding the tree seized.
        forkd_sys::die_with_parent(&mut cmd);
        if let (Some(fd), None) = (child_setup.netns_fd, child_setup.netns) {
            forkd_sys::fresh_netns_fd(&mut cmd, fd);
        }
        if child_setup.mergeable {
            forkd_sys::memory_merge_in_child(&mut cmd);
        }
        if let Some((mnt, at)) = child_setup.root_mount {
            // After the hook that gives CRIU its own namespace, when there is one.
            let own_namespace = self.private_run.is_none();
            forkd_sys::attach_in_child(&mut cmd, mnt.as_fd(), at, own_namespace)
                .map_err(io("attach the restored tree's root"))?;
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| CriuError::NotFound(format!("{}: {e}", self.path.display())))?;
        drop(theirs);
        for procs in child_setup.join_cgroup_procs {
            std::fs::write(procs, child.id().to_string())
                .map_err(io("move criu into the branch cgroup"))?;
        }
        let mut sock = std::fs::File::from(mine);
        let mut req = rpc::Criu_req::new();
        req.set_type(kind);
        req.opts = MessageField::some(opts);
        let bytes = req
            .write_to_bytes()
            .map_err(|e| CriuError::Rpc(e.to_string()))?;
        sock.write_all(&bytes).map_err(io("send request to criu"))?;
        let deadline = Instant::now() + self.timeout;
        let action = match kind {
            rpc::Criu_req_type::DUMP => "dump",
            rpc::Criu_req_type::RESTORE => "restore",
            _ => "request",
        };
        let result = loop {
            // In slices, so that a CRIU that died (its helpers still holding the socket,
            // which then never reads as closed) is noticed at once.
            let slice = deadline.min(Instant::now() + Duration::from_millis(100));
            match wait_readable(&sock, slice) {
                Ok(true) => {}
                Ok(false) if Instant::now() >= deadline => {
                    break Err(CriuError::TimedOut {
                        action,
                        limit: self.timeout,
                        log: log.to_path_buf(),
                    });
                }
                Ok(false) => match child.try_wait() {
                    Ok(Some(status)) if !wait_readable(&sock, Instant::now()).unwrap_or(false) => {
                        break Err(CriuError::Rpc(format!(
                            "criu {action} ended ({status}) without answering"
                        )));
                    }
                    _ => continue,
                },
                Err(e) => break Err(io("wait for criu")(e)),
            }
            let mut buf = vec![0u8; 1 << 16];
            let n = match sock.read(&mut buf) {
                Ok(0) => {
                    break Err(CriuError::Rpc(
                        "criu closed the connection without answering".into(),
                    ))
                }
                Ok(n) => n,
                Err(e) => break Err(io("read criu response")(e)),
            };
            let resp = match rpc::Criu_resp::parse_from_bytes(&buf[..n]) {
                Ok(r) => r,
                Err(e) => break Err(CriuError::Rpc(format!("bad response: {e}"))),
            };
            if resp.type_() == rpc::Criu_req_type::NOTIFY {
                let script = resp
                    .notify
                    .as_ref()
                    .map(|n| n.script().to_string())
                    .unwrap_or_default();
                let ok = notify(&script);
                let mut ack = rpc::Criu_req::new();
                ack.set_type(rpc::Criu_req_type::NOTIFY);
                ack.set_notify_success(ok);
                let bytes = ack
                    .write_to_bytes()
                    .map_err(|e| CriuError::Rpc(e.to_string()))?;
                if let Err(e) = sock.write_all(&bytes) {
                    break Err(io("answer criu notification")(e));
                }
                continue;
            }
            break Ok(resp);
        };
        drop(sock);
        if result.is_err() {
            // The processes a restore forked hold CRIU's socket and stderr and outlive a
            // CRIU that died half-way; once it is gone they are the caller's children
            // (a subreaper's, as the daemon is), and go too.
            let _ = child.kill();
            let _ = child.wait();
            kill_orphaned_helpers();
        }
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        let _ = child.wait();
        if std::env::var_os("FORKD_CRIU_DEBUG").is_some() {
            eprintln!("criu stderr: {stderr}");
        }
        result.map_err(|e| match e {
            CriuError::Rpc(m) if !stderr.trim().is_empty() => {
                CriuError::Rpc(format!("{m}; criu said: {}", stderr.trim()))
            }
            other => other,
        })
    }
}

/// Kills the children of this process that a CRIU left behind when it died: their
/// command line is CRIU's (`criu: restore ...`), and their parent is now this process.
/// A live CRIU's helpers are its own children, never ours, and are not touched.
fn kill_orphaned_helpers() {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for pid in dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        let ours = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(|p| p == me))
            })
            .unwrap_or(false);
        let criu = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.starts_with(b"criu"))
            .unwrap_or(false);
        if ours && criu {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
    }
}

/// Waits until `f` can be read or `deadline` passes; whether it can.
fn wait_readable(f: &std::fs::File, deadline: Instant) -> std::io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        // A deadline already past still looks once (a poll that does not wait).
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) if left.is_zero() => return Ok(false),
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Options common to every request. CRIU reaches the directories through the caller's
/// own descriptors (`/proc/<caller>/fd/N`), so they stay open, close-on-exec, here.
fn base_opts(images: &OwnedFd, log_file: &str) -> rpc::Criu_opts {
    let mut o = rpc::Criu_opts::new();
    o.set_images_dir_fd(images.as_raw_fd());
    o.set_log_file(log_file.to_string());
    o.set_log_level(log_level());
    // Sandboxes have no outside network: nothing to lock, and no iptables dependency.
    o.set_network_lock(rpc::Criu_network_lock_method::SKIP);
    o.set_file_locks(true);
    // TCP connections between a sandbox's own processes (over its loopback) are dumped
    // and restored with TCP repair, in-flight data included; both ends are in the tree.
    o.set_tcp_established(true);
    o
}

/// CRIU's log level: `FORKD_CRIU_LOG_LEVEL` (0 to 4), default 2: errors and warnings,
/// which is what a failure report needs. Level 4 (debug) logs every step and costs
/// some 7 ms of a 35 ms restore.
pub fn log_level() -> i32 {
    std::env::var("FORKD_CRIU_LOG_LEVEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|l| (0..=4).contains(l))
        .unwrap_or(2)
}

fn open_dir(path: &Path) -> Result<OwnedFd, CriuError> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| CriuError::Io {
            step: "open image directory",
            source: std::io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })
}

fn check(
    resp: rpc::Criu_resp,
    action: &'static str,
    log: &Path,
) -> Result<rpc::Criu_resp, CriuError> {
    if resp.success() {
        return Ok(resp);
    }
    // CRIU's own message is its first error, often a harmless one (RLIMIT_NOFILE, which
    // it cannot raise without CAP_SYS_RESOURCE); the log's first real error is the cause.
    let errors = log_errors(log);
    let mut message = errors.first().cloned().unwrap_or_else(|| {
        // With nothing in the log (one it could not write, say), CRIU's own message is
        // all there is, unless it is only the harmless RLIMIT_NOFILE one.
        let own = resp.cr_errmsg();
        if own.contains("RLIMIT_NOFILE") {
            "no reason in the log".to_string()
        } else {
            own.to_string()
        }
    });
    if resp.has_cr_errno() && resp.cr_errno() != 0 {
        message.push_str(&format!(
            " ({})",
            std::io::Error::from_raw_os_error(resp.cr_errno())
        ));
    }
    if message.trim().is_empty() {
        message = "no reason given; see the log".into();
    }
    if let Some(why) = explain(&errors) {
        message.push_str(": ");
        message.push_str(&why);
    }
    if let Some(full) = log.parent().and_then(full_filesystem) {
        message.push_str(": ");
        message.push_str(&full);
    }
    Err(CriuError::Failed {
        action,
        message: message.trim().to_string(),
        log: log.to_path_buf(),
        tail: log_tail(log),
    })
}

/// When the filesystem holding `dir` (the images, the log) has under 16 MiB left, which
/// is what a dump or restore that ran out of space leaves: what to tell the user.
fn full_filesystem(dir: &Path) -> Option<String> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    (free < 16 << 20).then(|| {
        format!(
            "No space left on device: the filesystem holding {} has {} KiB free",
            dir.display(),
            free / 1024
        )
    })
}

/// What a known CRIU failure means here, in forkd's terms.
fn explain(errors: &[String]) -> Option<String> {
    if errors
        .iter()
        .any(|e| e.starts_with("inet: In-flight connection"))
    {
        return Some(
            "a listening socket has connections its server has not accepted yet; a live \
             checkpoint cannot keep them (they would be lost in every branch): let the \
             server accept them (or the clients give up) and checkpoint again"
                .into(),
        );
    }
    if errors.iter().any(|e| e.starts_with("Can't get rlimit")) {
        // `Dump core (pid: N) failed`: the process CRIU could not read.
        let who = errors
            .iter()
            .find_map(|e| {
                e.split("(pid: ")
                    .nth(1)?
                    .split(')')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
            .and_then(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                let field = |k: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(k))
                        .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
                };
                Some(format!(" ({}, uid {})", field("Name:")?, field("Uid:")?))
            })
            .unwrap_or_default();
        return Some(format!(
            "a process of the tree{who} runs as a user other than root; CRIU reads every \
             process's resource limits with prlimit(2), which for another user's process \
             needs CAP_SYS_RESOURCE, and this machine does not grant it. forkd's CRIU bundle \
             (fixtures/setup.sh criu) carries a shim that reads them from /proc instead; \
             this CRIU does not: use the bundle (FORKD_CRIU), or checkpoint the files only"
        ));
    }
    None
}

/// Error lines of a CRIU log without their timestamp and source location, harmless
/// ones left out.
fn log_errors(log: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| l.contains("Error (") && !l.contains("RLIMIT_NOFILE"))
        .map(|l| l.split_once("): ").map(|(_, m)| m).unwrap_or(l).to_string())
        .collect()
}

/// The last error lines of a CRIU log, for error messages.
pub fn log_tail(log: &Path) -> String {
    let errors = log_errors(log);
    if errors.is_empty() {
        return String::new();
    }
    let start = errors.len().saturating_sub(4);
    format!("\n  {}", errors[start..].join("\n  "))
}

/// Parses `Version: 4.1.1` from `criu --version`.
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))?
        .trim();
    let mut it = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty());
    Some((
        it.next()?.parse().ok()?,
        it.next().unwrap_or("0").parse().ok()?,
    ))
}

/// The directory where every hierarchy is mounted under its CRIU name, if there is one.
fn host_yard(hierarchies: &[(String, PathBuf)]) -> Option<PathBuf> {
    let root = hierarchies.first()?.1.parent()?.to_path_buf();
    hierarchies
        .iter()
        .all(|(name, point)| *point == root.join(name))
        .then_some(root)
}

/// Every cgroup hierarchy this process belongs to, as (the directory name CRIU gives it
/// in a cgroup yard, where it is mounted here): `cpu,cpuacct` for a v1 hierarchy of
/// those controllers, `systemd` for a named one (`name=systemd`), `unified` for v2.
fn cgroup_hierarchies() -> std::io::Result<Vec<(String, PathBuf)>> {
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    parse_hierarchies(&own, &mounts)
}

fn parse_hierarchies(own: &str, mountinfo: &str) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mounts: Vec<_> = forkd_sys::mountinfo::parse(mountinfo)
        .into_iter()
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .collect();
    let mut out = Vec::new();
    for line in own.lines().filter(|l| !l.is_empty()) {
        let ctrls = line.split(':').nth(1).unwrap_or("");
        let found = if ctrls.is_empty() {
            mounts
                .iter()
                .find(|m| m.fstype == "cgroup2")
                .map(|m| ("unified".to_string(), m))
        } else {
            mounts
                .iter()
                .find(|m| {
                    m.fstype == "cgroup"
                        && ctrls
                            .split(',')
                            .all(|c| m.super_options.split(',').any(|o| o == c))
                })
                .map(|m| (ctrls.trim_start_matches("name=").to_string(), m))
        };
        let (name, mount) = found.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("cgroup hierarchy {ctrls:?} is not mounted"),
            )
        })?;
        out.push((name, mount.mount_point.clone()));
    }
    Ok(out)
}

/// For a private bundle as `fixtures/setup.sh criu` installs it (`<prefix>/bin/criu`, a
/// shell wrapper that runs `<prefix>/usr/sbin/criu` through the prefix's own loader and
/// libraries, its rlimit shim preloaded), the same launch without the shell: a couple of
/// milliseconds per call.
fn bundle_launch(wrapper: &Path) -> Option<(PathBuf, Vec<std::ffi::OsString>)> {
    let prefix = wrapper.parent()?.parent()?;
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    let loader_name = match std::env::consts::ARCH {
        "x86_64" => "ld-linux-x86-64.so.2",
        "aarch64" => "ld-linux-aarch64.so.1",
        _ => return None,
    };
    let libs = prefix.join("usr/lib").join(&triplet);
    let loader = libs.join(loader_name);
    let criu = prefix.join("usr/sbin/criu");
    if wrapper.file_name()? != "criu" || !loader.is_file() || !criu.is_file() {
        return None;
    }
    let mut path = std::ffi::OsString::from(libs.as_os_str());
    path.push(":");
    path.push(prefix.join("lib").join(&triplet));
    let mut args = Vec::new();
    // The bundle's rlimit shim (fixtures/criu/rlimit-shim.c), as its wrapper preloads it.
    let shim = prefix.join("lib/forkd/rlimit-shim.so");
    if shim.is_file() {
        args.extend(["--preload".into(), shim.into_os_string()]);
    }
    args.extend(["--library-path".into(), path, criu.into()]);
    Some((loader, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_failures_are_explained() {
        let e = vec![
            "Can't get rlimit 0: Operation not permitted".to_string(),
            "Dump core (pid: 4000000000) failed with -1".to_string(),
        ];
        let why = explain(&e).unwrap();
        assert!(
            why.contains("CAP_SYS_RESOURCE") && why.contains("other than root"),
            "{why}"
        );
        assert_eq!(explain(&["Can't dump fd 5".to_string()]), None);
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("Version: 4.1.1\n"), Some((4, 1)));
        assert_eq!(
            parse_version("Version: 3.17.1\nGitID: v3.17\n"),
            Some((3, 17))
        );
        assert_eq!(parse_version("Version: 4.0\n"), Some((4, 0)));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn log_tail_prefers_error_lines() {
        let dir = std::env::temp_dir().join(format!("forkd-criu-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("dump.log");
        std::fs::write(&log, "(00.0) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\n(00.1) a\n(00.2) Error (criu/files.c:1): Can't dump fd 5\n(00.3) b\n").unwrap();
        assert_eq!(log_errors(&log), vec!["Can't dump fd 5".to_string()]);
        assert!(log_tail(&log).contains("Can't dump fd 5"));
        assert!(!log_tail(&log).contains("RLIMIT"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hierarchies_of_a_hybrid_v1_host() {
        let own = "12:pids:/a\n5:cpu,cpuacct:/a\n1:name=systemd:/a\n0::/a\n";
        let mi = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/my\\040pids rw - cgroup cgroup rw,pids
";
        let h = parse_hierarchies(own, mi).unwrap();
        assert_eq!(
            h,
            vec![
                ("pids".to_string(), PathBuf::from("/sys/fs/cgroup/my pids")),
                (
                    "cpu,cpuacct".to_string(),
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
                ),
                (
                    "systemd".to_string(),
                    PathBuf::from("/sys/fs/cgroup/systemd")
                ),
                (
                    "unified".to_string(),
                    PathBuf::from("/sys/fs/cgroup/unified")
                ),
            ]
        );
    }

    #[test]
    fn the_host_cgroup_root_is_a_yard_only_when_named_as_criu_names() {
        let hybrid = vec![
            ("pids".to_string(), PathBuf::from("/sys/fs/cgroup/pids")),
            (
                "systemd".to_string(),
                PathBuf::from("/sys/fs/cgroup/systemd"),
            ),
            (
                "unified".to_string(),
                PathBuf::from("/sys/fs/cgroup/unified"),
            ),
        ];
        assert_eq!(host_yard(&hybrid), Some(PathBuf::from("/sys/fs/cgroup")));
        let v2 = vec![("unified".to_string(), PathBuf::from("/sys/fs/cgroup"))];
        assert_eq!(host_yard(&v2), None);
        let mut odd = hybrid.clone();
        odd[0].1 = PathBuf::from("/cgroups/pids");
        assert_eq!(host_yard(&odd), None);
    }

    #[test]
    fn hierarchies_of_a_v2_host_and_a_missing_mount() {
        let mi = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_hierarchies("0::/x\n", mi).unwrap(),
            vec![("unified".to_string(), PathBuf::from("/sys/fs/cgroup"))]
        );
        let err = parse_hierarchies("3:memory:/x\n", mi).unwrap_err();
        assert!(err.to_string().contains("\"memory\""), "{err}");
    }
}
