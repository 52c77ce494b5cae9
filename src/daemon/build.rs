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

use std::collections::{BTreeMap, HashSet};
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

use super::checkpoints::Lower;
use super::sandboxes::SandboxRecord;
use super::{log, Daemon, Sandbox};
use super::{Lock as _, RwLockExt as _};
use crate::api::{ApiError, BuildRequest, BuildResult, BuildStatus, BuildStep};

const CACHE_VERSION: u32 = 1;
/// The label on a build's step sandboxes.
pub const BUILD_LABEL: &str = "forkd.build";
/// How much of a failed RUN's output an error shows.
const ERROR_TAIL_LINES: usize = 40;

/// Builds in progress, by image name.
#[derive(Default)]
pub struct Builds {
    jobs: Mutex<BTreeMap<String, Arc<Mutex<BuildStatus>>>>,
}

impl Builds {
    pub fn list(&self) -> Vec<BuildStatus> {
        self.jobs
            .locked()
            .values()
            .map(|j| j.locked().clone())
            .collect()
    }
}

/// Removes a build from the table when it ends, however it ends.
struct Registered<'a> {
    builds: &'a Builds,
    name: String,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.builds.jobs.locked().remove(&self.name);
    }
}

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
        self.data.join("build-cache")
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
                self.layers.exists(&id).then_some(Some(id))
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

    fn layer_names(&self) -> HashSet<String> {
        std::fs::read_dir(self.layers.root())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Builds an image from a Dockerfile. See the module header.
    pub fn build_image(self: &Arc<Self>, req: BuildRequest) -> Result<BuildResult, ApiError> {
        let started = Instant::now();
        forkd_layers::validate_image_name(&req.name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        req.limits
            .validate()
            .map_err(|e| ApiError::bad_request(format!("limits: {e}")))?;
        if req.network {
            return Err(ApiError::bad_request(
                "network: RUN steps with network access are not available; builds run with none",
            ));
        }
        let ctx_dir = PathBuf::from(&req.context);
        if !ctx_dir.is_absolute() {
            return Err(ApiError::bad_request(format!(
                "build context {:?} must be an absolute path",
                req.context
            )));
        }
        if !ctx_dir.is_dir() {
            return Err(ApiError::not_found(format!(
                "build context {} is not a directory",
                ctx_dir.display()
            )));
        }
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
        let users = self.users_of(&req.name);
        if !users.is_empty() {
            return Err(ApiError::conflict(format!(
                "image {} is in use by sandboxes {}: remove them or build under another name",
                req.name,
                users.join(", ")
            )));
        }
        let status = Arc::new(Mutex::new(BuildStatus {
            name: req.name.clone(),
            started: super::now_secs(),
            steps: Vec::new(),
            current: None,
        }));
        let _registered = {
            let mut jobs = self.builds.jobs.locked();
            if jobs.contains_key(&req.name) {
                return Err(ApiError::conflict(format!(
                    "image {} is being built already",
                    req.name
                )));
            }
            jobs.insert(req.name.clone(), status.clone());
            Registered {
                builds: &self.builds,
                name: req.name.clone(),
            }
        };
        let _store = self.store_lock.read_locked();
        let mut made = Made {
            layers_before: self.layer_names(),
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
                    };
                    self.images
                        .put(&image)
                        .map_err(|e| ApiError::from_chain("write image record", &e))?;
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
            if let Err(e) = self.images.remove(img) {
                log::warn(&format!("build {name}: remove base image {img}: {e}"));
            }
        }
        for id in &made.layers {
            if made.layers_before.contains(&id.to_string()) {
                continue;
            }
            if let Err(e) = self.layers.remove(id) {
                log::warn(&format!("build {name}: remove layer {id}: {e}"));
            }
        }
    }

    /// A sandbox over `layers` (bottom first) for one build step.
    fn step_sandbox(
        self: &Arc<Self>,
        name: &str,
        layers: &[LayerId],
        config: &ImageConfig,
        limits: &forkd_cgroups::Limits,
    ) -> Result<Arc<Sandbox>, ApiError> {
        let started = Instant::now();
        let id = SandboxId::random();
        let mut lowers = vec![Lower::Layer(self.runtime_layer)];
        lowers.extend(layers.iter().rev().cloned().map(Lower::Layer));
        let record = SandboxRecord {
            version: 1,
            id: id.clone(),
            image: name.to_string(),
            lowers,
            parent: None,
            created: super::now_secs(),
            hostname: "build".into(),
            limits: limits.clone(),
            labels: [(BUILD_LABEL.to_string(), name.to_string())].into(),
            status: crate::api::SandboxStatus::Running,
            init_pid: None,
            init_start: None,
            cgroup: format!("forkd/{id}"),
            create_us: 0,
            config: config.clone(),
            network: forkd_net::Network::none(),
            lease: None,
        };
        let dir = self.sandbox_dir(&id);
        self.start_or_undo(&dir, record, started, |d, dir, rec| {
            d.start_init_in(dir, rec, None)
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
}

const ESC: char = '\\';

impl Job<'_> {
    fn err(&self, line: usize, msg: impl std::fmt::Display) -> ApiError {
        at_line(self.file, line, msg)
    }

    /// The global ARGs: defaults overridden by `build_args`.
    fn global_args(&self) -> Result<Vars, ApiError> {
        let mut vars = Vars::new();
        for (line, raw) in &self.plan.global_args {
            let (name, default) =
                words::arg(raw, &vars, ESC).map_err(|e| self.err(*line, format!("ARG: {e}")))?;
            if let Some(v) = self.req.build_args.get(&name).cloned().or(default) {
                vars.insert(name, v);
            }
        }
        Ok(vars)
    }

    /// The stages `target` needs, itself included.
    fn needed(&self, target: usize, globals: &Vars) -> Result<Vec<bool>, ApiError> {
        let mut need = vec![false; self.plan.stages.len()];
        let mut todo = vec![target];
        while let Some(i) = todo.pop() {
            if need[i] {
                continue;
            }
            need[i] = true;
            let st = &self.plan.stages[i];
            let base = words::expand(&st.base, globals, ESC)
                .map_err(|e| self.err(st.line, format!("FROM: {e}")))?;
            if let Some(j) = self.plan.stage_named(&base, i) {
                todo.push(j);
            }
            for step in &st.steps {
                if let StepKind::Copy(CopySpec { from: Some(f), .. }) = &step.kind {
                    let f = words::expand(f, globals, ESC).unwrap_or_else(|_| f.clone());
                    if let Some(j) = self.plan.stage_named(&f, i) {
                        todo.push(j);
                    }
                }
            }
        }
        Ok(need)
    }

    fn run(&self, target: usize, made: &mut Made) -> Result<State, ApiError> {
        let globals = self.global_args()?;
        let need = self.needed(target, &globals)?;
        let mut done: Vec<Option<State>> = vec![None; self.plan.stages.len()];
        for (i, stage) in self.plan.stages.iter().enumerate().take(target + 1) {
            if !need[i] {
                continue;
            }
            let t0 = Instant::now();
            let base = words::expand(&stage.base, &globals, ESC)
                .map_err(|e| self.err(stage.line, format!("FROM: {e}")))?;
            let mut state = self.base(i, &base, stage.line, &done, made)?;
            self.record(i, stage.line, &format!("FROM {base}"), "config", None, t0);
            for step in &stage.steps {
                self.status.locked().current = Some(step.text.clone());
                let t0 = Instant::now();
                let (cache, layer) = self.step(i, step, &mut state, &globals, &done, made)?;
                self.record(i, step.line, &step.text, cache, layer, t0);
            }
            self.status.locked().current = None;
            done[i] = Some(state);
        }
        Ok(done[target].take().expect("the target stage was built"))
    }

    fn record(
        &self,
        stage: usize,
        line: usize,
        text: &str,
        cache: &str,
        layer: Option<LayerId>,
        t0: Instant,
    ) {
        let step = BuildStep {
            stage,
            line,
            instruction: text.to_string(),
            cache: cache.to_string(),
            layer: layer.map(|l| l.to_string()),
            duration_us: t0.elapsed().as_micros() as u64,
        };
        log::info(&format!(
            "build {}: [{}] line {} {} ({}, {} ms)",
            self.req.name,
            stage,
            line,
            first_line(text),
            cache,
            step.duration_us / 1000
        ));
        self.status.locked().steps.push(step);
    }

    /// The state a stage starts from.
    fn base(
        &self,
        index: usize,
        base: &str,
        line: usize,
        done: &[Option<State>],
        made: &mut Made,
    ) -> Result<State, ApiError> {
        if let Some(j) = self.plan.stage_named(base, index) {
            let mut s = done[j].clone().expect("needed stages are built first");
            s.args.clear();
            return Ok(s);
        }
        let (layers, config) = if base == "scratch" {
            (Vec::new(), ImageConfig::default())
        } else if base.starts_with('/') || base.starts_with("./") {
            let img = self.import_base(base, line, made)?;
            (img.layers, img.config)
        } else {
            let img = self.d.images.get(base).map_err(|e| match e {
                forkd_layers::ImageError::NotFound(_) => self.err(
                    line,
                    format!("FROM {base}: no such image (import it with `forkd image import`)"),
                ),
                forkd_layers::ImageError::InvalidName { .. } => {
                    self.err(line, format!("FROM {base}: {e}"))
                }
                other => ApiError::from_chain("read image", &other),
            })?;
            (img.layers, img.config)
        };
        let ids: Vec<String> = layers.iter().map(|l| l.to_string()).collect();
        let cfg = serde_json::to_string(&config).expect("config serialises");
        Ok(State {
            key: key_of(&["base", &ids.join(","), &cfg]),
            layers,
            config,
            args: Vars::new(),
        })
    }

    /// `FROM /path` or `FROM ./path`: an OCI layout or `docker save` archive, imported
    /// once under a name derived from its path, size and time.
    fn import_base(&self, base: &str, line: usize, made: &mut Made) -> Result<Image, ApiError> {
        let path = if let Some(rel) = base.strip_prefix("./") {
            if rel.split('/').any(|c| c == "..") {
                return Err(self.err(line, format!("FROM {base}: '..' leaves the build context")));
            }
            self.ctx.root().join(rel)
        } else {
            PathBuf::from(base)
        };
        let meta = std::fs::metadata(&path)
            .map_err(|e| self.err(line, format!("FROM {}: {e}", path.display())))?;
        let mtime = std::os::unix::fs::MetadataExt::mtime(&meta);
        let name = format!(
            "forkd-build/base-{}",
            &key_of(&[
                &path.display().to_string(),
                &meta.len().to_string(),
                &mtime.to_string()
            ])[..16]
        );
        if let Ok(img) = self.d.images.get(&name) {
            return Ok(img);
        }
        let img =
            forkd_layers::import_image(&self.d.layers, &self.d.images, &path, &name, &mut |_| {})
                .map_err(|e| {
                self.err(
                    line,
                    ApiError::from_chain(&format!("FROM {}", path.display()), &e).message,
                )
            })?;
        made.images.push(name);
        made.layers.extend(img.layers.iter().cloned());
        Ok(img)
    }

    /// Runs one step; returns its cache status and the layer it added.
    fn step(
        &self,
        stage: usize,
        step: &forkd_build::Step,
        state: &mut State,
        globals: &Vars,
        done: &[Option<State>],
        made: &mut Made,
    ) -> Result<(&'static str, Option<LayerId>), ApiError> {
        let line = step.line;
        let vars = state.vars();
        let ex = |raw: &str| words::expand(raw, &vars, ESC).map_err(|e| self.err(line, e));
        match &step.kind {
            StepKind::Env(raw) => {
                let pairs = words::pairs(raw, &vars, ESC, true)
                    .map_err(|e| self.err(line, format!("ENV: {e}")))?;
                for (k, v) in &pairs {
                    state.set_env(k, v);
                    state.extend_key(&["ENV", k, v]);
                }
            }
            StepKind::Arg(raw) => {
                let (name, default) =
                    words::arg(raw, &vars, ESC).map_err(|e| self.err(line, format!("ARG: {e}")))?;
                let value = self
                    .req
                    .build_args
                    .get(&name)
                    .cloned()
                    .or_else(|| default.clone())
                    .or_else(|| globals.get(&name).cloned());
                if let Some(v) = &value {
                    state.args.insert(name.clone(), v.clone());
                }
                // The value is not part of the key: a RUN's key holds the ARG values it
                // sees, and any other use of it is in the expanded instruction. So a
                // changed value reruns only the steps it reaches.
                state.extend_key(&["ARG", &name]);
            }
            StepKind::Label(raw) => {
                let pairs = words::pairs(raw, &vars, ESC, false)
                    .map_err(|e| self.err(line, format!("LABEL: {e}")))?;
                for (k, v) in pairs {
                    state.extend_key(&["LABEL", &k, &v]);
                    state.config.labels.insert(k, v);
                }
            }
            StepKind::User(raw) => {
                let u = ex(raw)?;
                if u.is_empty() {
                    return Err(self.err(line, "USER needs a user"));
                }
                state.extend_key(&["USER", &u]);
                state.config.user = Some(u);
            }
            StepKind::Expose(ports) => {
                for p in ports {
                    let p = ex(p)?;
                    let p = if p.contains('/') {
                        p
                    } else {
                        format!("{p}/tcp")
                    };
                    state.extend_key(&["EXPOSE", &p]);
                    if !state.config.exposed_ports.contains(&p) {
                        state.config.exposed_ports.push(p);
                    }
                }
            }
            StepKind::Entrypoint(c) => {
                let argv = self.cmd_argv(c, state);
                state.extend_key(&["ENTRYPOINT", &json(&argv)]);
                state.config.entrypoint = argv;
                // Docker: a new ENTRYPOINT drops the CMD inherited with the base.
                state.config.cmd.clear();
            }
            StepKind::Cmd(c) => {
                let argv = self.cmd_argv(c, state);
                state.extend_key(&["CMD", &json(&argv)]);
                state.config.cmd = argv;
            }
            StepKind::Shell(argv) => {
                if argv.is_empty() {
                    return Err(self.err(line, "SHELL needs a program"));
                }
                state.extend_key(&["SHELL", &json(argv)]);
                state.config.shell = argv.clone();
            }
            StepKind::StopSignal(raw) => {
                let s = ex(raw)?;
                state.extend_key(&["STOPSIGNAL", &s]);
                state.config.stop_signal = Some(s);
            }
            StepKind::Volume(paths) => {
                for p in paths {
                    let p = ex(p)?;
                    state.extend_key(&["VOLUME", &p]);
                    if !state.config.volumes.contains(&p) {
                        state.config.volumes.push(p);
                    }
                }
            }
            StepKind::Workdir(raw) => {
                let dir = ex(raw)?;
                if dir.is_empty() {
                    return Err(self.err(line, "WORKDIR needs a directory"));
                }
                let dir = state.absolute(&dir);
                state.config.working_dir = Some(dir.clone());
                state.extend_key(&["WORKDIR", &dir]);
                return self.file_step(state, made, |sb| self.d.make_dirs(sb, &dir));
            }
            StepKind::Run(c) => {
                let argv = match c {
                    Cmd::Exec(v) => v.clone(),
                    Cmd::Shell(s) => state.shell_argv(s),
                };
                // ARG values are in a RUN's environment (ENV overrides them), not in the
                // image's.
                let mut env: Vec<String> =
                    state.args.iter().map(|(k, v)| format!("{k}={v}")).collect();
                env.extend(state.config.env.iter().cloned());
                state.extend_key(&["RUN", &json(&argv), &json(&env)]);
                let req = ExecRequest {
                    argv,
                    env,
                    cwd: state.config.working_dir.clone(),
                    user: state.config.user.clone(),
                    merge_stderr: true,
                    timeout_ms: self.req.step_timeout_secs.map(|s| s.saturating_mul(1000)),
                    ..Default::default()
                };
                let text = step.text.clone();
                return self.file_step(state, made, |sb| {
                    let out =
                        self.d
                            .exec(sb, &req, None, crate::api::DEFAULT_OUTPUT_LIMIT as usize)?;
                    if out.exit.exit_code == 0 && out.exit.signal.is_none() {
                        return Ok(());
                    }
                    let output = crate::api::b64::decode(&out.output_b64).unwrap_or_default();
                    let how = match (out.exit.timed_out, out.exit.signal) {
                        (true, _) => format!(
                            "timed out after {} s (step_timeout_secs); its processes were killed",
                            self.req.step_timeout_secs.unwrap_or(0)
                        ),
                        (false, Some(s)) => format!("was killed by signal {s}"),
                        (false, None) => format!("exited with code {}", out.exit.exit_code),
                    };
                    Err(self.err(
                        line,
                        format!("{} {how}\n{}", first_line(&text), tail(&output)),
                    ))
                });
            }
            StepKind::Copy(spec) => return self.copy(stage, line, spec, state, done, made),
        }
        Ok(("config", None))
    }

    fn cmd_argv(&self, c: &Cmd, state: &State) -> Vec<String> {
        match c {
            Cmd::Exec(v) => v.clone(),
            Cmd::Shell(s) => state.shell_argv(s),
        }
    }

    /// Looks the state's key up in the cache, or runs `action` in a step sandbox and
    /// seals what it wrote.
    fn file_step(
        &self,
        state: &mut State,
        made: &mut Made,
        action: impl FnOnce(&Arc<Sandbox>) -> Result<(), ApiError>,
    ) -> Result<(&'static str, Option<LayerId>), ApiError> {
        if !self.req.no_cache {
            if let Some(hit) = self.d.cache_get(&state.key) {
                if let Some(id) = &hit {
                    state.layers.push(*id);
                }
                return Ok(("hit", hit));
            }
        }
        let sb = self.d.step_sandbox(
            &self.req.name,
            &state.layers,
            &state.config,
            &self.req.limits,
        )?;
        let res = action(&sb).and_then(|()| self.d.seal_step(&sb));
        if let Err(e) = self.d.remove_sandbox(&sb, true) {
            log::warn(&format!(
                "build {}: remove step sandbox {}: {}",
                self.req.name, sb.id, e.message
            ));
        }
        let layer = res?;
        if let Some(id) = &layer {
            made.layers.push(*id);
            state.layers.push(*id);
        }
        made.cache.push((state.key.clone(), layer));
        Ok(("miss", layer))
    }

    fn copy(
        &self,
        stage: usize,
        line: usize,
        spec: &CopySpec,
        state: &mut State,
        done: &[Option<State>],
        made: &mut Made,
    ) -> Result<(&'static str, Option<LayerId>), ApiError> {
        let what = if spec.add { "ADD" } else { "COPY" };
        let vars = state.vars();
        let ex = |raw: &str| {
            words::expand(raw, &vars, ESC).map_err(|e| self.err(line, format!("{what}: {e}")))
        };
        let sources: Vec<String> = spec
            .sources
            .iter()
            .map(|s| ex(s))
            .collect::<Result<_, _>>()?;
        let dest_raw = ex(&spec.dest)?;
        let dest_abs = state.absolute(&dest_raw);
        let chmod = match &spec.chmod {
            Some(m) => Some(
                context::parse_chmod(&ex(m)?)
                    .map_err(|e| self.err(line, format!("{what}: {e}")))?,
            ),
            None => None,
        };
        let chown = spec.chown.as_deref().map(ex).transpose()?;
        let from = spec.from.as_deref().map(ex).transpose()?;
        let opts = format!(
            "{}|{}|{}",
            dest_abs,
            chown.as_deref().unwrap_or(""),
            chmod.map(|m| format!("{m:o}")).unwrap_or_default()
        );
        if let Some(from) = from {
            // Another stage (or an image): its files, read inside a sandbox of it.
            let src_layers = match self.plan.stage_named(&from, stage) {
                Some(j) => done[j]
                    .as_ref()
                    .expect("needed stages are built first")
                    .layers
                    .clone(),
                None => {
                    self.d
                        .images
                        .get(&from)
                        .map_err(|_| {
                            self.err(
                                line,
                                format!("{what} --from={from}: no such stage or image"),
                            )
                        })?
                        .layers
                }
            };
            for s in &sources {
                if context::has_glob(s) {
                    return Err(self.err(
                        line,
                        format!("{what} --from: wildcard source {s:?} is not supported"),
                    ));
                }
                if s.split('/').any(|c| c == "..") {
                    return Err(self.err(line, format!("{what} --from: source {s:?} has '..'")));
                }
            }
            let ids: Vec<String> = src_layers.iter().map(|l| l.to_string()).collect();
            state.extend_key(&[what, "from", &ids.join(","), &json(&sources), &opts]);
            let dest_is_dir = dest_raw.ends_with('/') || sources.len() > 1;
            // The source stage's files are read in a sandbox of it, made only when the
            // step runs (a cache hit needs none).
            let mut src_sb: Option<Arc<Sandbox>> = None;
            let res = self.file_step(state, made, |sb| {
                let owner = self.owner(sb, chown.as_deref(), line)?;
                let src_sb = src_sb.insert(self.d.step_sandbox(
                    &self.req.name,
                    &src_layers,
                    &ImageConfig::default(),
                    &self.req.limits,
                )?);
                for s in &sources {
                    let abs = if s.starts_with('/') {
                        s.clone()
                    } else {
                        format!("/{s}")
                    };
                    let tar = self.d.copy_out(src_sb, &abs).map_err(|e| {
                        self.err(line, format!("{what} --from={from}: {}", e.message))
                    })?;
                    let (tar, is_dir) = repack(&tar, owner, chmod)
                        .map_err(|e| self.err(line, format!("{what} --from: {e}")))?;
                    if is_dir || dest_is_dir {
                        self.d.make_dirs(sb, &dest_abs)?;
                        self.d.copy_in(sb, &dest_abs, &tar)?;
                    } else {
                        self.d.make_dirs(sb, &parent(&dest_abs))?;
                        self.d.copy_in(sb, dest_abs.trim_end_matches('/'), &tar)?;
                    }
                }
                Ok(())
            });
            if let Some(sb) = src_sb {
                let _ = self.d.remove_sandbox(&sb, true);
            }
            return res;
        }
        let sel = self
            .ctx
            .select(&sources, &dest_raw)
            .map_err(|e| self.err(line, format!("{what}: {e}")))?;
        // ADD unpacks local archives; everything else is copied as is.
        let mut archives = Vec::new();
        let mut plain = Vec::new();
        for e in sel.entries {
            if spec.add {
                if let EntryKind::File { .. } = e.kind {
                    let mut head = [0u8; 512];
                    let n = read_head(&e.src, &mut head).map_err(|x| {
                        self.err(line, format!("ADD: read {}: {x}", e.src.display()))
                    })?;
                    match context::archive_kind(&head[..n]) {
                        Some(k @ ("xz" | "bzip2")) => {
                            return Err(self.err(line, format!("ADD: {} is a {k} archive, which is not supported (use gzip, zstd or plain tar)", e.src.display())))
                        }
                        Some(_) => {
                            archives.push(e);
                            continue;
                        }
                        None => {}
                    }
                }
            }
            plain.push(e);
        }
        let plain = Selection {
            entries: plain,
            dest_is_dir: sel.dest_is_dir || !archives.is_empty(),
        };
        let digest = plain
            .digest()
            .map_err(|e| self.err(line, format!("{what}: {e}")))?;
        let mut arch_digest = String::new();
        for e in &archives {
            let one = Selection {
                entries: vec![e.clone()],
                dest_is_dir: true,
            };
            arch_digest.push_str(&one.digest().map_err(|x| self.err(line, x))?);
        }
        state.extend_key(&[what, "context", &digest, &arch_digest, &opts]);
        self.file_step(state, made, |sb| {
            let owner = self.owner(sb, chown.as_deref(), line)?;
            if plain.dest_is_dir {
                self.d.make_dirs(sb, &dest_abs)?;
            } else {
                self.d.make_dirs(sb, &parent(&dest_abs))?;
            }
            if !plain.entries.is_empty() {
                let tar = plain
                    .tar(owner, chmod)
                    .map_err(|e| self.err(line, format!("{what}: {e}")))?;
                let at = if plain.dest_is_dir {
                    dest_abs.clone()
                } else {
                    dest_abs.trim_end_matches('/').to_string()
                };
                self.d
                    .copy_in(sb, &at, &tar)
                    .map_err(|e| self.err(line, format!("{what}: {}", e.message)))?;
            }
            for e in &archives {
                let tar = unpack(&e.src)
                    .map_err(|x| self.err(line, format!("ADD: unpack {}: {x}", e.src.display())))?;
                self.d
                    .copy_in(sb, &dest_abs, &tar)
                    .map_err(|x| self.err(line, format!("ADD: {}", x.message)))?;
            }
            Ok(())
        })
    }

    /// `--chown` resolved against the step sandbox's own `/etc/passwd` and `/etc/group`.
    fn owner(
        &self,
        sb: &Arc<Sandbox>,
        chown: Option<&str>,
        line: usize,
    ) -> Result<(u32, u32), ApiError> {
        let Some(spec) = chown else {
            return Ok((0, 0));
        };
        let needs_db = spec.split(':').any(|p| p.parse::<u32>().is_err());
        let (passwd, group) = if needs_db {
            (
                self.read_file(sb, "/etc/passwd"),
                self.read_file(sb, "/etc/group"),
            )
        } else {
            (String::new(), String::new())
        };
        context::resolve_owner(spec, &passwd, &group).map_err(|e| self.err(line, e))
    }

    fn read_file(&self, sb: &Arc<Sandbox>, path: &str) -> String {
        let Ok(tar) = self.d.copy_out(sb, path) else {
            return String::new();
        };
        let mut a = tar::Archive::new(&tar[..]);
        let mut out = String::new();
        if let Ok(mut entries) = a.entries() {
            if let Some(Ok(mut e)) = entries.next() {
                let _ = std::io::Read::read_to_string(&mut e, &mut out);
            }
        }
        out
    }
}

fn read_head(p: &Path, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut f = std::fs::File::open(p)?;
    let mut n = 0;
    while n < buf.len() {
        let k = f.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(n)
}

/// A local archive as a plain tar (the layer store's decompression, which sniffs gzip
/// and zstd from the first bytes).
fn unpack(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let (mut r, _) = forkd_layers::extract::decompress(std::fs::File::open(p)?)?;
    let mut out = Vec::new();
    r.read_to_end(&mut out)?;
    Ok(out)
}

/// A tar from `copy_out` (top entry = the source's name) made ready for the
/// destination: a directory's contents lose the top component; owner and mode set.
fn repack(tar: &[u8], owner: (u32, u32), chmod: Option<u32>) -> Result<(Vec<u8>, bool), String> {
    let mut a = tar::Archive::new(tar);
    let mut b = tar::Builder::new(Vec::new());
    let mut is_dir = false;
    for (i, e) in a.entries().map_err(|e| e.to_string())?.enumerate() {
        let mut e = e.map_err(|e| e.to_string())?;
        let path = e.path().map_err(|e| e.to_string())?.into_owned();
        if i == 0 && e.header().entry_type().is_dir() {
            is_dir = true;
        }
        let rel: PathBuf = if is_dir {
            path.components().skip(1).collect()
        } else {
            path.clone()
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let mut h = e.header().clone();
        h.set_uid(owner.0 as u64);
        h.set_gid(owner.1 as u64);
        if let Some(m) = chmod {
            if !h.entry_type().is_symlink() {
                h.set_mode(m);
            }
        }
        if h.entry_type().is_symlink() || h.entry_type().is_hard_link() {
            let target = e
                .link_name()
                .map_err(|e| e.to_string())?
                .unwrap_or_default()
                .into_owned();
            b.append_link(&mut h, &rel, &target)
                .map_err(|e| e.to_string())?;
        } else {
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).map_err(|e| e.to_string())?;
            b.append_data(&mut h, &rel, &data[..])
                .map_err(|e| e.to_string())?;
        }
    }
    Ok((b.into_inner().map_err(|e| e.to_string())?, is_dir))
}

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

    #[test]
    fn repack_strips_a_directory_top_and_sets_owner() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, "out", std::io::empty()).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(2);
        b.append_data(&mut h, "out/f", &b"hi"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let (t, is_dir) = repack(&tar, (3, 4), None).unwrap();
        assert!(is_dir);
        let mut a = tar::Archive::new(&t[..]);
        let e: Vec<(String, u64)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().uid().unwrap(),
                )
            })
            .collect();
        assert_eq!(e, vec![("f".to_string(), 3)]);
    }
}
