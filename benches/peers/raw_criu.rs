//! The raw CRIU command line as a peer: `criu restore -d` of the very images of a forkd
//! checkpoint, into an overlay mounted by hand over the checkpoint's layers, one copy at a
//! time (benches/checkpoint/forks.rs). Also the helpers it needs: the layer directories
//! of a checkpoint, a child subreaper, and `/proc` readings of the restored tree.

use crate::common::{describe, Report};
use anyhow::{bail, Context, Result};
use forkd::api::CheckpointInfo;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The directory of a layer of a checkpoint's stack (`CheckpointInfo::layers`).
pub fn lower_dir(data: &Path, layer: &str) -> Result<PathBuf> {
    let p = match layer.split_once(':') {
        Some(("checkpoint", id)) => data.join("checkpoints").join(id).join("fs/upper"),
        Some(("layer", hex)) => data.join("layers").join(hex).join("tree"),
        _ => bail!("unknown layer reference {layer:?}"),
    };
    if !p.is_dir() {
        bail!("layer {layer}: {} is not a directory", p.display());
    }
    Ok(p)
}

/// Makes this process the reaper of orphaned descendants while it lives: `criu restore
/// -d` exits after the restore, and the restored tree's root is reparented to us, so we
/// can reap it after killing it.
pub struct Subreaper;

impl Subreaper {
    pub fn on() -> Result<Subreaper> {
        nix::sys::prctl::set_child_subreaper(true).context("become a child subreaper")?;
        Ok(Subreaper)
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        let _ = nix::sys::prctl::set_child_subreaper(false);
    }
}

/// One copy restored with the raw CRIU command line: its directory on the volume
/// (`upper`, `work`, `root`, `log`), the overlay at `root`, the restored tree.
pub struct RawCopy {
    dir: PathBuf,
    mounted: bool,
    pid: Option<i32>,
    done: bool,
}

impl RawCopy {
    pub fn new(dir: PathBuf) -> Result<RawCopy> {
        for sub in ["upper", "work", "root", "log"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        }
        Ok(RawCopy {
            dir,
            mounted: false,
            pid: None,
            done: false,
        })
    }

    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    pub fn mount(&mut self, lowers: &[PathBuf]) -> Result<()> {
        let esc = |p: &Path| {
            p.display()
                .to_string()
                .replace('\\', "\\\\")
                .replace(':', "\\:")
                .replace(',', "\\,")
        };
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lowers.iter().map(|p| esc(p)).collect::<Vec<_>>().join(":"),
            esc(&self.dir.join("upper")),
            esc(&self.dir.join("work"))
        );
        nix::mount::mount(
            Some("overlay"),
            &self.root(),
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(opts.as_str()),
        )
        .with_context(|| format!("mount overlay on {} ({opts})", self.root().display()))?;
        self.mounted = true;
        Ok(())
    }

    /// Kills the restored tree, reaps its root, unmounts the overlay and removes the
    /// directory.
    pub fn teardown(&mut self) -> Result<()> {
        self.done = true;
        if let Some(pid) = self.pid.take() {
            let p = nix::unistd::Pid::from_raw(pid);
            // The root is the init of its own pid namespace: killing it kills the tree.
            let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
            // Our child once criu exited (we are a subreaper); ECHILD otherwise.
            let _ = nix::sys::wait::waitpid(p, None);
            let t = Instant::now();
            while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
                if t.elapsed() > Duration::from_secs(10) {
                    bail!("the tree restored by raw CRIU (pid {pid}) did not die within 10 s");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if self.mounted {
            let root = self.root();
            let t = Instant::now();
            loop {
                match nix::mount::umount2(&root, nix::mount::MntFlags::empty()) {
                    Ok(()) => break,
                    Err(nix::errno::Errno::EBUSY) if t.elapsed() < Duration::from_secs(5) => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(e).with_context(|| format!("unmount {}", root.display())),
                }
            }
            self.mounted = false;
        }
        std::fs::remove_dir_all(&self.dir).with_context(|| format!("remove {}", self.dir.display()))
    }
}

impl Drop for RawCopy {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.teardown() {
                eprintln!("cleanup: raw CRIU copy {}: {e:#}", self.dir.display());
            }
        }
    }
}

/// Whether a process is a zombie (or gone: its stat cannot be read).
pub fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Command names of a process and all its descendants.
pub fn tree_comms(pid: i32) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![pid.to_string()];
    while let Some(p) = todo.pop() {
        if let Ok(c) = std::fs::read_to_string(format!("/proc/{p}/comm")) {
            out.push(c.trim().to_string());
        }
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in rd.flatten() {
                if let Ok(ch) = std::fs::read_to_string(t.path().join("children")) {
                    todo.extend(ch.split_whitespace().map(str::to_string));
                }
            }
        }
    }
    out
}

/// The raw CRIU command line restoring a forkd checkpoint's images, one copy at a time,
/// each into its own overlay on the data volume.
pub struct RawCriuPeer<'a> {
    criu: &'a forkd_criu::Criu,
    images: PathBuf,
    lowers: Vec<PathBuf>,
    /// `<data>/bench-raw-criu-<pid>`: one directory per copy below it.
    base: PathBuf,
    copies: usize,
    with_tree: usize,
    /// The daemon's private `/run` for CRIU (its kernel-facts cache), if it has one.
    run_dir: Option<PathBuf>,
    /// The daemon's read-only sysfs, which a sandbox's `/sys` is a copy of (an external
    /// mount in the images), if it has one.
    sysfs: Option<PathBuf>,
}

impl<'a> RawCriuPeer<'a> {
    /// A peer for checkpoint `ck`, on the daemon's data volume `data`; `daemon_root` is
    /// the daemon's state root (for CRIU's kernel-facts cache).
    pub fn new(
        data: &Path,
        daemon_root: &Path,
        ck: &CheckpointInfo,
        criu: &'a forkd_criu::Criu,
    ) -> Result<Self> {
        let lowers = ck
            .layers
            .iter()
            .map(|l| lower_dir(data, l))
            .collect::<Result<Vec<_>>>()?;
        let base = data.join(format!("bench-raw-criu-{}", std::process::id()));
        std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
        Ok(RawCriuPeer {
            criu,
            images: data.join("checkpoints").join(&ck.id).join("criu"),
            lowers,
            base,
            copies: 0,
            with_tree: 0,
            run_dir: Some(daemon_root.join("criu-run")).filter(|d| d.join("criu.kdat").exists()),
            sysfs: Some(daemon_root.join("sysfs")).filter(|d| d.join("kernel").is_dir()),
        })
    }

    /// Mounts an overlay, restores one copy with `criu restore -d`, checks that the
    /// tree runs, kills it and unmounts. Returns (criu restore wall time, mount +
    /// restore wall time), microseconds. The copy counts as running the tree when all
    /// of `expect` run in it; its host pid is added to `raw_pids`.
    pub fn restore_once(&mut self, expect: &[&str], raw_pids: &mut Vec<i32>) -> Result<(u64, u64)> {
        self.copies += 1;
        let mut copy = RawCopy::new(self.base.join(self.copies.to_string()))?;
        let log_dir = copy.dir.join("log");
        let pidfile = log_dir.join("pid");
        let t = Instant::now();
        copy.mount(&self.lowers)?;
        let mut cmd = Command::new(&self.criu.path);
        cmd.arg("restore")
            .arg("-D")
            .arg(&self.images)
            .arg("--root")
            .arg(copy.root())
            .args([
                "-d",
                "--network-lock",
                "skip",
                // As forkd asks over RPC: file locks, cgroups left alone.
                "--file-locks",
                "--manage-cgroups=ignore",
                "-o",
                "restore.log",
                "-W",
            ])
            .arg(&log_dir)
            .arg("--pidfile")
            .arg(&pidfile)
            // forkd's log level.
            .arg(format!(
                "-v{}",
                forkd::daemon::config::Config::from_env()
                    .map(|c| c.criu.log_level)
                    .unwrap_or(forkd_criu::DEFAULT_LOG_LEVEL)
            ))
            // The images mark the sandbox's network namespace as external: like forkd,
            // hand the tree a new one with loopback up.
            .arg("--inherit-fd")
            .arg(format!("fd[3]:{}", forkd_criu::NETNS_KEY))
            // Its `/sys`, as forkd maps it.
            .args(self.sysfs.iter().flat_map(|d| {
                [
                    "--ext-mount-map".into(),
                    format!("forkd-sysfs:{}", d.display()),
                ]
            }))
            .stdin(Stdio::null())
            // Files, not pipes: the restored tree must not hold our end of anything.
            .stdout(File::create(log_dir.join("stdout"))?)
            .stderr(File::create(log_dir.join("stderr"))?);
        // `criu restore -d` exits after the restore and the tree's root is reparented:
        // to us while we are a subreaper, so that we can reap it after killing it. Only
        // for this copy: podman's monitors must not end up here.
        forkd_sys::fresh_netns_fd(&mut cmd, 3);
        // Like forkd's, with CRIU's kernel facts cached on a tmpfs `/run` (this host's
        // `/run` is not one; without it every CRIU start probes the kernel, ~40 ms).
        if let Some(dir) = &self.run_dir {
            forkd_sys::with_own_run(&mut cmd, dir, &[])?;
        }
        let reaper = Subreaper::on()?;
        let t_restore = Instant::now();
        let status = cmd
            .status()
            .with_context(|| format!("run {}", describe(&cmd)))?;
        let restore_us = t_restore.elapsed().as_micros() as u64;
        let total_us = t.elapsed().as_micros() as u64;
        let pid = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            copy.pid = Some(pid);
            raw_pids.push(pid);
        }
        if !status.success() || pid.is_none() {
            bail!(
                "{} failed ({status}): {}{}",
                describe(&cmd),
                std::fs::read_to_string(log_dir.join("stderr"))
                    .unwrap_or_default()
                    .trim(),
                forkd_criu::log_tail(&log_dir.join("restore.log"))
            );
        }
        let names = tree_comms(pid.unwrap_or(0));
        if expect.iter().all(|e| names.iter().any(|n| n == e)) {
            self.with_tree += 1;
        }
        copy.teardown()?;
        drop(reaper);
        Ok((restore_us, total_us))
    }

    /// Removes the peer's directory; notes copies of tree `name` that did not run all
    /// of `expect`.
    pub fn finish(self, name: &str, expect: &[&str], report: &mut Report) -> Result<()> {
        if self.with_tree < self.copies {
            report.notes.push(format!(
                "**raw CRIU, {}: only {} of {} restored trees had all of {:?} running**",
                name, self.with_tree, self.copies, expect
            ));
        }
        Ok(())
    }
}

impl Drop for RawCriuPeer<'_> {
    fn drop(&mut self) {
        // Each copy removed its own directory (or its guard did, on failure).
        if let Err(e) = std::fs::remove_dir(&self.base) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("cleanup: remove {}: {e}", self.base.display());
            }
        }
    }
}
