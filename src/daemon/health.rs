//! The node's health: the volume's space and state, CRIU, the exit watcher and the
//! network table (`GET /v1/health`, `forkd doctor`), and the volume's watcher, which
//! grows a loop volume before it fills (`forkd_volume::Volume::keep_ahead`), stops the
//! largest writer when it can grow no more, and keeps what it found for the requests
//! that make sandboxes: while the volume is full or unusable, creates, forks and builds
//! are refused with that reason (503) rather than failing one by one half-way.
//!
//! Stopping a writer: once the volume is down to its reserve (`Space::reserve`, 5%, at
//! least 256 MiB) and cannot grow, the sandbox whose writable layer grew most is given a
//! disk limit equal to what it holds (btrfs simple quotas, where the volume has them;
//! the charges made current first): its next write fails with `EDQUOT`, and the reserve
//! stays for the daemon's
//! records and the other sandboxes. One writer a look (five a second), and only one that
//! grew by at least `GREW` since the volume came near its reserve: a sandbox rewriting a
//! small file now and then is never taken for a filler. Once twice the reserve is free
//! again, every writer stopped so gets its own limit back.

use super::{log, Daemon, Lock};
use crate::api::{ApiError, ComponentHealth, Health, VolumeHealth};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the watcher looks at the volume.
const EVERY: Duration = Duration::from_millis(200);

/// How much a sandbox must have grown since the volume came near its reserve to be
/// stopped as a writer (a rewrite of a small file moves its use by a few blocks).
const GREW: u64 = 1 << 20;

/// What the watcher last found.
#[derive(Debug, Default, Clone)]
pub struct VolumeState {
    pub space: forkd_volume::Space,
    pub pressure: Option<String>,
    pub problems: Vec<String>,
}

#[derive(Default)]
pub struct Watch {
    pub state: Mutex<VolumeState>,
    /// Found at start: the image is not allocated under the filesystem (a full disk could
    /// still make it read-only).
    pub unbacked: Mutex<Option<String>>,
    /// Sandboxes stopped from writing more, with the disk limit each had, and what was
    /// said of them.
    pub held: Mutex<std::collections::HashMap<forkd_sandbox::SandboxId, (Option<u64>, String)>>,
    /// What each sandbox's writable layer held when the volume came near its reserve
    /// (or when the sandbox was first seen after): the writer stopped is the one that
    /// grew most since.
    pub first_use: Mutex<std::collections::HashMap<forkd_sandbox::SandboxId, u64>>,
}

impl Daemon {
    /// Starts the volume's watcher (a thread that ends with the daemon).
    pub(crate) fn watch_volume(self: &Arc<Self>) -> std::io::Result<()> {
        self.look_at_volume();
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("volume".into())
            .spawn(move || loop {
                std::thread::sleep(EVERY);
                match weak.upgrade() {
                    Some(d) => d.look_at_volume(),
                    None => break,
                }
            })
            .map(drop)
    }

    /// One look: grow if filling, then note pressure and problems (each change logged).
    fn look_at_volume(&self) {
        let (space, grew) = match self.node.volume.keep_ahead() {
            Ok(a) => (a.space, a.grew),
            Err(e) => {
                // Growing failed (the host filled between the look and the allocation):
                // say so, and look again next time.
                log::warn(&format!("volume: could not grow: {e}"));
                (self.node.volume.space().unwrap_or_default(), None)
            }
        };
        if let Some((from, to)) = grew {
            log::info(&format!(
                "volume: grew from {} to {} MiB (the disk under it has {} MiB free)",
                from >> 20,
                to >> 20,
                space.host_free >> 20
            ));
        }
        let held = if self.node.disk_quotas.is_ok() {
            self.hold_back_writers(&space)
        } else {
            Vec::new()
        };
        let pressure = match (space.pressure(), held.is_empty()) {
            (Some(p), true) => Some(p),
            (Some(p), false) => Some(format!("{p}; {}", held.join("; "))),
            (None, false) => Some(format!(
                "the volume is down to its reserve: {} free of {}, and it cannot grow; {}",
                forkd_volume::mib(space.fs_free),
                forkd_volume::mib(space.fs_bytes),
                held.join("; ")
            )),
            (None, true) => None,
        };
        let problems = self.node.volume.problems();
        let mut st = self.node.volume_watch.state.locked();
        if pressure != st.pressure {
            match &pressure {
                Some(p) => log::warn(&format!(
                    "{p}; creates and forks are refused until space is freed"
                )),
                None if st.pressure.is_some() => log::info("volume: space is free again"),
                None => {}
            }
        }
        if problems != st.problems && !problems.is_empty() {
            log::warn(&format!("volume: {}", problems.join("; ")));
        }
        *st = VolumeState {
            space,
            pressure,
            problems,
        };
    }

    /// Stops the largest writer while the volume is down to its reserve and cannot grow;
    /// lets every writer stopped so write again once twice the reserve is free. Returns
    /// what is said of the writers held back now.
    fn hold_back_writers(&self, space: &forkd_volume::Space) -> Vec<String> {
        let mut held = self.node.volume_watch.held.locked();
        let mut first_use = self.node.volume_watch.first_use.locked();
        let near = space.fs_free < 2 * space.reserve() && !space.can_grow();
        if near {
            // What each holds now, and how much it grew since the volume came near (its
            // charges made current first).
            if let Err(e) = self.node.volume.settle_charges() {
                log::warn(&format!("volume: {e}"));
            }
            let first_look = first_use.is_empty();
            let now: Vec<(u64, u64, Arc<super::sandboxes::Sandbox>)> = self
                .sandboxes_in_order()
                .into_iter()
                .filter(|sb| !held.contains_key(&sb.id))
                .filter_map(|sb| {
                    let used = self.node.volume.disk_use(&sb.dir.join("layer"))?.used_bytes;
                    let was = *first_use.entry(sb.id.clone()).or_insert(used);
                    Some((used.saturating_sub(was), used, sb))
                })
                .collect();
            if space.in_reserve() {
                // The one that grew most; at the first look (the volume went from plenty
                // to its reserve within one), the one that holds most.
                let writer = now
                    .iter()
                    .filter(|(grew, _, _)| *grew >= GREW)
                    .max_by_key(|(grew, _, _)| *grew)
                    .or_else(|| {
                        now.iter()
                            .filter(|_| first_look)
                            .filter(|(_, used, _)| *used >= space.reserve() / 4)
                            .max_by_key(|(_, used, _)| *used)
                    });
                if let Some((_, used, sb)) = writer {
                    let had = sb.record.locked().limits.disk_bytes;
                    match self
                        .node
                        .volume
                        .set_disk_limit(&sb.dir.join("layer"), Some(*used))
                    {
                        Ok(()) => {
                            let said = format!(
                                "sandbox {}, its largest writer ({}), may write no more (EDQUOT) until space is freed",
                                sb.id,
                                forkd_volume::mib(*used)
                            );
                            log::warn(&format!("volume: {said}"));
                            held.insert(sb.id.clone(), (had, said));
                        }
                        Err(e) => {
                            log::warn(&format!("volume: could not stop sandbox {}: {e}", sb.id))
                        }
                    }
                }
            }
        } else {
            first_use.clear();
        }
        if !held.is_empty() && (space.fs_free > 2 * space.reserve() || space.can_grow()) {
            let table = self.sandboxes.table.locked();
            for (id, (had, _)) in held.drain() {
                let Some(sb) = table.by_id().get(&id) else {
                    continue;
                };
                if let Err(e) = self.node.volume.set_disk_limit(&sb.dir.join("layer"), had) {
                    log::warn(&format!(
                        "volume: could not give sandbox {id} its disk limit back: {e}"
                    ));
                }
            }
            log::info("volume: space is free again; every sandbox may write");
        }
        held.values().map(|(_, said)| said.clone()).collect()
    }

    /// Gives every sandbox the disk limit its record says, at start: one a daemon held
    /// back before it stopped (`hold_back_writers`) would otherwise stay stopped.
    pub(crate) fn restore_disk_limits(&self) {
        if self.node.disk_quotas.is_err() {
            return;
        }
        for sb in self.sandboxes_in_order() {
            let limit = sb.record.locked().limits.disk_bytes;
            if let Err(e) = self
                .node
                .volume
                .set_disk_limit(&sb.dir.join("layer"), limit)
            {
                log::warn(&format!("sandbox {}: set its disk limit: {e}", sb.id));
            }
        }
    }

    /// What `GET /v1/health` answers: what the volume's watcher last found (at most a
    /// fifth of a second ago; only the watcher grows the volume or stops writers), with
    /// the volume's state read now.
    /// The host's ceilings for sandboxes of `tasks_per` tasks each (`GET /v1/health`).
    pub fn ceilings(&self, tasks_per: usize) -> Vec<crate::api::NodeCeiling> {
        let mut out: Vec<crate::api::NodeCeiling> = match forkd_sys::ceilings::Host::read() {
            Ok(h) => h
                .ceilings(tasks_per as u64, forkd_sys::ceilings::SANDBOX_MEMORY_FLOOR)
                .into_iter()
                .map(|c| crate::api::NodeCeiling {
                    name: c.name.into(),
                    value: c.value,
                    used: c.used,
                    kept: c.kept,
                    per_sandbox: c.per,
                    allows: c.allows,
                    how_to_raise: c.raise,
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        if self.sandboxes.proc_events.is_none() {
            let room = self.sandboxes.exits.room() as u64;
            out.push(crate::api::NodeCeiling {
                name: "RLIMIT_NOFILE".into(),
                value: room + self.sandboxes.exits.len() as u64,
                used: self.sandboxes.exits.len() as u64,
                kept: 0,
                per_sandbox: 1,
                allows: room,
                how_to_raise: "each init is watched through a descriptor here (the kernel's process events cannot be had): raise the daemon's RLIMIT_NOFILE".into(),
            });
        }
        out
    }

    pub fn health(&self, tasks_per: usize) -> Health {
        let mut st = self.node.volume_watch.state.locked().clone();
        st.problems = self.node.volume.problems();
        let mut problems = st.problems.clone();
        if let Some(u) = self.node.volume_watch.unbacked.locked().clone() {
            problems.push(u);
        }
        let volume = VolumeHealth {
            path: self.node.data.display().to_string(),
            ok: st.problems.is_empty(),
            size_bytes: st.space.fs_bytes,
            free_bytes: st.space.fs_free,
            max_bytes: st.space.max_bytes,
            host_free_bytes: st.space.host_free,
            host_reserve_bytes: st.space.host_reserve,
            pressure: st.pressure.clone(),
            problems,
        };
        let criu = match &self.checkpoints.criu {
            Ok(c) => ComponentHealth {
                ok: true,
                detail: format!("CRIU {} ({})", c.version, c.path.display()),
            },
            Err(e) => ComponentHealth {
                ok: false,
                detail: format!("live checkpoints are unavailable: {e}"),
            },
        };
        let exit_watcher = if self.sandboxes.exits.is_running() {
            ComponentHealth {
                ok: true,
                detail: match &self.sandboxes.proc_events {
                    Some(p) => format!(
                        "watching {} inits through the kernel's process events (one descriptor)",
                        p.len()
                    ),
                    None => format!(
                        "watching {} processes, a descriptor each",
                        self.sandboxes.exits.len()
                    ),
                },
            }
        } else {
            ComponentHealth {
                ok: false,
                detail: "the exit watcher's threads have ended: sandboxes' exits go unnoticed; restart the daemon".into(),
            }
        };
        let network = match self.sandboxes.egress.nft_path() {
            Ok(p) => ComponentHealth {
                ok: true,
                detail: format!(
                    "table inet {} ({})",
                    self.sandboxes.egress.table,
                    p.display()
                ),
            },
            Err(e) => ComponentHealth {
                ok: false,
                detail: format!("sandboxes with egress are unavailable: {e}"),
            },
        };
        let mut degraded = Vec::new();
        for p in &volume.problems {
            degraded.push(format!("volume: {p}"));
        }
        if let Some(p) = &volume.pressure {
            degraded.push(format!("volume: {p}"));
        }
        for (name, c) in [
            ("criu", &criu),
            ("exit watcher", &exit_watcher),
            ("network", &network),
        ] {
            if !c.ok {
                degraded.push(format!("{name}: {}", c.detail));
            }
        }
        let disk_limits = match &self.node.disk_quotas {
            Ok(()) => ComponentHealth {
                ok: true,
                detail: "btrfs simple quotas".into(),
            },
            Err(e) => ComponentHealth {
                ok: false,
                detail: e.clone(),
            },
        };
        let (ok, detail) = self
            .checkpoints
            .templates
            .health(self.checkpoints.criu.as_ref().ok());
        Health {
            ok: degraded.is_empty(),
            degraded,
            volume,
            criu,
            exit_watcher,
            network,
            disk_limits,
            templates: ComponentHealth { ok, detail },
            ceilings: self.ceilings(tasks_per),
        }
    }
}

impl super::services::Node {
    /// Refuses what would write a new sandbox to a volume that is full or unusable.
    pub(crate) fn volume_usable(&self, what: &str) -> Result<(), ApiError> {
        let st = self.volume_watch.state.locked().clone();
        if let Some(p) = st.problems.first() {
            return Err(ApiError::unavailable(format!("{what} refused: {p}")));
        }
        if let Some(p) = &st.pressure {
            return Err(ApiError::unavailable(format!(
                "{what} refused: {p} (remove sandboxes, checkpoints or files in them)"
            )));
        }
        Ok(())
    }
}
