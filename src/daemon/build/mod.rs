//! Image builds: a Dockerfile run step by step in forkd's own sandboxes.
//!
//! # Mechanism
//!
//! The plan comes from `forkd_build` (every instruction understood or refused by name).
//! Each stage carries a *state*: its layer stack (bottom first), its image config, its
//! ARG values, and a cache key. A step either changes only the config (ENV, ARG, USER,
//! LABEL, EXPOSE, ENTRYPOINT, CMD, SHELL, STOPSIGNAL, VOLUME) or writes files (RUN,
//! COPY, ADD, WORKDIR). A file step runs in a fresh sandbox over the state's layers;
//! the sandbox's writes (its overlay upper, whiteouts included, `/.forkd` left out)
//! are sealed into the layer store as one layer, pushed onto the state, and the sandbox
//! is removed. A step that writes nothing makes no layer.
//!
//! # Step cache
//!
//! Every step's key is SHA-256 over the previous key and what the step is: the
//! instruction after `$VAR` expansion, the ARG values a RUN sees, and for COPY and ADD
//! the digest of the files taken (names, types, modes and contents; not times) or, for
//! `--from`, the source stage's layers. So a key names everything the step's result
//! depends on. `<data>/build-cache/<key>.json` records the layer a file step made; a
//! rebuild whose key and layer are still there takes the layer without running
//! anything, and a changed step rebuilds from that step on.
//!
//! # Atomicity
//!
//! The image record is written once, at the end. A failed build leaves the store as it
//! found it: its step sandboxes are removed, the layers it created (not those that were
//! stored before) are removed, no cache entry is written (entries are written only when
//! the whole build succeeds), and a FROM base it imported from a file is removed again.
//! The build holds the store lock for reading throughout, so `gc` cannot take layers
//! from under it.
//!
//! # Where it lives
//!
//! This file: the build's registry, cache and step sandboxes (`impl Daemon`), a stage's
//! state and the job; `job.rs`: the stages and steps of one build (`impl Job`);
//! `copy.rs`: COPY and ADD (their sources, `--chown`, archives unpacked).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkd_build::context::{self, EntryKind, Selection};
use forkd_build::words::{self, Vars};
use forkd_build::{Cmd, CopySpec, Plan, StepKind};
use forkd_layers::{Image, ImageConfig, LayerId};
use forkd_sandbox::proto::ExecRequest;
use forkd_sandbox::SandboxId;
use sha2::{Digest, Sha256};

use super::sandboxes::{LayerFrom, SandboxRecord};
use super::{log, Daemon, Sandbox};
use super::{Lock as _, RwLockExt as _};
use crate::api::{ApiError, BuildRequest, BuildResult, BuildStatus, BuildStep};

mod copy;
mod job;
mod upload;

const CACHE_VERSION: u32 = 1;
/// The label on a build's step sandboxes.
pub const BUILD_LABEL: &str = "forkd.build";
/// How much of a failed RUN's output an error shows.
const ERROR_TAIL_LINES: usize = 40;

/// Builds in progress, by image name.
pub type Builds = super::jobs::Jobs<String, BuildStatus>;

#[derive(Clone)]
struct State {
    layers: Vec<LayerId>,
    config: ImageConfig,
    key: String,
    /// ARG values declared in this stage so far.
    args: Vars,
}

impl State {
    /// ARGs, then ENV over them: what `$VAR` means at this step.
    fn vars(&self) -> Vars {
        let mut v = self.args.clone();
        for kv in &self.config.env {
            if let Some((k, val)) = kv.split_once('=') {
                v.insert(k.to_string(), val.to_string());
            }
        }
        v
    }

    fn extend_key(&mut self, parts: &[&str]) {
        let mut h = Sha256::new();
        h.update(self.key.as_bytes());
        for p in parts {
            h.update([0]);
            h.update(p.as_bytes());
        }
        self.key = context::hex(&h.finalize());
    }

    fn set_env(&mut self, k: &str, v: &str) {
        let prefix = format!("{k}=");
        self.config.env.retain(|e| !e.starts_with(&prefix));
        self.config.env.push(format!("{k}={v}"));
    }

    fn workdir(&self) -> String {
        self.config
            .working_dir
            .clone()
            .unwrap_or_else(|| "/".into())
    }

    /// A path as the step means it: relative ones are under the working directory.
    fn absolute(&self, p: &str) -> String {
        if p.starts_with('/') {
            p.to_string()
        } else {
            let wd = self.workdir();
            format!("{}/{p}", wd.trim_end_matches('/'))
        }
    }

    fn shell_argv(&self, line: &str) -> Vec<String> {
        let mut argv = if self.config.shell.is_empty() {
            vec!["/bin/sh".to_string(), "-c".to_string()]
        } else {
            self.config.shell.clone()
        };
        argv.push(line.to_string());
        argv
    }
}

/// The error of a step: the Dockerfile, the line, and what went wrong.
fn at_line(file: &Path, line: usize, msg: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("{} line {line}: {msg}", file.display()))
}

fn key_of(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(b"forkd-build-v1");
    for p in parts {
        h.update([0]);
        h.update(p.as_bytes());
    }
    context::hex(&h.finalize())
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CacheEntry {
    version: u32,
    layer: Option<String>,
    created: u64,
}

/// What the build made so far, undone if it fails.
#[derive(Default)]
struct Made {
    layers_before: HashSet<String>,
    layers: Vec<LayerId>,
    images: Vec<String>,
    cache: Vec<(String, Option<LayerId>)>,
}

impl Daemon {
    fn cache_dir(&self) -> PathBuf {
        self.node.data.join("build-cache")
    }

    fn cache_get(&self, key: &str) -> Option<Option<LayerId>> {
        let bytes = std::fs::read(self.cache_dir().join(format!("{key}.json"))).ok()?;
        let e: CacheEntry = serde_json::from_slice(&bytes).ok()?;
        if e.version != CACHE_VERSION {
            return None;
        }
        match e.layer {
            None => Some(None),
            Some(l) => {
                let id: LayerId = l.parse().ok()?;
                self.images.layers.exists(&id).then_some(Some(id))
            }
        }
    }

    fn cache_put(&self, key: &str, layer: Option<&LayerId>) -> Result<(), ApiError> {
        let dir = self.cache_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| ApiError::internal(format!("create {}: {e}", dir.display())))?;
        super::write_json_atomic(
            &dir,
            &format!("{key}.json"),
            &CacheEntry {
                version: CACHE_VERSION,
                layer: layer.map(|l| l.to_string()),
                created: super::now_secs(),
            },
            super::Survive::DaemonCrash,
        )
    }

    /// Builds an image from a Dockerfile. See the module header.
    /// Builds an image; the images its `FROM` and `COPY --from` pull are pulled with
    /// `given`, the caller's credentials, when it brought any.
    pub fn build_image(
        self: &Arc<Self>,
        req: BuildRequest,
        given: Option<forkd_registry::auth::Given>,
    ) -> Result<BuildResult, ApiError> {
        let started = Instant::now();
        forkd_layers::validate_image_name(&req.name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let mut req = req;
        self.admit(
            super::admission::Ask {
                what: &format!("build of {}", req.name),
                sandboxes: 1,
                tasks_each: 2,
                defaults: true,
            },
            &mut req.limits,
        )?;
        let ctx_dir = super::paths::host_path(
            "build context",
            Path::new(&req.context),
            super::paths::Want::Dir,
        )?;
        let file = match &req.dockerfile {
            Some(f) if Path::new(f).is_absolute() => PathBuf::from(f),
            Some(f) => ctx_dir.join(f),
            None => ctx_dir.join("Dockerfile"),
        };
        let text = std::fs::read_to_string(&file)
            .map_err(|e| ApiError::not_found(format!("read Dockerfile {}: {e}", file.display())))?;
        let plan = forkd_build::plan(&text).map_err(|e| at_line(&file, e.line, &e.message))?;
        let target = plan
            .target(req.target.as_deref())
            .map_err(ApiError::bad_request)?;
        let ctx = forkd_build::Context::open(&ctx_dir).map_err(ApiError::bad_request)?;
        let users = self.sandboxes.of_image(&req.name);
        if !users.is_empty() {
            return Err(ApiError::conflict(format!(
                "image {} is in use by sandboxes {}: remove them or build under another name",
                req.name,
                users.join(", ")
            )));
        }
        let registered = self
            .images
            .builds
            .register(
                req.name.clone(),
                BuildStatus {
                    name: req.name.clone(),
                    started: super::now_secs(),
                    steps: Vec::new(),
                    current: None,
                },
            )
            .ok_or_else(|| {
                ApiError::conflict(format!("image {} is being built already", req.name))
            })?;
        let status = registered.status.clone();
        let _store = self.images.store_lock.read_locked();
        let mut made = Made {
            layers_before: self.images.layer_names(),
            ..Default::default()
        };
        log::info(&format!(
            "build {}: {} ({} stages)",
            req.name,
            file.display(),
            plan.stages.len()
        ));
        let job = Job {
            d: self,
            req: &req,
            file: &file,
            plan: &plan,
            ctx: &ctx,
            status: &status,
            given: &given,
        };
        let res = job.run(target, &mut made);
        match res {
            Ok(state) => {
                let finish = || -> Result<Image, ApiError> {
                    let image = Image {
                        name: req.name.clone(),
                        layers: state.layers.clone(),
                        created: super::now_secs(),
                        source: format!("build:{}", file.display()),
                        config: state.config.clone(),
                        digest: None,
                    };
                    self.images
                        .store
                        .put(&image)
                        .map_err(|e| ApiError::from_chain("write image record", &e))?;
                    self.make_image_base(&image);
                    for (key, layer) in &made.cache {
                        if let Err(e) = self.cache_put(key, layer.as_ref()) {
                            log::warn(&format!(
                                "build {}: cache entry {key}: {}",
                                req.name, e.message
                            ));
                        }
                    }
                    Ok(image)
                };
                match finish() {
                    Ok(image) => {
                        let steps = status.locked().steps.clone();
                        log::info(&format!(
                            "build {}: done in {} ms",
                            req.name,
                            started.elapsed().as_millis()
                        ));
                        Ok(BuildResult {
                            image: self.image_to_info(image),
                            steps,
                            duration_us: started.elapsed().as_micros() as u64,
                        })
                    }
                    Err(e) => {
                        self.undo_build(&req.name, &made);
                        Err(e)
                    }
                }
            }
            Err(e) => {
                self.undo_build(&req.name, &made);
                log::info(&format!("build {} failed: {}", req.name, e.message));
                Err(e)
            }
        }
    }

    fn undo_build(&self, name: &str, made: &Made) {
        for img in &made.images {
            if let Err(e) = self.images.store.remove(img) {
                log::warn(&format!("build {name}: remove base image {img}: {e}"));
            }
        }
        for id in &made.layers {
            if made.layers_before.contains(&id.to_string()) {
                continue;
            }
            if let Err(e) = self.images.layers.remove(id) {
                log::warn(&format!("build {name}: remove layer {id}: {e}"));
            }
        }
    }

    /// A sandbox over `layers` (bottom first) for one build step; with `network`, it
    /// has egress (the outside world through NAT, never the host or other sandboxes).
    fn step_sandbox(
        self: &Arc<Self>,
        name: &str,
        layers: &[LayerId],
        config: &ImageConfig,
        limits: &crate::api::Limits,
        network: bool,
    ) -> Result<Arc<Sandbox>, ApiError> {
        let started = Instant::now();
        let network = if network {
            forkd_net::Network::egress()
        } else {
            forkd_net::Network::none()
        };
        let policy = self.sandboxes.network_policy(&network)?;
        let id = SandboxId::random();
        let lowers = self.images.stack(layers);
        let base = self.base_for(&lowers)?;
        let record = SandboxRecord {
            version: 1,
            id: id.clone(),
            image: name.to_string(),
            lowers,
            base: Some(base.id.clone()),
            owner: None,
            parent: None,
            created: super::now_secs(),
            hostname: "build".into(),
            limits: limits.clone(),
            labels: [(BUILD_LABEL.to_string(), name.to_string())].into(),
            status: crate::api::SandboxStatus::Running,
            init_pid: None,
            init_start: None,
            cgroup: format!("forkd/{id}"),
            memory_cgroup: self
                .sandboxes
                .cgroups
                .shared_memory_for(&crate::daemon::edge::cgroup_limits(limits)),
            create_us: 0,
            config: config.clone(),
            network,
            lease: None,
            seccomp: forkd_sandbox::Seccomp::Default,
            setuid: false,
            expires_at: None,
        };
        let dir = self.sandbox_dir(&id);
        self.start_or_undo(&dir, record, started, &LayerFrom::Base, |d, dir, rec| {
            d.start_init_in(dir, rec, policy.as_ref())
        })
    }

    /// Stops a step's sandbox and seals what it wrote into a layer (none if nothing).
    fn seal_step(&self, sb: &Sandbox) -> Result<Option<LayerId>, ApiError> {
        self.stop_sandbox(sb, Duration::ZERO)?;
        let upper = sb.upper();
        let wrote = std::fs::read_dir(&upper)
            .map_err(|e| ApiError::internal(format!("read {}: {e}", upper.display())))?
            .flatten()
            .any(|e| e.file_name() != ".forkd");
        if !wrote {
            return Ok(None);
        }
        let id = self
            .images
            .layers
            .import_upper(&upper, &[".forkd"], &mut |_| {})
            .map_err(|e| ApiError::from_chain("seal the step's layer", &e))?;
        Ok(Some(id))
    }
}

struct Job<'a> {
    d: &'a Arc<Daemon>,
    req: &'a BuildRequest,
    file: &'a Path,
    plan: &'a Plan,
    ctx: &'a forkd_build::Context,
    status: &'a Arc<Mutex<BuildStatus>>,
    /// The caller's registry credentials.
    given: &'a Option<forkd_registry::auth::Given>,
}

const ESC: char = '\\';

fn parent(p: &str) -> String {
    let t = p.trim_end_matches('/');
    match t.rfind('/') {
        Some(0) | None => "/".into(),
        Some(i) => t[..i].to_string(),
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serialises")
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn tail(out: &[u8]) -> String {
    let s = String::from_utf8_lossy(out);
    let lines: Vec<&str> = s.lines().collect();
    let start = lines.len().saturating_sub(ERROR_TAIL_LINES);
    let mut t = String::new();
    if start > 0 {
        t.push_str(&format!("[... {start} earlier lines]\n"));
    }
    t.push_str(&lines[start..].join("\n"));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_and_tails() {
        assert_eq!(parent("/a/b/c"), "/a/b");
        assert_eq!(parent("/a/"), "/");
        assert_eq!(parent("/a"), "/");
        let many: Vec<String> = (0..50).map(|i| i.to_string()).collect();
        let t = tail(many.join("\n").as_bytes());
        assert!(t.starts_with("[... 10 earlier lines]\n10\n"));
        assert!(t.ends_with("49"));
    }
}
