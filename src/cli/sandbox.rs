//! `forkd run|ps|inspect|logs|stop|rm|cp`.

use super::exec::{build_request, ExecOpts};
use super::Ctx;
use crate::api::url::encode as url_encode;
use crate::api::SandboxInfo;
use clap::Args;
use std::path::Path;

#[derive(Args)]
pub struct RunArgs {
    /// Print the new sandbox's id and leave it running
    #[arg(short, long)]
    pub detach: bool,
    /// Remove the sandbox when the command ends
    #[arg(long)]
    pub rm: bool,
    #[arg(long)]
    pub hostname: Option<String>,
    /// Memory limit (e.g. 512m)
    #[arg(short, long)]
    pub memory: Option<String>,
    /// Maximum number of processes and threads
    #[arg(long)]
    pub pids_limit: Option<u64>,
    /// CPU limit in CPUs (e.g. 1.5)
    #[arg(long)]
    pub cpus: Option<f64>,
    /// What the sandbox may write to its filesystem (e.g. 10g); past it, writes fail
    /// with EDQUOT. Its image's layers and its checkpoints are not counted
    #[arg(long)]
    pub disk: Option<String>,
    /// Labels (KEY=VALUE)
    #[arg(short, long = "label")]
    pub labels: Vec<String>,
    /// What the sandbox may reach: none (loopback only), egress (the outside world,
    /// never the host or other sandboxes), or allowlist=HOST,... (IPv4 addresses,
    /// networks, or names resolved now)
    #[arg(long, default_value = "none", value_parser = clap::value_parser!(crate::api::Network))]
    pub network: crate::api::Network,
    /// Pull the image from its registry when it is not here (`missing`), or never
    #[arg(long, default_value = "missing", value_parser = ["missing", "never"])]
    pub pull: String,
    /// Security options: `seccomp=unconfined` runs the sandbox without the system-call
    /// filter (`seccomp=default` is the default); `no-new-privileges=false` lets setuid
    /// programs such as sudo take effect (`true`, the default, does not)
    #[arg(long = "security-opt", value_name = "OPT")]
    pub security_opt: Vec<String>,
    #[command(flatten)]
    pub opts: ExecOpts,
    pub image: String,
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// The system-call filter and whether setuid programs take effect, as `--security-opt`
/// asks (podman's and Docker's spelling); any other option is refused by name.
fn security_opts(opts: &[String]) -> anyhow::Result<(crate::api::Seccomp, bool)> {
    let mut seccomp = crate::api::Seccomp::Default;
    let mut setuid = false;
    for o in opts {
        match o.split_once(['=', ':']) {
            Some(("seccomp", v)) => seccomp = v.parse().map_err(anyhow::Error::msg)?,
            None if o == "no-new-privileges" => setuid = false,
            Some(("no-new-privileges", "true")) => setuid = false,
            Some(("no-new-privileges", "false")) => setuid = true,
            _ => anyhow::bail!(
                "--security-opt {o:?} is not supported: forkd knows seccomp=default, seccomp=unconfined and no-new-privileges[=true|false]"
            ),
        }
    }
    Ok((seccomp, setuid))
}

pub fn run(ctx: &Ctx, args: RunArgs) -> anyhow::Result<i32> {
    if args.detach && args.rm {
        anyhow::bail!(
            "--rm and -d cannot be used together: a detached sandbox is removed with forkd rm"
        );
    }
    let limits = crate::api::Limits {
        memory_bytes: super::parse_size_opt(args.memory.as_deref())?,
        pids: args.pids_limit,
        cpu_millis: args.cpus.map(|c| (c * 1000.0) as u64),
        disk_bytes: super::parse_size_opt(args.disk.as_deref())?,
    };
    let detached_cmd = args.detach && !args.command.is_empty();
    let (seccomp, setuid) = security_opts(&args.security_opt)?;
    let mut body = crate::api::CreateSandboxRequest {
        image: args.image.clone(),
        hostname: args.hostname.clone(),
        limits,
        labels: super::checkpoint::labels(&args.labels)?,
        network: args.network.clone(),
        seccomp,
        setuid,
        expires_in_secs: None,
        command: detached_cmd.then(|| build_request(&args.opts, &args.command)),
    };
    let info: SandboxInfo = match ctx.client.send("POST", "/v1/sandboxes", &body) {
        // As `docker run` does: an image that is not here is pulled, then created again.
        Err(crate::client::ClientError::Api(e))
            if args.pull == "missing"
                && e.kind == crate::api::ErrorKind::NotFound
                && e.message.contains("no such image") =>
        {
            eprintln!("{}; pulling it", e.message);
            let pull = crate::api::PullRequest {
                reference: args.image.clone(),
                ..Default::default()
            };
            let img: crate::api::ImageInfo = ctx.client.send("POST", "/v1/images/pull", &pull)?;
            body.image = img.name;
            ctx.client.send("POST", "/v1/sandboxes", &body)?
        }
        other => other?,
    };
    if args.detach {
        if ctx.json {
            ctx.print_json(&info);
        } else {
            println!("{}", info.id);
        }
        return Ok(0);
    }
    let command = if args.command.is_empty() {
        vec!["/bin/sh".to_string()]
    } else {
        args.command.clone()
    };
    let code = super::exec::stream(ctx, &info.id, &build_request(&args.opts, &command));
    // Like a container whose main process ended, the sandbox stops (or goes, with --rm).
    let path = if args.rm {
        format!("/v1/sandboxes/{}?force=true", info.id)
    } else {
        format!("/v1/sandboxes/{}/stop", info.id)
    };
    let _: serde_json::Value = if args.rm {
        ctx.client.call("DELETE", &path, None)?
    } else {
        ctx.client
            .send("POST", &path, &crate::api::StopRequest::default())?
    };
    code
}

/// What `forkd ps` shows of a sandbox, read from a list's JSON in place: a list of
/// thousands is some 400 bytes a sandbox, and decoding only these fields, borrowed
/// from the body, is a fraction of decoding every description whole.
#[derive(serde::Deserialize)]
struct PsRow<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    image: std::borrow::Cow<'a, str>,
    status: crate::api::SandboxStatus,
    init_pid: Option<i32>,
    #[serde(borrow)]
    hostname: std::borrow::Cow<'a, str>,
    memory_bytes: Option<u64>,
}

pub fn ps(ctx: &Ctx, quiet: bool, all: bool, stats: bool) -> anyhow::Result<i32> {
    let path = if stats {
        "/v1/sandboxes?stats=true"
    } else {
        "/v1/sandboxes"
    };
    let shown = |s: crate::api::SandboxStatus| all || s != crate::api::SandboxStatus::Stopped;
    if ctx.json {
        let list: Vec<SandboxInfo> = ctx.client.call("GET", path, None)?;
        let list: Vec<_> = list.into_iter().filter(|s| shown(s.status)).collect();
        ctx.print_json(&list);
        return Ok(0);
    }
    let resp = ctx.client.raw("GET", path, &[])?;
    if resp.status >= 400 {
        return Err(crate::client::Client::api_error(&resp).into());
    }
    let list: Vec<PsRow> = serde_json::from_slice(&resp.body)
        .map_err(|e| anyhow::anyhow!("decode the list of sandboxes: {e}"))?;
    let list = list.into_iter().filter(|s| shown(s.status));
    // The table is written at once, and a reader that stops early (`| head`) ends the
    // listing quietly.
    let mut text = String::new();
    use std::fmt::Write as _;
    if quiet {
        list.for_each(|s| {
            let _ = writeln!(text, "{}", s.id);
        });
    } else {
        let memory = if stats {
            format!(" {:>10}", "MEMORY")
        } else {
            String::new()
        };
        let _ = writeln!(
            text,
            "{:<16}  {:<24} {:<8} {:>8}{memory}  HOSTNAME",
            "ID", "IMAGE", "STATUS", "PID"
        );
        for s in list {
            let mem = match (stats, s.memory_bytes) {
                (false, _) => String::new(),
                (true, Some(b)) => format!(" {:>10}", format!("{:.1}M", b as f64 / 1048576.0)),
                (true, None) => format!(" {:>10}", "-"),
            };
            let pid = s
                .init_pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                text,
                "{:<16}  {:<24} {:<8} {:>8}{mem}  {}",
                s.id,
                s.image,
                s.status.to_string(),
                pid,
                s.hostname
            );
        }
    }
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    Ok(0)
}

pub fn inspect(ctx: &Ctx, ids: &[String]) -> anyhow::Result<i32> {
    let mut out = Vec::new();
    for id in ids {
        let info: serde_json::Value =
            ctx.client
                .call("GET", &format!("/v1/sandboxes/{id}"), None)?;
        out.push(info);
    }
    ctx.print_json(&out);
    Ok(0)
}

pub fn logs(ctx: &Ctx, id: &str, name: &str) -> anyhow::Result<i32> {
    let resp = ctx.client.raw(
        "GET",
        &format!("/v1/sandboxes/{id}/logs?name={}", url_encode(name)),
        &[],
    )?;
    if resp.status >= 400 {
        return Err(crate::client::Client::api_error(&resp).into());
    }
    use std::io::Write;
    std::io::stdout().write_all(&resp.body)?;
    Ok(0)
}

pub fn stop(ctx: &Ctx, grace: u64, ids: &[String]) -> anyhow::Result<i32> {
    for id in ids {
        let body = crate::api::StopRequest {
            grace_secs: Some(grace),
        };
        let _: SandboxInfo = ctx
            .client
            .send("POST", &format!("/v1/sandboxes/{id}/stop"), &body)?;
        println!("{id}");
    }
    Ok(0)
}

pub fn rm(ctx: &Ctx, force: bool, ids: &[String]) -> anyhow::Result<i32> {
    for id in ids {
        let _: serde_json::Value =
            ctx.client
                .call("DELETE", &format!("/v1/sandboxes/{id}?force={force}"), None)?;
        println!("{id}");
    }
    Ok(0)
}

/// Splits `SANDBOX:/path`; a bare path (or one starting with `.` or `/`) is local.
fn remote(spec: &str) -> Option<(&str, &str)> {
    if spec.starts_with('/') || spec.starts_with('.') {
        return None;
    }
    spec.split_once(':')
        .filter(|(id, p)| !id.is_empty() && p.starts_with('/'))
}

pub fn cp(ctx: &Ctx, src: &str, dest: &str) -> anyhow::Result<i32> {
    match (remote(src), remote(dest)) {
        (None, Some((id, path))) => {
            let local = Path::new(src);
            let meta =
                std::fs::symlink_metadata(local).map_err(|e| anyhow::anyhow!("{src}: {e}"))?;
            let name = local
                .file_name()
                .map(|n| n.to_owned())
                .unwrap_or_else(|| ".".into());
            let mut b = tar::Builder::new(Vec::new());
            b.follow_symlinks(false);
            if meta.is_dir() {
                b.append_dir_all(&name, local)?;
            } else {
                b.append_path_with_name(local, &name)?;
            }
            let body = b.into_inner()?;
            let resp = ctx.client.raw(
                "PUT",
                &format!("/v1/sandboxes/{id}/files?path={}", url_encode(path)),
                &body,
            )?;
            let _: serde_json::Value = crate::client::Client::decode(resp)?;
            Ok(0)
        }
        (Some((id, path)), None) => {
            let resp = ctx.client.raw(
                "GET",
                &format!("/v1/sandboxes/{id}/files?path={}", url_encode(path)),
                &[],
            )?;
            if resp.status >= 400 {
                return Err(crate::client::Client::api_error(&resp).into());
            }
            unpack_local(&resp.body, Path::new(path), Path::new(dest))?;
            Ok(0)
        }
        (Some(_), Some(_)) => {
            anyhow::bail!("copying between two sandboxes is not supported; copy through the host")
        }
        (None, None) => anyhow::bail!("one of SRC and DEST must be SANDBOX:/absolute/path"),
    }
}

/// Unpacks a tar whose top entry is the copied item: into `dest` when it is a
/// directory, else as `dest`. The archive comes from the sandbox, so it is unpacked as
/// an untrusted one (`forkd_sandbox::files::Side::Host`).
fn unpack_local(tar_bytes: &[u8], src: &Path, dest: &Path) -> anyhow::Result<()> {
    // A relative destination is the working directory's, never the root's.
    let dest = std::path::absolute(dest).map_err(|e| anyhow::anyhow!("{}: {e}", dest.display()))?;
    // The archive's top entry is the source's last component (`.` for the root).
    let top = src.file_name().map(Path::new).unwrap_or(Path::new("."));
    forkd_sandbox::files::unpack(&dest, tar_bytes, forkd_sandbox::files::Side::Host { top })
        .map_err(|e| anyhow::anyhow!("{}: {e}", dest.display()))?;
    Ok(())
}
