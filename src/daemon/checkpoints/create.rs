//! Checkpointing a sandbox (`POST /v1/sandboxes/{id}/checkpoint`): its filesystem
//! captured while the tree is frozen (a small layer copied, file contents shared; any
//! other a read-only btrfs snapshot: see [`capture_layer`]), and with `live` its process
//! tree dumped by CRIU, the filesystem captured in CRIU's post-dump hook. Assembled in a
//! stage directory and renamed into place, so a failed checkpoint leaves nothing.

use super::tree::{freeze_outside_vfork, stopped_tasks, traced_tasks, wait_for_exiting_relays};
use super::{max_stack, Checkpoint, CheckpointRecord, Lower, RECORD_VERSION};
use crate::api::CHECKPOINT_PHASES as CHECKPOINT;
use crate::api::{record_phase, ApiError, CheckpointRequest, SandboxStatus};
use crate::daemon::lifecycle::{Begun, Verb};
use crate::daemon::sandboxes::{Sandbox, SandboxRecord};
use crate::daemon::{Daemon, Lock, RwLockExt};
use forkd_cgroups::Cgroup;
use forkd_sandbox::CheckpointId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Unwritten data (bytes) above which a filesystem checkpoint of a running sandbox
/// syncs the volume before freezing it: writing out this much more inside the frozen
/// window takes a few milliseconds.
const PRESYNC_ABOVE_BYTES: u64 = 4 << 20;

/// A layer this small is copied into its checkpoint rather than snapshotted: at most
/// a few milliseconds of copying (a reflink is per extent, an extent at least 4 KiB),
/// below what a snapshot's commit of the shared volume costs with thousands of
/// sandboxes writing.
const COPIED_UP_TO: forkd_layers::copy::Small = forkd_layers::copy::Small {
    entries: 128,
    bytes: 4 << 20,
};

/// How a checkpoint took the filesystem (the name of its phase).
#[derive(Clone, Copy)]
enum Captured {
    Copy,
    Snapshot,
}

impl Captured {
    fn phase(self) -> &'static str {
        match self {
            Captured::Copy => "copy",
            Captured::Snapshot => "snapshot",
        }
    }
}

/// Captures a sandbox's writable layer (`upper/` and `work/`) as a checkpoint's `fs`,
/// its tree frozen meanwhile. A btrfs snapshot costs the same whatever the layer holds,
/// but it commits the volume's transaction: it writes out what every sandbox on the
/// volume has changed since the last commit, so it grows with the number writing (and
/// waits out a commit already running). A small layer is copied instead (file contents
/// reflinked; every attribute and whiteout kept), which commits nothing and costs what
/// the layer holds. A layer the copy cannot reproduce exactly (a socket in it, say) is
/// snapshotted. A copy reaches the disk with the volume's next commit (`commit=5`).
fn capture_layer(
    volume: &forkd_volume::Volume,
    layer: &Path,
    fs: &Path,
) -> Result<Captured, String> {
    let copied = std::fs::create_dir(fs)
        .and_then(|()| std::fs::create_dir(fs.join("upper")))
        .and_then(|()| std::fs::create_dir(fs.join("work")))
        .map_err(|e| format!("create {}: {e}", fs.display()))
        .and_then(|()| {
            forkd_layers::copy::copy_upper_exactly(
                &layer.join("upper"),
                &fs.join("upper"),
                COPIED_UP_TO,
            )
            .map_err(|e| format!("copy {}: {e}", layer.display()))
        });
    match copied {
        Ok(true) => return Ok(Captured::Copy),
        Ok(false) => {}
        Err(e) => crate::daemon::log::warn(&format!("{e}; snapshotting it instead")),
    }
    if let Err(e) = std::fs::remove_dir_all(fs) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(format!("remove {}: {e}", fs.display()));
        }
    }
    volume.snapshot_readonly(layer, fs).map_err(|e| {
        // With its causes (the volume's error names the step, its source the errno).
        ApiError::from_chain(&format!("snapshot {}", layer.display()), &e).message
    })?;
    Ok(Captured::Snapshot)
}

/// The sandbox whose tree a live checkpoint dumps, as the checkpoint found it.
#[derive(Clone, Copy)]
struct Tree<'a> {
    sb: &'a Sandbox,
    rec: &'a SandboxRecord,
    cg: &'a Cgroup,
    upper: &'a Path,
    fs: &'a Path,
}

impl Daemon {
    /// Checkpoints a sandbox. See the module header for the mechanism.
    pub fn checkpoint_sandbox(
        self: &Arc<Self>,
        sb: &Sandbox,
        req: &CheckpointRequest,
    ) -> Result<Arc<Checkpoint>, ApiError> {
        let _store = self.images.store_lock.read_locked();
        let total = Instant::now();
        let criu = if req.live {
            Some(self.checkpoints.criu.as_ref().map_err(|e| {
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
        let stage = self
            .node
            .data
            .join("checkpoints")
            .join(format!(".stage-{id}"));
        let fs = stage.join("fs");
        let upper = sb.layer();
        let cg = rec.cgroup_in(&self.sandboxes.hierarchy);
        let mut phases = BTreeMap::new();
        let result = std::fs::create_dir_all(&stage)
            .map_err(|e| ApiError::internal(format!("create {}: {e}", stage.display())))
            .and_then(|()| match criu {
                Some(criu) => {
                    let tree = Tree {
                        sb,
                        rec: &rec,
                        cg: &cg,
                        upper: &upper,
                        fs: &fs,
                    };
                    self.dump_tree(criu, &tree, &stage, &id, req.stop, &mut phases)
                }
                None => self.snapshot_files(&cg, &upper, &fs, running, &mut phases),
            });
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
        let (dir, record) = self.seal(&stage, &id, sb, &rec, req, phases, total)?;
        if let Some(mut held) = to_stop {
            // A live dump with `stop` already ended the tree; either way, tidy up like a stop.
            held.pass_to(SandboxStatus::Stopping);
            let _ = self.stop_held(sb, held, Duration::from_secs(10));
        }
        // Its branches' layers are snapshots of its own (or of the base, for a copied
        // one): have one made ahead for the fork that usually follows.
        if let Some(base) = &record.base {
            let from = self.checkpoint_layer(&dir);
            self.images
                .spare_layers
                .want(&self.layer_source(&from, base));
        }
        let c = Arc::new(Checkpoint::new(dir, record));
        self.checkpoints.table.locked().insert(id, c.clone());
        self.hash_in_background(c.clone());
        Ok(c)
    }

    /// Completes a staged checkpoint: its layer stack (squashed when too deep), its
    /// record written, the stage renamed into place. Deletes the stage on failure.
    #[allow(clippy::too_many_arguments)]
    fn seal(
        &self,
        stage: &Path,
        id: &CheckpointId,
        sb: &Sandbox,
        rec: &SandboxRecord,
        req: &CheckpointRequest,
        mut phases: BTreeMap<String, u64>,
        total: Instant,
    ) -> Result<(PathBuf, CheckpointRecord), ApiError> {
        let mut lowers = vec![Lower::Checkpoint(id.clone())];
        if let Some(base) = &rec.base {
            // The layer holds everything the sandbox changed over its base's stack (for
            // a branch, its checkpoint's files too): that stack is what it stands on, and
            // its depth never grows.
            match self.images.bases.stack(base) {
                Ok(stack) => lowers.extend(stack),
                Err(e) => {
                    self.delete_checkpoint_dir(stage);
                    return Err(e);
                }
            }
        } else if rec.lowers.len() + 1 > max_stack(self.config.max_layers) {
            // Deep chains: flatten everything below this checkpoint's own layer into one
            // layer, so branches stay within overlayfs's stack limit.
            let t = Instant::now();
            match self.squash(&rec.lowers) {
                Ok(layer) => lowers.push(Lower::Layer(layer)),
                Err(e) => {
                    self.delete_checkpoint_dir(stage);
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
            base: rec.base.clone(),
            live: req.live,
            created: crate::daemon::now_secs(),
            labels: req.labels.clone(),
            // Whoever owns the sandbox owns what is made of it.
            owner: rec.owner.clone(),
            fs_hash: None,
            tree_hash: None,
            phases_us: phases,
            images_bytes: dir_size(&stage.join("criu")),
            config: rec.config.clone(),
            network: rec.network.clone(),
            lease: rec.lease.clone(),
            seccomp: rec.seccomp,
            setuid: rec.setuid,
        };
        let dir = self.node.data.join("checkpoints").join(id.as_str());
        // Not fsynced: the checkpoint is on disk with the volume's next commit (every
        // 5 s), its record, its files and the rename into place in one transaction or in
        // order. A host crash before that loses it whole (recovery removes a stage), and
        // an fsync alone would not save it: the rename that follows is what makes it a
        // checkpoint. An fsync here also turned into a commit of the whole volume
        // whenever btrfs could not log the change alone (a removal in the same
        // transaction, say).
        if let Err(e) = crate::daemon::write_json_atomic(
            stage,
            "meta.json",
            &record,
            crate::daemon::Survive::DaemonCrash,
        )
        .and_then(|()| {
            std::fs::rename(stage, &dir).map_err(|e| {
                ApiError::internal(format!(
                    "rename {} to {}: {e}",
                    stage.display(),
                    dir.display()
                ))
            })
        }) {
            self.delete_checkpoint_dir(stage);
            return Err(e);
        }
        Ok((dir, record))
    }

    /// The process tree's part of a live checkpoint: checks that CRIU can take the tree
    /// as it is, freezes it (outside any `vfork`), dumps it into `STAGE/criu` and takes
    /// the filesystem snapshot in CRIU's post-dump hook, while the tree is still frozen;
    /// thaws it in every case.
    fn dump_tree(
        &self,
        criu: &forkd_criu::Criu,
        t: &Tree,
        stage: &Path,
        id: &CheckpointId,
        stop: bool,
        phases: &mut BTreeMap<String, u64>,
    ) -> Result<(), ApiError> {
        let Tree {
            sb,
            rec,
            cg,
            upper,
            fs,
        } = *t;
        let images = stage.join("criu");
        std::fs::create_dir_all(&images)
            .map_err(|e| ApiError::internal(format!("create {}: {e}", images.display())))?;
        let volume = &self.node.volume;
        let captured = std::cell::Cell::new(None);
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
        let traced = traced_tasks(cg);
        if !traced.is_empty() {
            let list: Vec<String> = traced
                .iter()
                .map(|(p, c, t, tc)| format!("process {p} ({c}) is traced by process {t} ({tc})"))
                .collect();
            return Err(ApiError::conflict(format!(
                "live checkpoint of sandbox {}: {}; CRIU cannot seize a traced process: detach the tracer first (a filesystem checkpoint works meanwhile)",
                sb.id,
                list.join("; ")
            )));
        }
        let t = Instant::now();
        wait_for_exiting_relays(cg, rec.init_pid.unwrap_or(0), Duration::from_secs(2));
        record_phase(phases, CHECKPOINT, "relays", t.elapsed());
        // A stopped process (SIGSTOP, a shell's suspended job) in a frozen cgroup
        // cannot be seized: ptrace waits for it to trap, which a frozen task never
        // does, and the dump hangs in the kernel. With one, CRIU seizes the tree
        // itself (stopped tasks included) and restores them stopped.
        let stopped = stopped_tasks(cg);
        let freezer = cg.freezer_dir().is_some() && stopped.is_empty();
        if !stopped.is_empty() {
            crate::daemon::log::info(&format!(
                "sandbox {}: {} stopped process(es) {stopped:?}: CRIU seizes the tree without the freezer",
                sb.id,
                stopped.len()
            ));
        }
        if freezer {
            let t = Instant::now();
            let refrozen = freeze_outside_vfork(cg, &sb.id)?;
            record_phase(phases, CHECKPOINT, "freeze", t.elapsed());
            if refrozen > 0 {
                crate::daemon::log::info(&format!(
                    "sandbox {}: frozen again {refrozen} time(s) to catch no thread inside vfork",
                    sb.id
                ));
            }
        }
        // Sockets that leave the sandbox cannot be restored in a branch, which
        // has another address (forkd_net::sockets). Looked for with the tree
        // frozen, so none appears between the look and the dump.
        let outside =
            forkd_net::sockets::outside(rec.init_pid.unwrap_or(0), &cg.pids().unwrap_or_default());
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
                root: crate::daemon::sandboxes::init_root(rec.init_pid.unwrap_or(0)),
                leave_running: !stop,
                freeze_cgroup: if freezer { cg.freezer_dir() } else { None },
                log_file: "dump.log".into(),
                // A sandbox cannot change its network namespace (see
                // forkd_sandbox::setup): a branch gets a new one like it.
                external_net: true,
                // The sandbox's /sys is a bind of the daemon's (see Daemon::sysfs): a
                // branch binds it again rather than mounting a sysfs of its own.
                external_mounts: self
                    .sandboxes
                    .sysfs
                    .iter()
                    .map(|_| ("/sys".to_string(), super::SYSFS_KEY.to_string()))
                    .collect(),
            },
            &mut || {
                captured.set(Some(capture_layer(volume, upper, fs)?));
                Ok(())
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
        record_phase(phases, CHECKPOINT, "dump", report.duration);
        let captured = captured.get().unwrap_or(Captured::Snapshot);
        record_phase(phases, CHECKPOINT, captured.phase(), report.hook);
        Ok(())
    }

    /// A filesystem checkpoint: the writable layer snapshotted with the tree (if running)
    /// frozen for the snapshot alone, the volume synced before if the sandbox has much
    /// unwritten data.
    fn snapshot_files(
        &self,
        cg: &Cgroup,
        upper: &Path,
        fs: &Path,
        running: bool,
        phases: &mut BTreeMap<String, u64>,
    ) -> Result<(), ApiError> {
        // The snapshot writes out what the sandbox left dirty in its layer, inside the
        // frozen window. A sandbox with much unwritten data has the volume synced
        // first, while it still runs, so that the window stays short. Not otherwise: a
        // sync of the volume writes what every sandbox on it has dirtied, a cost that
        // grows with the number alive (docs/DESIGN.md, "Many sandboxes").
        if running && cg.unwritten_bytes().is_none_or(|b| b > PRESYNC_ABOVE_BYTES) {
            let t = Instant::now();
            if let Ok(f) = std::fs::File::open(upper) {
                let _ = nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f));
            }
            record_phase(phases, CHECKPOINT, "sync", t.elapsed());
        }
        let t = Instant::now();
        if running {
            cg.set_frozen(true, Duration::from_secs(10))
                .map_err(|e| ApiError::from_chain("freeze sandbox", &e))?;
            record_phase(phases, CHECKPOINT, "freeze", t.elapsed());
        }
        let t = Instant::now();
        let captured = capture_layer(&self.node.volume, upper, fs);
        if let Ok(c) = captured {
            record_phase(phases, CHECKPOINT, c.phase(), t.elapsed());
        }
        if running {
            cg.set_frozen(false, Duration::from_secs(10))
                .map_err(|e| ApiError::from_chain("thaw sandbox", &e))?;
        }
        captured.map_err(ApiError::internal)?;
        Ok(())
    }
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
