//! Image handlers: import (from a path on the daemon's host), list, inspect, remove.
//! Removal is refused while any sandbox, running or stopped, still uses the image.

use super::RwLockExt as _;
use super::{log, Daemon};
use crate::api::{ApiError, ImageInfo, ImportImageRequest};
use forkd_layers::{Image, ImageError, Progress};

impl Daemon {
    pub(super) fn image_to_info(&self, img: Image) -> ImageInfo {
        ImageInfo {
            used_by: self.sandboxes.of_image(&img.name),
            layers: img.layers.iter().map(|l| l.to_string()).collect(),
            name: img.name,
            created: img.created,
            source: img.source,
            digest: img.digest,
            config: super::edge::image_config(img.config),
        }
    }

    pub fn list_images(&self) -> Result<Vec<ImageInfo>, ApiError> {
        let images = self
            .images
            .store
            .list()
            .map_err(|e| ApiError::from_chain("list images", &e))?;
        Ok(images.into_iter().map(|i| self.image_to_info(i)).collect())
    }

    pub fn image_info(&self, name: &str) -> Result<ImageInfo, ApiError> {
        Ok(self.image_to_info(self.images.store.get(name).map_err(image_error)?))
    }

    pub fn import_image(&self, req: ImportImageRequest) -> Result<ImageInfo, ApiError> {
        forkd_layers::validate_image_name(&req.name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let source = super::paths::host_path(
            "image source",
            std::path::Path::new(&req.source),
            super::paths::Want::Exists,
        )?;
        if !self.sandboxes.of_image(&req.name).is_empty() {
            return Err(ApiError::conflict(format!(
                "image {} is in use; remove its sandboxes or import under another name",
                req.name
            )));
        }
        let _store = self.images.store_lock.read_locked();
        let name = req.name.clone();
        let mut last = std::time::Instant::now();
        let mut progress = |p: Progress| {
            if last.elapsed().as_secs() >= 2 {
                last = std::time::Instant::now();
                log::info(&format!("import {name}: {p:?}"));
            }
        };
        let img = forkd_layers::import_image(
            &self.images.layers,
            &self.images.store,
            &source,
            &req.name,
            &mut progress,
        )
        .map_err(|e| {
            let chain = ApiError::from_chain(
                &format!("import image {} from {}", req.name, source.display()),
                &e,
            );
            match e {
                forkd_layers::ImportError::Io { .. } => chain,
                // Everything else describes the input: a bad archive, a path escaping, ...
                _ => ApiError::bad_request(chain.message),
            }
        })?;
        self.make_image_base(&img);
        Ok(self.image_to_info(img))
    }

    pub fn remove_image(&self, name: &str) -> Result<(), ApiError> {
        let users = self.sandboxes.of_image(name);
        if !users.is_empty() {
            return Err(ApiError::conflict(format!(
                "image {name} is in use by sandboxes {}",
                users.join(", ")
            )));
        }
        self.images.store.remove(name).map_err(image_error)
    }
}

fn image_error(e: ImageError) -> ApiError {
    match e {
        ImageError::NotFound(n) => ApiError::not_found(format!("no such image: {n}")),
        ImageError::InvalidName { .. } => ApiError::bad_request(e.to_string()),
        other => ApiError::from_chain("image store", &other),
    }
}
