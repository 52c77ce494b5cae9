//! Clean start states: the images a run's tasks need (imported from the fixture cache,
//! pulled, or built from the task's Dockerfile), and each task's clean state, cached as
//! a checkpoint.

use super::session::Session;
use super::task::Task;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Records the commit the clean state of a SWE task is at (see [`Task::base_commit`]),
/// from a fresh fork of it.
pub fn record_base_commit(s: &Session, task: &Task, clean: &str) -> anyhow::Result<()> {
    if task.config.task.kind != "swe" || task.base_commit.get().is_some() {
        return Ok(());
    }
    let sb = s
        .fork(clean, true)
        .map_err(|e| anyhow::anyhow!("task {}: {e}", task.name))?;
    let r = s.sh(
        &sb,
        "git rev-parse --verify HEAD 2>/dev/null || true",
        task.workdir(),
        Some(60),
    );
    s.remove(&sb);
    let head = r
        .map_err(|e| anyhow::anyhow!("task {}: {e}", task.name))?
        .out();
    let head = head.trim();
    if head.len() >= 40 && head.bytes().all(|b| b.is_ascii_hexdigit()) {
        let _ = task.base_commit.set(head.to_string());
    }
    Ok(())
}

/// Imports image `name` from the fixture cache (`images/NAME.tar*`) if it is there and
/// the daemon lacks it.
fn import_from_cache(s: &Session, name: &str) -> anyhow::Result<()> {
    let images = forkd_api::defaults::cache().join("images");
    let src = ["tar.zst", "tar.gz", "tar"]
        .iter()
        .map(|e| images.join(format!("{name}.{e}")))
        .find(|p| p.exists());
    if let Some(src) = src {
        s.ensure_image(name, &src)?;
    }
    Ok(())
}

/// The images a Dockerfile starts from (stage references and `scratch` left out).
fn dockerfile_bases(dockerfile: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dockerfile) else {
        return Vec::new();
    };
    let Ok(plan) = forkd_build::plan(&text) else {
        return Vec::new();
    };
    let mut args = forkd_build::words::Vars::new();
    for (_, raw) in &plan.global_args {
        if let Ok((k, Some(v))) = forkd_build::words::arg(raw, &args, '\\') {
            args.insert(k, v);
        }
    }
    plan.stages
        .iter()
        .enumerate()
        .filter_map(|(i, st)| {
            let base = forkd_build::words::expand(&st.base, &args, '\\').ok()?;
            (base != "scratch" && plan.stage_named(&base, i).is_none()).then_some(base)
        })
        .collect()
}

/// Whether the daemon holds image `name`.
fn have_image(s: &Session, name: &str) -> bool {
    s.client
        .call::<serde_json::Value>(
            "GET",
            &format!("/v1/images/{}", forkd_api::url::encode_segment(name)),
            None,
        )
        .is_ok()
}

/// Pulls `name` from its registry (a task's prebuilt `docker_image`), kept under the name
/// the task gives it.
fn pull_image(s: &Session, name: &str) -> anyhow::Result<()> {
    eprintln!("pull {name}");
    let body = serde_json::json!({ "reference": name, "name": name });
    let img: forkd_api::ImageInfo = s
        .client
        .call("POST", "/v1/images/pull", Some(&body))
        .map_err(|e| anyhow::anyhow!("pull {name}: {e}"))?;
    eprintln!(
        "pulled {name}: {} layers, {}",
        img.layers.len(),
        img.digest.as_deref().unwrap_or("-")
    );
    Ok(())
}

/// Makes every image the suite needs exist: a task's prebuilt image pulled from its
/// registry when the daemon lacks it (as Harbor's own backends do with `docker_image`),
/// else built from the task's Dockerfile (its base images imported from the fixture
/// cache first, or pulled), or imported from the fixture cache. Builds have egress
/// unless the task's network is `none`. Returns each image's layers.
pub fn ensure_images(s: &Session, tasks: &[Task]) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    // Images built from a task's Dockerfile: always when the task asks to rebuild,
    // otherwise only when the daemon lacks the image.
    let mut built = std::collections::BTreeSet::new();
    for t in tasks {
        let Some(ctx) = &t.config.task.build else {
            continue;
        };
        let name = &t.config.task.image;
        if built.contains(name) {
            continue;
        }
        let have = have_image(s, name);
        if have && !t.config.task.rebuild {
            continue;
        }
        // A prebuilt image named by the task comes from its registry when it can.
        if t.config.task.pull {
            match pull_image(s, name) {
                Ok(()) => continue,
                Err(e) => eprintln!("task {}: {e:#}; building it from its Dockerfile", t.name),
            }
        }
        let context = t.dir.join(ctx);
        for base in dockerfile_bases(&context.join("Dockerfile")) {
            import_from_cache(s, &base)?;
        }
        let network = t.config.environment.network.as_deref().unwrap_or("none") != "none";
        eprintln!(
            "build {name} from {}{}",
            context.join("Dockerfile").display(),
            if network { " (with network)" } else { "" }
        );
        let body = serde_json::json!({ "context": context, "name": name, "network": network });
        let r: forkd_api::BuildResult = s
            .client
            .call("POST", "/v1/images/build", Some(&body))
            .map_err(|e| anyhow::anyhow!("task {}: build {name}: {e}", t.name))?;
        let ran = r.steps.iter().filter(|x| x.cache == "miss").count();
        eprintln!(
            "built {name}: {ran} steps run, {} layers",
            r.image.layers.len()
        );
        built.insert(name.clone());
    }
    for name in tasks
        .iter()
        .map(|t| t.config.task.image.clone())
        .collect::<std::collections::BTreeSet<_>>()
    {
        import_from_cache(s, &name)?;
        let pull = tasks
            .iter()
            .any(|t| t.config.task.image == name && t.config.task.pull);
        if pull && !have_image(s, &name) {
            pull_image(s, &name).map_err(|e| {
                e.context(format!(
                    "image {name} is not in the daemon nor in {}",
                    forkd_api::defaults::cache().join("images").display()
                ))
            })?;
        }
        let info: serde_json::Value = s
            .client
            .call(
                "GET",
                &format!("/v1/images/{}", forkd_api::url::encode_segment(&name)),
                None,
            )
            .map_err(|e| {
                anyhow::anyhow!(
                    "image {name} is not in the daemon and not in {}: {e}",
                    forkd_api::defaults::cache().join("images").display()
                )
            })?;
        let layers = info["layers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        out.insert(name, layers);
    }
    Ok(out)
}

/// The clean start state of a task: built once (environment copied, set-up run,
/// background processes started) and cached as a checkpoint labelled with a key over the
/// task's files and image.
pub fn clean_state(s: &Session, task: &Task, image_layers: &[String]) -> anyhow::Result<String> {
    use sha2::Digest;
    // Whether it is live is part of what the state is.
    let key: String = sha2::Sha256::digest(
        format!(
            "{}|{}|{}|live={}",
            task.checksum,
            task.config.task.image,
            image_layers.join(","),
            task.config.live()
        )
        .as_bytes(),
    )
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect();
    for c in s.checkpoints()? {
        if c.labels.get("forkd.eval.clean").map(String::as_str) == Some(key.as_str()) {
            return Ok(c.id);
        }
    }
    let env = &task.config.environment;
    let wd = task.workdir();
    let sb = s.create(
        &task.config.task.image,
        &[("forkd.eval.task", &task.name)],
        env,
    )?;
    let built = (|| -> anyhow::Result<String> {
        // A build context went into the image; other environment files are copied in.
        if task.dir.join("environment").is_dir() && task.config.task.build.is_none() {
            s.put_dir(&sb, &task.dir.join("environment"), wd)?;
        } else {
            s.sh(&sb, &format!("mkdir -p {wd}"), "/", Some(60))?;
        }
        for line in &env.setup {
            let r = s.sh(&sb, line, wd, Some(1800))?;
            anyhow::ensure!(
                r.code == 0,
                "task {}: set-up step {line:?} exited {}: {}",
                task.name,
                r.code,
                r.err().trim()
            );
        }
        for (i, line) in env.background.iter().enumerate() {
            let req = forkd_api::ExecRequest {
                shell: Some(line.clone()),
                cwd: Some(wd.into()),
                detach: true,
                log: Some(format!("background-{i}")),
                ..Default::default()
            };
            s.exec(&sb, &req, None)?;
        }
        let mut started = !env.background.is_empty();
        if env.entrypoint {
            let name = forkd_api::url::encode_segment(&task.config.task.image);
            let img: forkd_api::ImageInfo = s
                .client
                .call("GET", &format!("/v1/images/{name}"), None)
                .map_err(|e| anyhow::anyhow!("task {}: image {name}: {e}", task.name))?;
            if !img.config.entrypoint.is_empty() {
                let mut argv = img.config.entrypoint.clone();
                argv.extend(["sh", "-c", "sleep infinity"].map(String::from));
                let req = forkd_api::ExecRequest {
                    argv,
                    detach: true,
                    log: Some("entrypoint".into()),
                    ..Default::default()
                };
                s.exec(&sb, &req, None)?;
                started = true;
            }
        }
        if let Some(check) = &env.ready {
            let deadline = std::time::Instant::now() + Duration::from_secs(env.ready_timeout_secs);
            loop {
                let r = s.sh(&sb, check, wd, Some(30))?;
                if r.code == 0 {
                    break;
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "task {}: the environment never became ready: {check:?} exited {} for {} s: {}",
                    task.name,
                    r.code,
                    env.ready_timeout_secs,
                    r.err().trim()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        } else if started {
            // Give the processes a moment to reach their steady state.
            std::thread::sleep(Duration::from_millis(500));
        }
        let c = s
            .checkpoint(
                &sb,
                task.config.live(),
                &[("forkd.eval.clean", &key), ("forkd.eval.task", &task.name)],
            )
            .map_err(|e| anyhow::anyhow!("task {}: the clean state: {}", task.name, e.0))?;
        Ok(c.id)
    })();
    s.remove(&sb);
    built
}
