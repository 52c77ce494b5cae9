//! Image pulls: `forkd-registry`'s streams fed into the layer store.
//!
//! # A pull
//! 1. The reference is expanded (`RegistriesConf::candidates`: itself, its alias, each
//!    search registry, or Docker Hub) and the registry configuration, credentials and
//!    CAs are read afresh, so edits apply without a restart.
//! 2. An image of that name pulled before from the same reference is checked with one
//!    manifest `HEAD`: an unchanged digest ends the pull there (a digest reference
//!    needs no request at all).
//! 3. The manifest is resolved for the platform (an index's entry), every layer's media
//!    type is checked before anything is fetched (foreign and encrypted layers are
//!    refused by name), and the config is fetched and verified; its `rootfs.diff_ids`
//!    must pair with the layers.
//! 4. The plan: a layer whose blob or `diff_id` the store's index knows is present and
//!    is never fetched. The others are fetched on threads of their own, at most
//!    `FORKD_PULL_PARALLEL` (default 3) at once for the whole daemon. A blob another
//!    pull is fetching is waited for, not fetched twice (single flight by digest).
//! 5. Each blob streams through decompression into extraction (nothing held whole); its
//!    digest is checked at its end and its `diff_id` against the config, then it is
//!    sealed and indexed.
//! 6. The image record is written once, at the end.
//!
//! # Failures
//! A failed or interrupted pull writes no image. A layer is either sealed whole or its
//! staging directory goes (on error, or at the next start after a kill), so what a
//! later pull of the same image finds is whole layers only, which it keeps. The store
//! lock is held for reading throughout, so `gc` cannot take a layer sealed by this pull
//! before the image refers to it.

use forkd_registry::auth::Given;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use forkd_layers::{Image, LayerId};
use forkd_registry::manifest::{self, ConfigHead, Descriptor};
use forkd_registry::{Client, ClientConfig, Digest, Platform, RegistryError, Resolved};

mod flights;

use super::{log, Daemon};
use super::{Lock as _, RwLockExt as _};
use crate::api::{ApiError, ImageInfo, PullLayer, PullRequest, PullStatus};
pub use flights::Pulls;
use flights::{Flight, Leading};

/// Maps a registry error to the API's kinds: what describes the input or the remote
/// registry is a 400 (bad reference, unknown manifest, credentials, a bad blob), a
/// blocked registry a 403, this machine's failures a 500.
fn api_error(e: &RegistryError) -> ApiError {
    match e {
        RegistryError::Blocked { .. } => ApiError::forbidden(e.to_string()),
        RegistryError::ManifestUnknown { .. } => ApiError::not_found(e.to_string()),
        RegistryError::Io { .. } => ApiError::from_chain("pull", e),
        _ => ApiError::bad_request(e.to_string()),
    }
}

/// A reader that counts what passes into a pull's status, and stops when the pull is
/// cancelled.
struct Counted<'a, R> {
    inner: R,
    status: &'a Mutex<PullStatus>,
    index: usize,
    pending: u64,
    cancel: &'a AtomicBool,
}

impl<R: std::io::Read> std::io::Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Other,
                "the pull was cancelled",
            ));
        }
        let n = self.inner.read(buf)?;
        self.pending += n as u64;
        if self.pending >= 1 << 20 || n == 0 {
            self.status.locked().layers[self.index].done += self.pending;
            self.pending = 0;
        }
        Ok(n)
    }
}

impl Daemon {
    /// A pull; `cancel` turning true (its client went away) stops it, leaving no image.
    /// `given`, the caller's credentials, are the only ones used when it brought any.
    pub fn pull_image(
        &self,
        req: PullRequest,
        given: Option<Given>,
        cancel: &AtomicBool,
    ) -> Result<ImageInfo, ApiError> {
        let _store = self.images.store_lock.read_locked();
        self.pull_held(req, given, cancel)
            .map(|img| self.image_to_info(img))
    }

    /// The image a build's `FROM` or `COPY --from` names: the image of that name; else
    /// one pulled before under the fully qualified reference the name means; else
    /// pulled now, as `docker build` pulls a missing base. The caller holds the store
    /// lock for reading.
    pub(super) fn image_for_build(
        &self,
        name: &str,
        given: &Option<Given>,
    ) -> Result<Image, ApiError> {
        match self.images.local(name, &self.config.registries_conf) {
            Ok(img) => return Ok(img),
            Err(forkd_layers::ImageError::NotFound(_)) => {}
            Err(e @ forkd_layers::ImageError::InvalidName { .. }) => {
                return Err(ApiError::bad_request(e.to_string()))
            }
            Err(e) => return Err(ApiError::from_chain("read image", &e)),
        }
        self.pull_held(
            PullRequest {
                reference: name.to_owned(),
                ..Default::default()
            },
            given.clone(),
            &AtomicBool::new(false),
        )
        .map_err(|mut e| {
            e.message = format!("no such image here, and pulling it failed: {}", e.message);
            e
        })
    }

    /// A pull; the caller holds the store lock for reading.
    fn pull_held(
        &self,
        req: PullRequest,
        given: Option<Given>,
        cancel: &AtomicBool,
    ) -> Result<Image, ApiError> {
        let t0 = Instant::now();
        let platform: Platform = match &req.platform {
            Some(p) => p
                .parse()
                .map_err(|e: RegistryError| ApiError::bad_request(e.to_string()))?,
            None => Platform::default(),
        };
        if let Some(n) = &req.name {
            forkd_layers::validate_image_name(n)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
        let mut config =
            ClientConfig::with(&self.config.registries_conf, self.config.certs_dirs.clone())
                .map_err(|e| api_error(&e))?;
        config.given = given;
        let candidates = config
            .registries
            .candidates(&req.reference)
            .map_err(|e| api_error(&e))?;
        let client = Client::new(config);
        let id = self
            .images
            .pulls
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let registered = self
            .images
            .pulls
            .jobs
            .register(
                id,
                PullStatus {
                    reference: req.reference.clone(),
                    resolved: None,
                    started: forkd_sys::clock::now_secs(),
                    phase: "resolving".into(),
                    layers: Vec::new(),
                },
            )
            .expect("pull ids are never reused");
        let status = registered.status.clone();
        let _store = self.images.store_lock.read_locked();

        let mut last: Option<RegistryError> = None;
        for reference in &candidates {
            let name = req.name.clone().unwrap_or_else(|| reference.to_string());
            forkd_layers::validate_image_name(&name).map_err(|e| {
                ApiError::bad_request(format!(
                    "{reference}: give the image a name of its own: {e}"
                ))
            })?;
            if let Some(img) = self.unchanged(&client, reference, &name, &platform) {
                log::info(&format!(
                    "pull {reference}: up to date ({} ms)",
                    t0.elapsed().as_millis()
                ));
                return Ok(img);
            }
            let resolved = match client.resolve(reference, &platform) {
                Ok(r) => r,
                // A short name goes on to the next search registry.
                Err(e) if candidates.len() > 1 && e.try_next_endpoint() => {
                    log::info(&format!("pull {}: {reference}: {e}", req.reference));
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(api_error(&e)),
            };
            status.locked().resolved = Some(reference.to_string());
            let img = self.pull_resolved(&client, &resolved, &name, &platform, &status, cancel)?;
            log::info(&format!(
                "pull {reference}: {} layers from {} in {} ms",
                img.layers.len(),
                resolved.endpoint.reference.registry,
                t0.elapsed().as_millis()
            ));
            return Ok(img);
        }
        let tried: Vec<String> = candidates.iter().map(|c| c.to_string()).collect();
        let e = last.expect("at least one candidate");
        let mut err = api_error(&e);
        err.message = format!("{} (tried {})", err.message, tried.join(", "));
        Err(err)
    }

    /// The image of this name if it was pulled from `reference` and the registry still
    /// names the same digest (one `HEAD`; none for a digest reference).
    fn unchanged(
        &self,
        client: &Client,
        reference: &forkd_registry::Reference,
        name: &str,
        platform: &Platform,
    ) -> Option<Image> {
        let img = self.images.store.get(name).ok()?;
        let have = img.digest.as_deref()?;
        if img.source != source_of(reference, platform) {
            return None;
        }
        if let Some(d) = &reference.digest {
            return (d.to_string() == have).then_some(img);
        }
        // The first place that answers: a mirror, or the registry itself.
        let now = client
            .config()
            .registries
            .endpoints(reference)
            .ok()?
            .iter()
            .find_map(|ep| client.head(ep).ok())??;
        (now.to_string() == have && img.layers.iter().all(|l| self.images.layers.exists(l)))
            .then_some(img)
    }

    fn pull_resolved(
        &self,
        client: &Client,
        r: &Resolved,
        name: &str,
        platform: &Platform,
        status: &Mutex<PullStatus>,
        cancel: &AtomicBool,
    ) -> Result<Image, ApiError> {
        let shown = r.reference.to_string();
        for d in &r.manifest.layers {
            manifest::layer_compression(&d.media_type).map_err(|what| {
                ApiError::bad_request(format!("{shown}: layer {}: {what}", d.digest))
            })?;
        }
        let config_bytes = client
            .fetch_small(&r.endpoint, &r.manifest.config, manifest::MAX_CONFIG)
            .map_err(|e| api_error(&e))?;
        let head: ConfigHead = serde_json::from_slice(&config_bytes)
            .map_err(|e| ApiError::bad_request(format!("{shown}: image config: {e}")))?;
        let diff_ids: Vec<String> = head.rootfs.unwrap_or_default().diff_ids;
        if diff_ids.len() != r.manifest.layers.len() {
            return Err(ApiError::bad_request(format!(
                "{shown}: the config lists {} diff_ids for {} layers",
                diff_ids.len(),
                r.manifest.layers.len()
            )));
        }
        let diff_hex: Vec<String> = diff_ids
            .iter()
            .map(|d| {
                d.parse::<Digest>()
                    .map(|d| d.hex().to_owned())
                    .map_err(|e| ApiError::bad_request(format!("{shown}: image config: {e}")))
            })
            .collect::<Result<_, _>>()?;
        let config = forkd_layers::parse_image_config(&config_bytes)
            .map_err(|e| ApiError::bad_request(format!("{shown}: image config: {e}")))?;
        {
            let mut s = status.locked();
            s.phase = "layers".into();
            s.layers = r
                .manifest
                .layers
                .iter()
                .map(|d| PullLayer {
                    digest: d.digest.clone(),
                    size: d.size,
                    done: 0,
                    state: "waiting".into(),
                })
                .collect();
        }
        let results: Vec<Result<LayerId, ApiError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = r
                .manifest
                .layers
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let diff = &diff_hex[i];
                    scope.spawn(move || self.layer(client, r, i, d, diff, status, cancel))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ApiError::internal("a layer's thread panicked".to_string()))
                    })
                })
                .collect()
        });
        let mut ids = Vec::with_capacity(results.len());
        for res in results {
            ids.push(res?);
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(cancelled(&shown));
        }
        let users = self.sandboxes.of_image(name);
        if !users.is_empty()
            && self
                .images
                .store
                .get(name)
                .is_ok_and(|old| old.layers != ids)
        {
            // A count, not their ids: the caller may be a key that owns none of them.
            return Err(ApiError::conflict(format!(
                "image {name} is in use by {} sandbox(es) and {shown} has changed; remove them (forkd ps lists them) or pull under another name (--name)",
                users.len()
            )));
        }
        let image = Image {
            name: name.to_owned(),
            layers: ids,
            created: forkd_sys::clock::now_secs(),
            source: source_of(&r.reference, platform),
            config,
            digest: Some(r.digest.to_string()),
        };
        self.images
            .store
            .put(&image)
            .map_err(|e| ApiError::from_chain(&format!("write image {name}"), &e))?;
        self.make_image_base(&image);
        status.locked().phase = "done".into();
        Ok(image)
    }

    /// One layer: present, shared with a pull fetching it now, or fetched here.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        client: &Client,
        r: &Resolved,
        index: usize,
        d: &Descriptor,
        diff: &str,
        status: &Mutex<PullStatus>,
        cancel: &AtomicBool,
    ) -> Result<LayerId, ApiError> {
        let shown = r.reference.to_string();
        let digest = manifest::descriptor_digest(&shown, d).map_err(|e| api_error(&e))?;
        let set = |state: &str| status.locked().layers[index].state = state.to_owned();
        let mut waited = false;
        loop {
            if let Some((known_diff, id)) = self.images.layers.layer_of_blob(digest.hex()) {
                if known_diff != diff {
                    return Err(ApiError::bad_request(format!(
                        "{shown}: layer {digest} unpacks to sha256:{known_diff}, but the config says sha256:{diff}"
                    )));
                }
                set(if waited { "shared" } else { "present" });
                return Ok(id);
            }
            if let Some(id) = self.images.layers.layer_of_diff(diff) {
                set("present");
                return Ok(id);
            }
            // Lead the fetch of this blob, or wait for the pull that leads it.
            let key = digest.hex().to_owned();
            let (flight, lead) = {
                let mut flights = self.images.pulls.flights.locked();
                match flights.get(&key) {
                    Some(f) => (f.clone(), false),
                    None => {
                        let f = Arc::new(Flight {
                            done: Mutex::new(false),
                            cv: Condvar::new(),
                        });
                        flights.insert(key.clone(), f.clone());
                        (f, true)
                    }
                }
            };
            if !lead {
                set("waiting");
                let mut done = flight.done.locked();
                while !*done {
                    done = flight.cv.wait(done).unwrap_or_else(|p| p.into_inner());
                }
                waited = true;
                continue;
            }
            let _leading = Leading {
                pulls: &self.images.pulls,
                key,
                flight,
            };
            let _slot = self.images.pulls.slots.acquire();
            if cancel.load(Ordering::Relaxed) {
                set("failed");
                return Err(cancelled(&shown));
            }
            set("fetching");
            return match self.fetch_layer(client, r, index, &digest, d.size, diff, status, cancel) {
                Ok(id) => {
                    set("done");
                    Ok(id)
                }
                Err(e) => {
                    set("failed");
                    Err(e)
                }
            };
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn fetch_layer(
        &self,
        client: &Client,
        r: &Resolved,
        index: usize,
        digest: &Digest,
        size: u64,
        diff: &str,
        status: &Mutex<PullStatus>,
        cancel: &AtomicBool,
    ) -> Result<LayerId, ApiError> {
        let shown = r.reference.to_string();
        let mut blob = client
            .open_blob(&r.endpoint, digest, size)
            .map_err(|e| api_error(&e))?;
        let staged = {
            let counted = Counted {
                inner: &mut blob,
                status,
                index,
                pending: 0,
                cancel,
            };
            self.images.layers.stage_blob(counted, &mut |_| {})
        };
        let in_layer =
            |what: String| ApiError::bad_request(format!("{shown}: layer {digest}: {what}"));
        // A registry error inside the stream (a bad digest, a dead registry) says more
        // than the extraction's wrapping of it.
        if cancel.load(Ordering::Relaxed) {
            return Err(cancelled(&shown));
        }
        let pending = staged.map_err(|e| in_layer(chain(&e)))?;
        blob.finish().map_err(|e| in_layer(e.to_string()))?;
        if pending.diff_id != diff {
            return Err(in_layer(format!(
                "it unpacks to sha256:{}, but the config says sha256:{diff}",
                pending.diff_id
            )));
        }
        let id = self
            .images
            .layers
            .seal_pending(pending, &mut |_| {})
            .map_err(|e| ApiError::from_chain(&format!("{shown}: seal layer {digest}"), &e))?;
        self.images
            .layers
            .record_blob(digest.hex(), diff, &id)
            .map_err(|e| ApiError::from_chain(&format!("{shown}: index layer {digest}"), &e))?;
        if blob.resumes() > 0 {
            log::info(&format!(
                "pull {shown}: layer {digest} resumed {} times",
                blob.resumes()
            ));
        }
        Ok(id)
    }
}

fn cancelled(shown: &str) -> ApiError {
    ApiError::conflict(format!("pull {shown}: cancelled (its client went away)"))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// An image's `source`: `registry:` and the reference, with the platform after a space
/// unless it is linux/amd64.
fn source_of(reference: &forkd_registry::Reference, platform: &Platform) -> String {
    if *platform == Platform::default() {
        format!("registry:{reference}")
    } else {
        format!("registry:{reference} {platform}")
    }
}
