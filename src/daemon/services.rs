//! The daemon's services: each owns a part of its state, and the daemon composes them.
//!
//! | service | owns |
//! |---|---|
//! | [`Node`] | the state root and its lock, the volume and its watch, whether disk limits hold, the metrics, the cgroup2 flag kept, the requests under way |
//! | [`Images`] | the layer store, images, bases, the runtime layer, the store lock, pulls and builds in progress, spare layers |
//! | [`Sandboxes`] | the table of sandboxes, cgroups, the watch of inits' exits, network leases and egress, spare network namespaces, the sysfs and mount namespace every sandbox starts from, the set-up program, grants |
//! | [`Checkpoints`] | the table of checkpoints, CRIU, restore templates, memory sharing |
//!
//! An operation of one resource is a method in that resource's file; one that crosses
//! services (a create takes an image's layers and makes a sandbox; a fork takes a
//! checkpoint and makes sandboxes) is the daemon's, composing them after one admission
//! (`admission.rs`).

use super::bases::Lower;
use super::*;
use crate::api::ApiError;
use forkd_layers::Image;
use std::collections::HashSet;

/// The node: where the state lives, and what the daemon knows of the machine.
pub struct Node {
    /// The state root given by the user (holds the lock and, if needed, the volume image).
    pub root: PathBuf,
    /// Where all data lives: a btrfs filesystem (the state root itself, or a loop-mounted
    /// image below it), so that sandboxes' upper layers can be snapshotted in O(1).
    pub data: PathBuf,
    pub volume: forkd_volume::Volume,
    /// Whether disk limits can be enforced (btrfs simple quotas on the volume), or why
    /// not.
    pub disk_quotas: Result<(), String>,
    /// The volume's space and state, as its watcher last found them (see [`health`]).
    pub volume_watch: health::Watch,
    pub metrics: metrics::Metrics,
    /// The API keys TCP callers present (`ROOT/keys.json`, read again when it changes).
    pub keys: forkd_keys::Keys,
    /// What keys did (`ROOT/audit.log`).
    pub audit: super::server::audit::Audit,
    /// The requests under way, for the work made ahead when the daemon is quiet.
    pub activity: Arc<super::quiet::Activity>,
    /// Keep `favordynmods` on the cgroup2 mount (unless `FORKD_CGROUP_FAVOR_DYNMODS=0`).
    pub(super) favor_dynmods: bool,
    /// Whether the last attempt to set it failed (so a failure is logged once).
    pub(super) favor_dynmods_failed: std::sync::atomic::AtomicBool,
    /// Held for the daemon's lifetime: one daemon per state root.
    pub(super) _lock: nix::fcntl::Flock<std::fs::File>,
    pub(super) next_request: AtomicU64,
}

/// Images and the layers they and every sandbox stand on.
pub struct Images {
    pub layers: LayerStore,
    pub store: ImageStore,
    /// Layer stacks merged into one subvolume each: every sandbox's one lower layer.
    pub bases: bases::Bases,
    /// The layer holding `/.forkd/init`, on top of every sandbox's stack.
    pub runtime_layer: LayerId,
    /// Held for reading by whatever adds layers to the store before a record refers to
    /// them (imports, squashes); `gc` holds it for writing.
    pub store_lock: std::sync::RwLock<()>,
    /// Image pulls in progress, and the bound on blob fetches.
    pub pulls: pull::Pulls,
    /// Image builds in progress.
    pub builds: build::Builds,
    /// Writable layers (snapshots of bases and checkpoints) made ahead.
    pub spare_layers: Arc<spare_layers::SpareLayers>,
}

/// Sandboxes and what each runs in.
pub struct Sandboxes {
    pub table: Mutex<table::SandboxTable>,
    pub hierarchy: Hierarchy,
    /// Sandboxes' cgroups, kept for the next sandbox rather than removed (cgroup v1;
    /// `FORKD_CGROUP_POOL`, default 32, `0` for none).
    pub cgroups: forkd_cgroups::Pool,
    /// Watches every sandbox's init for its exit (one thread, one epoll set).
    pub exits: forkd_sys::exits::ExitWatcher,
    /// The host's process events, through which inits' exits are learned with one
    /// descriptor whatever the number alive; `None` where they cannot be had (then each
    /// init takes a pidfd of `exits`).
    pub proc_events: Option<forkd_sys::proc_events::ProcEvents>,
    /// Sandbox egress: the pool, the nftables table, `nft`.
    pub egress: forkd_net::Egress,
    /// The network lease of every sandbox that holds one.
    pub leases: Mutex<HashMap<forkd_sandbox::SandboxId, forkd_net::Lease>>,
    /// Network namespaces made ahead for the sandboxes and branches to come.
    pub spare_netns: Arc<spare_netns::SpareNetns>,
    /// The sysfs every new sandbox binds as `/sys` (`forkd_sys::mount_quiet_sysfs`), or
    /// none if it could not be mounted: each sandbox then mounts its own.
    pub sysfs: Option<PathBuf>,
    /// The network namespace of that sysfs, kept so that its loopback stays listed.
    pub(super) _sysfs_netns: Option<std::os::fd::OwnedFd>,
    /// The mount namespace every new sandbox's is copied from: one empty read-only tmpfs
    /// (`forkd_sys::mount::empty_namespace`).
    pub empty_mntns: std::os::fd::OwnedFd,
    /// The program run as `__setup` to start a sandbox's init: the runtime layer's copy
    /// of `forkd-init`, the very file every sandbox runs as its init. A static executable
    /// at a fixed address, it starts in about half the time the daemon's own (position-
    /// independent, three times larger) executable took, and a rebuilt binary on the host
    /// cannot pair one build's set-up with another's init.
    pub setup_exe: PathBuf,
    /// Capabilities on single sandboxes, each served on a socket of its own.
    pub grants: grants::Grants,
}

/// Checkpoints and what restores them.
pub struct Checkpoints {
    pub table: Mutex<HashMap<forkd_sandbox::CheckpointId, Arc<checkpoints::Checkpoint>>>,
    /// CRIU, if usable here; live checkpoints need it.
    pub criu: Result<forkd_criu::Criu, String>,
    /// Restore templates of live checkpoints: branches share their memory.
    pub templates: Arc<templates::Templates>,
    /// Memory shared between branches (KSM): which forks share, and KSM's pacing.
    pub sharing: sharing::Sharing,
}

impl Node {
    /// Refuses `what`, which makes `n` sandboxes of `tasks_per` tasks each, when it would
    /// pass one of the host's ceilings (`forkd_sys::ceilings`: `kernel.pid_max`,
    /// `kernel.threads-max`, memory), before anything is made; the error names the ceiling,
    /// its value and what raises it.
    pub fn within_ceilings(&self, what: &str, n: usize, tasks_per: usize) -> Result<(), ApiError> {
        let host = match forkd_sys::ceilings::Host::read() {
            Ok(h) => h,
            // A host that does not say (a masked `/proc/sys`, a kernel without
            // MemAvailable) is not refused for it.
            Err(e) => {
                log::warn(&format!(
                    "{what}: the host's ceilings cannot be read ({e}): admitted"
                ));
                return Ok(());
            }
        };
        host.admit(
            what,
            n as u64,
            tasks_per as u64,
            forkd_sys::ceilings::SANDBOX_MEMORY_FLOOR,
        )
        .map_err(ApiError::unavailable)
    }

    /// A new request's id: a sequence number and two random bytes.
    pub fn request_id(&self) -> String {
        format!(
            "r{:06}-{}",
            self.next_request.fetch_add(1, Ordering::Relaxed),
            forkd_sandbox::id::random_hex(2)
        )
    }
}

impl Images {
    /// The image of this name, or one pulled before under the fully qualified reference
    /// the name means (`busybox` is `docker.io/library/busybox:latest` unless
    /// `registries_conf` says otherwise). Nothing is fetched.
    pub fn local(
        &self,
        name: &str,
        registries_conf: &std::path::Path,
    ) -> Result<Image, forkd_layers::ImageError> {
        let first = match self.store.get(name) {
            Err(forkd_layers::ImageError::NotFound(n)) => forkd_layers::ImageError::NotFound(n),
            other => return other,
        };
        let Ok(conf) = forkd_registry::RegistriesConf::load_from(registries_conf) else {
            return Err(first);
        };
        let Ok(candidates) = conf.candidates(name) else {
            return Err(first);
        };
        candidates
            .iter()
            .find_map(|c| self.store.get(&c.to_string()).ok())
            .ok_or(first)
    }

    /// The stack of a sandbox made from an image of `layers` (bottom first): this
    /// daemon's runtime layer over them, topmost first.
    pub fn stack(&self, layers: &[LayerId]) -> Vec<Lower> {
        let mut stack = vec![Lower::Layer(self.runtime_layer)];
        stack.extend(layers.iter().rev().cloned().map(Lower::Layer));
        stack
    }

    /// The names in the layer store's directory (what a failed build may have left).
    pub fn layer_names(&self) -> HashSet<String> {
        std::fs::read_dir(self.layers.root())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Sandboxes {
    /// Refuses work that would start `n` more inits than the watcher of their exits can
    /// take (its descriptor table is bounded by `RLIMIT_NOFILE`; each init needs a pidfd
    /// there).
    pub fn can_watch(&self, n: usize) -> Result<(), ApiError> {
        if self.proc_events.is_some() {
            return Ok(());
        }
        let room = self.exits.room();
        if room < n {
            return Err(ApiError::conflict(format!(
                "this daemon watches {} sandboxes and its descriptor limit (RLIMIT_NOFILE) leaves room to watch {room} more, not {n}",
                self.exits.len()
            )));
        }
        Ok(())
    }
    /// A sandbox by full id or unique prefix (at least 4 characters).
    pub fn get(&self, id: &str) -> Result<Arc<Sandbox>, ApiError> {
        find_by_prefix(self.table.locked().by_id(), id, "sandbox")
    }

    /// The sandboxes that stand on image `name`.
    pub fn of_image(&self, name: &str) -> Vec<String> {
        self.table.locked().of_image(name)
    }
}

impl Checkpoints {
    /// A checkpoint by full id or unique prefix (at least 4 characters).
    pub fn get(&self, id: &str) -> Result<Arc<checkpoints::Checkpoint>, ApiError> {
        find_by_prefix(&self.table.locked(), id, "checkpoint")
    }
}
