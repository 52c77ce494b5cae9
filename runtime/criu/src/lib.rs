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
//!
//! This file: the options, the reports and the verbs (locate, dump, restore, lazy
//! pages); `swrk.rs`: one RPC exchange with `criu swrk` (or a template's worker);
//! `channel.rs`: the socket pair it runs over; `template.rs`: restore templates;
//! `diagnose.rs`: a failure read from the log and explained; `cgroups.rs`: the host's
//! hierarchies as CRIU names them; `bundle.rs`: a relocatable CRIU bundle started
//! without its shell wrapper.

#![forbid(unsafe_code)]

mod bundle;
mod cgroups;
mod channel;
mod diagnose;
mod ops;
mod swrk;
mod template;

use bundle::*;
use cgroups::*;
pub use channel::DEFAULT_LOG_LEVEL;
use channel::*;
pub use diagnose::log_tail;
use diagnose::*;
use swrk::*;
pub use template::Template;
#[cfg(test)]
mod tests;

use rust_criu::rust_criu_protobuf::rpc;

use std::os::fd::AsRawFd;
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
    /// The namespace a restore's CRIU runs on; see [`Criu::use_root_base`].
    root_base: Option<(std::sync::Arc<std::os::fd::OwnedFd>, u64)>,
    /// How CRIU is started: a program and the arguments that precede CRIU's own.
    launch: Launch,
    /// How long one dump or restore may take before CRIU is killed
    /// (`FORKD_CRIU_TIMEOUT_SECS`, default [`DEFAULT_TIMEOUT`]): whatever the tree's
    /// processes do (a task in uninterruptible sleep, one CRIU waits on for ever), the
    /// request ends.
    pub timeout: Duration,
    /// CRIU's log level (0 to 4).
    log_level: i32,
    /// Whether CRIU's stderr is printed (to the caller's stderr) after each call.
    debug: bool,
}

/// What the caller decides about CRIU (the daemon from its settings: `FORKD_CRIU`,
/// `FORKD_CRIU_LOG_LEVEL`, `FORKD_CRIU_TIMEOUT_SECS`, `FORKD_CRIU_DEBUG`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Tried before the bundle and the system's program directories.
    pub program: Option<PathBuf>,
    pub log_level: i32,
    pub timeout: Duration,
    pub debug: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            program: None,
            log_level: DEFAULT_LOG_LEVEL,
            timeout: DEFAULT_TIMEOUT,
            debug: false,
        }
    }
}

/// The default bound on one CRIU exchange: ten minutes, well above the dump of a
/// guest of several GiB here.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

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
    /// Mounts of the tree left out of the images as external, each (its mount point in
    /// the tree, a key): a restore binds what it is given under that key instead.
    pub external_mounts: Vec<(String, String)>,
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
    /// What to bind for mounts a dump marked external: (key, a path where CRIU starts).
    /// Keys the images do not use are ignored.
    pub external_mounts: Vec<(String, PathBuf)>,
    /// (controller, path) roots for the restored tree's cgroups (`--cgroup-root`); an
    /// empty controller means every controller (cgroup v2).
    pub cgroup_roots: Vec<(String, String)>,
    /// The network namespace the tree is restored into (one the caller has set up, e.g.
    /// with a veth); without one, a new namespace with only loopback up.
    pub netns: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// A template of these images ([`Criu::start_template`]): the restore is its worker,
    /// and the tree shares the template's memory copy-on-write instead of reading it.
    pub template: Option<std::sync::Arc<Template>>,
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
    /// Run on the root base, if the Criu has one (restores).
    on_base: bool,
    /// Be a worker of this template rather than a CRIU of its own.
    template: Option<&'a Template>,
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
    /// Finds CRIU: `explicit`, then `settings.program`, then the bundle installed by
    /// `fixtures/setup.sh criu`, then `criu` in the system's program directories; checks
    /// its version.
    pub fn locate(explicit: Option<&Path>, settings: &Settings) -> Result<Criu, CriuError> {
        let path = Self::candidates(explicit, settings)
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(|| {
                CriuError::NotFound(
                    "criu not found (set FORKD_CRIU or run fixtures/setup.sh criu)".into(),
                )
            })?;
        Self::at(path, settings)
    }

    /// Where [`Criu::locate`] looks, in order: `explicit`, `settings.program`, the bundle
    /// installed by `fixtures/setup.sh criu`, then `criu` in each of the system's program
    /// directories.
    pub fn candidates(explicit: Option<&Path>, settings: &Settings) -> Vec<PathBuf> {
        explicit
            .map(Path::to_path_buf)
            .into_iter()
            .chain(settings.program.clone())
            .chain([PathBuf::from("/opt/forkd/criu/bin/criu")])
            .chain(
                forkd_sys::program_dirs()
                    .into_iter()
                    .map(|d| d.join("criu")),
            )
            .collect()
    }

    /// CRIU at `path`, version-checked.
    fn at(path: PathBuf, settings: &Settings) -> Result<Criu, CriuError> {
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
        let launch = bundle_launch(&path).unwrap_or_else(|| Launch::plain(&path));
        Ok(Criu {
            path,
            version: format!("{major}.{minor}"),
            private_run: None,
            root_base: None,
            launch,
            timeout: settings.timeout,
            log_level: settings.log_level,
            debug: settings.debug,
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

    /// Makes restores run CRIU on `base` (made by `forkd_sys::mount::base_namespace`),
    /// where its root shim gives the restored namespace its root without `pivot_root`
    /// (docs/DESIGN.md, "What still grows").
    pub fn use_root_base(&mut self, (base, dev): (std::os::fd::OwnedFd, u64)) {
        self.root_base = Some((std::sync::Arc::new(base), dev));
    }

    fn command(&self) -> Result<Command, CriuError> {
        self.command_on(false)
    }

    /// CRIU's command; on the root base (when there is one) if `on_base`.
    fn command_on(&self, on_base: bool) -> Result<Command, CriuError> {
        let mut cmd = Command::new(&self.launch.program);
        cmd.args(&self.launch.args);
        self.place(cmd, on_base)
    }

    /// `cmd` made to run where a CRIU of this Criu runs: on the root base (when asked and
    /// there is one) and with its private `/run`.
    fn place(&self, mut cmd: Command, on_base: bool) -> Result<Command, CriuError> {
        if let (true, Some((base, dev))) = (on_base, &self.root_base) {
            use std::os::fd::AsFd;
            forkd_sys::on_namespace_base(&mut cmd, base.as_fd(), *dev)
                .map_err(io("run CRIU on the root base"))?;
        }
        if let Some(p) = &self.private_run {
            forkd_sys::with_own_run(&mut cmd, &p.dir, &p.binds)
                .map_err(io("prepare CRIU's /run"))?;
        }
        Ok(cmd)
    }
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
