//! The daemon under test: [`DaemonGuard`], a thin wrapper over
//! [`forkd::private_daemon::PrivateDaemon`] with the API calls the benchmarks make.

use super::env::{check_interrupted, unique_temp_dir};
use super::host::rss_kib;
use anyhow::{anyhow, bail, Context, Result};
use forkd::api::{CheckpointInfo, ForkResult, ImageInfo, SandboxInfo};
use forkd::client::Client;
use forkd::private_daemon::{Options, PrivateDaemon};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A `forkd daemon` on a fresh temporary state root and socket: the product's one
/// private-daemon harness ([`forkd::private_daemon`]) with the benchmarks' helpers on top.
/// Dropping it (or [`DaemonGuard::stop`]) removes every sandbox and checkpoint through
/// the API, stops the daemon and deletes the temporary directory once nothing is mounted
/// below it.
pub struct DaemonGuard {
    /// The temporary directory holding `root/`, the socket and `daemon.log`.
    pub dir: PathBuf,
    pub root: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    daemon: PrivateDaemon,
}

pub use forkd::private_daemon::Cleanup;

impl DaemonGuard {
    /// Starts `bin daemon` and waits until it answers `GET /v1/version`.
    pub fn start(bin: &Path) -> Result<DaemonGuard> {
        Self::start_with_env(bin, &[])
    }

    /// [`DaemonGuard::start`] with extra environment for the daemon.
    pub fn start_with_env(bin: &Path, env: &[(&str, &str)]) -> Result<DaemonGuard> {
        let dir = unique_temp_dir("forkd-bench")?;
        let mut opts = Options::new(bin, &dir);
        for (k, v) in env {
            opts = opts.env(k, v);
        }
        // Its own process group: a Ctrl-C at the terminal must reach the benchmark
        // only, so that the daemon is still there to remove the sandboxes.
        opts.own_process_group = true;
        let daemon = PrivateDaemon::start(opts, || check_interrupted().map_err(|e| e.to_string()))
            .map_err(|e| anyhow!(e))?;
        Ok(DaemonGuard {
            dir,
            root: daemon.root.clone(),
            socket: daemon.socket.clone(),
            log: daemon.log.clone(),
            daemon,
        })
    }

    pub fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    pub fn pid(&self) -> Result<u32> {
        self.daemon
            .pid()
            .ok_or_else(|| anyhow!("the daemon is not running"))
    }

    /// The daemon's resident set size (VmRSS), KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        rss_kib(self.pid()?)
    }

    /// The last `n` lines of the daemon's log.
    pub fn log_tail(&self, n: usize) -> String {
        self.daemon.log_tail(n)
    }

    /// Creates a sandbox from `image`.
    pub fn create(&self, image: &str) -> Result<SandboxInfo> {
        self.client()
            .call("POST", "/v1/sandboxes", Some(&json!({ "image": image })))
            .with_context(|| format!("create a sandbox from {image}"))
    }

    /// Runs `argv` to completion in a sandbox; fails unless it exits 0.
    pub fn exec_ok(&self, id: &str, argv: &[&str]) -> Result<forkd::api::ExecResult> {
        let r: forkd::api::ExecResult = self
            .client()
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({ "argv": argv })),
            )
            .with_context(|| format!("exec {argv:?} in sandbox {id}"))?;
        if r.exit.exit_code != 0 {
            bail!(
                "exec {argv:?} in sandbox {id} exited {}: {}",
                r.exit.exit_code,
                String::from_utf8_lossy(
                    &forkd::api::b64::decode(&r.stderr_b64).unwrap_or_default()
                )
            );
        }
        Ok(r)
    }

    /// Removes a sandbox, stopping it first.
    pub fn remove(&self, id: &str) -> Result<()> {
        let _: Value = self
            .client()
            .call("DELETE", &format!("/v1/sandboxes/{id}?force=true"), None)
            .with_context(|| format!("remove sandbox {id}"))?;
        Ok(())
    }

    /// Imports an image from a path on this host; returns how long it took.
    pub fn import(&self, source: &Path, name: &str) -> Result<Duration> {
        let t = Instant::now();
        let _: ImageInfo = self
            .client()
            .call(
                "POST",
                "/v1/images",
                Some(&json!({ "source": source.display().to_string(), "name": name })),
            )
            .with_context(|| format!("import {} as {name}", source.display()))?;
        Ok(t.elapsed())
    }

    /// Creates a sandbox from a full `POST /v1/sandboxes` body.
    pub fn create_with(&self, body: &Value) -> Result<SandboxInfo> {
        self.client()
            .call("POST", "/v1/sandboxes", Some(body))
            .with_context(|| format!("create a sandbox ({body})"))
    }

    pub fn inspect(&self, id: &str) -> Result<SandboxInfo> {
        self.client()
            .call("GET", &format!("/v1/sandboxes/{id}"), None)
            .with_context(|| format!("inspect sandbox {id}"))
    }

    /// Runs a shell line to completion in a sandbox; fails unless it exits 0. Returns
    /// its standard output.
    pub fn sh_ok(&self, id: &str, line: &str) -> Result<String> {
        let r: forkd::api::ExecResult = self
            .client()
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({ "shell": line })),
            )
            .with_context(|| format!("exec {line:?} in sandbox {id}"))?;
        let text = |b: &str| {
            String::from_utf8_lossy(&forkd::api::b64::decode(b).unwrap_or_default()).to_string()
        };
        if r.exit.exit_code != 0 {
            bail!(
                "exec {line:?} in sandbox {id} exited {}: {}",
                r.exit.exit_code,
                text(&r.stderr_b64).trim()
            );
        }
        Ok(text(&r.stdout_b64))
    }

    /// Starts `argv` in the background in a sandbox (output in its log `log`); returns
    /// the pid inside the sandbox.
    pub fn exec_detached(&self, id: &str, argv: &[&str], log: &str) -> Result<i32> {
        let r: forkd::api::ExecResult = self
            .client()
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&json!({ "argv": argv, "detach": true, "log": log })),
            )
            .with_context(|| format!("start {argv:?} detached in sandbox {id}"))?;
        Ok(r.pid)
    }

    /// Copies host files into directory `dir` of a sandbox (a tar through the files API).
    pub fn put_files(&self, id: &str, dir: &str, files: &[&Path]) -> Result<()> {
        self.sh_ok(id, &format!("mkdir -p '{dir}'"))?;
        let mut tar = tar::Builder::new(Vec::new());
        for f in files {
            let name = f
                .file_name()
                .ok_or_else(|| anyhow!("{} has no file name", f.display()))?;
            tar.append_path_with_name(f, name)
                .with_context(|| format!("tar {}", f.display()))?;
        }
        let body = tar.into_inner().context("finish tar")?;
        let resp = self
            .client()
            .raw(
                "PUT",
                &format!("/v1/sandboxes/{id}/files?path={dir}"),
                &body,
            )
            .with_context(|| format!("PUT files into {dir} of sandbox {id}"))?;
        if resp.status != 200 {
            bail!(
                "PUT files into {dir} of sandbox {id}: {} {}",
                resp.status,
                String::from_utf8_lossy(&resp.body)
            );
        }
        Ok(())
    }

    /// `POST /v1/sandboxes/{id}/checkpoint`.
    pub fn checkpoint(&self, id: &str, live: bool, stop: bool) -> Result<CheckpointInfo> {
        self.client()
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/checkpoint"),
                Some(&json!({ "live": live, "stop": stop })),
            )
            .with_context(|| {
                format!(
                    "{} checkpoint of sandbox {id}",
                    if live { "live" } else { "filesystem" }
                )
            })
    }

    /// `POST /v1/checkpoints/{id}/fork`.
    pub fn fork(&self, checkpoint: &str, count: usize, lazy: bool) -> Result<ForkResult> {
        self.fork_with(
            checkpoint,
            &forkd::api::ForkRequest {
                count: Some(count),
                lazy,
                ..Default::default()
            },
        )
    }

    /// A fork as `req` asks.
    pub fn fork_with(&self, checkpoint: &str, req: &forkd::api::ForkRequest) -> Result<ForkResult> {
        self.client()
            .call(
                "POST",
                &format!("/v1/checkpoints/{checkpoint}/fork"),
                Some(&serde_json::to_value(req)?),
            )
            .with_context(|| {
                format!(
                    "fork {} {} branches of checkpoint {checkpoint}",
                    req.count.unwrap_or(1),
                    if req.lazy { "lazy" } else { "eager" }
                )
            })
    }

    /// Removes a checkpoint and whatever still uses it (`force`).
    pub fn remove_checkpoint(&self, id: &str) -> Result<()> {
        let _: Value = self
            .client()
            .call("DELETE", &format!("/v1/checkpoints/{id}?force=true"), None)
            .with_context(|| format!("remove checkpoint {id}"))?;
        Ok(())
    }

    /// Removes all sandboxes and checkpoints, stops the daemon and deletes the
    /// temporary directory; says what it found on stderr.
    pub fn stop(mut self) -> Cleanup {
        let cleanup = self.daemon.shutdown();
        if cleanup.sandboxes_removed + cleanup.checkpoints_removed > 0 {
            eprintln!(
                "cleanup: removed {} sandboxes and {} checkpoints",
                cleanup.sandboxes_removed, cleanup.checkpoints_removed
            );
        }
        for p in &cleanup.problems {
            eprintln!("cleanup: {p}");
        }
        cleanup
    }
}
