//! `forkd daemon`: one process that owns the state root and serves the API on a Unix
//! socket.
//!
//! Requests are parsed by [`http`], dispatched by [`routes`] and carried out by the
//! resource modules ([`sandboxes`], [`images`], [`files`]); blocking work (mounts,
//! starting inits, file walks, execs) runs on tokio's blocking pool so a long exec never
//! holds up other requests. Every request gets an id that appears in its log line and in
//! its error body; every operation's latency is recorded in [`metrics`].

mod archive;
mod bases;
mod build;
mod checkpoints;
pub mod config;
mod edge;
mod exec;
mod files;
mod gc;
mod grants;
mod health;
mod http;
mod images;
mod jobs;
mod lifecycle;
mod metrics;
mod network;
mod paths;
mod pull;
mod record;
mod routes;
mod sandboxes;
mod sharing;
mod spare_layers;
mod spare_netns;
mod startup;
mod table;
mod templates;

use forkd_cgroups::Hierarchy;
use forkd_layers::{ImageStore, LayerId, LayerStore};
use sandboxes::Sandbox;
pub use startup::SANDBOXES_MEMORY_ENV;
use startup::*;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The checkpoint-archive reader on its own (the daemon's import, and the fuzz target
/// `checkpoint_archive`).
pub use archive::{unpack_and_verify, Verified};

/// Where the daemon keeps its state and listens.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub root: PathBuf,
    pub socket: PathBuf,
}

pub struct Daemon {
    /// The settings, read once at start.
    pub config: config::Config,
    /// The state root given by the user (holds the lock and, if needed, the volume image).
    pub root: PathBuf,
    /// Where all data lives: a btrfs filesystem (the state root itself, or a loop-mounted
    /// image below it), so that sandboxes' upper layers can be snapshotted in O(1).
    pub data: PathBuf,
    pub volume: forkd_volume::Volume,
    /// CRIU, if usable here; live checkpoints need it.
    pub criu: Result<forkd_criu::Criu, String>,
    pub checkpoints: Mutex<HashMap<forkd_sandbox::CheckpointId, Arc<checkpoints::Checkpoint>>>,
    /// Held for reading by whatever adds layers to the store before a record refers to
    /// them (imports, squashes); `gc` holds it for writing.
    pub store_lock: std::sync::RwLock<()>,
    /// The program run as `__setup` to start a sandbox's init: the runtime layer's copy
    /// of `forkd-init`, the very file every sandbox runs as its init. A static executable
    /// at a fixed address, it starts in about half the time the daemon's own (position-
    /// independent, three times larger) executable took, and a rebuilt binary on the host
    /// cannot pair one build's set-up with another's init.
    pub setup_exe: PathBuf,
    pub layers: LayerStore,
    pub images: ImageStore,
    /// Layer stacks merged into one subvolume each: every sandbox's one lower layer.
    pub bases: bases::Bases,
    /// The layer holding `/.forkd/init`, on top of every sandbox's stack.
    pub runtime_layer: LayerId,
    pub hierarchy: Hierarchy,
    /// Sandboxes' cgroups, kept for the next sandbox rather than removed (cgroup v1;
    /// `FORKD_CGROUP_POOL`, default 32, `0` for none).
    pub cgroups: forkd_cgroups::Pool,
    pub sandboxes: Mutex<table::SandboxTable>,
    pub metrics: metrics::Metrics,
    /// Image builds in progress.
    pub builds: build::Builds,
    /// Image pulls in progress, and the bound on blob fetches.
    pub pulls: pull::Pulls,
    /// Memory shared between branches (KSM): which forks share, and KSM's pacing.
    pub sharing: sharing::Sharing,
    /// Sandbox egress: the pool, the nftables table, `nft`.
    pub egress: forkd_net::Egress,
    /// Capabilities on single sandboxes, each served on a socket of its own.
    pub grants: grants::Grants,
    /// The network lease of every sandbox that holds one.
    pub leases: Mutex<HashMap<forkd_sandbox::SandboxId, forkd_net::Lease>>,
    pub runtime: tokio::runtime::Handle,
    /// Watches every sandbox's init for its exit (one thread, one epoll set).
    pub exits: forkd_sys::exits::ExitWatcher,
    /// The host's process events, through which inits' exits are learned with one
    /// descriptor whatever the number alive; `None` where they cannot be had (then each
    /// init takes a pidfd of `exits`).
    pub proc_events: Option<forkd_sys::proc_events::ProcEvents>,
    /// The sysfs every new sandbox binds as `/sys` (`forkd_sys::mount_quiet_sysfs`), or
    /// none if it could not be mounted: each sandbox then mounts its own.
    pub sysfs: Option<PathBuf>,
    /// Network namespaces made ahead for the sandboxes and branches to come.
    pub spare_netns: Arc<spare_netns::SpareNetns>,
    /// Writable layers (snapshots of bases and checkpoints) made ahead.
    pub spare_layers: Arc<spare_layers::SpareLayers>,
    /// Restore templates of live checkpoints: branches share their memory.
    pub templates: Arc<templates::Templates>,
    /// The network namespace of that sysfs, kept so that its loopback stays listed.
    _sysfs_netns: Option<std::os::fd::OwnedFd>,
    /// The mount namespace every new sandbox's is copied from: one empty read-only tmpfs
    /// (`forkd_sys::mount::empty_namespace`).
    pub empty_mntns: std::os::fd::OwnedFd,
    /// Held for the daemon's lifetime: one daemon per state root.
    _lock: nix::fcntl::Flock<std::fs::File>,
    next_request: AtomicU64,
    /// Whether disk limits can be enforced (btrfs simple quotas on the volume), or why
    /// not.
    pub disk_quotas: Result<(), String>,
    /// The volume's space and state, as its watcher last found them (see [`health`]).
    pub volume_watch: health::Watch,
    /// Keep `favordynmods` on the cgroup2 mount (unless `FORKD_CGROUP_FAVOR_DYNMODS=0`).
    favor_dynmods: bool,
    /// Whether the last attempt to set it failed (so a failure is logged once).
    favor_dynmods_failed: std::sync::atomic::AtomicBool,
}

/// Locks that outlive a panicking holder. A handler that panics answers 500 and its
/// thread ends; the tables and records it held stay usable (they change by whole
/// entries and fields, so no half-done update is left behind), where `lock().unwrap()`
/// would make every later request panic until the daemon restarts.
pub(crate) trait Lock<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T>;
}

impl<T> Lock<T> for Mutex<T> {
    fn locked(&self) -> std::sync::MutexGuard<'_, T> {
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The same for the store's read-write lock.
pub(crate) trait RwLockExt<T> {
    fn read_locked(&self) -> std::sync::RwLockReadGuard<'_, T>;
    fn write_locked(&self) -> std::sync::RwLockWriteGuard<'_, T>;
}

impl<T> RwLockExt<T> for std::sync::RwLock<T> {
    fn read_locked(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn write_locked(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub(crate) use forkd_sys::clock::now_secs;

/// What a record must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Survive {
    /// A crash of the whole machine: the file is fsynced before the rename (checkpoint
    /// records: checkpoints outlive the machine's uptime).
    HostCrash,
    /// A crash of the daemon only, which the page cache survives (sandbox records: their
    /// sandboxes die with the machine, and recovery removes a sandbox without a valid
    /// record). An fsync on the volume waits for the disk (some 5 ms), on every fork.
    DaemonCrash,
}

/// Writes `value` as JSON to `dir/name` atomically: a temporary file, an fsync if the
/// record must survive a host crash, rename.
pub(crate) fn write_json_atomic<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
    survive: Survive,
) -> Result<(), crate::api::ApiError> {
    use std::io::Write;
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    let body = serde_json::to_vec_pretty(value).expect("records serialise");
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&body)?;
        if survive == Survive::HostCrash {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)
    })();
    res.map_err(|e| crate::api::ApiError::internal(format!("write {}: {e}", path.display())))
}

/// Looks an entry up by its full id or a unique prefix of at least 4 hex characters.
pub(crate) fn find_by_prefix<K, V>(
    table: &HashMap<K, Arc<V>>,
    id: &str,
    what: &str,
) -> Result<Arc<V>, crate::api::ApiError>
where
    K: std::str::FromStr + std::fmt::Display + std::hash::Hash + Eq,
{
    use crate::api::ApiError;
    if let Ok(full) = id.parse::<K>() {
        if let Some(v) = table.get(&full) {
            return Ok(v.clone());
        }
    }
    let matches: Vec<&Arc<V>> = if id.len() >= 4 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        table
            .iter()
            .filter(|(k, _)| k.to_string().starts_with(id))
            .map(|(_, v)| v)
            .collect()
    } else {
        Vec::new()
    };
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(ApiError::not_found(format!("no such {what}: {id}"))),
        many => Err(ApiError::bad_request(format!(
            "{what} id prefix {id} is ambiguous: {} match",
            many.len()
        ))),
    }
}

/// Minimal structured logging to stderr: time, level, message.
pub mod log {
    fn emit(level: &str, msg: &str) {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!("{}.{:03} {level} {msg}", t.as_secs(), t.subsec_millis());
    }
    pub fn info(msg: &str) {
        emit("INFO", msg)
    }
    pub fn warn(msg: &str) {
        emit("WARN", msg)
    }
}

impl Daemon {
    /// Opens (creating if needed) the state root and recovers sandboxes left by a
    /// previous daemon.
    pub fn open(
        cfg: &DaemonConfig,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Arc<Daemon>> {
        use anyhow::Context;
        let config = config::Config::from_env()?;
        if !nix::unistd::Uid::effective().is_root() {
            anyhow::bail!(
                "forkd daemon must run as root (it creates namespaces, mounts and cgroups)"
            );
        }
        std::fs::create_dir_all(&cfg.root)
            .with_context(|| format!("create {}", cfg.root.display()))?;
        std::fs::set_permissions(&cfg.root, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod {}", cfg.root.display()))?;
        let lock_path = cfg.root.join("daemon.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("open {}", lock_path.display()))?;
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|_| {
                anyhow::anyhow!(
                    "another forkd daemon is already using {} (lock {})",
                    cfg.root.display(),
                    lock_path.display()
                )
            })?;

        // Inits are reparented to us when their set-up helper exits; we reap them.
        nix::sys::prctl::set_child_subreaper(true).context("become a child subreaper")?;
        // Out of the OOM killer's way, as container daemons keep themselves; where that
        // needs a capability this machine withholds (CAP_SYS_RESOURCE), the sandboxes'
        // processes are raised instead (forkd_sandbox::setup::OOM_SCORE_ADJ) all the same.
        match std::fs::write("/proc/self/oom_score_adj", "-999") {
            Ok(()) => log::info("oom_score_adj -999"),
            Err(e) => log::info(&format!(
                "oom_score_adj left as it is ({e}); sandboxes' processes run at +{}",
                forkd_sandbox::setup::OOM_SCORE_ADJ
            )),
        }
        if let Some(mode) = config.overlay_lowers {
            forkd_sys::mount::set_lower_mode(mode);
        }
        let volume = forkd_volume::Volume::open(&cfg.root, &config.volume)
            .context("open the data volume")?;
        let data = volume.path().to_path_buf();
        match volume.tune() {
            Ok(done) if !done.is_empty() => log::info(&format!("volume: {}", done.join("; "))),
            Ok(_) => {}
            Err(e) => log::warn(&format!(
                "volume left untuned (checkpoints after large writes will be slower): {e}"
            )),
        }
        let unbacked = match volume.ensure_backed() {
            Ok(done) => {
                for d in done {
                    log::info(&format!("volume: {d}"));
                }
                None
            }
            Err(e) => {
                log::warn(&format!("volume: {e}"));
                Some(e.to_string())
            }
        };
        check_volume_size(&volume);
        // Simple quotas set a feature flag that kernels before 6.7 cannot mount: on a
        // volume that is the host's own btrfs only when the operator says so.
        let disk_quotas = if volume.loop_image().is_none() && !config.disk_quotas_on_host {
            Err(format!(
                "disk limits on {}, the host's own btrfs, need FORKD_DISK_QUOTAS=on (btrfs simple quotas set a feature flag that kernels before 6.7 cannot mount)",
                volume.path().display()
            ))
        } else {
            volume.enable_quotas()
        };
        match &disk_quotas {
            Ok(()) => log::info("disk limits: btrfs simple quotas"),
            Err(e) => log::info(&format!("{e}: a sandbox with a disk limit is refused")),
        }
        log::info(&format!(
            "overlay lower layers: {} (Linux {})",
            match forkd_sys::mount::lower_mode() {
                forkd_sys::mount::LowerMode::Append => "lowerdir+".to_string(),
                forkd_sys::mount::LowerMode::Links => format!(
                    "as links, this kernel has no lowerdir+ (at most {} a stack)",
                    forkd_sys::lowerdir::MAX_LINKED_LOWERS
                ),
            },
            forkd_sys::mount::kernel_release()
        ));
        for sub in ["sandboxes", "runtime", "checkpoints", "logs"] {
            let d = data.join(sub);
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        }
        let layers = LayerStore::open(&data.join("layers")).context("open layer store")?;
        let images = ImageStore::open(&data.join("images")).context("open image store")?;
        let bases = bases::Bases::open(data.join("bases"), &volume)
            .map_err(|e| anyhow::anyhow!("open the bases: {e}"))?;
        let exe = std::fs::read_link("/proc/self/exe").context("find own executable")?;
        let init = init_program(&exe, config.init.as_deref())?;
        let runtime_layer = ensure_runtime_layer(&data, &layers, &init)?;
        let setup_exe = layers.path(&runtime_layer).join(".forkd/init");
        let (sysfs, sysfs_netns) = {
            let dir = cfg.root.join("sysfs");
            match forkd_sys::mount_quiet_sysfs(&dir) {
                Ok(ns) => (Some(dir), Some(ns)),
                Err(e) => {
                    log::warn(&format!(
                        "every sandbox mounts a sysfs of its own (slower with many alive): mount {}: {e}",
                        dir.display()
                    ));
                    (None, None)
                }
            }
        };
        let empty_mntns = {
            let dir = cfg.root.join("empty-root");
            forkd_sys::mount::empty_namespace(&dir).with_context(|| {
                format!(
                    "make the empty mount namespace that sandboxes start from (on {})",
                    dir.display()
                )
            })?
        };
        let criu = forkd_criu::Criu::locate(None, &config.criu)
            .map(|mut c| {
                // Without it CRIU works, just some 40 ms slower per call.
                if let Err(e) = c.use_private_run(&cfg.root.join("criu-run")) {
                    log::warn(&format!("CRIU will probe the kernel on every call: {e}"));
                }
                // Restores give the namespace its root without `pivot_root`, which walks
                // every task on the host (docs/DESIGN.md, "What still grows");
                // FORKD_CRIU_ROOT=pivot leaves it to CRIU's own.
                if !config.criu_pivot_root {
                    let dir = cfg.root.join("criu-base");
                    match forkd_sys::mount::base_namespace(&dir) {
                        Ok(base) => c.use_root_base(base),
                        Err(e) => log::warn(&format!(
                            "restores pivot: make the namespace CRIU runs on ({}): {e}",
                            dir.display()
                        )),
                    }
                }
                c
            })
            .map_err(|e| e.to_string());
        if criu.is_ok() && forkd_sys::probe::random_ready().ok() == Some(false) {
            log::warn(
                "the kernel's random pool is not ready yet: each CRIU run waits for it (3-4 s \
                 a checkpoint or restore) until it is; a virtual machine needs RDRAND or \
                 virtio-rng (forkd doctor: random)",
            );
        }
        match &criu {
            Err(e) => log::warn(&format!("live checkpoints are unavailable: {e}")),
            // The private /run starts empty: probe the kernel now, off the request path,
            // rather than in the first dump or restore (about 40 ms).
            Ok(c) if c.run_dir().is_some() => {
                let c = c.clone();
                std::thread::Builder::new()
                    .name("criu-kdat".into())
                    .spawn(move || {
                        if let Err(e) = c.cache_kernel_facts() {
                            log::warn(&format!("CRIU's kernel facts not cached ahead: {e}"));
                        }
                    })
                    .context("start the CRIU kernel-facts thread")?;
            }
            Ok(_) => {}
        }
        let hierarchy = Hierarchy::detect().context("detect cgroups")?;
        let spare_netns = spare_netns::SpareNetns::start(config.spare_netns)?;
        let spare_layers =
            spare_layers::SpareLayers::start(data.join("spare-layers"), config.spare_layers)?;
        let templates = Arc::new(templates::Templates::new(
            data.join("logs"),
            config.templates,
            config.template_budget,
        ));
        raise_pid_max();
        // The table's name comes from the data directory, so that daemons on one host
        // (one per state root) never share rules.
        let tag = {
            use sha2::Digest;
            let h = sha2::Sha256::digest(data.as_os_str().as_encoded_bytes());
            h.iter()
                .take(4)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let mut cgroups = forkd_cgroups::Pool::new(&hierarchy, "forkd", &tag, config.cgroup_pool);
        bound_sandboxes_memory(&hierarchy, config.sandboxes_memory)?;
        if let config::MemoryCgroups::Limited { said: asked } = config.memory_cgroups {
            cgroups = cgroups.sharing_memory();
            match cgroups.shared_memory_for(&forkd_cgroups::Limits::default()) {
                Some(shared) => log::info(&format!(
                    "cgroup: sandboxes without a memory limit share the memory cgroup {shared}"
                )),
                None if asked => log::warn(
                    "cgroup: FORKD_MEMCG=limited needs cgroup v1; every sandbox has a memory cgroup of its own",
                ),
                None => {}
            }
        }
        let swept = cgroups.sweep();
        if swept > 0 {
            log::info(&format!(
                "cgroup: removed {swept} free cgroups an earlier daemon kept"
            ));
        }
        let nft = forkd_net::locate_nft(
            config.nft.as_deref(),
            criu.as_ref().ok().map(|c| c.path.as_path()),
        );
        let egress = forkd_net::Egress::new(config.egress_pool, &tag, nft);
        let sharing = sharing::Sharing::new(config.ksm.clone())?;
        // The socket's directory (/run/forkd by default) is gone after every boot; the
        // grants' directory sits beside the socket.
        if let Some(parent) = cfg.socket.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create {}", parent.display()))?;
        }
        let grant_dir = {
            let mut p = cfg.socket.clone().into_os_string();
            p.push(".grants");
            PathBuf::from(p)
        };
        let grants = grants::Grants::open(grant_dir).context("prepare the grant directory")?;
        let daemon = Arc::new(Daemon {
            sharing,
            grants,
            root: cfg.root.clone(),
            data,
            volume,
            criu,
            checkpoints: Mutex::new(HashMap::new()),
            store_lock: std::sync::RwLock::new(()),
            setup_exe,
            layers,
            images,
            bases,
            runtime_layer,
            cgroups,
            hierarchy,
            sandboxes: Mutex::new(table::SandboxTable::default()),
            metrics: metrics::Metrics::default(),
            builds: build::Builds::default(),
            pulls: pull::Pulls::new(config.pull_parallel),
            egress,
            leases: Mutex::new(HashMap::new()),
            runtime,
            exits: forkd_sys::exits::ExitWatcher::start("init-exits")
                .context("start the watcher of init exits")?,
            proc_events: open_proc_events(),
            sysfs,
            spare_netns,
            spare_layers,
            templates,
            _sysfs_netns: sysfs_netns,
            empty_mntns,
            _lock: lock,
            next_request: AtomicU64::new(1),
            favor_dynmods: config.cgroup_favor_dynmods,
            config,
            favor_dynmods_failed: std::sync::atomic::AtomicBool::new(false),
            disk_quotas,
            volume_watch: health::Watch {
                unbacked: Mutex::new(unbacked),
                ..Default::default()
            },
        });
        daemon
            .watch_volume()
            .context("start the volume's watcher")?;
        daemon.keep_migrations_cheap();
        if daemon.favor_dynmods {
            // Another program's mount of cgroup2 clears the flag; set it again within a
            // second, off the request path (setting it waits for an RCU grace period).
            let weak = Arc::downgrade(&daemon);
            std::thread::Builder::new()
                .name("favordynmods".into())
                .spawn(move || loop {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                    match weak.upgrade() {
                        Some(d) => d.keep_migrations_cheap(),
                        None => break,
                    }
                })
                .context("start the favordynmods watcher")?;
        }
        daemon
            .recover()
            .map_err(|e| anyhow::anyhow!("recover sandboxes: {e}"))?;
        daemon.restore_disk_limits();
        daemon
            .recover_checkpoints()
            .map_err(|e| anyhow::anyhow!("recover checkpoints: {e}"))?;
        Ok(daemon)
    }

    /// On shutdown, unmount CRIU's private `/run`, the sandboxes' sysfs and, with nothing
    /// running, the loop-mounted volume, so that no mount outlives the daemon; the next start
    /// mounts them again.
    fn release_volume_if_idle(&self) {
        if let Some(dir) = self.criu.as_ref().ok().and_then(|c| c.run_dir()) {
            let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
        }
        // Sandboxes keep their own copies of it.
        if let Some(dir) = &self.sysfs {
            let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
        }
        let running = self
            .sandboxes
            .locked()
            .values()
            .any(|sb| sb.record.locked().status == crate::api::SandboxStatus::Running);
        if running || self.volume.loop_image().is_none() {
            return;
        }
        // The roots of sandboxes that stopped a moment ago may still be held, each
        // unmounted (and the volume synced) on the exit watcher's releasing thread.
        self.spare_layers.stop();
        self.templates.stop();
        if !self.exits.wait_released(std::time::Duration::from_secs(60)) {
            log::warn("sandbox roots still held after 60 s: the volume may stay mounted");
        }
        if let Err(e) = self.volume.clone().unmount() {
            log::warn(&format!("unmount {}: {e}", self.data.display()));
        }
    }

    fn request_id(&self) -> String {
        format!(
            "r{:06}-{}",
            self.next_request.fetch_add(1, Ordering::Relaxed),
            forkd_sandbox::id::random_hex(2)
        )
    }
}

/// Runs the daemon until SIGINT/SIGTERM.
pub fn run(cfg: DaemonConfig) -> anyhow::Result<()> {
    use anyhow::Context;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(512)
        .enable_all()
        .build()
        .context("start async runtime")?;
    let result = rt.block_on(async move {
        let daemon = {
            let cfg = cfg.clone();
            let handle = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || Daemon::open(&cfg, handle)).await??
        };
        if let Some(parent) = cfg.socket.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create {}", parent.display()))?;
        }
        let _ = std::fs::remove_file(&cfg.socket);
        // Bind with a restrictive umask so the socket is never reachable by others.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        let listener = tokio::net::UnixListener::bind(&cfg.socket);
        nix::sys::stat::umask(old);
        let listener = listener.with_context(|| format!("listen on {}", cfg.socket.display()))?;
        std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(0o600))?;
        log::info(&format!(
            "forkd {} listening on {} (root {}, cgroup v{}, {} sandboxes recovered)",
            env!("CARGO_PKG_VERSION"),
            cfg.socket.display(),
            cfg.root.display(),
            daemon.hierarchy.version(),
            daemon.sandboxes.locked().len()
        ));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    match accepted {
                        Ok((stream, _)) => {
                            let d = daemon.clone();
                            tokio::spawn(async move { routes::serve(d, stream, None).await });
                        }
                        Err(e) => log::warn(&format!("accept: {e}")),
                    }
                }
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
            }
        }
        // Sandboxes keep running: a restarted daemon picks them up again.
        let _ = std::fs::remove_file(&cfg.socket);
        // Free cgroups are not kept across a restart (the next start would sweep them).
        daemon.cgroups.sweep();
        daemon.release_volume_if_idle();
        daemon.sharing.stop();
        log::info("daemon stopped; sandboxes keep running");
        Ok(())
    });
    // Streaming execs may still be relaying; they end with the process, their commands
    // live on in the sandboxes.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// The host's process events for inits' exits, or `None` (said in the log) where the
/// kernel's connector cannot be had: outside the host's pid or network namespace, or
/// without `CAP_NET_ADMIN`.
fn open_proc_events() -> Option<forkd_sys::proc_events::ProcEvents> {
    let filter = forkd_sys::mount::kernel_version(&forkd_sys::mount::kernel_release())
        .is_some_and(|v| v >= forkd_sys::proc_events::KERNEL_FILTER);
    match forkd_sys::proc_events::ProcEvents::open("proc-events", filter) {
        Ok(p) => Some(p),
        Err(e) => {
            log::warn(&format!(
                "the kernel's process events cannot be had ({e}): each sandbox's init is \
                 watched through a descriptor of its own, and RLIMIT_NOFILE bounds how many \
                 sandboxes may run"
            ));
            None
        }
    }
}

/// Raises `kernel.pid_max` to what the host's memory can carry where it is lower (every
/// branch takes two pids or more), and says so; says why not where it cannot.
fn raise_pid_max() {
    let host = match forkd_sys::ceilings::Host::read() {
        Ok(h) => h,
        Err(e) => return log::warn(&format!("read the host's ceilings: {e}")),
    };
    match forkd_sys::ceilings::raise_pid_max(&host) {
        Ok(Some((before, after))) => log::info(&format!(
            "kernel.pid_max raised from {before} to {after} (what {} MiB of memory can carry): \
             every sandbox takes two pids or more",
            host.mem_total >> 20
        )),
        Ok(None) => {}
        Err(e) => log::warn(&format!(
            "kernel.pid_max is {} and could not be raised to {}: {e}; it bounds how many \
             sandboxes may run",
            host.pid_max,
            host.pid_max_for_memory()
        )),
    }
}
