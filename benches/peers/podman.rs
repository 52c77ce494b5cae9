//! The podman peer of every benchmark that has one: finding podman, its run flags,
//! containers removed when dropped, its checkpoint and restore command lines, and the
//! checkpoint/restore peer of a process tree for benches/checkpoint/forks.rs
//! (`checkpoint --export`, then `restore --import` one copy at a time or several at once).

use crate::common::{run_checked, sample, skip, time_command, Report};
use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// podman's flags for states with TCP connections: the rlimits of [`PODMAN_RUN_FLAGS`]
/// and podman's default bridge network. With `--network none` podman's restore of a
/// loopback TCP connection fails (`Can't connect inet socket back: Network is
/// unreachable`: the restored namespace's loopback is down).
pub const PODMAN_TCP_FLAGS: &[&str] = &[
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1000:1000",
];

/// The flags every podman container needs on machines without CAP_SYS_RESOURCE (the
/// runtime would otherwise try to raise rlimits above their hard limits), plus no
/// network, which matches a forkd sandbox.
pub const PODMAN_RUN_FLAGS: &[&str] = &[
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1000:1000",
    "--network",
    "none",
];

#[derive(Debug, Clone)]
pub struct Podman {
    pub version: String,
    pub runtime: String,
}

impl Podman {
    /// Finds podman, unless `FORKD_BENCH_PODMAN=0`. Absent podman is a `SKIP` (an
    /// error under `CI=true`).
    pub fn detect() -> Result<Option<Podman>> {
        if std::env::var("FORKD_BENCH_PODMAN").is_ok_and(|v| v == "0") {
            println!("SKIP podman peers: FORKD_BENCH_PODMAN=0");
            return Ok(None);
        }
        let version = match Command::new("podman")
            .args(["version", "--format", "{{.Client.Version}}"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
        {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            Ok(o) => {
                skip(
                    "podman peers",
                    &format!("`podman version` failed ({})", o.status),
                )?;
                return Ok(None);
            }
            Err(e) => {
                skip("podman peers", &format!("podman is not installed ({e})"))?;
                return Ok(None);
            }
        };
        let runtime = Command::new("podman")
            .args(["info", "--format", "{{.Host.OCIRuntime.Version}}"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                let s = String::from_utf8_lossy(&o.stdout);
                // The runtime's version is multi-line; its first line is enough.
                s.lines().next().unwrap_or("").trim().to_string()
            })
            .unwrap_or_else(|| "unknown".into());
        Ok(Some(Podman { version, runtime }))
    }

    pub fn command(&self) -> Command {
        Command::new("podman")
    }

    /// `podman import TAR NAME`; returns the image id.
    pub fn import(&self, tar: &Path, name: &str) -> Result<String> {
        let out = run_checked(self.command().arg("import").arg(tar).arg(name))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// `podman container checkpoint FLAGS --export EXPORT NAME`.
    pub fn checkpoint_export(&self, flags: &[&str], export: &Path, name: &str) -> Command {
        let mut cmd = self.command();
        cmd.args(["container", "checkpoint"])
            .args(flags)
            .arg("--export")
            .arg(export)
            .arg(name);
        cmd
    }

    /// `podman container restore FLAGS --import EXPORT` (the caller may add `--name`).
    pub fn restore_import(&self, flags: &[&str], export: &Path) -> Command {
        let mut cmd = self.command();
        cmd.args(["container", "restore"])
            .args(flags)
            .arg("--import")
            .arg(export);
        cmd
    }
}

/// A detached podman container, removed (`podman rm -f`) when dropped.
pub struct PodmanContainer {
    pub name: String,
}

impl PodmanContainer {
    /// `podman run -d --name NAME FLAGS IMAGE ARGV...`
    pub fn start(podman: &Podman, name: &str, image: &str, argv: &[&str]) -> Result<Self> {
        Self::start_with(podman, name, image, PODMAN_RUN_FLAGS, argv)
    }

    /// [`PodmanContainer::start`] with other `podman run` flags.
    pub fn start_with(
        podman: &Podman,
        name: &str,
        image: &str,
        flags: &[&str],
        argv: &[&str],
    ) -> Result<Self> {
        let _ = podman
            .command()
            .args(["rm", "-f", "-t", "0", name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        run_checked(
            podman
                .command()
                .args(["run", "-d", "--name", name])
                .args(flags)
                .arg(image)
                .args(argv),
        )?;
        Ok(PodmanContainer {
            name: name.to_string(),
        })
    }
}

impl Drop for PodmanContainer {
    fn drop(&mut self) {
        let res = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        match res {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "cleanup: podman rm -f {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => eprintln!("cleanup: podman rm -f {}: {e}", self.name),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Checkpoint/restore of a process tree

/// The names of podman's containers (running or not) that start with `prefix`.
pub fn podman_containers(prefix: &str) -> Vec<String> {
    Command::new("podman")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with(prefix))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The process tree [`PodmanPeer`] checkpoints: a container of a fixture's rootfs
/// running a shell line.
pub struct PodmanTree {
    /// The fixture rootfs archive, under the cache's images/.
    pub fixture: &'static str,
    /// The name podman imports it under.
    pub image: &'static str,
    /// The container's command (`sh -c`).
    pub shell: &'static str,
    /// Process names that every restored copy must have running.
    pub expect: &'static [&'static str],
}

/// podman's checkpoint of a tree: a detached container of the same rootfs running the
/// same shell line, one `checkpoint --export` measured `samples` times (the last export
/// kept), then one `restore --import` per call, each copy removed after it.
pub struct PodmanPeer {
    podman: Podman,
    prefix: String,
    expect: &'static [&'static str],
    export: PathBuf,
    copies: usize,
    running: usize,
    /// Declared last: dropped (removed) after the fields above.
    _source: PodmanContainer,
}

impl PodmanPeer {
    /// Imports the tree's fixture, starts its source container `PREFIX-src` and waits
    /// until it runs the whole tree; the copies are named `PREFIX-rN` and `PREFIX-cN`,
    /// the export is written to `export` (and removed when the peer is dropped).
    pub fn new(p: &Podman, tree: &PodmanTree, prefix: String, export: PathBuf) -> Result<Self> {
        let tar = crate::common::fixture_image(tree.fixture);
        p.import(&tar, tree.image)?;
        let source = PodmanContainer::start(
            p,
            &format!("{prefix}-src"),
            tree.image,
            &["sh", "-c", tree.shell],
        )?;
        let peer = PodmanPeer {
            podman: p.clone(),
            prefix,
            expect: tree.expect,
            export,
            copies: 0,
            running: 0,
            _source: source,
        };
        let t = Instant::now();
        while !peer.has_tree(&peer._source.name) {
            if t.elapsed() > Duration::from_secs(20) {
                bail!(
                    "podman container {} did not run all of {:?} within 20 s",
                    peer._source.name,
                    tree.expect
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(peer)
    }

    /// `podman container checkpoint --leave-running --export` of the source container,
    /// one warm-up and `samples` timed (row `row`), in microseconds; the last export is
    /// kept for the restores.
    pub fn checkpoints(&self, row: &str, samples: usize) -> Result<Vec<u64>> {
        let export = &self.export;
        sample(row, 1, samples, || {
            let _ = std::fs::remove_file(export);
            time_command(&mut self.podman.checkpoint_export(
                &["--leave-running"],
                export,
                &self._source.name,
            ))
        })
    }

    /// Whether a container runs every process the tree needs.
    fn has_tree(&self, name: &str) -> bool {
        let top = self
            .podman
            .command()
            .args(["top", name, "comm"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        self.expect
            .iter()
            .all(|e| top.lines().any(|l| l.trim() == *e))
    }

    /// One `podman container restore --import` under a new name; its wall time, in
    /// microseconds. The copy is removed (outside the timing).
    pub fn restore_once(&mut self) -> Result<u64> {
        self.copies += 1;
        let copy = PodmanContainer {
            name: format!("{}-r{}", self.prefix, self.copies),
        };
        let us = time_command(
            self.podman
                .restore_import(&[], &self.export)
                .args(["--name", &copy.name]),
        )?;
        if self.has_tree(&copy.name) {
            self.running += 1;
        }
        drop(copy);
        Ok(us)
    }

    /// `copies` restores, `parallel` at a time, each timed on its own (in microseconds);
    /// the copies are checked and removed once all are done, outside the timing.
    pub fn restore_concurrently(&mut self, copies: usize, parallel: usize) -> Result<Vec<u64>> {
        let names: Vec<String> = (0..copies)
            .map(|i| format!("{}-c{}", self.prefix, self.copies + 1 + i))
            .collect();
        self.copies += copies;
        let export = &self.export;
        let podman = &self.podman;
        let next = std::sync::atomic::AtomicUsize::new(0);
        let timed: Vec<Result<Vec<u64>>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..parallel.max(1))
                .map(|_| {
                    scope.spawn(|| -> Result<Vec<u64>> {
                        let mut us = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let Some(name) = names.get(i) else {
                                return Ok(us);
                            };
                            us.push(time_command(
                                podman.restore_import(&[], export).args(["--name", name]),
                            )?);
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join()
                        .unwrap_or_else(|_| Err(anyhow!("a restore thread panicked")))
                })
                .collect()
        });
        for name in &names {
            if self.has_tree(name) {
                self.running += 1;
            }
            drop(PodmanContainer { name: name.clone() });
        }
        let mut all = Vec::new();
        for t in timed {
            all.extend(t?);
        }
        Ok(all)
    }

    /// Notes copies that did not run the whole tree.
    pub fn note_failures(&self, report: &mut Report) {
        if self.running < self.copies {
            report.notes.push(format!(
                "**podman: only {} of {} restored containers had all of {:?} running**",
                self.running, self.copies, self.expect
            ));
        }
    }
}

impl Drop for PodmanPeer {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.export) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("cleanup: remove {}: {e}", self.export.display());
            }
        }
    }
}
