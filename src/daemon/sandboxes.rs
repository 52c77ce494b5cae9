//! The sandbox table: create, inspect, exec, and recovery after a restart; how a
//! sandbox ends (stop, remove, an init that exits) is in [`ending`], and where its
//! writable layer comes from (a snapshot of its base or of a checkpoint's) in [`layer`].
//!
//! Each sandbox lives in `<root>/sandboxes/<id>/` with `layer/{upper,work}` (its
//! private overlay layer), `rootfs/` (where the merged root is attached inside the
//! sandbox's own mount namespace; on the host it stays an empty directory, and the daemon
//! reaches the root through the init, `/proc/<pid>/root`), `state.json` (the
//! persisted [`SandboxRecord`], written atomically) and `execs.jsonl` (one line per exec:
//! the sandbox's trajectory).
//!
//! States: `running -> stopped -> removed`, with `stopping`, `checkpointing` and
//! `removing` while such an operation runs; what each allows is one table in
//! [`super::lifecycle`]. `stop` is idempotent; `rm` of a running sandbox needs `force`.
//! No lock is held across a grace period, a CRIU call or a file walk. A record is
//! written only once the sandbox is fully up, so a directory without `state.json` is a
//! half-made sandbox and recovery removes it. Everything here blocks; callers run it on
//! the blocking pool.

use super::record::Record;
use super::{Daemon, Lock};
use crate::api::{ApiError, CreateSandboxRequest, MemoryCounted, SandboxInfo, SandboxStatus};
use forkd_cgroups::Cgroup;
use forkd_sandbox::host;
use forkd_sandbox::proto::ExecRequest;
use forkd_sandbox::setup::SetupSpec;
use forkd_sandbox::SandboxId;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Condvar};
use std::time::{Duration, Instant, SystemTime};

mod describe;
mod ending;
mod expiry;
mod layer;

pub(super) use layer::LayerFrom;

pub(super) use super::record::{SandboxRecord, RECORD_VERSION};

/// Below a sandbox's directory: where its root is attached, and its overlay's upper
/// directory.
pub(crate) const ROOTFS: &str = "rootfs";
const UPPER: &str = "layer/upper";

/// What [`Sandbox::rootfs`] and [`Sandbox::upper`] look like in a description.
struct Shown {
    rootfs: String,
    upper: String,
}

/// A sandbox in the table. The record's mutex is held only to read or change fields,
/// never across slow work: operations that take time hold the sandbox in a passing state
/// instead ([`super::lifecycle`]).
pub struct Sandbox {
    pub id: SandboxId,
    pub dir: PathBuf,
    /// Its paths as descriptions show them, made once (a list of thousands of sandboxes
    /// spent a tenth of its time joining and formatting them).
    shown: Shown,
    /// Its record, and the description a list shows of it (see [`super::record`]).
    pub record: Record,
    /// Signalled whenever the state changes.
    pub changed: Condvar,
    /// Execs in flight (changed under the record's lock; see `begin_exec`).
    pub execs: AtomicUsize,
}

impl Sandbox {
    pub fn new(dir: PathBuf, record: SandboxRecord) -> Sandbox {
        let shown = Shown {
            rootfs: dir.join(ROOTFS).display().to_string(),
            upper: dir.join(UPPER).display().to_string(),
        };
        Sandbox {
            id: record.id.clone(),
            shown,
            dir,
            record: Record::new(record),
            changed: Condvar::new(),
            execs: AtomicUsize::new(0),
        }
    }

    /// Where the sandbox's root is attached inside its own mount namespace (and where a
    /// restored tree's root goes). On the host this is an empty directory: use
    /// [`Sandbox::root`] to reach the files.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join(ROOTFS)
    }
    /// The sandbox's merged root as the daemon reaches it: through its running init
    /// (the root lives in the sandbox's mount namespace only; see
    /// `forkd_sys::mount`). `None` once it is stopped.
    pub fn root(&self) -> Option<PathBuf> {
        self.record.locked().init_pid.map(init_root)
    }
    /// The sandbox's own writable layer: a btrfs subvolume holding the overlay's
    /// `upper` and `work` directories (overlayfs copies up by renaming from `work` into
    /// `upper`, which btrfs allows only within one subvolume).
    pub fn layer(&self) -> PathBuf {
        self.dir.join("layer")
    }
    pub fn upper(&self) -> PathBuf {
        self.dir.join(UPPER)
    }
}

fn valid_hostname(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 63
        && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !h.starts_with('-')
}

impl Daemon {
    pub(super) fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.node.data.join("sandboxes").join(id.as_str())
    }

    /// Creates and starts a sandbox from an image.
    pub fn create_sandbox(
        self: &Arc<Self>,
        req: CreateSandboxRequest,
        owner: Option<String>,
    ) -> Result<Arc<Sandbox>, ApiError> {
        let started = Instant::now();
        let mut req = req;
        self.admit(
            super::admission::Ask {
                what: "create",
                sandboxes: 1,
                // An init and the command it starts.
                tasks_each: 2,
                defaults: true,
            },
            &mut req.limits,
        )?;
        let image = self
            .images
            .local(&req.image, &self.config.registries_conf)
            .map_err(|e| match e {
                forkd_layers::ImageError::NotFound(_) => ApiError::not_found(format!(
                    "no such image: {} (pull it with `forkd image pull {}`)",
                    req.image, req.image
                )),
                e @ forkd_layers::ImageError::InvalidName { .. } => {
                    ApiError::bad_request(format!("image: {e}"))
                }
                other => ApiError::from_chain("read image", &other),
            })?;
        if let Some(cmd) = &mut req.command {
            if cmd.tty || cmd.stdin {
                return Err(ApiError::bad_request("command: the command given at create runs detached; it cannot have a tty or stdin"));
            }
            cmd.detach = true;
            cmd.log.get_or_insert_with(|| "main".into());
            cmd.validate()
                .map_err(|e| ApiError::bad_request(format!("command: {e}")))?;
        }
        let network = super::edge::network(&req.network);
        let policy = self.sandboxes.network_policy(&network)?;
        let id = SandboxId::random();
        let hostname = req
            .hostname
            .clone()
            .unwrap_or_else(|| id.short().to_string());
        if !valid_hostname(&hostname) {
            return Err(ApiError::bad_request(format!(
                "invalid hostname {hostname:?}: use letters, digits and '-', at most 63"
            )));
        }
        let lowers = self.images.stack(&image.layers);
        let base = self.base_for(&lowers)?;
        let origin = super::record::Origin {
            image: image.name.clone(),
            lowers,
            base: base.id.clone(),
            parent: None,
            hostname,
            limits: req.limits.clone(),
            labels: req.labels.clone(),
            config: image.config.clone(),
            network,
            seccomp: super::edge::seccomp(req.seccomp),
            setuid: req.setuid,
            expires_at: req
                .expires_in_secs
                .map(|s| super::now_secs().saturating_add(s)),
            owner,
        };
        let memory_cgroup = self
            .sandboxes
            .cgroups
            .shared_memory_for(&super::edge::cgroup_limits(&req.limits));
        let record = SandboxRecord::starting(id.clone(), origin, memory_cgroup);
        let dir = self.sandbox_dir(&id);
        // Until its command has started too: the spare layer taken is made again after,
        // not beside that start (whose log file waits out the snapshot's commit).
        let _busy = self.images.spare_layers.busy();
        let sb = self.start_or_undo(&dir, record, started, &LayerFrom::Base, |d, dir, rec| {
            d.start_init_in(dir, rec, policy.as_ref())
        })?;
        if let Some(mut cmd) = req.command {
            self.apply_image_defaults(&sb, &mut cmd);
            let root = sb.root().unwrap_or_else(|| sb.rootfs());
            if let Err(e) = host::start_exec(&root, &cmd) {
                let msg = format!("start command in sandbox {id}: {e}");
                let _ = self.remove_sandbox(&sb, true);
                return Err(ApiError::bad_request(msg));
            }
        }
        Ok(sb)
    }

    /// Fills what an API exec leaves unset from the sandbox's image config: the image's
    /// ENV comes first (the request's own variables override it), and the working
    /// directory and user apply unless the request names its own. forkd's own tools
    /// (`cp`) do not go through this: they always run as root from `/`.
    pub fn apply_image_defaults(&self, sb: &Sandbox, req: &mut ExecRequest) {
        if req.attach.is_some() {
            // Joins a command that runs already, with the settings it was started with.
            return;
        }
        let rec = sb.record.locked();
        let c = &rec.config;
        if !c.env.is_empty() {
            let mut env = c.env.clone();
            env.append(&mut req.env);
            req.env = env;
        }
        if req.cwd.is_none() {
            req.cwd = c.working_dir.clone();
        }
        if req.user.is_none() {
            req.user = c.user.clone();
        }
    }

    /// Prepares a sandbox's root and cgroup, runs `start` to bring its processes up,
    /// records it and watches it. On failure, everything made so far is undone.
    pub(super) fn start_or_undo(
        self: &Arc<Self>,
        dir: &Path,
        mut record: SandboxRecord,
        started: Instant,
        layer: &LayerFrom,
        start: impl FnOnce(&Daemon, &Path, &mut SandboxRecord) -> Result<(), ApiError>,
    ) -> Result<Arc<Sandbox>, ApiError> {
        let _busy = self.images.spare_layers.busy();
        let res = self
            .prepare_root(dir, &record, layer)
            .and_then(|()| start(self, dir, &mut record))
            .and_then(|()| {
                record.create_us = started.elapsed().as_micros() as u64;
                super::write_json_atomic(dir, "state.json", &record, super::Survive::DaemonCrash)
            });
        if let Err(e) = res {
            // A limit too small for the sandbox to start is the request's fault: the
            // error names it (read before the cgroup goes).
            let e = self.limit_hit(&record).map_or(e, ApiError::bad_request);
            let cg = record.cgroup_in(&self.sandboxes.hierarchy);
            self.teardown(&record.id, dir, &cg, record.init_pid);
            self.delete_sandbox_dir(dir);
            return Err(e);
        }
        let sb = Arc::new(Sandbox::new(dir.to_path_buf(), record));
        self.sandboxes.table.locked().insert(sb.clone());
        self.watch(sb.clone());
        Ok(sb)
    }

    /// The limit a sandbox's processes ran into while it started, as an error naming the
    /// field: the OOM killer fired in its cgroup, or a fork was refused at its task limit.
    fn limit_hit(&self, record: &SandboxRecord) -> Option<String> {
        let cg = record.cgroup_in(&self.sandboxes.hierarchy);
        let id = &record.id;
        if let Some(m) = record.limits.memory_bytes {
            if cg.oom_kills().is_some_and(|n| n > 0) {
                return Some(format!(
                    "limits.memory_bytes {m} is too small for sandbox {id} to start: the kernel's OOM killer ended it while it started"
                ));
            }
        }
        if let Some(p) = record.limits.pids {
            if cg.pids_refusals() > 0 {
                return Some(format!(
                    "limits.pids {p} is too few for sandbox {id} to start: a process it needed to start was refused"
                ));
            }
        }
        None
    }

    /// Makes the sandbox directory, its writable layer (a btrfs subvolume, so that a
    /// checkpoint can snapshot it in O(1); made from its base as `layer` says), the
    /// directory its root is attached at, and the cgroup. The root itself is made by
    /// [`Daemon::root_mount`] when the sandbox's processes start.
    fn prepare_root(
        &self,
        dir: &Path,
        record: &SandboxRecord,
        from: &LayerFrom,
    ) -> Result<(), ApiError> {
        let id = &record.id;
        let ctx = |step: &str| format!("sandbox {id}: {step}");
        let rootfs = dir.join(ROOTFS);
        std::fs::create_dir_all(&rootfs).map_err(|e| {
            ApiError::internal(format!(
                "{}: {e}",
                ctx(&format!("create {}", rootfs.display()))
            ))
        })?;
        self.make_layer(&dir.join("layer"), record, from)?;
        self.sandboxes
            .cgroups
            .take(
                &record.cgroup,
                record.memory_cgroup.as_deref(),
                &super::edge::cgroup_limits(&record.limits),
            )
            .map_err(|e| ApiError::from_chain(&ctx("create cgroup"), &e))?;
        Ok(())
    }

    /// The sandbox's root: its lower layers and writable layer as one overlay, a
    /// detached mount that the process making the sandbox's mount namespace (the set-up,
    /// or CRIU for a branch) attaches there. It never enters the daemon's mount table,
    /// so what every new sandbox copies and every mount operation on the host walks does
    /// not grow with the number of sandboxes. Files can be placed in it first through
    /// [`forkd_sys::mount::fd_path`].
    pub(super) fn root_mount(
        &self,
        dir: &Path,
        record: &SandboxRecord,
    ) -> Result<std::os::fd::OwnedFd, ApiError> {
        let lowers: Vec<PathBuf> = match &record.base {
            Some(base) => vec![self.images.bases.tree(base)],
            None => record.lowers.iter().map(|l| self.lower_path(l)).collect(),
        };
        let lower_refs: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
        let layer = dir.join("layer");
        forkd_sys::mount::overlay(
            &lower_refs,
            Some((&layer.join("upper"), &layer.join("work"))),
        )
        .map_err(|e| ApiError::internal(format!("sandbox {}: mount root: {e}", record.id)))
    }

    /// Removes a sandbox directory, its upper subvolume included. Idempotent.
    pub(super) fn delete_sandbox_dir(&self, dir: &Path) {
        if let Err(e) = self.node.volume.delete_subvolume(&dir.join("layer")) {
            log::warn(&format!("delete {}: {e}", dir.join("layer").display()));
        }
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn(&format!("remove {}: {e}", dir.display()));
            }
        }
    }

    /// Starts a fresh init in a prepared sandbox, with egress when `policy` says so.
    pub(super) fn start_init_in(
        &self,
        dir: &Path,
        record: &mut SandboxRecord,
        policy: Option<&forkd_net::Policy>,
    ) -> Result<(), ApiError> {
        let id = record.id.clone();
        let ctx = |step: &str| format!("sandbox {id}: {step}");
        let rootfs = dir.join(ROOTFS);
        let root = self.root_mount(dir, record)?;
        let connected = match policy {
            Some(p) => Some(self.sandboxes.connect(
                &id,
                p,
                &forkd_sys::mount::fd_path(root.as_fd()),
                &record.hostname,
            )?),
            None => None,
        };
        let spec = SetupSpec {
            id: id.clone(),
            rootfs,
            hostname: record.hostname.clone(),
            cgroup: Some(record.cgroup_in(&self.sandboxes.hierarchy)),
            name_files: connected.is_some(),
            sysfs: self.sandboxes.sysfs.clone(),
            seccomp: record.seccomp,
            setuid: record.setuid,
        };
        if let Some(c) = &connected {
            record.lease = Some(c.lease.clone());
        }
        let spare;
        let netns = match &connected {
            Some(c) => c.netns.as_fd(),
            None => {
                spare =
                    self.sandboxes.spare_netns.take().map_err(|e| {
                        ApiError::from_chain(&ctx("create a network namespace"), &e)
                    })?;
                spare.as_fd()
            }
        };
        let pid = host::start_init(
            &self.sandboxes.setup_exe,
            &spec,
            Some(netns),
            root.as_fd(),
            self.sandboxes.empty_mntns.as_fd(),
        )
        .map_err(|e| ApiError::from_chain(&ctx("start init"), &e))?;
        drop(root);
        record.init_pid = Some(pid);
        // The set-up answers once the init listens on its control socket.
        record.init_start = forkd_sys::process_start_time(pid);
        Ok(())
    }

    /// Rebuilds the table from the state root after a start or restart: sandboxes whose
    /// init still runs come back; the rest are cleaned up and marked stopped; half-made
    /// ones are removed.
    pub fn recover(self: &Arc<Self>) -> Result<(), ApiError> {
        let dir = self.node.data.join("sandboxes");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| ApiError::internal(format!("read {}: {e}", dir.display())))?;
        let (mut alive_leases, mut gone, mut to_watch) = (Vec::new(), Vec::new(), Vec::new());
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            let Ok(id) = name.parse::<SandboxId>() else {
                log::warn(&format!("ignoring {}: not a sandbox id", path.display()));
                continue;
            };
            let rec = std::fs::read(path.join("state.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<SandboxRecord>(&b).ok())
                .filter(|r| r.id == id && r.version == RECORD_VERSION);
            let Some(mut rec) = rec else {
                log::info(&format!("removing half-made sandbox {id}"));
                let cg = Cgroup::new(&self.sandboxes.hierarchy, &format!("forkd/{id}"));
                self.teardown(&id, &path, &cg, None);
                self.delete_sandbox_dir(&path);
                continue;
            };
            let alive = rec.status == SandboxStatus::Running
                && rec.init_pid.is_some_and(|p| {
                    forkd_sys::process_alive(p)
                        && forkd_sys::process_start_time(p) == rec.init_start
                });
            if alive {
                // A daemon killed in the middle of a checkpoint left the tree frozen.
                let cg = rec.cgroup_in(&self.sandboxes.hierarchy);
                if cg.freezer_dir().is_some() {
                    if let Err(e) = cg.set_frozen(false, Duration::from_secs(10)) {
                        log::warn(&format!("sandbox {id}: thaw after restart: {e}"));
                    }
                }
            }
            if rec.status == SandboxStatus::Running && !alive {
                log::info(&format!("sandbox {id}: init is gone; cleaning up"));
                self.teardown(&id, &path, &rec.cgroup_in(&self.sandboxes.hierarchy), None);
                gone.extend(rec.lease.take());
                rec.status = SandboxStatus::Stopped;
                rec.init_pid = None;
                rec.init_start = None;
                super::write_json_atomic(&path, "state.json", &rec, super::Survive::DaemonCrash)?;
            }
            let sb = Arc::new(Sandbox::new(path, rec));
            if alive {
                if let Some(l) = &sb.record.locked().lease {
                    alive_leases.push((id.clone(), l.clone()));
                }
            }
            self.sandboxes.table.locked().insert(sb.clone());
            if alive {
                to_watch.push(sb);
            }
        }
        // The leases first: a sandbox that exits from now on gives its lease back.
        self.sandboxes.recover_network(alive_leases, gone);
        for sb in to_watch {
            self.watch(sb);
        }
        Ok(())
    }

    /// Appends one exec to the sandbox's trajectory.
    pub fn log_exec(
        &self,
        sb: &Sandbox,
        req: &ExecRequest,
        started: SystemTime,
        result: &serde_json::Value,
    ) {
        let t = started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0);
        let line = crate::api::ExecRecord {
            t_us: t as u64,
            argv: req.shell.is_none().then(|| req.argv.clone()),
            shell: req.shell.clone(),
            cwd: req.cwd.clone(),
            user: req.user.clone(),
            tty: req.tty,
            detach: req.detach,
            result: result.clone(),
        };
        let line = serde_json::to_string(&line).expect("records serialise");
        let path = sb.dir.join("execs.jsonl");
        // One write of the whole line: with O_APPEND, concurrent execs' lines never
        // interleave (formatting straight into the file writes it in pieces).
        let text = format!("{line}\n");
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(e) = res {
            log::warn(&format!("append {}: {e}", path.display()));
        }
    }
}

use super::log;

/// The root of the sandbox whose init is `pid`, as the host reaches it.
pub(super) fn init_root(pid: i32) -> PathBuf {
    PathBuf::from(init_root_shown(pid))
}

fn init_root_shown(pid: i32) -> String {
    format!("/proc/{pid}/root")
}
