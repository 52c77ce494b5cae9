//! Where a sandbox's writable layer comes from: always a snapshot (of its base, or of a
//! checkpoint's layer made over that base), never an empty subvolume, so that every file
//! the sandbox makes is numbered above every file of its lower layer (see
//! [`crate::daemon::bases`]); one made ahead where there is one
//! ([`crate::daemon::spare_layers`]).

use super::SandboxRecord;
use crate::api::ApiError;
use crate::daemon::bases::{BaseId, Pinned};
use crate::daemon::checkpoints::Lower;
use crate::daemon::Daemon;
use std::path::{Path, PathBuf};

/// What a new sandbox's writable layer is made from.
pub(in crate::daemon) enum LayerFrom {
    /// Its record's base: it starts as the stack.
    Base,
    /// A checkpoint's snapshot of a layer made from the record's base: the branch starts
    /// with the checkpointed files, each under the number it had.
    Snapshot(PathBuf),
    /// Its record's base, with this upper directory (a checkpoint's copy of a small
    /// layer over the same base) copied in.
    BaseAndUpper(PathBuf),
}

impl Daemon {
    /// What the branches of the checkpoint in `dir` (made over its sandbox's base) start
    /// from: its snapshot of the layer, or its copy of a small one.
    pub(in crate::daemon) fn checkpoint_layer(&self, dir: &Path) -> LayerFrom {
        let fs = dir.join("fs");
        if self.node.volume.is_subvolume(&fs) {
            LayerFrom::Snapshot(fs)
        } else {
            LayerFrom::BaseAndUpper(fs.join("upper"))
        }
    }

    /// The subvolume a layer made `from` is a snapshot of, over `base`.
    pub(in crate::daemon) fn layer_source(&self, from: &LayerFrom, base: &BaseId) -> PathBuf {
        match from {
            LayerFrom::Snapshot(fs) => fs.clone(),
            LayerFrom::Base | LayerFrom::BaseAndUpper(_) => self.images.bases.subvolume(base),
        }
    }

    /// Makes the base an image's sandboxes stand on as soon as the image is recorded (an
    /// import, a pull, a build), so that its first create need not, and has a snapshot of
    /// it made ahead. A failure is only said: the first create makes it again.
    pub(in crate::daemon) fn make_image_base(&self, image: &forkd_layers::Image) {
        match self.base_for(&self.images.stack(&image.layers)) {
            Ok(base) => self
                .images
                .spare_layers
                .want(&self.images.bases.subvolume(&base.id)),
            Err(e) => crate::daemon::log::warn(&format!(
                "image {}: make its base: {}",
                image.name, e.message
            )),
        }
    }

    /// The base of `stack`, made now if it is new, pinned until the guard goes: hold it
    /// until the record that names the base is in the table.
    pub(in crate::daemon) fn base_for(&self, stack: &[Lower]) -> Result<Pinned<'_>, ApiError> {
        self.images
            .bases
            .ensure(&self.node.volume, stack, &|l| self.lower_path(l))
    }

    /// Makes the writable layer `layer` of the sandbox `record` describes, from its base
    /// as `from` says: the snapshot, the disk limit, `upper/` and `work/`, and a copied
    /// small layer copied in.
    pub(super) fn make_layer(
        &self,
        layer: &Path,
        record: &SandboxRecord,
        from: &LayerFrom,
    ) -> Result<(), ApiError> {
        let id = &record.id;
        let ctx = |step: &str| format!("sandbox {id}: {step}");
        let Some(base) = &record.base else {
            return Err(ApiError::internal(ctx("a new sandbox needs a base")));
        };
        let src = self.layer_source(from, base);
        self.images
            .spare_layers
            .snapshot_to(&src, layer)
            .map_err(|e| {
                ApiError::internal(ctx(&format!(
                    "create writable layer: snapshot {} at {}: {e}",
                    src.display(),
                    layer.display()
                )))
            })?;
        if let Some(bytes) = record.limits.disk_bytes {
            self.node
                .volume
                .set_disk_limit(layer, Some(bytes))
                .map_err(|e| ApiError::from_chain(&ctx("set the disk limit"), &e))?;
        }
        for sub in ["upper", "work"] {
            let d = layer.join(sub);
            if let Err(e) = std::fs::create_dir(&d) {
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(ApiError::internal(format!(
                        "{}: {e}",
                        ctx(&format!("create {}", d.display()))
                    )));
                }
            }
        }
        if let LayerFrom::BaseAndUpper(up) = from {
            let everything = forkd_layers::copy::Small {
                entries: u64::MAX,
                bytes: u64::MAX,
            };
            let copied =
                forkd_layers::copy::copy_upper_exactly(up, &layer.join("upper"), everything)
                    .map_err(|e| {
                        ApiError::from_chain(&ctx(&format!("copy {}", up.display())), &e)
                    })?;
            if !copied {
                return Err(ApiError::internal(ctx(&format!(
                    "copy {}: it holds a file of a kind the copy cannot make",
                    up.display()
                ))));
            }
        }
        Ok(())
    }
}
