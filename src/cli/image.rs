//! `forkd image import|build|pull|ls|rm|inspect`.

use super::Ctx;
use crate::api::url::encode_segment as url_encode_segment;
use crate::api::{
    BuildRequest, BuildResult, BuildStatus, BuildStep, ImageInfo, PullRequest, PullStatus,
};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Import a rootfs directory, a tarball (plain, gzip, zstd), an OCI layout or a docker-save archive
    Import {
        source: String,
        #[arg(long)]
        name: String,
    },
    /// Build an image from a Dockerfile; each step runs in a sandbox and is cached
    Build {
        /// The build context directory
        context: String,
        /// The image to make
        #[arg(short = 't', long = "tag")]
        name: String,
        /// The Dockerfile (default CONTEXT/Dockerfile)
        #[arg(short = 'f', long = "file")]
        dockerfile: Option<String>,
        /// NAME=VALUE for an ARG (repeatable)
        #[arg(long = "build-arg")]
        build_args: Vec<String>,
        /// The stage to build (default: the last)
        #[arg(long)]
        target: Option<String>,
        /// Run every step, ignoring the step cache
        #[arg(long)]
        no_cache: bool,
        /// Kill a RUN step (and fail the build) after this many seconds
        #[arg(long, value_name = "SECS")]
        step_timeout: Option<u64>,
        /// RUN steps' network: `none` (loopback only) or `egress` (the outside world
        /// through NAT, never the host or other sandboxes)
        #[arg(long, default_value = "none", value_parser = ["none", "egress"])]
        network: String,
    },
    /// Pull an image from a registry (Docker Hub, a registry of your own, a mirror)
    Pull {
        /// [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]; short names as podman resolves them
        reference: String,
        /// OS/ARCH[/VARIANT] of the image to take from a multi-platform index
        #[arg(long, default_value = "linux/amd64")]
        platform: String,
        /// The image's name here (default: the fully qualified reference)
        #[arg(long)]
        name: Option<String>,
    },
    /// List images
    Ls {
        #[arg(short, long)]
        quiet: bool,
    },
    /// Remove images (refused while a sandbox uses them)
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Show an image's details
    Inspect { name: String },
}

pub fn run(ctx: &Ctx, cmd: ImageCmd) -> anyhow::Result<i32> {
    match cmd {
        ImageCmd::Import { source, name } => {
            let abs = std::fs::canonicalize(&source)
                .map_err(|e| anyhow::anyhow!("image source {source}: {e}"))?;
            eprintln!("importing {} as {name} ...", abs.display());
            let t = std::time::Instant::now();
            let body = crate::api::ImportImageRequest {
                source: super::utf8_path(&abs)?,
                name,
            };
            let img: ImageInfo = ctx.client.send("POST", "/v1/images", &body)?;
            if ctx.json {
                ctx.print_json(&img);
            } else {
                eprintln!(
                    "imported {} ({} layers) in {:.1}s",
                    img.name,
                    img.layers.len(),
                    t.elapsed().as_secs_f64()
                );
                println!("{}", img.name);
            }
        }
        ImageCmd::Build {
            context,
            name,
            dockerfile,
            build_args,
            target,
            no_cache,
            step_timeout,
            network,
        } => {
            let abs = std::fs::canonicalize(&context)
                .map_err(|e| anyhow::anyhow!("build context {context}: {e}"))?;
            // A Dockerfile named on the command line is relative to where forkd runs.
            let dockerfile = dockerfile
                .map(|f| {
                    std::fs::canonicalize(&f)
                        .map(|p| p.display().to_string())
                        .map_err(|e| anyhow::anyhow!("Dockerfile {f}: {e}"))
                })
                .transpose()?;
            let mut args = std::collections::BTreeMap::new();
            for a in build_args {
                let (k, v) = match a.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    // Docker's `--build-arg NAME` takes the value from the environment.
                    None => match std::env::var(&a) {
                        Ok(v) => (a.clone(), v),
                        Err(_) => anyhow::bail!(
                            "--build-arg {a}: give NAME=VALUE, or set {a} in the environment"
                        ),
                    },
                };
                args.insert(k, v);
            }
            let req = BuildRequest {
                context: abs.display().to_string(),
                dockerfile,
                name: name.clone(),
                build_args: args,
                target,
                no_cache,
                step_timeout_secs: step_timeout,
                network: network == "egress",
                ..Default::default()
            };
            let file = req
                .dockerfile
                .as_ref()
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| abs.join("Dockerfile"));
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let auth = caller_credentials(&images_named(&text))?;
            let headers: Vec<(&str, &str)> = auth
                .iter()
                .map(|v| (crate::api::registry_auth::HEADER, v.as_str()))
                .collect();
            let progress = if ctx.json {
                None
            } else {
                Some(watch_build(ctx, &name))
            };
            let res: Result<BuildResult, _> =
                ctx.client
                    .send_with("POST", "/v1/images/build", &headers, &req);
            if let Some((stop, handle)) = progress {
                drop(stop);
                let shown = handle.join().unwrap_or(0);
                if let Ok(r) = &res {
                    for s in &r.steps[shown.min(r.steps.len())..] {
                        print_step(s);
                    }
                }
            }
            let r = res?;
            if ctx.json {
                ctx.print_json(&r);
            } else {
                let hits = r.steps.iter().filter(|s| s.cache == "hit").count();
                let ran = r.steps.iter().filter(|s| s.cache == "miss").count();
                eprintln!(
                    "built {} ({} layers; {ran} steps run, {hits} from cache) in {:.2}s",
                    r.image.name,
                    r.image.layers.len(),
                    r.duration_us as f64 / 1e6
                );
                println!("{}", r.image.name);
            }
        }
        ImageCmd::Pull {
            reference,
            platform,
            name,
        } => {
            let req = PullRequest {
                reference: reference.clone(),
                platform: Some(platform),
                name,
            };
            let auth = caller_credentials(&[reference.as_str()])?;
            let headers: Vec<(&str, &str)> = auth
                .iter()
                .map(|v| (crate::api::registry_auth::HEADER, v.as_str()))
                .collect();
            let progress = (!ctx.json).then(|| watch_pull(ctx, &reference));
            let t = std::time::Instant::now();
            let res: Result<ImageInfo, _> =
                ctx.client
                    .send_with("POST", "/v1/images/pull", &headers, &req);
            if let Some((stop, handle)) = progress {
                drop(stop);
                let _ = handle.join();
            }
            let img = res?;
            if ctx.json {
                ctx.print_json(&img);
            } else {
                eprintln!(
                    "pulled {} ({} layers, {}) in {:.1}s",
                    img.name,
                    img.layers.len(),
                    img.digest.as_deref().unwrap_or("-"),
                    t.elapsed().as_secs_f64()
                );
                println!("{}", img.name);
            }
        }
        ImageCmd::Ls { quiet } => {
            let imgs: Vec<ImageInfo> = ctx.client.call("GET", "/v1/images", None)?;
            if ctx.json {
                ctx.print_json(&imgs);
            } else if quiet {
                imgs.iter().for_each(|i| println!("{}", i.name));
            } else {
                println!(
                    "{:<40} {:>6} {:>9}  {:<19}  SOURCE",
                    "NAME", "LAYERS", "SANDBOXES", "DIGEST"
                );
                for i in imgs {
                    let digest = match &i.digest {
                        Some(d) => d.chars().take(19).collect(),
                        None => "-".to_string(),
                    };
                    println!(
                        "{:<40} {:>6} {:>9}  {:<19}  {}",
                        i.name,
                        i.layers.len(),
                        i.used_by.len(),
                        digest,
                        i.source
                    );
                }
            }
        }
        ImageCmd::Rm { names } => {
            for n in names {
                let _: serde_json::Value = ctx.client.call(
                    "DELETE",
                    &format!("/v1/images/{}", url_encode_segment(&n)),
                    None,
                )?;
                println!("{n}");
            }
        }
        ImageCmd::Inspect { name } => {
            let img: ImageInfo = ctx.client.call(
                "GET",
                &format!("/v1/images/{}", url_encode_segment(&name)),
                None,
            )?;
            ctx.print_json(&img);
        }
    }
    Ok(0)
}

fn print_step(s: &BuildStep) {
    let first = s.instruction.lines().next().unwrap_or("");
    let shown: String = first.chars().take(100).collect();
    let what = match s.cache.as_str() {
        "hit" => "cached".to_string(),
        "miss" => format!("{:.2}s", s.duration_us as f64 / 1e6),
        _ => String::new(),
    };
    eprintln!("[{}] line {:>3}  {shown}  {what}", s.stage, s.line);
}

/// Prints a build's steps as the daemon finishes them (polling `GET /v1/builds`);
/// returns how many it printed when told to stop (a send on the channel, or its drop).
fn watch_build(
    ctx: &Ctx,
    name: &str,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<usize>) {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let client = ctx.client.clone();
    let name = name.to_string();
    let handle = std::thread::spawn(move || {
        let mut shown = 0;
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            stopped.recv_timeout(std::time::Duration::from_millis(100))
        {
            let Ok(builds) = client.call::<Vec<BuildStatus>>("GET", "/v1/builds", None) else {
                continue;
            };
            if let Some(b) = builds.iter().find(|b| b.name == name) {
                for s in &b.steps[shown.min(b.steps.len())..] {
                    print_step(s);
                }
                shown = shown.max(b.steps.len());
            }
        }
        shown
    });
    (stop, handle)
}

/// Prints a pull's layers as the daemon reports them (polling `GET /v1/pulls`): a line
/// when a layer starts, and one when it ends.
fn watch_pull(
    ctx: &Ctx,
    reference: &str,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let client = ctx.client.clone();
    let reference = reference.to_string();
    let handle = std::thread::spawn(move || {
        let mut shown: std::collections::HashMap<String, String> = Default::default();
        let mut last_report = std::time::Instant::now();
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            stopped.recv_timeout(std::time::Duration::from_millis(200))
        {
            let Ok(pulls) = client.call::<Vec<PullStatus>>("GET", "/v1/pulls", None) else {
                continue;
            };
            let Some(p) = pulls.iter().find(|p| p.reference == reference) else {
                continue;
            };
            let periodic = last_report.elapsed().as_secs() >= 5;
            for l in &p.layers {
                let short: String = l.digest.chars().take(19).collect();
                if shown.get(&l.digest) != Some(&l.state) || (periodic && l.state == "fetching") {
                    eprintln!(
                        "{short}  {:<8}  {:>7.1} / {:.1} MiB",
                        l.state,
                        l.done as f64 / 1048576.0,
                        l.size as f64 / 1048576.0
                    );
                    shown.insert(l.digest.clone(), l.state.clone());
                }
            }
            if periodic {
                last_report = std::time::Instant::now();
            }
        }
    });
    (stop, handle)
}

/// The images a Dockerfile's `FROM` and `COPY --from`/`ADD --from` lines name, as
/// written (a stage's name too, and `scratch`: short names send no credentials). A name
/// with a `$` is the build's to expand, and left out.
fn images_named(dockerfile: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in dockerfile.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        let Some(instruction) = words.next() else {
            continue;
        };
        let named = if instruction.eq_ignore_ascii_case("FROM") {
            words.find(|w| !w.starts_with("--"))
        } else if instruction.eq_ignore_ascii_case("COPY")
            || instruction.eq_ignore_ascii_case("ADD")
        {
            words.find_map(|w| w.strip_prefix("--from="))
        } else {
            None
        };
        if let Some(image) = named.filter(|i| !i.contains('$')) {
            out.push(image);
        }
    }
    out
}

/// The `X-Registry-Config` a pull of `references` carries (or a build whose images they
/// are): the caller's own credentials for each one's registry (REGISTRY_AUTH_FILE, the
/// containers auth files, Docker's config and its helpers), as podman-remote and docker
/// send theirs. None when the caller has none, or every name is short: the daemon's own
/// files are used then.
fn caller_credentials(references: &[&str]) -> anyhow::Result<Option<String>> {
    let mut config = crate::api::registry_auth::RegistryConfig::new();
    for reference in references {
        let (registry, c) = match forkd_registry::auth::for_reference(reference) {
            Ok(Some(found)) => found,
            // A name that is not a reference (a stage's) has no registry either.
            Ok(None) | Err(forkd_registry::RegistryError::BadReference { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        config.entry(registry).or_insert_with(|| registry_auth(c));
    }
    Ok((!config.is_empty()).then(|| crate::api::registry_auth::encode(&config)))
}

fn registry_auth(c: forkd_registry::auth::Credential) -> crate::api::registry_auth::RegistryAuth {
    if c.identity_token {
        crate::api::registry_auth::RegistryAuth {
            username: Some(c.username),
            identitytoken: Some(c.secret),
            from: Some(c.from),
            ..Default::default()
        }
    } else {
        crate::api::registry_auth::RegistryAuth {
            username: Some(c.username),
            password: Some(c.secret),
            from: Some(c.from),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dockerfile_names_its_images() {
        let f = "FROM --platform=linux/amd64 reg.example:5000/base:1 AS build\n\
                 RUN make\n\
                 from scratch\n\
                 COPY --from=build /out /out\n\
                 COPY --from=ghcr.io/astral-sh/uv:0.5 /uv /bin/uv\n\
                 FROM ${BASE}\n";
        assert_eq!(
            super::images_named(f),
            [
                "reg.example:5000/base:1",
                "scratch",
                "build",
                "ghcr.io/astral-sh/uv:0.5"
            ]
        );
    }
}
