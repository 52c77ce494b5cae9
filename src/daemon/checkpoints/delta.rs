//! A checkpoint's delta (`GET /v1/checkpoints/{id}/delta`): what its sandbox changed
//! since it was made, as a tar in overlay form.
//!
//! A checkpoint's own layer holds what its sandbox changed over its base (see
//! `crate::daemon::bases`). For a sandbox made from an image, that is the delta. A
//! branch's layer started as its checkpoint's, so a checkpoint of a branch holds its
//! parent checkpoint's changes too: its delta is the difference of the two layers
//! (`forkd_layers::diff::diff_uppers`), made in a scratch directory of the volume and
//! removed after. A checkpoint made before bases, or imported, has its own layer over
//! the whole stack below it, as before.

use super::{Checkpoint, Lower};
use crate::api::ApiError;
use crate::daemon::{Daemon, Lock};
use std::sync::atomic::{AtomicU64, Ordering};

impl Daemon {
    /// The tar of checkpoint `c`'s delta.
    pub fn checkpoint_delta(&self, c: &Checkpoint) -> Result<Vec<u8>, ApiError> {
        // Neither it nor its parent is removed while their layers are read.
        let _in_use = c.use_for("delta")?;
        let rec = c.record.locked().clone();
        // Its own layer: its snapshot, or (imported) its topmost store layer.
        let own = rec
            .lowers
            .first()
            .map(|l| self.lower_path(l))
            .unwrap_or_else(|| c.fs());
        let started_from = match (&rec.base, &rec.parent) {
            (Some(base), Some(parent)) => {
                let p = self.checkpoints.get(parent.as_str()).map_err(|_| {
                    ApiError::conflict(format!(
                        "checkpoint {}: its sandbox was forked from checkpoint {parent}, which is gone; its layer holds that checkpoint's changes too, and they can no longer be told apart",
                        c.id
                    ))
                })?;
                let prec = p.record.locked().clone();
                let same_base = prec.base.as_ref() == Some(base)
                    && prec.lowers.first() == Some(&Lower::Checkpoint(p.id.clone()));
                same_base.then_some(p)
            }
            _ => None,
        };
        let parent_in_use = match &started_from {
            Some(p) => Some(p.use_for("delta")?),
            None => None,
        };
        let mut tar = Vec::new();
        let export = |dir: &std::path::Path, tar: &mut Vec<u8>| {
            forkd_layers::export_tar(dir, tar).map(|_| ()).map_err(|e| {
                ApiError::from_chain(&format!("checkpoint {}: export its delta", c.id), &e)
            })
        };
        match &started_from {
            None => export(&own, &mut tar)?,
            Some(parent) => {
                let old = parent.fs();
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let scratch = self.node.data.join("tmp").join(format!(
                    "delta-{}-{}",
                    c.id,
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&scratch).map_err(|e| {
                    ApiError::internal(format!("create {}: {e}", scratch.display()))
                })?;
                let res = forkd_layers::diff::diff_uppers(&old, &own, &scratch)
                    .map_err(|e| {
                        ApiError::from_chain(
                            &format!("checkpoint {}: its changes over its parent's", c.id),
                            &e,
                        )
                    })
                    .and_then(|()| export(&scratch, &mut tar));
                if let Err(e) = std::fs::remove_dir_all(&scratch) {
                    crate::daemon::log::warn(&format!("remove {}: {e}", scratch.display()));
                }
                res?;
            }
        }
        drop(parent_in_use);
        Ok(tar)
    }
}
