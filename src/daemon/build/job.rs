//! One build's stages and steps: which stages the target needs, each stage's base, and
//! each instruction applied to the stage's state (config-only steps in place, file steps
//! in a step sandbox whose writes become one layer), with the step cache consulted first.

use super::*;

impl Job<'_> {
    pub(super) fn err(&self, line: usize, msg: impl std::fmt::Display) -> ApiError {
        at_line(self.file, line, msg)
    }

    /// The global ARGs: defaults overridden by `build_args`.
    pub(super) fn global_args(&self) -> Result<Vars, ApiError> {
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
    pub(super) fn needed(&self, target: usize, globals: &Vars) -> Result<Vec<bool>, ApiError> {
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

    pub(super) fn run(&self, target: usize, made: &mut Made) -> Result<State, ApiError> {
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

    pub(super) fn record(
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
    pub(super) fn base(
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
            let img = self
                .d
                .image_for_build(base, self.given)
                .map_err(|e| self.err(line, format!("FROM {base}: {}", e.message)))?;
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
    pub(super) fn import_base(
        &self,
        base: &str,
        line: usize,
        made: &mut Made,
    ) -> Result<Image, ApiError> {
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
        if let Ok(img) = self.d.images.store.get(&name) {
            return Ok(img);
        }
        let img = forkd_layers::import_image(
            &self.d.images.layers,
            &self.d.images.store,
            &path,
            &name,
            &mut |_| {},
        )
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
    pub(super) fn step(
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
                return self.file_step(state, made, false, |sb| self.d.make_dirs(sb, &dir));
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
                let network = self.req.network && !step.no_network;
                return self.file_step(state, made, network, |sb| {
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

    pub(super) fn cmd_argv(&self, c: &Cmd, state: &State) -> Vec<String> {
        match c {
            Cmd::Exec(v) => v.clone(),
            Cmd::Shell(s) => state.shell_argv(s),
        }
    }

    /// Looks the state's key up in the cache, or runs `action` in a step sandbox (with
    /// egress if `network`) and seals what it wrote.
    pub(super) fn file_step(
        &self,
        state: &mut State,
        made: &mut Made,
        network: bool,
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
            network,
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
}
