//! Shared pieces of forkd's benchmarks: a daemon on a private temporary state root that
//! cleans up after itself, sampling with warm-up and percentiles, the podman peer,
//! machine facts, and the report (JSON for tools, a markdown table for people).
//!
//! Every benchmark binary includes this module with `mod common;` and uses a subset of
//! it, hence the `dead_code` allowance.
#![allow(dead_code)]

use anyhow::{anyhow, bail, Context, Result};
use forkd::api::{CheckpointInfo, ForkResult, ImageInfo, SandboxInfo};
use forkd::client::Client;
use forkd::private_daemon::{Options, PrivateDaemon};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

// ---------------------------------------------------------------------------------------
// Configuration and skipping

/// A positive integer from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| anyhow!("{name}={v:?}: expected a positive integer")),
        _ => Ok(default),
    }
}

/// True when running in CI, where nothing may be skipped silently.
pub fn in_ci() -> bool {
    forkd_sys::testing::in_ci()
}

/// Reports that `what` cannot be measured here. Outside CI this prints a `SKIP` line
/// and returns `Ok`; under `CI=true` it is an error.
pub fn skip(what: &str, reason: &str) -> Result<()> {
    if in_ci() {
        bail!("{what} cannot run: {reason} (CI=true: nothing may be skipped)");
    }
    println!("SKIP {what}: {reason}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Interruption: Ctrl-C ends the run through the normal error path, so guards clean up.

/// Turns SIGINT and SIGTERM into a flag that [`check_interrupted`] reports.
pub fn install_interrupt_handler() {
    if let Err(e) = forkd_sys::flag_interrupts() {
        eprintln!("Ctrl-C will not clean up: {e}");
    }
}

pub fn check_interrupted() -> Result<()> {
    if forkd_sys::interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// External programs

/// Describes a command for error messages: `prog arg arg`.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().to_string();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command to completion, capturing its output; a failure names the command,
/// its exit status and its standard error.
pub fn run_checked(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", describe(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Runs a command and returns the wall time from spawn to exit, in microseconds.
/// Standard output is discarded; standard error is kept for the error message.
pub fn time_command(cmd: &mut Command) -> Result<u64> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let t = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("run {}", describe(cmd)))?;
    let us = t.elapsed().as_micros() as u64;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(us)
}

// ---------------------------------------------------------------------------------------
// Sampling and statistics

/// Summary of one series of samples, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub n: usize,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub mean: f64,
    pub min: u64,
    pub max: u64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[u64]) -> Summary {
    let mut s = samples.to_vec();
    s.sort_unstable();
    if s.is_empty() {
        return Summary::default();
    }
    Summary {
        n: s.len(),
        p50: percentile(&s, 50.0),
        p90: percentile(&s, 90.0),
        p99: percentile(&s, 99.0),
        mean: s.iter().sum::<u64>() as f64 / s.len() as f64,
        min: s[0],
        max: s[s.len() - 1],
    }
}

/// Runs `warmup` untimed calls then `n` timed ones. `f` does one sample and returns
/// its time in microseconds, so it decides what is timed (set-up and clean-up of a
/// fresh object per sample stay outside). Progress goes to stderr every 25 samples.
pub fn sample(
    label: &str,
    warmup: usize,
    n: usize,
    mut f: impl FnMut() -> Result<u64>,
) -> Result<Vec<u64>> {
    let started = Instant::now();
    for i in 0..warmup {
        check_interrupted()?;
        f().with_context(|| format!("{label}: warm-up {}/{warmup}", i + 1))?;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        check_interrupted()?;
        out.push(f().with_context(|| format!("{label}: sample {}/{n}", i + 1))?);
        if (i + 1) % 25 == 0 || i + 1 == n {
            eprintln!(
                "  {label}: {}/{n} (p50 so far {}, {:.1}s)",
                i + 1,
                fmt_us(summarize(&out).p50),
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(out)
}

/// Microseconds as milliseconds with two decimals.
pub fn fmt_ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

/// Microseconds with a unit that keeps the number readable.
pub fn fmt_us(us: u64) -> String {
    if us >= 10_000_000 {
        format!("{:.1} s", us as f64 / 1e6)
    } else {
        format!("{:.2} ms", us as f64 / 1000.0)
    }
}

pub fn fmt_kib(kib: f64) -> String {
    if kib.abs() >= 10.0 * 1024.0 {
        format!("{:.1} MiB", kib / 1024.0)
    } else {
        format!("{kib:.0} KiB")
    }
}

// ---------------------------------------------------------------------------------------
// /proc readings

/// A `kB` field of a `/proc` key-value file (`/proc/meminfo`, `/proc/PID/status`).
fn proc_kib(path: &str, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse().ok()
        })
        .ok_or_else(|| anyhow!("{path} has no {key} field"))
}

pub fn mem_available_kib() -> Result<u64> {
    proc_kib("/proc/meminfo", "MemAvailable")
}

pub fn rss_kib(pid: u32) -> Result<u64> {
    proc_kib(&format!("/proc/{pid}/status"), "VmRSS")
}

/// Proportional set size of a process (shared pages split among their users), KiB.
pub fn pss_kib(pid: u32) -> Result<u64> {
    proc_kib(&format!("/proc/{pid}/smaps_rollup"), "Pss")
}

/// Mount points at or below `dir`, from this process's mount table.
#[allow(unused_imports)]
pub use forkd::private_daemon::mounts_below as mounts_under;

/// Cgroup directories still present for the given sandbox ids (forkd puts each
/// sandbox in `forkd/<id>` of every hierarchy, v1 controllers or v2).
pub fn cgroups_left(ids: &[String]) -> Vec<String> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots = vec![base.to_path_buf()];
    if let Ok(rd) = std::fs::read_dir(base) {
        roots.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    let mut left = Vec::new();
    for root in roots {
        for id in ids {
            let p = root.join("forkd").join(id);
            if p.exists() {
                left.push(p.display().to_string());
            }
        }
    }
    left
}

/// Host pids of the processes in cgroup `rel` (such as `forkd/<id>`): from the v2
/// directory, or from whichever v1 hierarchy lists the most (they should all agree).
pub fn cgroup_pids(rel: &str) -> Vec<u32> {
    let base = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![base.join(rel)];
    if let Ok(rd) = std::fs::read_dir(base) {
        dirs.extend(rd.flatten().map(|e| e.path().join(rel)));
    }
    dirs.iter()
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .max_by_key(Vec::len)
        .unwrap_or_default()
}

/// The command names (`/proc/PID/comm`) of some processes; vanished ones are left out.
pub fn comms(pids: &[u32]) -> Vec<String> {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------
// The daemon under test

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

/// A new, empty directory under the system's temporary directory.
pub fn unique_temp_dir(prefix: &str) -> Result<PathBuf> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "{prefix}-{}-{:08x}",
            std::process::id(),
            nanos ^ attempt
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("create {}", dir.display())),
        }
    }
    bail!("no free temporary directory name under {}", base.display())
}

impl DaemonGuard {
    /// Starts `bin daemon` and waits until it answers `GET /v1/version`.
    pub fn start(bin: &Path) -> Result<DaemonGuard> {
        let dir = unique_temp_dir("forkd-bench")?;
        let mut opts = Options::new(bin, &dir);
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
        self.client()
            .call(
                "POST",
                &format!("/v1/checkpoints/{checkpoint}/fork"),
                Some(&json!({ "count": count, "lazy": lazy })),
            )
            .with_context(|| {
                format!(
                    "fork {count} {} branches of checkpoint {checkpoint}",
                    if lazy { "lazy" } else { "eager" }
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

// ---------------------------------------------------------------------------------------
// Fixtures

/// Where `fixtures/setup.sh` puts its fixtures: `$FORKD_CACHE`, or `/var/cache/forkd`.
pub fn cache_dir() -> PathBuf {
    forkd::api::defaults::cache()
}

/// A fixture image built by `fixtures/setup.sh`: `$FORKD_CACHE/images/<file>`.
/// Polls `f` every 100 ms until it holds (true) or `limit` has passed (false).
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

pub fn fixture_image(file: &str) -> PathBuf {
    cache_dir().join("images").join(file)
}

/// For a benchmark that needs root and the Debian fixture: the fixture, or `None` after
/// a SKIP line (an error under CI=true, see [`skip`]).
pub fn root_and_debian(bench: &str) -> Result<Option<PathBuf>> {
    if !nix::unistd::Uid::effective().is_root() {
        skip(bench, "needs root (namespaces, mounts, cgroups, CRIU)")?;
        return Ok(None);
    }
    let debian = fixture_image("debian.tar.zst");
    if !debian.exists() {
        skip(
            bench,
            &format!(
                "{} is missing (run fixtures/setup.sh debian)",
                debian.display()
            ),
        )?;
        return Ok(None);
    }
    Ok(Some(debian))
}

// ---------------------------------------------------------------------------------------
// The podman peer

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
// Machine facts and the report

/// `git rev-parse HEAD` of the source tree, and whether tracked files differ from it.
pub fn git_revision() -> (Option<String>, Option<bool>) {
    let dir = env!("CARGO_MANIFEST_DIR");
    let rev = Command::new("git")
        .args(["-C", dir, "rev-parse", "HEAD"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let dirty = Command::new("git")
        .args(["-C", dir, "status", "--porcelain", "--untracked-files=no"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| !o.stdout.is_empty());
    (rev, dirty)
}

/// What a report's header and title say about the run: the revision, the machine and
/// its load at the start and the end.
pub struct RunInfo {
    rev: Option<String>,
    dirty: Option<bool>,
    date: String,
    machine: Value,
    load_start: String,
    load_end: String,
}

impl RunInfo {
    /// Taken at the end of a run that started at `date` with load `load_start`.
    pub fn at_end(date: &str, load_start: &str) -> RunInfo {
        let (rev, dirty) = git_revision();
        RunInfo {
            rev,
            dirty,
            date: date.to_string(),
            machine: machine(),
            load_start: load_start.to_string(),
            load_end: load_average(),
        }
    }

    /// The JSON header: run facts, the benchmark's `config`, and its peers under `peers.0`.
    pub fn header(&self, config: Value, peers: (&str, Value)) -> Value {
        let mut header = json!({
            "git_revision": self.rev,
            "git_dirty": self.dirty,
            "date": self.date,
            "machine": self.machine,
            "load_average": { "start": self.load_start, "end": self.load_end },
            "config": config,
        });
        header[peers.0] = peers.1;
        header
    }

    /// The one-line title under the report's heading; `peers` names the peers measured.
    pub fn title(&self, peers: &str) -> String {
        let m = &self.machine;
        format!(
            "revision `{}`{}, {}; {} CPUs ({}), kernel {}, load average {} at start, {} at \
             end; {peers}",
            self.rev
                .as_deref()
                .map(|r| &r[..r.len().min(12)])
                .unwrap_or("unknown"),
            if self.dirty == Some(true) {
                " (with uncommitted changes)"
            } else {
                ""
            },
            self.date,
            m["nproc"],
            m["cpu"].as_str().unwrap_or("unknown cpu"),
            m["kernel"].as_str().unwrap_or("?"),
            self.load_start,
            self.load_end,
        )
    }
}

/// Now as an RFC 3339 UTC timestamp.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The 1, 5 and 15 minute load averages: a busy machine makes every row slower.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        "cpu": cpu,
        "mem_total_kib": proc_kib("/proc/meminfo", "MemTotal").ok(),
    })
}

/// One measured series.
pub struct Row {
    pub name: String,
    pub samples_us: Vec<u64>,
}

/// A ratio or threshold check, shown under the table.
pub struct Check {
    pub name: String,
    pub value: Option<f64>,
    /// How the value is printed, e.g. `0.041` or `0.52 ms`.
    pub shown: String,
    pub goal: String,
    pub met: Option<bool>,
}

/// A free-form markdown table: a view across rows (e.g. latency against size).
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// The benchmark's results: rows of samples, checks, and free-form sections.
pub struct Report {
    pub benchmark: String,
    pub rows: Vec<Row>,
    pub checks: Vec<Check>,
    /// Extra tables, printed after the checks.
    pub tables: Vec<Table>,
    /// Extra markdown tables: (title, [(metric, value)]).
    pub sections: Vec<(String, Vec<(String, String)>)>,
    /// Everything else that goes into the JSON document.
    pub extra: serde_json::Map<String, Value>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(benchmark: &str) -> Report {
        Report {
            benchmark: benchmark.to_string(),
            rows: Vec::new(),
            checks: Vec::new(),
            tables: Vec::new(),
            sections: Vec::new(),
            extra: serde_json::Map::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&mut self, name: &str, samples_us: Vec<u64>) -> Summary {
        let s = summarize(&samples_us);
        self.rows.push(Row {
            name: name.to_string(),
            samples_us,
        });
        s
    }

    /// The summary of a row, if it exists and has samples.
    pub fn summary(&self, name: &str) -> Option<Summary> {
        self.rows
            .iter()
            .find(|r| r.name == name && !r.samples_us.is_empty())
            .map(|r| summarize(&r.samples_us))
    }

    pub fn p50(&self, name: &str) -> Option<u64> {
        self.rows
            .iter()
            .find(|r| r.name == name)
            .map(|r| summarize(&r.samples_us).p50)
    }

    pub fn to_json(&self, header: &Value) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let s = summarize(&r.samples_us);
                json!({
                    "name": r.name,
                    "unit": "us",
                    "n": s.n,
                    "p50": s.p50,
                    "p90": s.p90,
                    "p99": s.p99,
                    "mean": (s.mean * 10.0).round() / 10.0,
                    "min": s.min,
                    "max": s.max,
                    "samples": r.samples_us,
                })
            })
            .collect();
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|c| json!({ "name": c.name, "value": c.value, "goal": c.goal, "met": c.met }))
            .collect();
        let mut doc = serde_json::Map::new();
        doc.insert("benchmark".into(), json!(self.benchmark));
        if let Value::Object(h) = header {
            doc.extend(h.clone());
        }
        doc.insert("rows".into(), Value::Array(rows));
        doc.insert("checks".into(), Value::Array(checks));
        doc.extend(self.extra.clone());
        doc.insert("notes".into(), json!(self.notes));
        Value::Object(doc)
    }

    pub fn to_markdown(&self, title_line: &str) -> String {
        let mut md = format!("# forkd benchmark: {}\n\n{title_line}\n\n", self.benchmark);
        md.push_str(
            "| benchmark | n | p50 ms | p90 ms | p99 ms | mean ms | min ms | max ms |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.rows {
            let s = summarize(&r.samples_us);
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                r.name,
                s.n,
                fmt_ms(s.p50 as f64),
                fmt_ms(s.p90 as f64),
                fmt_ms(s.p99 as f64),
                fmt_ms(s.mean),
                fmt_ms(s.min as f64),
                fmt_ms(s.max as f64)
            ));
        }
        if !self.checks.is_empty() {
            md.push_str("\n| comparison | value | goal | met |\n|---|---:|---|---|\n");
            for c in &self.checks {
                let met = match c.met {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "-",
                };
                md.push_str(&format!(
                    "| {} | {} | {} | {met} |\n",
                    c.name, c.shown, c.goal
                ));
            }
        }
        for t in &self.tables {
            md.push_str(&format!("\n**{}**\n\n", t.title));
            md.push_str(&format!("| {} |\n", t.header.join(" | ")));
            md.push_str(&format!(
                "|{}\n",
                t.header
                    .iter()
                    .enumerate()
                    .map(|(i, _)| if i == 0 { "---|" } else { "---:|" })
                    .collect::<String>()
            ));
            for r in &t.rows {
                md.push_str(&format!("| {} |\n", r.join(" | ")));
            }
        }
        for (title, items) in &self.sections {
            md.push_str(&format!(
                "\n**{title}**\n\n| metric | value |\n|---|---:|\n"
            ));
            for (k, v) in items {
                md.push_str(&format!("| {k} | {v} |\n"));
            }
        }
        if !self.notes.is_empty() {
            md.push('\n');
            for n in &self.notes {
                md.push_str(&format!("- {n}\n"));
            }
        }
        md
    }

    /// Writes `<target>/bench/<name>.json` and `.md`; returns their paths.
    pub fn write(&self, header: &Value, title_line: &str) -> Result<(PathBuf, PathBuf, String)> {
        let dir = bench_output_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let json_path = dir.join(format!("{}.json", self.benchmark));
        let md_path = dir.join(format!("{}.md", self.benchmark));
        let body = serde_json::to_string_pretty(&self.to_json(header))? + "\n";
        std::fs::write(&json_path, body)
            .with_context(|| format!("write {}", json_path.display()))?;
        let md = self.to_markdown(title_line);
        std::fs::write(&md_path, &md).with_context(|| format!("write {}", md_path.display()))?;
        Ok((json_path, md_path, md))
    }
}

/// Writes a benchmark's `NAME.json` and `NAME.md` to [`bench_output_dir`] and prints the
/// markdown.
pub fn write_outputs(name: &str, report: &Value, md: &str) -> Result<()> {
    let dir = bench_output_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let json_path = dir.join(format!("{name}.json"));
    std::fs::write(&json_path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("write {}", json_path.display()))?;
    let md_path = dir.join(format!("{name}.md"));
    std::fs::write(&md_path, md).with_context(|| format!("write {}", md_path.display()))?;
    println!("{md}");
    Ok(())
}

/// `$CARGO_TARGET_DIR/bench`, or `target/bench` in the workspace.
pub fn bench_output_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|t| manifest.join(t))
        .unwrap_or_else(|| manifest.join("target"));
    target.join("bench")
}

/// The QEMU guest of the benches and tests/guest.rs, run inside a Debian sandbox
/// holding the fixture's kernel and initramfs in /guest: TCG (CRIU cannot dump KVM file
/// descriptors), serial console to a file. One argument a line in
/// fixtures/qemu/sandbox-argv.
pub fn qemu_argv() -> Vec<&'static str> {
    include_str!("../../fixtures/qemu/sandbox-argv")
        .lines()
        .collect()
}

/// The last complete `forkd-guest counter=N` line of a guest's serial log at `path`.
pub fn read_guest_counter(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let complete = &text[..text.rfind('\n')?];
    complete.lines().rev().find_map(|l| {
        let rest = &l[l.find("forkd-guest counter=")? + "forkd-guest counter=".len()..];
        rest.split_whitespace().next()?.parse().ok()
    })
}
