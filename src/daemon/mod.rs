//! `forkd daemon`: one process that owns the state root and serves the API on a Unix
//! socket.
//!
//! Requests are parsed by [`http`], dispatched by [`routes`] and carried out by the
//! resource modules ([`sandboxes`], [`images`], [`files`]); blocking work (mounts,
//! starting inits, file walks, execs) runs on tokio's blocking pool so a long exec never
//! holds up other requests. Every request gets an id that appears in its log line and in
//! its error body; every operation's latency is recorded in [`metrics`].

mod admission;
mod archive;
mod bases;
mod build;
mod checkpoints;
pub mod config;
mod e2b;
mod edge;
mod exec;
pub mod features;
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
mod open;
mod paths;
mod prometheus;
mod pull;
mod quiet;
mod record;
mod routes;
mod sandboxes;
mod server;
mod services;
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
    /// What the kernel can do, asked once at start.
    pub features: features::Features,
    pub node: services::Node,
    pub images: services::Images,
    pub sandboxes: services::Sandboxes,
    pub checkpoints: services::Checkpoints,
    /// E2B's protocol, served beside the API (`e2b.rs`; the `forkd-e2b` crate).
    pub e2b: e2b::E2b,
    pub runtime: tokio::runtime::Handle,
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
    one_of(by_prefix(table, id), id, what)
}

/// Whether a listing for `viewer` (a key's id, or `None` for everyone's) shows a thing
/// whose record names `owner`.
pub(crate) fn visible(viewer: Option<&str>, owner: Option<&str>) -> bool {
    viewer.is_none() || viewer == owner
}

/// What `id` names in `table`: the entry of that full id, or every entry it is a prefix
/// of (at least 4 hex digits).
pub(crate) fn by_prefix<K, V>(table: &HashMap<K, Arc<V>>, id: &str) -> Vec<Arc<V>>
where
    K: std::str::FromStr + std::fmt::Display + std::hash::Hash + Eq,
{
    if let Ok(full) = id.parse::<K>() {
        if let Some(v) = table.get(&full) {
            return vec![v.clone()];
        }
    }
    if id.len() >= 4 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        table
            .iter()
            .filter(|(k, _)| k.to_string().starts_with(id))
            .map(|(_, v)| v.clone())
            .collect()
    } else {
        Vec::new()
    }
}

/// The one entry of `matches`, or why not.
pub(crate) fn one_of<V>(
    matches: Vec<Arc<V>>,
    id: &str,
    what: &str,
) -> Result<Arc<V>, crate::api::ApiError> {
    use crate::api::ApiError;
    match matches.as_slice() {
        [one] => Ok(one.clone()),
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
    /// On shutdown, unmount CRIU's private `/run`, the sandboxes' sysfs and, with nothing
    /// running, the loop-mounted volume, so that no mount outlives the daemon; the next start
    /// mounts them again.
    fn release_volume_if_idle(&self) {
        if let Some(dir) = self
            .checkpoints
            .criu
            .as_ref()
            .ok()
            .and_then(|c| c.run_dir())
        {
            let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
        }
        // Sandboxes keep their own copies of it.
        if let Some(dir) = &self.sandboxes.sysfs {
            let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
        }
        let running = self
            .sandboxes
            .table
            .locked()
            .values()
            .any(|sb| sb.record.locked().status == crate::api::SandboxStatus::Running);
        if running || self.node.volume.loop_image().is_none() {
            return;
        }
        // The roots of sandboxes that stopped a moment ago may still be held, each
        // unmounted (and the volume synced) on the exit watcher's releasing thread.
        log::info("stopping: spare layers and templates");
        self.images.spare_layers.stop();
        self.checkpoints.templates.stop();
        log::info("stopping: waiting for sandbox roots to be released");
        if !self
            .sandboxes
            .exits
            .wait_released(std::time::Duration::from_secs(60))
        {
            log::warn("sandbox roots still held after 60 s: the volume may stay mounted");
        }
        if let Err(e) = self.node.volume.clone().unmount() {
            log::warn(&format!("unmount {}: {e}", self.node.data.display()));
        }
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
            daemon.sandboxes.hierarchy.version(),
            daemon.sandboxes.table.locked().len()
        ));
        let tcp = server::bind_tcp(&daemon.config.listen).await?;
        if let Some(sockets) = daemon.sandboxes.grants.sockets() {
            tokio::spawn(server::serve_grants(daemon.clone(), sockets));
        }
        if let Some(dialed) = daemon.e2b.connections() {
            tokio::spawn(server::serve_dialed(daemon.clone(), dialed));
        }
        let (stopping, stopped) = tokio::sync::watch::channel(false);
        for (l, tls) in tcp {
            log::info(&format!(
                "listening on tcp://{}{}",
                l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                if tls.is_some() {
                    " (TLS)"
                } else {
                    " (plain, loopback)"
                }
            ));
            let mut stopped = stopped.clone();
            tokio::spawn(server::serve_tcp(
                daemon.clone(),
                l,
                tls,
                daemon.config.listen.max_connections,
                async move {
                    let _ = stopped.changed().await;
                },
            ));
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        server::serve_unix(daemon.clone(), listener, stop).await;
        log::info("stopping: no new requests");
        let _ = stopping.send(true);
        // Sandboxes keep running: a restarted daemon picks them up again.
        let _ = std::fs::remove_file(&cfg.socket);
        // Free cgroups are not kept across a restart (the next start would sweep them).
        daemon.sandboxes.cgroups.sweep();
        daemon.release_volume_if_idle();
        daemon.checkpoints.sharing.stop();
        log::info("daemon stopped; sandboxes keep running");
        Ok(())
    });
    // Streaming execs may still be relaying; they end with the process, their commands
    // live on in the sandboxes.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}
