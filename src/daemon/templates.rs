//! Restore templates kept for live checkpoints (`forkd_criu::Template`): a checkpoint's
//! first eager fork starts one, which reads the checkpoint's memory once; every branch
//! restored from it shares that memory copy-on-write and costs only what it writes
//! (docs/DESIGN.md, "Memory shared between branches").
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
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

enum Entry {
    Held {
        template: Arc<Template>,
        used: Instant,
    },
    /// It could not start: not tried again for a while (its branches read their pages).
    Failed { at: Instant },
}

/// How long a checkpoint whose template could not start goes without one.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

pub struct Templates {
    enabled: bool,
    /// Whether the daemon's CRIU has templates, asked once.
    supported: std::sync::OnceLock<bool>,
    budget: u64,
    /// Per checkpoint: its template, or the lock a start in progress holds.
    slots: Mutex<HashMap<String, Arc<Mutex<Option<Entry>>>>>,
}

impl Templates {
    /// From `FORKD_TEMPLATES` (`on`, the default, or `off`) and `FORKD_TEMPLATE_MIB`.
    pub fn from_env() -> anyhow::Result<Templates> {
        let enabled = match std::env::var("FORKD_TEMPLATES").as_deref() {
            Err(_) | Ok("") | Ok("on") => true,
            Ok("off") => false,
            Ok(v) => anyhow::bail!("FORKD_TEMPLATES={v:?}: expected on or off"),
        };
        let budget = match std::env::var("FORKD_TEMPLATE_MIB") {
            Ok(v) => {
                v.parse::<u64>()
                    .map_err(|_| anyhow::anyhow!("FORKD_TEMPLATE_MIB={v:?}: expected MiB"))?
                    << 20
            }
            Err(_) => host_memory() / 4,
        };
        Ok(Templates {
            enabled,
            supported: std::sync::OnceLock::new(),
            budget,
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// The template of checkpoint `id` (images in `images`), started if there is none
    /// and templates are on. `None` when off, or when one could not start (logged).
    pub fn get(&self, criu: &Criu, id: &str, images: &Path, logs: &Path) -> Option<Arc<Template>> {
        if !self.enabled {
            return None;
        }
        let supported = *self.supported.get_or_init(|| {
            let yes = criu.has_templates();
            if !yes {
                log::warn(&format!(
                    "CRIU {} at {} has no restore templates (fixtures/setup.sh criu builds forkd's): branches read their pages",
                    criu.version,
                    criu.path.display()
                ));
            }
            yes
        });
        if !supported {
            return None;
        }
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(id.to_string()).or_default().clone()
        };
        // Branches of one checkpoint wait for its one start; other checkpoints do not.
        let mut held = slot.lock().unwrap_or_else(|e| e.into_inner());
        match held.as_mut() {
            Some(Entry::Held { template, used }) if template.alive() => {
                *used = Instant::now();
                return Some(template.clone());
            }
            Some(Entry::Held { template, .. }) => {
                log::warn(&format!(
                    "the template of checkpoint {id} (pid {}) has ended: starting another",
                    template.pid()
                ));
                held.take();
            }
            Some(Entry::Failed { at }) if at.elapsed() < RETRY_AFTER => return None,
            Some(Entry::Failed { .. }) | None => {}
        }
        let want = pages_bytes(images);
        if want > self.budget {
            log::info(&format!(
                "checkpoint {id}: no restore template: its {} MiB of pages are more than \
                 templates may hold ({} MiB, FORKD_TEMPLATE_MIB)",
                want >> 20,
                self.budget >> 20
            ));
            *held = Some(Entry::Failed { at: Instant::now() });
            return None;
        }
        self.make_room(want, id);
        let log_path = logs.join(format!("template-{id}.log"));
        match criu.start_template(images, &log_path) {
            Ok(t) => {
                let t = Arc::new(t);
                *held = Some(Entry::Held {
                    template: t.clone(),
                    used: Instant::now(),
                });
                drop(held);
                let (n, bytes) = self.held();
                log::info(&format!(
                    "template of checkpoint {id}: {} MiB in {} areas, read in {} ms (pid {}); \
                     {n} template(s) hold {} MiB of {} (FORKD_TEMPLATE_MIB)",
                    t.bytes >> 20,
                    t.areas,
                    t.load.as_millis(),
                    t.pid(),
                    bytes >> 20,
                    self.budget >> 20
                ));
                Some(t)
            }
            Err(e) => {
                log::warn(&format!(
                    "checkpoint {id}: no restore template ({e}); its branches read their pages, \
                     and it is tried again in {} s",
                    RETRY_AFTER.as_secs()
                ));
                *held = Some(Entry::Failed { at: Instant::now() });
                None
            }
        }
    }

    /// Stops templates, least recently used first, until `want` more bytes fit the
    /// budget (never the one for `except`, being started).
    fn make_room(&self, want: u64, except: &str) {
        let slots: Vec<(String, Arc<Mutex<Option<Entry>>>)> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(k, _)| k.as_str() != except)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut held: Vec<(Instant, u64, String)> = slots
            .iter()
            .filter_map(|(k, v)| match v.try_lock().ok()?.as_ref()? {
                Entry::Held { template, used } => Some((*used, template.bytes, k.clone())),
                Entry::Failed { .. } => None,
            })
            .collect();
        let mut total: u64 = held.iter().map(|h| h.1).sum();
        held.sort();
        for (_, bytes, id) in held {
            if total + want <= self.budget {
                break;
            }
            log::info(&format!(
                "template of checkpoint {id} stopped: templates may hold {} MiB (FORKD_TEMPLATE_MIB)",
                self.budget >> 20
            ));
            self.forget(&id);
            total = total.saturating_sub(bytes);
        }
    }

    /// Stops checkpoint `id`'s template, if it has one.
    pub fn forget(&self, id: &str) {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let Some(slot) = slot {
            slot.lock().unwrap_or_else(|e| e.into_inner()).take();
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
            slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }

    /// (templates held, bytes they hold).
    pub fn held(&self) -> (usize, u64) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        let mut bytes = 0;
        for slot in slots.values() {
            if let Ok(g) = slot.try_lock() {
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
