//! Test harness: a real daemon on a temporary state root and socket, with the busybox
//! fixture image imported. Tests that cannot run (not root, fixture missing) print a
//! SKIP line, and fail instead when CI=true.

#![allow(dead_code)]

use forkd::api::{ExecResult, SandboxInfo};
use forkd::client::{Client, ClientError};
use forkd::private_daemon::{Options, PrivateDaemon};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub mod pki;
pub mod registry;
mod tls;

pub use pki::make_pki;
#[allow(unused_imports)] // Not every test binary reaches a daemon over TLS.
pub use tls::{make_key, start_tls, Tls};

pub const BIN: &str = env!("CARGO_BIN_EXE_forkd");

/// Returns false (after printing SKIP) when the test cannot run here; panics in CI.
/// A free TCP port on loopback, for a daemon's listener (`FORKD_LISTEN`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn can_run(name: &str) -> bool {
    let reason = if !nix::unistd::Uid::effective().is_root() {
        Some("needs root".to_string())
    } else if !busybox_tar().exists() {
        Some(format!(
            "fixture {} missing (run fixtures/setup.sh busybox)",
            busybox_tar().display()
        ))
    } else {
        None
    };
    match reason {
        None => true,
        Some(r) => require(name, false, &r),
    }
}

pub fn cache_dir() -> PathBuf {
    forkd::api::defaults::cache()
}

pub fn busybox_tar() -> PathBuf {
    cache_dir().join("images/busybox.tar")
}

/// A private daemon ([`forkd::private_daemon`]) on `/tmp/forkd-test-NAME-PID`, with the
/// busybox image imported. Dropping it removes what it holds and stops it; the directory
/// stays when the test panicked, to be looked at.
pub struct TestDaemon {
    pub root: PathBuf,
    pub socket: PathBuf,
    pub client: Client,
    daemon: PrivateDaemon,
}

impl TestDaemon {
    /// Starts a daemon on a fresh root and imports busybox as `busybox`.
    pub fn start(name: &str) -> TestDaemon {
        Self::start_with_env(name, &[])
    }

    /// Like [`TestDaemon::start`], with extra environment variables for the daemon.
    pub fn start_with_env(name: &str, env: &[(&str, &str)]) -> TestDaemon {
        Self::start_at(name, env, None)
    }

    /// Like [`TestDaemon::start_with_env`], with the state root at `root` (a mount the
    /// test made, say) rather than below the test's directory.
    pub fn start_at(name: &str, env: &[(&str, &str)], root: Option<&Path>) -> TestDaemon {
        let base = PathBuf::from(format!("/tmp/forkd-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let mut opts = Options::new(BIN, &base);
        opts.root = root.map(Path::to_path_buf);
        // A bound, not a speed: under QEMU's TCG making the volume alone took 21 s.
        opts.ready_within = Duration::from_secs(120);
        // Hermetic: a name that is not here is never looked for on Docker Hub.
        if !env.iter().any(|(k, _)| *k == "FORKD_REGISTRIES_CONF") {
            let conf = PathBuf::from(format!("{}.registries.conf", base.display()));
            std::fs::write(
                &conf,
                "[[registry]]\nprefix = \"docker.io\"\nblocked = true\n",
            )
            .unwrap();
            opts = opts.env("FORKD_REGISTRIES_CONF", &conf);
        }
        for (k, v) in env {
            opts = opts.env(k, v);
        }
        let daemon = PrivateDaemon::start(opts, || Ok(())).unwrap_or_else(|e| panic!("{e}"));
        let d = TestDaemon {
            client: daemon.client(),
            root: daemon.root.clone(),
            socket: daemon.socket.clone(),
            daemon,
        };
        let body = serde_json::json!({ "source": busybox_tar(), "name": "busybox" });
        let _: serde_json::Value = d
            .client
            .call("POST", "/v1/images", Some(&body))
            .expect("import busybox");
        d
    }

    /// Starts the daemon again on the same root (after [`TestDaemon::kill9`]).
    pub fn spawn(&mut self) {
        self.daemon
            .respawn(|| Ok(()))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Kills the daemon with SIGKILL (sandboxes keep running).
    pub fn kill9(&mut self) {
        self.daemon.kill9();
    }

    /// The daemon's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.daemon.pid()
    }

    /// Everything the daemon has logged so far (every start appends to one file).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.daemon.log).unwrap_or_default()
    }

    /// Where the daemon keeps its data (the btrfs volume).
    pub fn data(&self) -> PathBuf {
        self.root.join("vol")
    }

    /// Mount points of sandboxes (the volume's own mount excluded).
    pub fn sandbox_mounts(&self) -> Vec<String> {
        mounts_under(&self.data().join("sandboxes"))
    }

    pub fn create(&self, body: serde_json::Value) -> SandboxInfo {
        self.client
            .call("POST", "/v1/sandboxes", Some(&body))
            .expect("create sandbox")
    }

    pub fn busybox(&self) -> SandboxInfo {
        self.create(serde_json::json!({ "image": "busybox" }))
    }

    pub fn exec(&self, id: &str, body: serde_json::Value) -> Result<ExecResult, ClientError> {
        self.client
            .call("POST", &format!("/v1/sandboxes/{id}/exec"), Some(&body))
    }

    /// Runs a shell line; returns (exit code, stdout, stderr).
    pub fn sh(&self, id: &str, line: &str) -> (i32, String, String) {
        let r = self
            .exec(id, serde_json::json!({ "shell": line }))
            .expect("exec");
        (
            r.exit.exit_code,
            String::from_utf8_lossy(&decode(&r.stdout_b64)).into(),
            String::from_utf8_lossy(&decode(&r.stderr_b64)).into(),
        )
    }

    pub fn remove(&self, id: &str) {
        let _: serde_json::Value = self
            .client
            .call("DELETE", &format!("/v1/sandboxes/{id}?force=true"), None)
            .expect("rm");
    }

    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .env("FORKD_SOCKET", &self.socket)
            .output()
            .expect("run forkd")
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.daemon.set_keep_state(std::thread::panicking());
    }
}

pub fn decode(b64: &str) -> Vec<u8> {
    forkd::api::b64::decode(b64).unwrap()
}

/// Mount points under `dir`, from the host's mount table.
#[allow(unused_imports)]
pub use forkd::private_daemon::mounts_below as mounts_under;

pub fn cgroup_exists(id: &str) -> bool {
    ["pids", "memory"]
        .iter()
        .any(|c| Path::new(&format!("/sys/fs/cgroup/{c}/forkd/{id}")).exists())
        || Path::new(&format!("/sys/fs/cgroup/forkd/{id}")).exists()
}

/// Like [`can_run`], and also needs CRIU 4.x (for live checkpoints).
pub fn can_run_criu(name: &str) -> bool {
    if !can_run(name) {
        return false;
    }
    match forkd_criu::Criu::locate(None, &settings().criu) {
        Ok(_) => true,
        Err(e) => require(name, false, &e.to_string()),
    }
}

impl TestDaemon {
    pub fn checkpoint(&self, id: &str, live: bool) -> forkd::api::CheckpointInfo {
        self.client
            .call(
                "POST",
                &format!("/v1/sandboxes/{id}/checkpoint"),
                Some(&serde_json::json!({ "live": live })),
            )
            .expect("checkpoint")
    }

    pub fn fork(&self, checkpoint: &str, count: usize, lazy: bool) -> forkd::api::ForkResult {
        self.client
            .call(
                "POST",
                &format!("/v1/checkpoints/{checkpoint}/fork"),
                Some(&serde_json::json!({ "count": count, "lazy": lazy })),
            )
            .expect("fork")
    }

    /// Reads a number a sandbox process keeps writing to `path`. The writer truncates the
    /// file before each write (`echo $i > path`), so a read can land in between and see
    /// it empty, and a writer that was just refused space (a disk limit, a full volume)
    /// left it empty until its next write: such a read is retried for up to 2 seconds,
    /// twenty times the writers' period.
    pub fn read_number(&self, id: &str, path: &str) -> u64 {
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let (code, out, err) = self.sh(id, &format!("cat {path}"));
            assert_eq!(code, 0, "cat {path} in {id}: {err}");
            if let Ok(n) = out.trim().parse() {
                return n;
            }
            seen.push(out);
            if Instant::now() > deadline {
                panic!(
                    "{path} in {id} held no number in 2 s ({} reads): {seen:?}",
                    seen.len()
                )
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The Python with the harness environment, or why it cannot run (a SKIP, or in CI a failure).
pub fn harness_python(name: &str) -> Option<String> {
    let py = std::env::var("FORKD_PYTHON").unwrap_or_else(|_| {
        cache_dir()
            .join("python/venv/bin/python")
            .display()
            .to_string()
    });
    let ok = std::process::Command::new(&py)
        .args(["-c", "import pytest, minisweagent"])
        .env("MSWEA_SILENT_STARTUP", "1")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let why = format!("{py} lacks pytest or mini-swe-agent (run fixtures/setup.sh python)");
    require(name, ok, &why).then_some(py)
}

/// A scripted OpenAI-compatible endpoint on loopback (python/tests/scripted_endpoint.py),
/// the one stand-in of the harness tests; killed when dropped.
pub struct Endpoint {
    child: std::process::Child,
    pub port: u16,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves `script` (see python/tests/scripted_endpoint.py) on a loopback port.
pub fn endpoint(py: &str, script: &Path) -> Endpoint {
    let server =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/tests/scripted_endpoint.py");
    let mut child = Command::new(py)
        .arg(server)
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the scripted endpoint");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("endpoint printed {line:?}"));
    Endpoint { child, port }
}

/// `true` when `ok`; otherwise prints `SKIP name: why` and returns `false`, or fails the
/// test under CI=true, where nothing is skipped.
pub fn require(name: &str, ok: bool, why: &str) -> bool {
    forkd_testing::require(name, ok, why)
}

/// Whether `program` is on the PATH, or a SKIP (in CI a failure) naming it: a test that
/// leans on a host tool (a C compiler, python3) must not pass for want of it.
pub fn have_program(name: &str, program: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require(name, found, &format!("{program} is not on the PATH"))
}

/// A fixture file of the cache (an image, a built suite), or a SKIP naming the set-up
/// component that makes it.
pub fn fixture(name: &str, rel: &str, component: &str) -> Option<PathBuf> {
    let p = cache_dir().join(rel);
    require(
        name,
        p.exists(),
        &format!(
            "{} missing (run fixtures/setup.sh {component})",
            p.display()
        ),
    )
    .then_some(p)
}

/// Copies a directory tree (files and directories only).
pub fn copy_dir(src: &Path, dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let to = dest.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), &to).unwrap();
        }
    }
}

impl TestDaemon {
    /// Imports a fixture image of the cache under `name`.
    pub fn import(&self, source: &Path, name: &str) {
        let _: serde_json::Value = self
            .client
            .call(
                "POST",
                "/v1/images",
                Some(&serde_json::json!({ "source": source, "name": name })),
            )
            .expect("import image");
    }
}

/// The rows of a run's `results.jsonl`.
pub fn results(run: &Path) -> Vec<forkd_analysis::TrialRow> {
    std::fs::read_to_string(run.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

impl TestDaemon {
    /// `forkd eval run SUITE --out RUN --agents AGENTS --conditions clean`, which must
    /// succeed.
    pub fn eval_run_clean(&self, suite: &Path, run: &Path, agents: &str) {
        let out = self.cli(&[
            "--socket",
            self.socket.to_str().unwrap(),
            "eval",
            "run",
            suite.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
            "--agents",
            agents,
            "--conditions",
            "clean",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes `contents` at `path` in sandbox `id` (through the API's file copy).
    pub fn put_file(&self, id: &str, path: &str, contents: &[u8]) {
        let name = std::path::Path::new(path)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(contents.len() as u64);
        b.append_data(&mut h, name, contents).unwrap();
        let tar = b.into_inner().unwrap();
        let resp = self
            .client
            .raw(
                "PUT",
                &format!(
                    "/v1/sandboxes/{id}/files?path={}",
                    forkd::api::url::encode(path)
                ),
                &tar,
            )
            .expect("copy into the sandbox");
        assert!(
            resp.status < 300,
            "put {path} into {id}: {}",
            String::from_utf8_lossy(&resp.body)
        );
    }

    /// Runs `line` in sandbox `id` until it exits 0 with output containing `want`;
    /// returns that output. Fails after 120 s (a bound, not a speed: under QEMU's TCG a
    /// sandbox's first 200 MB take most of a minute).
    pub fn wait_for(&self, id: &str, line: &str, want: &str) -> String {
        let t = Instant::now();
        loop {
            let (code, out, err) = self.sh(id, line);
            if code == 0 && out.contains(want) {
                return out;
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "{line:?} in {id}: exit {code}, {out:?} {err:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Polls `f` every 20 ms until it holds or `limit` passes; whether it held.
pub fn wait_until(limit: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A CRIU stand-in that, while its `hang` file exists, answers no swrk request (it
/// sleeps in CRIU's place), and otherwise runs the real CRIU: for tests of operations
/// caught in the middle of a dump or restore.
pub struct HangingCriu {
    dir: PathBuf,
    /// Touch to make the next dumps and restores hang; remove to let them through.
    pub hang: PathBuf,
    /// The wrapper, for the daemon's `FORKD_CRIU`.
    pub wrapper: String,
}

impl HangingCriu {
    pub fn new(tag: &str) -> HangingCriu {
        let real = forkd_criu::Criu::locate(None, &settings().criu)
            .expect("criu")
            .path;
        let dir =
            std::env::temp_dir().join(format!("forkd-hang-criu-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let hang = dir.join("hang");
        let wrapper = dir.join("bin/criu");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nif [ \"$1\" = swrk ] && [ -e {} ]; then exec sleep 600; fi\nexec {} \"$@\"\n",
                hang.display(),
                real.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        HangingCriu {
            wrapper: wrapper.display().to_string(),
            hang,
            dir,
        }
    }
}

impl Drop for HangingCriu {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TestDaemon {
    /// Sends one request from a thread of its own, for a test that acts while it is in
    /// flight; join the handle for the answer.
    pub fn call_in_background<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        method: &'static str,
        path: String,
        body: serde_json::Value,
    ) -> std::thread::JoinHandle<Result<T, ClientError>> {
        let socket = self.socket.clone();
        std::thread::spawn(move || Client::new(&socket).call(method, &path, Some(&body)))
    }
}

/// The daemon's settings as a daemon started by these tests reads them.
pub fn settings() -> forkd::daemon::config::Config {
    forkd::daemon::config::Config::from_env().expect("the test's FORKD_* settings")
}

/// `nft` as the daemon finds it.
pub fn nft() -> Result<std::path::PathBuf, String> {
    forkd_net::locate_nft(settings().nft.as_deref(), None)
}
