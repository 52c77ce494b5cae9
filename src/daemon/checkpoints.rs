//! Checkpoints and forks.
//!
//! A checkpoint seals a sandbox's state without copying it:
//! - the filesystem: the sandbox's upper layer is a btrfs subvolume; a read-only
//!   snapshot of it (O(1), whatever its size) becomes the checkpoint's own layer, taken
//!   while every process of the sandbox is frozen. The sandbox goes on writing into its
//!   upper, which from then on holds exactly what a fresh upper over the snapshot would;
//! - with `live`, the process tree: CRIU dumps it (frozen through the cgroup freezer) and
//!   the snapshot is taken in CRIU's post-dump notification, while the tree is still
//!   frozen, so memory and files are of the same instant.
//!
//! On disk: `<data>/checkpoints/<id>/{meta.json, fs/ (the snapshot of the sandbox's
//! writable layer; `fs/upper` is the checkpoint's overlay layer), criu/ (images)}`.
//! A checkpoint is assembled in `.stage-<id>` and renamed into place at the end, so a
//! failed checkpoint leaves nothing; recovery removes stale stages.
//!
//! A fork makes N branch sandboxes: each gets a fresh upper subvolume over the
//! checkpoint's layer stack and, for a live checkpoint, the process tree restored by CRIU
//! into new namespaces and its own cgroup (eagerly, or lazily through userfaultfd).

use super::lifecycle::{Begun, Verb};
use super::sandboxes::{Sandbox, SandboxRecord};
use super::{log, Daemon, Lock, RwLockExt};
use crate::api::{
    self, record_phase, ApiError, BranchInfo, CheckpointInfo, CheckpointRequest, ForkRequest,
    ForkResult, SandboxStatus,
};
use crate::api::{CHECKPOINT_PHASES as CHECKPOINT, FORK_PHASES as FORK};
use forkd_cgroups::{Cgroup, Limits};
use forkd_layers::LayerId;
use forkd_sandbox::{host, CheckpointId, SandboxId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RECORD_VERSION: u32 = 1;

/// How many branches of one fork request are restored at once (`FORKD_FORK_PARALLEL`,
/// default: the number of CPUs).
pub fn fork_parallelism() -> usize {
    std::env::var("FORKD_FORK_PARALLEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
}

/// The deepest layer stack a checkpoint may have before it is squashed (overlayfs takes
/// at most 500 lower layers; `FORKD_MAX_LAYERS` lowers the bound, e.g. for tests).
fn max_stack() -> usize {
    std::env::var("FORKD_MAX_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 2)
        .unwrap_or(128)
}

/// One layer of an overlay stack: a layer of the content-addressed store, or the
/// filesystem snapshot of a checkpoint. Written as `layer:<hex>` / `checkpoint:<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Lower {
    Layer(LayerId),
    Checkpoint(CheckpointId),
}

impl FromStr for Lower {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some(("layer", id)) => id.parse().map(Lower::Layer).map_err(|e| format!("{e}")),
            Some(("checkpoint", id)) => {
                id.parse().map(Lower::Checkpoint).map_err(|e| e.to_string())
            }
            _ => Err(format!("invalid layer reference {s:?}")),
        }
    }
}

impl TryFrom<String> for Lower {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Lower> for String {
    fn from(l: Lower) -> String {
        l.to_string()
    }
}

impl std::fmt::Display for Lower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lower::Layer(id) => write!(f, "layer:{id}"),
            Lower::Checkpoint(id) => write!(f, "checkpoint:{id}"),
        }
    }
}

/// What `meta.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub version: u32,
    pub id: CheckpointId,
    pub parent: Option<CheckpointId>,
    pub sandbox: SandboxId,
    pub image: String,
    pub hostname: String,
    pub limits: Limits,
    /// The checkpointed root's layers, topmost first; the first is this checkpoint's own.
    pub lowers: Vec<Lower>,
    pub live: bool,
    pub created: u64,
    pub labels: BTreeMap<String, String>,
    /// Tree hash of this checkpoint's own layer (computed after creation).
    #[serde(default)]
    pub fs_hash: Option<String>,
    /// SHA-256 over the tree hashes of all layers, topmost first.
    #[serde(default)]
    pub tree_hash: Option<String>,
    pub phases_us: BTreeMap<String, u64>,
    pub images_bytes: u64,
    /// The source sandbox's image config, which its branches keep.
    #[serde(default)]
    pub config: forkd_layers::ImageConfig,
    /// The source sandbox's network mode and lease when it was checkpointed: its branches
    /// get the same policy, each with an address of its own.
    #[serde(default)]
    pub network: forkd_net::Network,
    #[serde(default)]
    pub lease: Option<forkd_net::Lease>,
}

pub struct Checkpoint {
    pub id: CheckpointId,
    pub dir: PathBuf,
    pub record: Mutex<CheckpointRecord>,
    /// Set (under the record's lock) when the checkpoint is being removed.
    pub removed: std::sync::atomic::AtomicBool,
    /// Requests reading its files (forks, exports), and whether a removal has begun:
    /// both changed under the record's lock, so that a removal never deletes files a
    /// fork is restoring from (see [`Checkpoint::use_for`]).
    users: std::sync::atomic::AtomicUsize,
    removing: std::sync::atomic::AtomicBool,
}

/// A request reading a checkpoint's files; the checkpoint cannot be removed while one
/// is held.
pub struct InUse<'a>(&'a Checkpoint);

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        self.0
            .users
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Checkpoint {
    pub fn new(dir: PathBuf, record: CheckpointRecord) -> Checkpoint {
        Checkpoint {
            id: record.id.clone(),
            dir,
            record: Mutex::new(record),
            removed: Default::default(),
            users: Default::default(),
            removing: Default::default(),
        }
    }

    /// Marks the checkpoint as read by a request (`what`: "fork", "export") until the
    /// guard is dropped; refused once its removal has begun.
    pub fn use_for(&self, what: &str) -> Result<InUse<'_>, ApiError> {
        use std::sync::atomic::Ordering::SeqCst;
        let _rec = self.record.locked();
        if self.removing.load(SeqCst) {
            return Err(ApiError::conflict(format!(
                "checkpoint {} is being removed: no {what} of it can start",
                self.id
            )));
        }
        self.users.fetch_add(1, SeqCst);
        Ok(InUse(self))
    }

    /// Begins a removal: refused while a request reads the checkpoint's files.
    fn begin_removal(&self) -> Result<(), ApiError> {
        use std::sync::atomic::Ordering::SeqCst;
        let _rec = self.record.locked();
        let users = self.users.load(SeqCst);
        if users > 0 {
            return Err(ApiError::conflict(format!(
                "checkpoint {} is in use by {users} fork or export request(s) in flight: remove it once they return",
                self.id
            )));
        }
        if self.removing.swap(true, SeqCst) {
            return Err(ApiError::conflict(format!(
                "checkpoint {} is already being removed",
                self.id
            )));
        }
        Ok(())
    }

    /// The checkpoint's own overlay layer.
    pub fn fs(&self) -> PathBuf {
        self.dir.join("fs/upper")
    }
    pub fn images(&self) -> PathBuf {
        self.dir.join("criu")
    }
}

/// Waits, up to `limit`, until no exec relay of the sandbox is left whose command has
/// ended: a process running the init's binary (`comm` "init"), other than the init
/// itself, with no child. Relays of commands still running have their command as a
/// child and stay.
fn wait_for_exiting_relays(cg: &Cgroup, init_pid: i32, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let pids = cg.pids().unwrap_or_default();
        let stat = |pid: i32| -> Option<(String, i32)> {
            let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let comm = s.get(s.find('(')? + 1..s.rfind(')')?)?.to_string();
            let ppid = s
                .get(s.rfind(')')? + 2..)?
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            Some((comm, ppid))
        };
        let procs: Vec<(i32, String, i32)> = pids
            .iter()
            .filter_map(|&p| stat(p).map(|(c, pp)| (p, c, pp)))
            .collect();
        let exiting = procs.iter().any(|(pid, comm, _)| {
            *pid != init_pid && comm == "init" && !procs.iter().any(|(_, _, pp)| pp == pid)
        });
        if !exiting || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A thread of the cgroup caught inside `vfork` (or a `clone`/`clone3` that may carry
/// `CLONE_VFORK`, as `posix_spawn` does), read from `/proc/PID/task/TID/syscall` of the
/// frozen tree. Such a parent cannot be seized until its child has called `exec`, and a
/// frozen or seized child never does, so a dump taken then waits out CRIU's timeout and
/// fails ("Unseizable non-zombie ... state D").
fn vfork_parent(cg: &Cgroup) -> Option<i32> {
    const VFORK: &str = "58";
    const CLONE: &str = "56";
    const CLONE3: &str = "435";
    const CLONE_VFORK: u64 = 0x4000;
    cg.pids().unwrap_or_default().into_iter().find_map(|pid| {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        tasks.flatten().find_map(|t| {
            let text = std::fs::read_to_string(t.path().join("syscall")).ok()?;
            let mut fields = text.split_whitespace();
            let in_vfork = match fields.next()? {
                VFORK | CLONE3 => true,
                CLONE => fields
                    .next()
                    .and_then(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok())
                    .is_some_and(|flags| flags & CLONE_VFORK != 0),
                _ => false,
            };
            in_vfork.then_some(pid)
        })
    })
}

/// Freezes the cgroup at a moment when no thread is inside `vfork` (see
/// [`vfork_parent`]): a caught one is thawed, given a moment to `exec`, and frozen again,
/// for up to about two seconds; then the freeze stands as it is (the dump may fail, and
/// says why).
fn freeze_outside_vfork(cg: &Cgroup, sandbox: &SandboxId) -> Result<u32, ApiError> {
    let freeze = |on: bool| {
        cg.set_frozen(on, Duration::from_secs(10)).map_err(|e| {
            let _ = cg.set_frozen(false, Duration::from_secs(10));
            ApiError::from_chain(
                &format!("{} sandbox {sandbox}", if on { "freeze" } else { "thaw" }),
                &e,
            )
        })
    };
    freeze(true)?;
    let mut retries = 0;
    while retries < 200 && vfork_parent(cg).is_some() {
        retries += 1;
        freeze(false)?;
        std::thread::sleep(Duration::from_micros(500 * u64::from(retries.min(20))));
        freeze(true)?;
    }
    Ok(retries)
}

/// The processes of the cgroup in a stopped state (`T`, `t` in `/proc/PID/stat`).
fn stopped_tasks(cg: &Cgroup) -> Vec<i32> {
    cg.pids()
        .unwrap_or_default()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(") ")
                        .map(|(_, rest)| rest.starts_with(['T', 't']))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The processes of the cgroup that another process traces (`TracerPid` in
/// `/proc/PID/status`), each with its tracer: (pid, comm, tracer pid, tracer comm),
/// pids as the sandbox sees them.
fn traced_tasks(cg: &Cgroup) -> Vec<(i32, String, i32, String)> {
    let comm = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default()
    };
    // The innermost of `NSpid`'s pids: the one in the sandbox's own pid namespace.
    let inner = |pid: i32| -> i32 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|v| v.split_whitespace().last()?.parse().ok())
            })
            .unwrap_or(pid)
    };
    cg.pids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let tracer: i32 = status
                .lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))?
                .trim()
                .parse()
                .ok()?;
            (tracer != 0).then(|| (inner(pid), comm(pid), inner(tracer), comm(tracer)))
        })
        .collect()
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

impl Daemon {
    /// The directory of a layer of an overlay stack.
    pub fn lower_path(&self, l: &Lower) -> PathBuf {
        match l {
            Lower::Layer(id) => self.layers.path(id),
            Lower::Checkpoint(id) => self
                .data
                .join("checkpoints")
                .join(id.as_str())
                .join("fs/upper"),
        }
    }

    pub fn checkpoint(&self, id: &str) -> Result<Arc<Checkpoint>, ApiError> {
        super::find_by_prefix(&self.checkpoints.locked(), id, "checkpoint")
    }

    /// Sandboxes whose layer stack uses checkpoint `id`.
    fn branches_of(&self, id: &CheckpointId) -> Vec<String> {
        let mut out: Vec<String> = self
            .sandboxes
            .locked()
            .values()
            .filter(|sb| {
                sb.record
                    .locked()
                    .lowers
                    .contains(&Lower::Checkpoint(id.clone()))
            })
            .map(|sb| sb.id.to_string())
            .collect();
        out.sort();
        out
    }

    /// Checkpoints stacked on checkpoint `id`.
    fn children_of(&self, id: &CheckpointId) -> Vec<String> {
        let mut out: Vec<String> = self
            .checkpoints
            .locked()
            .values()
            .filter(|c| {
                c.id != *id
                    && c.record
                        .locked()
                        .lowers
                        .contains(&Lower::Checkpoint(id.clone()))
            })
            .map(|c| c.id.to_string())
            .collect();
        out.sort();
        out
    }

    pub fn checkpoint_info(&self, c: &Checkpoint) -> CheckpointInfo {
        let r = c.record.locked().clone();
        CheckpointInfo {
            branches: self.branches_of(&c.id),
            id: r.id.to_string(),
            parent: r.parent.map(|p| p.to_string()),
            sandbox: r.sandbox.to_string(),
            image: r.image,
            live: r.live,
            created: r.created,
            labels: r.labels,
            layers: r.lowers.iter().map(|l| l.to_string()).collect(),
            tree_hash: r.tree_hash,
            phases_us: r.phases_us,
            images_bytes: r.images_bytes,
        }
    }

    pub fn list_checkpoints(&self) -> Vec<CheckpointInfo> {
        let all: Vec<Arc<Checkpoint>> = self.checkpoints.locked().values().cloned().collect();
        let mut out: Vec<CheckpointInfo> = all.iter().map(|c| self.checkpoint_info(c)).collect();
        out.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        out
    }

    /// Checkpoints a sandbox. See the module header for the mechanism.
    pub fn checkpoint_sandbox(
        self: &Arc<Self>,
        sb: &Sandbox,
        req: &CheckpointRequest,
    ) -> Result<Arc<Checkpoint>, ApiError> {
        let _store = self.store_lock.read_locked();
        let total = Instant::now();
        let criu = if req.live {
            Some(self.criu.as_ref().map_err(|e| {
                ApiError::conflict(format!("live checkpoints are unavailable: {e}"))
            })?)
        } else {
            None
        };
        // The sandbox is `checkpointing` from here until the end; its record is read
        // once, and no lock is held through the dump, the snapshot or a squash.
        let held = match sb.begin(Verb::Checkpoint { live: req.live })? {
            Begun::Held(h) => h,
            Begun::Nothing => {
                return Err(ApiError::internal(format!(
                    "sandbox {}: a checkpoint was granted nothing to do",
                    sb.id
                )))
            }
        };
        let prior = held.prior();
        let running = prior == SandboxStatus::Running;
        let rec = held.record().clone();
        let id = CheckpointId::random();
        let stage = self.data.join("checkpoints").join(format!(".stage-{id}"));
        let fs = stage.join("fs");
        let upper = sb.layer();
        let cg = Cgroup::new(&self.hierarchy, &rec.cgroup);
        let mut phases = BTreeMap::new();
        let result = (|| -> Result<(), ApiError> {
            std::fs::create_dir_all(&stage)
                .map_err(|e| ApiError::internal(format!("create {}: {e}", stage.display())))?;
            if let Some(criu) = criu {
                let images = stage.join("criu");
                std::fs::create_dir_all(&images)
                    .map_err(|e| ApiError::internal(format!("create {}: {e}", images.display())))?;
                let volume = &self.volume;
                // The daemon freezes the tree itself: CRIU polls a freezing cgroup only
                // every 100 ms, and a cgroup v1 freezer is never frozen by its first look,
                // so that cost every dump 100 ms. Given a frozen cgroup CRIU seizes the
                // tasks at once and freezes it again when it lets them go (leave-running,
                // or a failed dump); the thaw below is the daemon's in every case.
                // An exec's relay closes its connection just before it exits, so one can
                // still be on its way out when the checkpoint starts; dumped mid-exit, its
                // memory restores broken (CRIU's restorer fails reading its pages). Wait
                // for such relays to be gone first.
                // CRIU seizes every task with ptrace, which a task already traced
                // refuses: say so plainly instead of failing deep in the dump.
                let traced = traced_tasks(&cg);
                if !traced.is_empty() {
                    let list: Vec<String> = traced
                        .iter()
                        .map(|(p, c, t, tc)| {
                            format!("process {p} ({c}) is traced by process {t} ({tc})")
                        })
                        .collect();
                    return Err(ApiError::conflict(format!(
                        "live checkpoint of sandbox {}: {}; CRIU cannot seize a traced process: detach the tracer first (a filesystem checkpoint works meanwhile)",
                        sb.id,
                        list.join("; ")
                    )));
                }
                let t = Instant::now();
                wait_for_exiting_relays(&cg, rec.init_pid.unwrap_or(0), Duration::from_secs(2));
                record_phase(&mut phases, CHECKPOINT, "relays", t.elapsed());
                // A stopped process (SIGSTOP, a shell's suspended job) in a frozen cgroup
                // cannot be seized: ptrace waits for it to trap, which a frozen task never
                // does, and the dump hangs in the kernel. With one, CRIU seizes the tree
                // itself (stopped tasks included) and restores them stopped.
                let stopped = stopped_tasks(&cg);
                let freezer = cg.freezer_dir().is_some() && stopped.is_empty();
                if !stopped.is_empty() {
                    super::log::info(&format!(
                        "sandbox {}: {} stopped process(es) {stopped:?}: CRIU seizes the tree without the freezer",
                        sb.id,
                        stopped.len()
                    ));
                }
                if freezer {
                    let t = Instant::now();
                    let refrozen = freeze_outside_vfork(&cg, &sb.id)?;
                    record_phase(&mut phases, CHECKPOINT, "freeze", t.elapsed());
                    if refrozen > 0 {
                        super::log::info(&format!(
                            "sandbox {}: frozen again {refrozen} time(s) to catch no thread inside vfork",
                            sb.id
                        ));
                    }
                }
                // Sockets that leave the sandbox cannot be restored in a branch, which
                // has another address (forkd_net::sockets). Looked for with the tree
                // frozen, so none appears between the look and the dump.
                let outside = forkd_net::sockets::outside(
                    rec.init_pid.unwrap_or(0),
                    &cg.pids().unwrap_or_default(),
                );
                if !outside.is_empty() {
                    if freezer {
                        let _ = cg.set_frozen(false, Duration::from_secs(10));
                    }
                    let list: Vec<String> = outside.iter().map(|o| o.to_string()).collect();
                    return Err(ApiError::conflict(format!(
                        "live checkpoint of sandbox {}: {}; a branch has an address of its own, so a socket bound to the sandbox's address or connected outside it cannot be restored there (close it first; sockets on loopback or bound to the wildcard address are kept)",
                        sb.id,
                        list.join("; ")
                    )));
                }
                let dumped = criu.dump(
                    &forkd_criu::DumpOpts {
                        pid: rec.init_pid.unwrap_or(0),
                        images_dir: images.clone(),
                        root: super::sandboxes::init_root(rec.init_pid.unwrap_or(0)),
                        leave_running: !req.stop,
                        freeze_cgroup: if freezer { cg.freezer_dir() } else { None },
                        log_file: "dump.log".into(),
                        // A sandbox cannot change its network namespace (see
                        // forkd_sandbox::setup): a branch gets a new one like it.
                        external_net: true,
                    },
                    &mut || {
                        volume
                            .snapshot_readonly(&upper, &fs)
                            .map_err(|e| format!("snapshot {}: {e}", upper.display()))
                    },
                );
                let thawed = if freezer {
                    cg.set_frozen(false, Duration::from_secs(10))
                } else {
                    Ok(())
                };
                let report = dumped.map_err(|e| {
                    self.criu_failed(
                        format!("live checkpoint of sandbox {}", sb.id),
                        &e,
                        &images.join("dump.log"),
                        &format!("checkpoint-{id}-dump.log"),
                    )
                })?;
                thawed.map_err(|e| ApiError::from_chain(&format!("thaw sandbox {}", sb.id), &e))?;
                record_phase(&mut phases, CHECKPOINT, "dump", report.duration);
                record_phase(&mut phases, CHECKPOINT, "snapshot", report.hook);
            } else {
                // Write dirty data out before freezing, so the snapshot (which must flush
                // what is still dirty) keeps the frozen window short.
                let t = Instant::now();
                if let Ok(f) = std::fs::File::open(&upper) {
                    let _ = nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f));
                }
                record_phase(&mut phases, CHECKPOINT, "sync", t.elapsed());
                let t = Instant::now();
                if running {
                    cg.set_frozen(true, Duration::from_secs(10))
                        .map_err(|e| ApiError::from_chain("freeze sandbox", &e))?;
                    record_phase(&mut phases, CHECKPOINT, "freeze", t.elapsed());
                }
                let t = Instant::now();
                let snap = self.volume.snapshot_readonly(&upper, &fs);
                record_phase(&mut phases, CHECKPOINT, "snapshot", t.elapsed());
                if running {
                    cg.set_frozen(false, Duration::from_secs(10))
                        .map_err(|e| ApiError::from_chain("thaw sandbox", &e))?;
                }
                snap.map_err(|e| {
                    ApiError::from_chain(&format!("snapshot {}", upper.display()), &e)
                })?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.delete_checkpoint_dir(&stage);
            return Err(e);
        }
        // The sandbox's part is done: what follows (a squash, the record) reads only the
        // checkpoint's own files, so the sandbox settles now, unless it is to be
        // stopped once the checkpoint is safe.
        let to_stop = if req.stop && running {
            Some(held)
        } else {
            held.settle(prior, |_| Ok(()))?;
            None
        };
        let mut lowers = vec![Lower::Checkpoint(id.clone())];
        if rec.lowers.len() + 1 > max_stack() {
            // Deep chains: flatten everything below this checkpoint's own layer into one
            // layer, so branches stay within overlayfs's stack limit.
            let t = Instant::now();
            match self.squash(&rec.lowers) {
                Ok(layer) => lowers.push(Lower::Layer(layer)),
                Err(e) => {
                    self.delete_checkpoint_dir(&stage);
                    return Err(e);
                }
            }
            record_phase(&mut phases, CHECKPOINT, "squash", t.elapsed());
        } else {
            lowers.extend(rec.lowers.iter().cloned());
        }
        record_phase(&mut phases, CHECKPOINT, "total", total.elapsed());
        let record = CheckpointRecord {
            version: RECORD_VERSION,
            id: id.clone(),
            parent: rec.parent.clone(),
            sandbox: sb.id.clone(),
            image: rec.image.clone(),
            hostname: rec.hostname.clone(),
            limits: rec.limits.clone(),
            lowers,
            live: req.live,
            created: super::now_secs(),
            labels: req.labels.clone(),
            fs_hash: None,
            tree_hash: None,
            phases_us: phases,
            images_bytes: dir_size(&stage.join("criu")),
            config: rec.config.clone(),
            network: rec.network.clone(),
            lease: rec.lease.clone(),
        };
        let dir = self.data.join("checkpoints").join(id.as_str());
        if let Err(e) =
            super::write_json_atomic(&stage, "meta.json", &record, super::Survive::HostCrash)
                .and_then(|()| {
                    std::fs::rename(&stage, &dir).map_err(|e| {
                        ApiError::internal(format!(
                            "rename {} to {}: {e}",
                            stage.display(),
                            dir.display()
                        ))
                    })
                })
        {
            self.delete_checkpoint_dir(&stage);
            return Err(e);
        }

        if let Some(mut held) = to_stop {
            // A live dump with `stop` already ended the tree; either way, tidy up like a stop.
            held.pass_to(SandboxStatus::Stopping);
            let _ = self.stop_held(sb, held, Duration::from_secs(10));
        }
        let c = Arc::new(Checkpoint::new(dir, record));
        self.checkpoints.locked().insert(id, c.clone());
        self.hash_in_background(c.clone());
        Ok(c)
    }

    /// The error of a CRIU dump or restore, by what went wrong, the same for both: CRIU
    /// ran and refused this process tree (what it holds, or where it is brought back),
    /// which the caller can act on, is `bad_request`, as the API documents; CRIU that hung,
    /// crashed or could not be driven is the host's problem, `internal`. The log is copied
    /// where it outlives the operation (`log` as `kept_as` in the data directory's
    /// `logs/`) and named in the message.
    fn criu_failed(
        &self,
        what: String,
        e: &forkd_criu::CriuError,
        log: &Path,
        kept_as: &str,
    ) -> ApiError {
        let dest = self.data.join("logs").join(kept_as);
        let kept = match std::fs::copy(log, &dest) {
            Ok(_) => format!(" (log kept at {})", dest.display()),
            Err(_) => String::new(),
        };
        let message = format!("{what}: {e}{kept}");
        match e {
            forkd_criu::CriuError::Failed { .. } => ApiError::bad_request(message),
            _ => ApiError::internal(message),
        }
    }

    fn delete_checkpoint_dir(&self, dir: &Path) {
        if let Err(e) = self.volume.delete_subvolume(&dir.join("fs")) {
            log::warn(&format!("delete {}: {e}", dir.join("fs").display()));
        }
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn(&format!("remove {}: {e}", dir.display()));
            }
        }
    }

    /// Computes the tree hash of a checkpoint's own layer, then of its whole stack.
    fn hash_in_background(self: &Arc<Self>, c: Arc<Checkpoint>) {
        let d = self.clone();
        std::thread::spawn(move || {
            let fs_hash = match forkd_layers::tree_hash(&c.fs()) {
                Ok(h) => h.to_string(),
                // Removed while being hashed: its files went away under the walk.
                Err(e) if c.removed.load(std::sync::atomic::Ordering::SeqCst) => {
                    log::info(&format!(
                        "checkpoint {}: tree hash abandoned, the checkpoint was removed ({e})",
                        c.id
                    ));
                    return;
                }
                Err(e) => {
                    log::warn(&format!("checkpoint {}: tree hash: {e}", c.id));
                    return;
                }
            };
            let lowers = c.record.locked().lowers.clone();
            let mut stack = sha2::Sha256::default();
            use sha2::Digest;
            stack.update(b"forkd-stack-v1\0");
            for l in &lowers {
                let h = match l {
                    Lower::Layer(id) => id.to_string(),
                    Lower::Checkpoint(cid) if *cid == c.id => fs_hash.clone(),
                    Lower::Checkpoint(cid) => match d.wait_fs_hash(cid) {
                        Some(h) => h,
                        None => return,
                    },
                };
                stack.update(h.as_bytes());
                stack.update(b"\n");
            }
            let tree: String = stack
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let mut rec = c.record.locked();
            // Removed meanwhile: its directory is going or gone, write nothing there.
            // The flag is set under this record's lock, so a write in progress finishes
            // before the directory is deleted. (Only the record lock is taken here: the
            // table is locked before records elsewhere.)
            if c.removed.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            rec.fs_hash = Some(fs_hash);
            rec.tree_hash = Some(tree);
            if let Err(e) =
                super::write_json_atomic(&c.dir, "meta.json", &*rec, super::Survive::HostCrash)
            {
                log::warn(&format!("checkpoint {}: {e}", c.id));
            }
        });
    }

    fn wait_fs_hash(&self, id: &CheckpointId) -> Option<String> {
        for _ in 0..6000 {
            let c = self.checkpoints.locked().get(id).cloned()?;
            if let Some(h) = c.record.locked().fs_hash.clone() {
                return Some(h);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Starts `count` branch sandboxes from a checkpoint.
    pub fn fork_checkpoint(
        self: &Arc<Self>,
        c: &Arc<Checkpoint>,
        req: &ForkRequest,
    ) -> Result<ForkResult, ApiError> {
        let count = req.count.unwrap_or(1);
        if count == 0 || count > 10_000 {
            return Err(ApiError::bad_request(format!(
                "branch count {count} must be between 1 and 10000"
            )));
        }
        let _in_use = c.use_for("fork")?;
        let ck = c.record.locked().clone();
        if req.lazy && req.fresh {
            return Err(ApiError::bad_request(
                "lazy and fresh exclude each other: a fresh branch restores no memory",
            ));
        }
        if req.lazy && !ck.live {
            return Err(ApiError::bad_request(format!(
                "checkpoint {} has no processes: lazy restore needs a live checkpoint",
                c.id
            )));
        }
        // The branches' network: as asked, or the checkpointed sandbox's own policy (its
        // allowlist as resolved then, so that every branch allows the same addresses).
        let (network, policy) = match &req.network {
            Some(n) => (n.clone(), self.network_policy(n)?),
            // A sandbox checkpointed while stopped held no lease: its mode, resolved now.
            None => match &ck.lease {
                Some(l) => (ck.network.clone(), Some(forkd_net::Policy::of(l))),
                None => (ck.network.clone(), self.network_policy(&ck.network)?),
            },
        };
        let criu = if ck.live && !req.fresh {
            Some(
                self.criu
                    .as_ref()
                    .map_err(|e| ApiError::conflict(format!("live forks are unavailable: {e}")))?,
            )
        } else {
            None
        };
        // One branch; run by a few workers at once (restores are CPU-bound CRIU runs).
        let one = || -> Result<BranchInfo, ApiError> {
            let started = Instant::now();
            let id = SandboxId::random();
            let mut labels = ck.labels.clone();
            labels.extend(req.labels.clone());
            let record = SandboxRecord {
                version: super::sandboxes::RECORD_VERSION,
                id: id.clone(),
                image: ck.image.clone(),
                lowers: ck.lowers.clone(),
                parent: Some(c.id.clone()),
                created: super::now_secs(),
                hostname: ck.hostname.clone(),
                limits: ck.limits.clone(),
                labels,
                status: SandboxStatus::Running,
                init_pid: None,
                init_start: None,
                cgroup: format!("forkd/{id}"),
                create_us: 0,
                config: ck.config.clone(),
                network: network.clone(),
                lease: None,
            };
            let dir = self.sandbox_dir(&id);
            let mut phases = BTreeMap::new();
            let mode = match (criu.is_some(), req.lazy) {
                (false, _) => api::ForkMode::Fresh,
                (true, false) => api::ForkMode::Eager,
                (true, true) => api::ForkMode::Lazy,
            };
            let images = c.images();
            let lazy = req.lazy;
            let hierarchy = self.hierarchy.clone();
            let prepared_at = std::cell::Cell::new(None);
            let phases_ref = std::cell::RefCell::new(&mut phases);
            let sb = self.start_or_undo(&dir, record, started, |d, dir, rec| {
                prepared_at.set(Some(started.elapsed()));
                let Some(criu) = criu else {
                    return d.start_init_in(dir, rec, policy.as_ref());
                };
                // With egress, the branch's namespace is made and plumbed first and CRIU
                // restores the tree into it; without, CRIU makes a bare one.
                let root = d.root_mount(dir, rec)?;
                let connected = match &policy {
                    Some(p) => Some(d.connect(
                        &rec.id,
                        p,
                        &forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(&root)),
                        &rec.hostname,
                    )?),
                    None => None,
                };
                let netns = connected.map(|c| {
                    rec.lease = Some(c.lease);
                    std::sync::Arc::new(c.netns)
                });
                let work = dir.join("criu");
                std::fs::create_dir_all(&work)
                    .map_err(|e| ApiError::internal(format!("create {}: {e}", work.display())))?;
                let mut lazy_daemon = None;
                if lazy {
                    lazy_daemon = Some(
                        criu.start_lazy_pages(&images, &work)
                            .map_err(|e| ApiError::from_chain("start lazy-pages", &e))?,
                    );
                }
                let t = Instant::now();
                let cg = Cgroup::new(&hierarchy, &rec.cgroup);
                let restored = criu.restore(&forkd_criu::RestoreOpts {
                    images_dir: images.clone(),
                    root: dir.join("rootfs"),
                    root_mount: Some(std::sync::Arc::new(root)),
                    mergeable: d.sharing.is_some(),
                    work_dir: work.clone(),
                    log_file: "restore.log".into(),
                    lazy_pages: lazy,
                    join_cgroup_procs: cg.procs_files(),
                    cgroup_roots: cg.roots(),
                    netns,
                });
                let restored = match restored {
                    Ok(r) => r,
                    Err(e) => {
                        if let Some(mut l) = lazy_daemon {
                            let _ = l.kill();
                            let _ = l.wait();
                        }
                        return Err(d.criu_failed(
                            format!("restore of checkpoint {} into {}", c.id, rec.id),
                            &e,
                            &work.join("restore.log"),
                            &format!("fork-{}-restore.log", rec.id),
                        ));
                    }
                };
                record_phase(&mut phases_ref.borrow_mut(), FORK, "restore", t.elapsed());
                if let Some(mut l) = lazy_daemon {
                    // It exits once every page is copied; reap it then.
                    std::thread::spawn(move || {
                        let _ = l.wait();
                    });
                }
                rec.init_pid = Some(restored.pid);
                rec.init_start = forkd_sys::process_start_time(restored.pid);
                let t = Instant::now();
                host::wait_ready(
                    &super::sandboxes::init_root(restored.pid),
                    Duration::from_secs(10),
                )
                .map_err(|e| {
                    ApiError::from_chain(&format!("branch {}: wait for init", rec.id), &e)
                })?;
                record_phase(&mut phases_ref.borrow_mut(), FORK, "ready", t.elapsed());
                Ok(())
            });
            let sb = sb?;
            if let Some(p) = prepared_at.get() {
                record_phase(&mut phases, FORK, "prepare", p);
            }
            record_phase(&mut phases, FORK, "total", started.elapsed());
            let init_pid = sb.record.locked().init_pid;
            Ok(BranchInfo {
                id: sb.id.to_string(),
                mode,
                init_pid,
                phases_us: phases,
            })
        };
        let workers = fork_parallelism().min(count);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Mutex<Vec<Result<BranchInfo, ApiError>>> =
            Mutex::new(Vec::with_capacity(count));
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < count {
                        let r = one();
                        let failed = r.is_err();
                        results.locked().push(r);
                        if failed {
                            // Stop handing out work; the others finish what they started.
                            next.store(count, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let mut branches = Vec::with_capacity(count);
        let mut first_error = None;
        for r in results.into_inner().unwrap() {
            match r {
                Ok(b) => branches.push(b),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            // All or nothing: the branches this request did start go too.
            for b in &branches {
                if let Ok(done) = self.sandbox(&b.id) {
                    let _ = self.remove_sandbox(&done, true);
                }
            }
            return Err(e);
        }
        if let (Some(sharing), Some(_)) = (&self.sharing, criu) {
            sharing.forked();
        }
        Ok(ForkResult {
            checkpoint: c.id.to_string(),
            branches,
        })
    }

    /// Removes a checkpoint. Refused while branches or later checkpoints use its layer,
    /// unless `force`, which removes those first.
    pub fn remove_checkpoint(&self, c: &Checkpoint, force: bool) -> Result<(), ApiError> {
        c.begin_removal()?;
        let res = self.remove_begun(c, force);
        if res.is_err() {
            c.removing.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        res
    }

    fn remove_begun(&self, c: &Checkpoint, force: bool) -> Result<(), ApiError> {
        let branches = self.branches_of(&c.id);
        let children = self.children_of(&c.id);
        if !force && (!branches.is_empty() || !children.is_empty()) {
            let mut what = Vec::new();
            if !branches.is_empty() {
                what.push(format!("sandboxes {}", branches.join(", ")));
            }
            if !children.is_empty() {
                what.push(format!("checkpoints {}", children.join(", ")));
            }
            return Err(ApiError::conflict(format!(
                "checkpoint {} is still needed by {}; remove them first or force",
                c.id,
                what.join(" and ")
            )));
        }
        for b in branches {
            if let Ok(sb) = self.sandbox(&b) {
                self.remove_sandbox(&sb, true)?;
            }
        }
        for child in children {
            if let Ok(cc) = self.checkpoint(&child) {
                self.remove_checkpoint(&cc, true)?;
            }
        }
        self.checkpoints.locked().remove(&c.id);
        // Stop a background hash from writing meta.json (see hash_in_background).
        {
            let _rec = c.record.locked();
            c.removed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.delete_checkpoint_dir(&c.dir);
        Ok(())
    }

    /// Loads checkpoints at start-up; removes stages of checkpoints never finished.
    pub fn recover_checkpoints(self: &Arc<Self>) -> Result<(), ApiError> {
        let dir = self.data.join("checkpoints");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| ApiError::internal(format!("read {}: {e}", dir.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with(".stage-") {
                log::info(&format!(
                    "removing unfinished checkpoint {}",
                    path.display()
                ));
                self.delete_checkpoint_dir(&path);
                continue;
            }
            let Ok(id) = name.parse::<CheckpointId>() else {
                continue;
            };
            let rec = std::fs::read(path.join("meta.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<CheckpointRecord>(&b).ok())
                .filter(|r| r.id == id && r.version == RECORD_VERSION);
            let Some(rec) = rec else {
                log::warn(&format!("ignoring {}: no valid meta.json", path.display()));
                continue;
            };
            let missing_hash = rec.tree_hash.is_none();
            let c = Arc::new(Checkpoint::new(path, rec));
            self.checkpoints.locked().insert(id, c.clone());
            if missing_hash {
                self.hash_in_background(c);
            }
        }
        Ok(())
    }

    /// Flattens a layer stack into one layer of the store: the merged view of the stack,
    /// mounted read-only, is copied in (its whiteouts are already applied there).
    fn squash(&self, lowers: &[Lower]) -> Result<LayerId, ApiError> {
        let paths: Vec<PathBuf> = lowers.iter().map(|l| self.lower_path(l)).collect();
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        // The stack as a detached mount, read through its descriptor: it never appears
        // in a mount table.
        let mnt = if refs.len() == 1 {
            None
        } else {
            Some(
                forkd_sys::mount::overlay(&refs, None)
                    .map_err(|e| ApiError::internal(format!("mount stack to squash: {e}")))?,
            )
        };
        let src = match &mnt {
            Some(m) => forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(m)),
            None => paths[0].clone(),
        };
        self.layers
            .import_dir(&src, &mut |_| {})
            .map_err(|e| ApiError::from_chain("squash layers", &e))
    }
}
