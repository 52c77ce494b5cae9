//! Garbage collection of the layer store (`POST /v1/gc`): every layer that no image,
//! sandbox or checkpoint uses (those on disk included, loaded or not) is removed, with
//! the runtime-layer cache entries that pointed at them, and every base (see
//! [`super::bases`]) that no sandbox or checkpoint stands on and that is not an image's
//! (its stack under this daemon's runtime layer). Holds the store lock for writing, so
//! no build, import or checkpoint adds a layer meanwhile.

use super::bases::BaseId;
use super::checkpoints::Lower;
use super::{log, Daemon};
use super::{Lock as _, RwLockExt as _};
use crate::api::{ApiError, GcResult};
use forkd_layers::LayerId;

impl Daemon {
    /// Removes store layers that no image, sandbox or checkpoint uses.
    pub fn gc(&self) -> Result<GcResult, ApiError> {
        let _store = self.images.store_lock.write_locked();
        let mut used: std::collections::HashSet<LayerId> = std::collections::HashSet::new();
        let mut bases: std::collections::HashSet<String> = std::collections::HashSet::new();
        used.insert(self.images.runtime_layer);
        for img in self
            .images
            .store
            .list()
            .map_err(|e| ApiError::from_chain("list images", &e))?
        {
            bases.insert(BaseId::of(&self.images.stack(&img.layers)).to_string());
            used.extend(img.layers);
        }
        for sb in self.sandboxes.table.locked().values() {
            let rec = sb.record.locked();
            for l in &rec.lowers {
                if let Lower::Layer(id) = l {
                    used.insert(*id);
                }
            }
            bases.extend(rec.base.as_ref().map(|b| b.to_string()));
        }
        for c in self.checkpoints.table.locked().values() {
            let rec = c.record.locked();
            for l in &rec.lowers {
                if let Lower::Layer(id) = l {
                    used.insert(*id);
                }
            }
            bases.extend(rec.base.as_ref().map(|b| b.to_string()));
        }
        self.layers_named_on_disk(&mut used, &mut bases)?;
        for base in self.images.bases.list() {
            if !bases.contains(base.as_str()) {
                // A base pinned by a request in flight stays; one that cannot be removed
                // is said, and the layers are still collected.
                let named = |id: &BaseId| {
                    let some = Some(id);
                    self.sandboxes
                        .table
                        .locked()
                        .values()
                        .any(|sb| sb.record.locked().base.as_ref() == some)
                        || self
                            .checkpoints
                            .table
                            .locked()
                            .values()
                            .any(|c| c.record.locked().base.as_ref() == some)
                };
                match self.images.bases.remove(&self.node.volume, &base, named) {
                    Ok(true) => {
                        self.images
                            .spare_layers
                            .forget(&self.images.bases.subvolume(&base));
                        log::info(&format!("gc: removed base {base}"));
                    }
                    Ok(false) => {}
                    Err(e) => log::warn(&format!("gc: {}", e.message)),
                }
            }
        }
        let mut removed = Vec::new();
        let mut freed = 0u64;
        for info in self
            .images
            .layers
            .list()
            .map_err(|e| ApiError::from_chain("list layers", &e))?
        {
            if used.contains(&info.id) {
                continue;
            }
            self.images
                .layers
                .remove(&info.id)
                .map_err(|e| ApiError::from_chain(&format!("remove layer {}", info.id), &e))?;
            freed += info.size_bytes;
            removed.push(info.id.to_string());
        }
        // Pull index entries (blob -> diff_id -> layer) whose layer is gone.
        self.images
            .layers
            .prune_index()
            .map_err(|e| ApiError::from_chain("prune the layer index", &e))?;
        // Runtime-layer cache entries pointing at removed layers.
        if let Ok(rd) = std::fs::read_dir(self.node.data.join("runtime")) {
            for e in rd.flatten() {
                let stale = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|t| t.trim().parse::<LayerId>().ok())
                    .is_some_and(|id| !self.images.layers.exists(&id));
                if stale {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(GcResult {
            removed_layers: removed,
            freed_bytes: freed,
        })
    }

    /// Adds the layers every checkpoint directory on disk names, whether the table
    /// holds it or not: a checkpoint whose `meta.json` did not load (damaged, of another
    /// version) still keeps every layer its text names. A directory with no readable
    /// `meta.json` at all stops the collection, since what it needs cannot be told.
    fn layers_named_on_disk(
        &self,
        used: &mut std::collections::HashSet<LayerId>,
        bases: &mut std::collections::HashSet<String>,
    ) -> Result<(), ApiError> {
        let dir = self.node.data.join("checkpoints");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| ApiError::internal(format!("gc: read {}: {e}", dir.display())))?;
        let known: std::collections::HashSet<String> = self
            .checkpoints
            .table
            .locked()
            .keys()
            .map(|k| k.to_string())
            .collect();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            // Stages belong to checkpoints and imports in progress, which hold the store
            // lock gc waits for; recovery removes those of a daemon that died.
            if name.starts_with('.') || known.contains(&name) {
                continue;
            }
            let meta = entry.path().join("meta.json");
            let text = std::fs::read(&meta).map_err(|e| {
                ApiError::conflict(format!(
                    "gc: checkpoint directory {} has no readable meta.json ({e}), so the layers it needs cannot be told; nothing was removed (repair or remove that directory first)",
                    entry.path().display()
                ))
            })?;
            let text = String::from_utf8_lossy(&text);
            for (i, _) in text.match_indices("layer:") {
                let hex: String = text[i + 6..]
                    .chars()
                    .take_while(|c| c.is_ascii_hexdigit())
                    .collect();
                if let Ok(id) = hex.parse::<LayerId>() {
                    used.insert(id);
                }
            }
            // Any id-shaped word may name its base: keeping too many is safe.
            for word in text.split(|c: char| !c.is_ascii_hexdigit()) {
                if word.len() == 64 {
                    bases.insert(word.to_string());
                }
            }
        }
        Ok(())
    }
}
