//! A `forkd daemon` of one's own: started on a state root and socket of the caller's
//! choosing, ready when it answers (the client's one readiness rule), and taken down
//! cleanly. The one harness for whoever needs a daemon for a while: the demo
//! (`forkd demo`), the integration tests (`tests/common`) and the benchmarks
//! (`benches/common`).
//!
//! Taking it down removes what it holds through its own API, in the order it needs:
//! sandboxes first (they outlive their daemon by design), then checkpoints (read-only
//! snapshots on the daemon's volume, which a recursive delete could not remove), then
//! SIGTERM, and SIGKILL after a grace period; last the directory, once nothing is
//! mounted below it. A caller may keep the state (checkpoints and directory) instead.

use crate::api::{CheckpointInfo, SandboxInfo};
use crate::client::{Client, ClientError};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to start one.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `forkd` binary.
    pub bin: PathBuf,
    /// The directory that holds the state root (`root/`), the socket (`forkd.sock`) and
    /// the log (`daemon.log`, appended to by every start).
    pub dir: PathBuf,
    /// The state root, when it is not `DIR/root`.
    pub root: Option<PathBuf>,
    /// Extra environment for the daemon.
    pub env: Vec<(OsString, OsString)>,
    /// Put the daemon in a process group of its own, so that a Ctrl-C at the terminal
    /// reaches the caller only and the daemon is still there to clean up.
    pub own_process_group: bool,
    /// How long to wait for the first answer.
    pub ready_within: Duration,
    /// Keep the state when taken down: the checkpoints and the directory (the demo's
    /// root is a cache; a failed test's is evidence). Otherwise both are deleted, the
    /// directory only if nothing is mounted below it.
    pub keep_state: bool,
}

impl Options {
    pub fn new(bin: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> Options {
        Options {
            bin: bin.into(),
            dir: dir.into(),
            root: None,
            env: Vec::new(),
            own_process_group: false,
            ready_within: Duration::from_secs(60),
            keep_state: false,
        }
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Options {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// What taking it down found and did.
#[derive(Debug, Default)]
pub struct Cleanup {
    pub sandboxes_removed: usize,
    pub checkpoints_removed: usize,
    /// Everything that did not go as it should, one line each.
    pub problems: Vec<String>,
    /// The daemon's whole log, read after it stopped.
    pub log: String,
}

/// A running private daemon. Dropping it takes it down ([`PrivateDaemon::shutdown`]).
pub struct PrivateDaemon {
    pub dir: PathBuf,
    pub root: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    opts: Options,
    child: Option<Child>,
}

impl PrivateDaemon {
    /// Starts the daemon and waits until it answers. `still_starting` is asked between
    /// attempts (as [`Client::wait_ready`] does) and may return why to give up.
    pub fn start(
        opts: Options,
        still_starting: impl FnMut() -> Result<(), String>,
    ) -> Result<PrivateDaemon, String> {
        std::fs::create_dir_all(&opts.dir)
            .map_err(|e| format!("create {}: {e}", opts.dir.display()))?;
        let mut d = PrivateDaemon {
            root: opts.root.clone().unwrap_or_else(|| opts.dir.join("root")),
            socket: opts.dir.join("forkd.sock"),
            log: opts.dir.join("daemon.log"),
            dir: opts.dir.clone(),
            opts,
            child: None,
        };
        d.respawn(still_starting)?;
        Ok(d)
    }

    /// Starts the daemon again on the same root and socket (after [`kill9`], say) and
    /// waits until it answers.
    ///
    /// [`kill9`]: PrivateDaemon::kill9
    pub fn respawn(
        &mut self,
        mut still_starting: impl FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        if self.child.is_some() {
            return Err("the daemon is running already".into());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("open {}: {e}", self.log.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let mut cmd = Command::new(&self.opts.bin);
        cmd.arg("daemon")
            .env("FORKD_ROOT", &self.root)
            .env("FORKD_SOCKET", &self.socket)
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        if self.opts.own_process_group {
            cmd.process_group(0);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("start {} daemon: {e}", self.opts.bin.display()))?;
        let mut exited = false;
        let ready = self.client().wait_ready(self.opts.ready_within, || {
            still_starting()?;
            match child.try_wait() {
                Ok(Some(status)) => {
                    exited = true;
                    Err(format!("the daemon exited during start-up ({status})"))
                }
                _ => Ok(()),
            }
        });
        if exited {
            let _ = child.wait();
        } else {
            // Kept even when it did not answer: taking it down still stops it.
            self.child = Some(child);
        }
        ready.map_err(|e| {
            format!(
                "{e}; its log ({}):\n{}",
                self.log.display(),
                self.log_tail(20)
            )
        })
    }

    /// See [`Options::keep_state`].
    pub fn set_keep_state(&mut self, keep: bool) {
        self.opts.keep_state = keep;
    }

    pub fn client(&self) -> Client {
        Client::new(&self.socket)
    }

    /// The daemon's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the daemon with SIGKILL and reaps it; its sandboxes keep running.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last `n` lines of the daemon's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Removes every sandbox (and every checkpoint unless the state is kept) through the
    /// API, stops the daemon (SIGTERM, SIGKILL after 10 s) and deletes the directory
    /// unless the state is kept or something is still mounted below it. Does nothing the
    /// second time.
    pub fn shutdown(&mut self) -> Cleanup {
        let mut cleanup = Cleanup::default();
        let Some(mut child) = self.child.take() else {
            return cleanup;
        };
        if matches!(child.try_wait(), Ok(None)) {
            self.remove_everything(&mut cleanup);
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if matches!(child.try_wait(), Ok(None)) {
                cleanup
                    .problems
                    .push("the daemon ignored SIGTERM for 10 s; killed it".into());
                let _ = child.kill();
            }
        } else {
            cleanup.problems.push(format!(
                "the daemon had exited before clean-up; its log:\n{}",
                self.log_tail(20)
            ));
        }
        let _ = child.wait();
        cleanup.log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if !self.opts.keep_state {
            let mounts = mounts_below(&self.dir);
            if mounts.is_empty() {
                if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                    cleanup
                        .problems
                        .push(format!("remove {}: {e}", self.dir.display()));
                }
            } else {
                // Deleting through a live mount would be wrong; leave it to inspect.
                cleanup.problems.push(format!(
                    "{} mounts remain under {} (left in place): {}",
                    mounts.len(),
                    self.dir.display(),
                    mounts.join(", ")
                ));
            }
        }
        cleanup
    }

    fn remove_everything(&self, cleanup: &mut Cleanup) {
        let c = self.client();
        match c.call::<Vec<SandboxInfo>>("GET", "/v1/sandboxes", None) {
            Ok(list) => {
                for sb in list {
                    let path = format!(
                        "/v1/sandboxes/{}?force=true",
                        crate::api::url::encode_segment(&sb.id)
                    );
                    match c.call::<crate::api::Removed>("DELETE", &path, None) {
                        Ok(_) => cleanup.sandboxes_removed += 1,
                        Err(e) => cleanup
                            .problems
                            .push(format!("remove sandbox {}: {e}", sb.id)),
                    }
                }
            }
            Err(e) => cleanup
                .problems
                .push(format!("list sandboxes for clean-up: {e}")),
        }
        if self.opts.keep_state {
            return;
        }
        match c.call::<Vec<CheckpointInfo>>("GET", "/v1/checkpoints", None) {
            Ok(list) => {
                for cp in list {
                    // Forced: children and branches made since the list go with it.
                    let path = format!(
                        "/v1/checkpoints/{}?force=true",
                        crate::api::url::encode_segment(&cp.id)
                    );
                    match c.call::<crate::api::Removed>("DELETE", &path, None) {
                        Ok(_) => cleanup.checkpoints_removed += 1,
                        // Gone already, with a parent removed before it.
                        Err(ClientError::Api(e)) if e.status() == 404 => {}
                        Err(e) => cleanup
                            .problems
                            .push(format!("remove checkpoint {}: {e}", cp.id)),
                    }
                }
            }
            Err(e) => cleanup
                .problems
                .push(format!("list checkpoints for clean-up: {e}")),
        }
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        let cleanup = self.shutdown();
        for p in &cleanup.problems {
            eprintln!("forkd private daemon {}: {p}", self.dir.display());
        }
    }
}

/// Mount points at or below `dir`, from this process's mount table.
pub fn mounts_below(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| *m == prefix || m.starts_with(&format!("{prefix}/")))
        .map(str::to_string)
        .collect()
}
