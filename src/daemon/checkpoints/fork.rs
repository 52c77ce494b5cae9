//! Forking a checkpoint (`POST /v1/checkpoints/{id}/fork`): N branch sandboxes, each a
//! writable layer holding the checkpoint's files over the base they were made on (a
//! snapshot of the checkpoint's snapshot, or the base with its small copied layer copied
//! in; see `crate::daemon::bases`) and, for a live checkpoint, its process tree
//! restored by CRIU into the branch's own namespaces and cgroup. All or nothing: a
//! request that fails removes the branches it started.

use super::{Checkpoint, CheckpointRecord, Lower};
use crate::api::FORK_PHASES as FORK;
use crate::api::{self, record_phase, ApiError, BranchInfo, ForkRequest, ForkResult};
use crate::daemon::bases::BaseId;
use crate::daemon::sandboxes::LayerFrom;
use crate::daemon::sandboxes::{SandboxRecord, ROOTFS};
use crate::daemon::{Daemon, Lock};
use forkd_sandbox::{host, SandboxId};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What every branch of one fork request shares, settled before the first starts.
pub(super) struct Plan<'a> {
    c: &'a Checkpoint,
    record: CheckpointRecord,
    pub(super) labels: BTreeMap<String, String>,
    /// The key that asked for the branches.
    owner: Option<String>,
    network: forkd_net::Network,
    policy: Option<forkd_net::Policy>,
    /// CRIU to restore the tree with; none for a fresh branch (or a filesystem
    /// checkpoint), which starts a new init over the checkpoint's files.
    criu: Option<&'a forkd_criu::Criu>,
    lazy: bool,
    /// Each branch's lifetime, if it expires.
    expires_in_secs: Option<u64>,
    /// Whether the restored trees are opened to KSM (`crate::daemon::sharing`).
    share_memory: bool,
    /// The checkpoint's restore template, whose memory eager branches share.
    template: Option<Arc<forkd_criu::Template>>,
    /// The base every branch stands on (pinned until the request ends), and what its
    /// layer is made from.
    base: crate::daemon::bases::Pinned<'a>,
    layer: LayerFrom,
}

impl Plan<'_> {
    fn mode(&self) -> api::ForkMode {
        match (self.criu.is_some(), self.lazy) {
            (false, _) => api::ForkMode::Fresh,
            (true, false) => api::ForkMode::Eager,
            (true, true) => api::ForkMode::Lazy,
        }
    }
}

/// Runs `one` for `count` items on up to `workers` threads and returns every result.
/// After the first failure no new item starts; those under way finish.
fn on_workers<T: Send>(
    count: usize,
    workers: usize,
    one: impl Fn() -> Result<T, ApiError> + Sync,
) -> Vec<Result<T, ApiError>> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(count));
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, count.max(1)) {
            scope.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    let r = one();
                    let failed = r.is_err();
                    results.locked().push(r);
                    if failed {
                        next.store(count, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    results.into_inner().unwrap_or_else(|e| e.into_inner())
}

impl Daemon {
    /// Starts `count` branch sandboxes from a checkpoint, all or none.
    pub fn fork_checkpoint(
        self: &Arc<Self>,
        c: &Arc<Checkpoint>,
        req: &ForkRequest,
        owner: Option<String>,
    ) -> Result<ForkResult, ApiError> {
        let count = req.count.unwrap_or(1);
        if count == 0 || count > 10_000 {
            return Err(ApiError::bad_request(format!(
                "branch count {count} must be between 1 and 10000"
            )));
        }
        // The branches keep the checkpoint's limits, a disk limit of their own aside.
        let mut limits = c.record.locked().limits.clone();
        if let Some(d) = req.disk_bytes {
            limits.disk_bytes = Some(d);
        }
        self.admit(
            crate::daemon::admission::Ask {
                what: &format!("fork of checkpoint {}", c.id),
                sandboxes: count,
                tasks_each: c.tasks(),
                defaults: false,
            },
            &mut limits,
        )?;
        let _in_use = c.use_for("fork")?;
        let plan = self.plan_fork(c, req, limits, owner)?;
        if count > 1 {
            // The branches' layers, made side by side: btrfs commits them together.
            self.images
                .spare_layers
                .prepare(&self.layer_source(&plan.layer, &plan.base.id), count);
        }
        let results = on_workers(count, self.config.fork_parallel, || {
            self.fork_branch(&plan, None)
        });
        let mut branches = Vec::with_capacity(count);
        let mut first_error = None;
        for r in results {
            match r {
                Ok(b) => branches.push(b),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(mut e) = first_error {
            // All or nothing: the branches this request did start go too.
            for b in &branches {
                if let Ok(done) = self.sandboxes.get(&b.id) {
                    let _ = self.remove_sandbox(&done, true);
                }
            }
            if !e.message.contains(c.id.as_str()) {
                e.message = format!(
                    "fork of checkpoint {} ({} of {count} branches made, removed): {}",
                    c.id,
                    branches.len(),
                    e.message
                );
            }
            return Err(e);
        }
        if plan.share_memory {
            self.checkpoints.sharing.forked();
        }
        Ok(ForkResult {
            checkpoint: c.id.to_string(),
            branches,
        })
    }

    /// Checks the request against the checkpoint and settles what the branches share.
    /// `limits` are the branches' ([`Daemon::admit`] took them).
    pub(super) fn plan_fork<'a>(
        &'a self,
        c: &'a Checkpoint,
        req: &ForkRequest,
        limits: crate::api::Limits,
        owner: Option<String>,
    ) -> Result<Plan<'a>, ApiError> {
        let mut ck = c.record.locked().clone();
        ck.limits = limits;
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
            Some(n) => {
                let n = crate::daemon::edge::network(n);
                let policy = self.sandboxes.network_policy(&n)?;
                (n, policy)
            }
            // A sandbox checkpointed while stopped held no lease: its mode, resolved now.
            None => match &ck.lease {
                Some(l) => (ck.network.clone(), Some(forkd_net::Policy::of(l))),
                None => (
                    ck.network.clone(),
                    self.sandboxes.network_policy(&ck.network)?,
                ),
            },
        };
        let criu = if ck.live && !req.fresh {
            Some(
                self.checkpoints
                    .criu
                    .as_ref()
                    .map_err(|e| ApiError::conflict(format!("live forks are unavailable: {e}")))?,
            )
        } else {
            None
        };
        // Only a restored tree has memory to share; a fresh branch's asking is refused.
        let share_memory = match (req.share_memory, criu.is_some()) {
            (Some(true), false) => {
                return Err(ApiError::bad_request(format!(
                    "share_memory needs a restored process tree: checkpoint {} {}",
                    c.id,
                    if ck.live {
                        "is forked fresh"
                    } else {
                        "has no processes"
                    }
                )))
            }
            (_, false) => false,
            (asked, true) => self
                .checkpoints
                .sharing
                .for_fork(asked)
                .map_err(|e| ApiError::conflict(format!("share_memory: {e}")))?,
        };
        let mut labels = ck.labels.clone();
        labels.extend(req.labels.clone());
        let (base, layer) = self.branch_layer(c, &ck)?;
        // Eager branches of a live checkpoint share its memory through its template. A
        // request for one branch that would start it does not wait for it (the branch reads
        // its pages, as fast as the template would); one for more does.
        let template = match (criu, req.lazy) {
            (Some(criu), false) => self.checkpoints.templates.get(
                criu,
                c.id.as_str(),
                &c.images(),
                req.count.unwrap_or(1) > 1,
            ),
            _ => None,
        };
        Ok(Plan {
            base,
            layer,
            c,
            record: ck,
            labels,
            owner,
            network,
            policy,
            criu,
            lazy: req.lazy,
            expires_in_secs: req.expires_in_secs,
            share_memory,
            template,
        })
    }

    /// What a branch's layer is made from: the checkpoint's own layer over the
    /// checkpointed sandbox's base, when it was made that way (its snapshot, whose files
    /// keep their numbers; or that base with the layer's copy copied in); otherwise (a
    /// checkpoint made before bases, or imported) the base of its whole stack, made at
    /// its first fork.
    fn branch_layer(
        &self,
        c: &Checkpoint,
        ck: &CheckpointRecord,
    ) -> Result<(crate::daemon::bases::Pinned<'_>, LayerFrom), ApiError> {
        if let (Some(base), Some((Lower::Checkpoint(own), below))) =
            (&ck.base, ck.lowers.split_first())
        {
            let pinned = self.images.bases.pin(base.clone());
            if *own == c.id && BaseId::of(below) == *base && self.images.bases.exists(base) {
                return Ok((pinned, self.checkpoint_layer(&c.dir)));
            }
        }
        Ok((self.base_for(&ck.lowers)?, LayerFrom::Base))
    }

    /// Starts one branch: its record, its root, and its processes (restored, or a fresh
    /// init); undone entirely if any step fails.
    /// `id` is the branch's, when it takes the place of a sandbox it resumes.
    pub(super) fn fork_branch(
        self: &Arc<Self>,
        plan: &Plan,
        id: Option<SandboxId>,
    ) -> Result<BranchInfo, ApiError> {
        let started = Instant::now();
        let ck = &plan.record;
        let id = id.unwrap_or_else(SandboxId::random);
        let origin = crate::daemon::record::Origin {
            image: ck.image.clone(),
            lowers: ck.lowers.clone(),
            base: plan.base.id.clone(),
            parent: Some(plan.c.id.clone()),
            hostname: ck.hostname.clone(),
            limits: ck.limits.clone(),
            labels: plan.labels.clone(),
            config: ck.config.clone(),
            network: plan.network.clone(),
            // A live branch's processes carry the filter CRIU restored; a fresh init
            // gets the same.
            seccomp: ck.seccomp,
            setuid: ck.setuid,
            expires_at: plan
                .expires_in_secs
                .map(|s| crate::daemon::now_secs().saturating_add(s)),
            owner: plan.owner.clone(),
        };
        let memory_cgroup = self
            .sandboxes
            .cgroups
            .shared_memory_for(&crate::daemon::edge::cgroup_limits(&ck.limits));
        let record = SandboxRecord::starting(id.clone(), origin, memory_cgroup);
        let dir = self.sandbox_dir(&id);
        let mut phases = BTreeMap::new();
        let mut prepared = None;
        let sb = self.start_or_undo(&dir, record, started, &plan.layer, |d, dir, rec| {
            prepared = Some(started.elapsed());
            match plan.criu {
                None => d.start_init_in(dir, rec, plan.policy.as_ref()),
                Some(criu) => d.restore_branch(plan, criu, dir, rec, &mut phases),
            }
        })?;
        if let Some(p) = prepared {
            record_phase(&mut phases, FORK, "prepare", p);
        }
        record_phase(&mut phases, FORK, "total", started.elapsed());
        let init_pid = sb.record.locked().init_pid;
        Ok(BranchInfo {
            id: sb.id.to_string(),
            mode: plan.mode(),
            init_pid,
            phases_us: phases,
        })
    }

    /// Restores the checkpoint's process tree into a branch whose root is prepared: the
    /// branch's namespace plumbed first when it has egress (CRIU restores into it; without,
    /// CRIU makes a bare one), CRIU run eagerly or with a lazy-pages daemon, then the
    /// restored init awaited.
    fn restore_branch(
        &self,
        plan: &Plan,
        criu: &forkd_criu::Criu,
        dir: &Path,
        rec: &mut SandboxRecord,
        phases: &mut BTreeMap<String, u64>,
    ) -> Result<(), ApiError> {
        let root = self.root_mount(dir, rec)?;
        let connected = match &plan.policy {
            Some(p) => Some(self.sandboxes.connect(
                &rec.id,
                p,
                &forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(&root)),
                &rec.hostname,
            )?),
            None => None,
        };
        let netns = match connected {
            Some(c) => {
                rec.lease = Some(c.lease);
                c.netns
            }
            None => self.sandboxes.spare_netns.take().map_err(|e| {
                ApiError::from_chain(
                    &format!("sandbox {}: create a network namespace", rec.id),
                    &e,
                )
            })?,
        };
        let images = plan.c.images();
        let work = dir.join("criu");
        std::fs::create_dir_all(&work)
            .map_err(|e| ApiError::internal(format!("create {}: {e}", work.display())))?;
        let mut lazy_daemon = None;
        if plan.lazy {
            lazy_daemon = Some(
                criu.start_lazy_pages(&images, &work)
                    .map_err(|e| ApiError::from_chain("start lazy-pages", &e))?,
            );
        }
        let t = Instant::now();
        let cg = rec.cgroup_in(&self.sandboxes.hierarchy);
        let restored = criu.restore(&forkd_criu::RestoreOpts {
            images_dir: images,
            root: dir.join(ROOTFS),
            root_mount: Some(Arc::new(root)),
            mergeable: plan.share_memory,
            work_dir: work.clone(),
            log_file: "restore.log".into(),
            lazy_pages: plan.lazy,
            join_cgroup_procs: cg.procs_files(),
            external_mounts: self
                .sandboxes
                .sysfs
                .iter()
                .map(|p| (super::SYSFS_KEY.to_string(), p.clone()))
                .collect(),
            cgroup_roots: cg.roots(),
            netns: Some(Arc::new(netns)),
            template: plan.template.clone(),
        });
        let restored = match restored {
            Ok(r) => r,
            Err(e) => {
                if let Some(mut l) = lazy_daemon {
                    let _ = l.kill();
                    let _ = l.wait();
                }
                return Err(self.criu_failed(
                    format!("restore of checkpoint {} into {}", plan.c.id, rec.id),
                    &e,
                    &work.join("restore.log"),
                    &format!("fork-{}-restore.log", rec.id),
                ));
            }
        };
        record_phase(phases, FORK, "restore", t.elapsed());
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
            &crate::daemon::sandboxes::init_root(restored.pid),
            Duration::from_secs(10),
        )
        .map_err(|e| ApiError::from_chain(&format!("branch {}: wait for init", rec.id), &e))?;
        record_phase(phases, FORK, "ready", t.elapsed());
        Ok(())
    }
}
