//! Restore templates kept for live checkpoints (`forkd_criu::Template`): a checkpoint's
//! first eager fork starts one, which reads the checkpoint's memory once; every branch
//! restored from it shares that memory copy-on-write and costs only what it writes
//! (docs/DESIGN.md, "Memory shared between branches").
//!
//! A template takes longer to start than one restore (it makes huge pages of what it
//! read), so a request for one branch that would start it reads its pages instead and
//! the template starts beside it; requests that come meanwhile, and a first request for
//! more than one branch, wait for it.
//!
//! Templates hold memory, so they are kept within a budget (`FORKD_TEMPLATE_MIB`,
//! default a quarter of the host's memory): starting one past it stops the least
//! recently used. `FORKD_TEMPLATES=off` restores every branch by reading its pages, as
//! before. A template that cannot start is said in the log and the fork goes on without
//! one. Removing a checkpoint stops its template; branches already restored keep their
//! memory (it is theirs, shared only until written).

use crate::daemon::log;
use forkd_criu::{Criu, Template};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

enum Entry {
    Held {
        template: Arc<Template>,
        used: Instant,
        /// Its CRIU log, removed when it is stopped.
        log: PathBuf,
    },
    /// It could not start: not tried again for a while (its branches read their pages).
    /// Its log is kept until the checkpoint is removed.
    Failed { at: Instant, log: PathBuf },
    /// Being started, to hold about these bytes: forks of its checkpoint wait for it, and
    /// the budget counts it.
    Starting(u64),
}

/// One checkpoint's template, and those waiting for it to start.
#[derive(Default)]
struct Slot {
    entry: Mutex<Option<Entry>>,
    ready: Condvar,
}

impl Entry {
    /// Ends it: a held template is stopped and its log removed (a failed one's log, and
    /// that of one that ended on its own, stay until the checkpoint goes).
    fn end(self, checkpoint_gone: bool) {
        let log = match self {
            Entry::Held { template, log, .. } => {
                drop(template);
                log
            }
            Entry::Failed { log, .. } if checkpoint_gone => log,
            Entry::Failed { .. } | Entry::Starting(_) => return,
        };
        let _ = std::fs::remove_file(&log);
        if checkpoint_gone {
            let _ = std::fs::remove_file(ended_log(&log));
        }
    }
}

/// Where the log of a template that ended on its own is kept.
fn ended_log(log: &Path) -> PathBuf {
    log.with_extension("ended.log")
}

/// How long a checkpoint whose template could not start goes without one.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

pub struct Templates {
    enabled: bool,
    /// Whether the daemon's CRIU has templates, asked once.
    supported: std::sync::OnceLock<bool>,
    budget: u64,
    /// Where templates' CRIU logs go (`template-<checkpoint>.log`).
    logs: PathBuf,
    /// Per checkpoint: its template, or its start in progress.
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

impl Templates {
    /// Templates on or off (`FORKD_TEMPLATES`), holding at most `budget` bytes
    /// together (`FORKD_TEMPLATE_MIB`; by default a quarter of the machine's memory);
    /// logs in `logs`.
    pub fn new(logs: PathBuf, enabled: bool, budget: Option<u64>) -> Templates {
        let budget = budget.unwrap_or_else(|| host_memory() / 4);
        Templates {
            enabled,
            supported: std::sync::OnceLock::new(),
            budget,
            logs,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The template of checkpoint `id` (images in `images`), started if there is none
    /// and templates are on. `None` when off, when one could not start (logged), and for
    /// the request that starts it when that request does not `wait`: the template is
    /// then started beside it, and requests that come meanwhile wait for it.
    pub fn get(
        self: &Arc<Self>,
        criu: &Criu,
        id: &str,
        images: &Path,
        wait: bool,
    ) -> Option<Arc<Template>> {
        if !self.enabled || !self.supported(criu) {
            return None;
        }
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(id.to_string()).or_default().clone()
        };
        // Branches of one checkpoint wait for its one start; other checkpoints do not.
        let mut held = slot.entry.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match held.as_mut() {
                Some(Entry::Held { template, used, .. }) if template.alive() => {
                    *used = Instant::now();
                    return Some(template.clone());
                }
                Some(Entry::Held { template, log, .. }) => {
                    let kept = ended_log(log);
                    let _ = std::fs::rename(&*log, &kept);
                    log::warn(&format!(
                        "the template of checkpoint {id} (pid {}) has ended (its log kept at {}): starting another",
                        template.pid(),
                        kept.display()
                    ));
                    held.take();
                    break;
                }
                Some(Entry::Starting(_)) => {
                    held = slot.ready.wait(held).unwrap_or_else(|e| e.into_inner());
                }
                Some(Entry::Failed { at, .. }) if at.elapsed() < RETRY_AFTER => return None,
                Some(Entry::Failed { .. }) | None => break,
            }
        }
        let log_path = self.log_of(id);
        let want = pages_bytes(images);
        if want > self.budget {
            log::info(&format!(
                "checkpoint {id}: no restore template: its {} MiB of pages are more than \
                 templates may hold ({} MiB, FORKD_TEMPLATE_MIB)",
                want >> 20,
                self.budget >> 20
            ));
            *held = Some(Entry::Failed {
                at: Instant::now(),
                log: log_path,
            });
            return None;
        }
        *held = Some(Entry::Starting(want));
        drop(held);
        self.make_room(want, id);
        if wait {
            return self.start(criu, id, images, &slot);
        }
        let (me, criu, owned_id, images) = (
            self.clone(),
            criu.clone(),
            id.to_string(),
            images.to_path_buf(),
        );
        let in_thread = slot.clone();
        let started = std::thread::Builder::new()
            .name("forkd-template".into())
            .spawn(move || {
                me.start(&criu, &owned_id, &images, &in_thread);
            });
        if let Err(e) = started {
            // Nobody will start it: those waiting for it go on without, and it is tried
            // again later.
            log::warn(&format!("checkpoint {id}: start a template's thread: {e}"));
            *slot.entry.lock().unwrap_or_else(|e| e.into_inner()) = Some(Entry::Failed {
                at: Instant::now(),
                log: self.log_of(id),
            });
            slot.ready.notify_all();
        }
        None
    }

    /// Starts the template of a slot marked `Starting`, and wakes those waiting for it.
    fn start(&self, criu: &Criu, id: &str, images: &Path, slot: &Slot) -> Option<Arc<Template>> {
        let log_path = self.log_of(id);
        let (entry, out) = match criu.start_template(images, &log_path) {
            Ok(t) => {
                let t = Arc::new(t);
                log::info(&format!(
                    "template of checkpoint {id}: {} MiB in {} areas, read in {} ms (pid {}); \
                     templates may hold {} MiB (FORKD_TEMPLATE_MIB)",
                    t.bytes >> 20,
                    t.areas,
                    t.load.as_millis(),
                    t.pid(),
                    self.budget >> 20
                ));
                let entry = Entry::Held {
                    template: t.clone(),
                    used: Instant::now(),
                    log: log_path,
                };
                (entry, Some(t))
            }
            Err(e) => {
                log::warn(&format!(
                    "checkpoint {id}: no restore template ({e}; log {}); its branches read their pages, \
                     and it is tried again in {} s",
                    log_path.display(),
                    RETRY_AFTER.as_secs()
                ));
                let entry = Entry::Failed {
                    at: Instant::now(),
                    log: log_path,
                };
                (entry, None)
            }
        };
        let mut held = slot.entry.lock().unwrap_or_else(|e| e.into_inner());
        match held.as_ref() {
            // Stopped meanwhile (the checkpoint removed, the daemon stopping): not kept.
            Some(Entry::Starting(_)) => *held = Some(entry),
            _ => {
                drop(held);
                entry.end(true);
                slot.ready.notify_all();
                return None;
            }
        }
        drop(held);
        slot.ready.notify_all();
        out
    }

    /// Whether the daemon's CRIU has templates, asked once (and said in the log if not).
    fn supported(&self, criu: &Criu) -> bool {
        *self.supported.get_or_init(|| {
            let yes = criu.has_templates();
            if !yes {
                log::warn(&format!(
                    "CRIU {} at {} has no restore templates (fixtures/setup.sh criu builds forkd's): branches read their pages",
                    criu.version,
                    criu.path.display()
                ));
            }
            yes
        })
    }

    /// What `GET /v1/health` says of templates: (usable, in words).
    pub fn health(&self, criu: Option<&Criu>) -> (bool, String) {
        if !self.enabled {
            return (
                false,
                "off (FORKD_TEMPLATES=off): every branch reads its checkpoint's pages".into(),
            );
        }
        match criu {
            None => (false, "no CRIU: no live checkpoints".into()),
            Some(c) if !self.supported(c) => (
                false,
                format!(
                    "CRIU {} has no restore templates: every branch reads its checkpoint's pages \
                     (fixtures/setup.sh criu builds forkd's)",
                    c.version
                ),
            ),
            Some(_) => {
                let (n, bytes) = self.held();
                (
                    true,
                    format!(
                        "{n} held, {} MiB of {} MiB (FORKD_TEMPLATE_MIB)",
                        bytes >> 20,
                        self.budget >> 20
                    ),
                )
            }
        }
    }

    /// Stops templates, least recently used first, until `want` more bytes fit the
    /// budget (never the one for `except`, being started).
    fn make_room(&self, want: u64, except: &str) {
        let slots: Vec<(String, Arc<Slot>)> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(k, _)| k.as_str() != except)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut held: Vec<(Instant, u64, String, Arc<Template>)> = slots
            .iter()
            .filter_map(|(k, v)| match v.entry.try_lock().ok()?.as_ref()? {
                Entry::Held { template, used, .. } => {
                    Some((*used, template.bytes, k.clone(), template.clone()))
                }
                Entry::Failed { .. } | Entry::Starting(_) => None,
            })
            .collect();
        // Templates being started count, and cannot be stopped.
        let starting: u64 = slots
            .iter()
            .filter_map(|(_, v)| match v.entry.try_lock().ok()?.as_ref()? {
                Entry::Starting(bytes) => Some(*bytes),
                _ => None,
            })
            .sum();
        let mut total: u64 = held.iter().map(|h| h.1).sum::<u64>() + starting;
        held.sort_by_key(|h| h.0);
        for (_, bytes, id, template) in held {
            if total + want <= self.budget {
                break;
            }
            // Only the template seen here: one started since (its predecessor having
            // ended) is left alone.
            let Some(slot) = slots.iter().find(|(k, _)| *k == id).map(|(_, v)| v) else {
                continue;
            };
            let mut entry = slot.entry.lock().unwrap_or_else(|e| e.into_inner());
            let same = matches!(entry.as_ref(), Some(Entry::Held { template: t, .. }) if Arc::ptr_eq(t, &template));
            if !same {
                continue;
            }
            let taken = entry.take();
            drop(entry);
            drop(template);
            log::info(&format!(
                "template of checkpoint {id} stopped: templates may hold {} MiB (FORKD_TEMPLATE_MIB)",
                self.budget >> 20
            ));
            if let Some(e) = taken {
                e.end(false);
            }
            slot.ready.notify_all();
            total = total.saturating_sub(bytes);
        }
    }

    /// Checkpoint `id` is removed: stops its template, if it has one, and removes the
    /// logs of its templates.
    pub fn forget(&self, id: &str) {
        self.stop_one(id, true);
    }

    fn log_of(&self, id: &str) -> PathBuf {
        self.logs.join(format!("template-{id}.log"))
    }

    fn stop_one(&self, id: &str, checkpoint_gone: bool) {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let Some(slot) = slot {
            let entry = slot.entry.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(e) = entry {
                e.end(checkpoint_gone);
            }
            slot.ready.notify_all();
        }
        // Logs a daemon before this one left.
        if checkpoint_gone {
            let log = self.log_of(id);
            let _ = std::fs::remove_file(ended_log(&log));
            let _ = std::fs::remove_file(log);
        }
    }

    /// Stops every template (the daemon is stopping).
    pub fn stop(&self) {
        let slots: Vec<_> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (_, slot) in slots {
            let entry = slot.entry.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(e) = entry {
                e.end(false);
            }
            slot.ready.notify_all();
        }
    }

    /// (templates held, bytes they hold).
    pub fn held(&self) -> (usize, u64) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        let mut bytes = 0;
        for slot in slots.values() {
            if let Ok(g) = slot.entry.try_lock() {
                if let Some(Entry::Held { template, .. }) = g.as_ref() {
                    n += 1;
                    bytes += template.bytes;
                }
            }
        }
        (n, bytes)
    }
}

/// The size of a checkpoint's page images: about what its template will hold.
fn pages_bytes(images: &Path) -> u64 {
    std::fs::read_dir(images)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn host_memory() -> u64 {
    forkd_sys::proc_kib_field("/proc/meminfo", "MemTotal:").unwrap_or(4 << 30)
}
