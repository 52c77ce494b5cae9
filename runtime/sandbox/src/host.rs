//! Host-side mechanism for one sandbox: starting its init through the set-up helper,
//! talking to the init, and unmounting its root. (The overlay itself is mounted with
//! `forkd_sys::mount::mount_overlay`.)
//!
//! All functions here block; the daemon calls them off its async threads.

use crate::proto::{self, ExecExit, ExecRequest, ExecStarted, Kind};
use crate::setup::{SetupReply, SetupSpec, CONTROL_SOCKET};
use nix::mount::{umount2, MntFlags};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{step} {path}")]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sandbox set-up failed at step '{step}': {message}")]
    Setup { step: String, message: String },
    #[error("the sandbox's init did not answer on {path} within {waited_ms} ms")]
    InitTimeout { path: PathBuf, waited_ms: u64 },
    #[error("exec protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Exec(String),
}

fn io_err<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> HostError + 'a {
    move |source| HostError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// Detaches the mount at `target`; a path that is not mounted is fine (idempotent).
pub fn unmount(target: &Path) -> Result<(), HostError> {
    match umount2(target, MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(io_err("unmount", target)(e.into())),
    }
}

/// Starts the sandbox's init by running `exe __setup` (`exe` is `forkd-init`); returns the
/// init's host pid once the init listens on its control socket.
///
/// `root` is the sandbox's root as a detached mount ([`forkd_sys::mount::overlay`]) and
/// `mntns` the empty mount namespace ([`forkd_sys::mount::empty_namespace`]): the set-up
/// makes the sandbox's mount namespace a copy of `mntns` and stacks the root on it, so
/// the root never appears in the caller's. `netns`, when given, is the network namespace
/// the sandbox joins instead of a new one.
pub fn start_init(
    exe: &Path,
    spec: &SetupSpec,
    netns: Option<std::os::fd::BorrowedFd<'_>>,
    root: std::os::fd::BorrowedFd<'_>,
    mntns: std::os::fd::BorrowedFd<'_>,
) -> Result<i32, HostError> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let body = serde_json::to_vec(spec).expect("spec serialises");
    if body.len() >= crate::layout::SPEC_LIMIT {
        return Err(HostError::Setup {
            step: "send spec".into(),
            message: format!(
                "the spec is {} bytes, over the set-up's {}",
                body.len(),
                crate::layout::SPEC_LIMIT
            ),
        });
    }
    let (ours, theirs) = UnixStream::pair().map_err(io_err("make a socket pair for", exe))?;
    // Nothing to do between fork and exec, so the standard library spawns it with
    // `posix_spawn` (see [`crate::setup::Handed`]).
    let child = Command::new(exe)
        .arg("__setup")
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_clear()
        .spawn()
        .map_err(io_err("run set-up helper", exe))?;
    let mut fds = vec![root.as_raw_fd(), mntns.as_raw_fd()];
    fds.extend(netns.map(|n| n.as_raw_fd()));
    let sent = sendmsg::<()>(
        ours.as_raw_fd(),
        &[io::IoSlice::new(&body)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| io_err("send spec to", exe)(e.into()))
    .and_then(|n| {
        (&ours)
            .write_all(&body[n..])
            .map_err(io_err("send spec to", exe))
    });
    // The set-up reads until this end is closed.
    drop(ours);
    if let Err(e) = sent {
        let _ = child.wait_with_output();
        return Err(e);
    }
    let out = child
        .wait_with_output()
        .map_err(io_err("wait for set-up helper", exe))?;
    match serde_json::from_slice::<SetupReply>(&out.stdout) {
        Ok(SetupReply::Ok { pid }) => Ok(pid),
        Ok(SetupReply::Error { step, message }) => Err(HostError::Setup { step, message }),
        Err(_) => Err(HostError::Setup {
            step: "run helper".into(),
            message: format!(
                "{} exited with {} and no reply: {}",
                exe.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }),
    }
}

/// Connects to the init's control socket under `rootfs` (the host's view of the
/// sandbox root). Goes through `/proc/self/fd` so long state roots never exceed the
/// 108-byte limit of a socket path.
pub fn connect(rootfs: &Path) -> Result<UnixStream, HostError> {
    let sock = rootfs.join(CONTROL_SOCKET);
    let dir = sock.parent().expect("socket has a parent");
    let dirfd = std::fs::File::open(dir).map_err(io_err("open control directory", dir))?;
    let via = format!("/proc/self/fd/{}/init.sock", dirfd.as_raw_fd());
    UnixStream::connect(&via).map_err(io_err("connect to", &sock))
}

/// Waits until the init answers on its socket.
pub fn wait_ready(rootfs: &Path, timeout: Duration) -> Result<(), HostError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        match connect(rootfs) {
            Ok(mut conn) => {
                // The init serves every connection with a relay, this one too: hang up
                // and wait for that relay to be gone (see wait_closed), so that nothing
                // of this check is left in the sandbox.
                let _ = conn.shutdown(std::net::Shutdown::Write);
                wait_closed(&mut conn);
                return Ok(());
            }
            Err(_) if start.elapsed() < timeout => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(_) => {
                return Err(HostError::InitTimeout {
                    path: rootfs.join(CONTROL_SOCKET),
                    waited_ms: start.elapsed().as_millis() as u64,
                })
            }
        }
    }
}

/// The collected result of a non-interactive exec.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub pid: i32,
    pub exit: ExecExit,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The kept output in the order the relay read it: (from stdout?, bytes) runs.
    pub order: Vec<(bool, usize)>,
    /// Bytes the command wrote, kept or not.
    pub total_bytes: u64,
    /// Output past the limit was read and dropped.
    pub truncated: bool,
}

impl ExecOutput {
    /// Both streams merged in the order the relay read them. When one stream is empty
    /// (always so with `merge_stderr`) that is the other one: no copy is made then.
    pub fn merged(&self) -> std::borrow::Cow<'_, [u8]> {
        if self.stderr.is_empty() {
            return std::borrow::Cow::Borrowed(&self.stdout);
        }
        if self.stdout.is_empty() {
            return std::borrow::Cow::Borrowed(&self.stderr);
        }
        let mut merged = Vec::with_capacity(self.stdout.len() + self.stderr.len());
        let (mut o, mut e) = (0, 0);
        for &(from_stdout, n) in &self.order {
            if from_stdout {
                merged.extend_from_slice(&self.stdout[o..o + n]);
                o += n;
            } else {
                merged.extend_from_slice(&self.stderr[e..e + n]);
                e += n;
            }
        }
        std::borrow::Cow::Owned(merged)
    }
}

/// Sends `req` on a fresh connection and returns the connection after the `Started`
/// frame (or the init's error).
pub fn start_exec(
    rootfs: &Path,
    req: &ExecRequest,
) -> Result<(UnixStream, ExecStarted), HostError> {
    req.validate().map_err(HostError::Exec)?;
    let mut conn = connect(rootfs)?;
    let body = serde_json::to_vec(req).expect("request serialises");
    proto::write_frame(&mut conn, Kind::Request, &body)
        .map_err(|e| HostError::Protocol(e.to_string()))?;
    match proto::read_frame(&mut conn).map_err(|e| HostError::Protocol(e.to_string()))? {
        Some((Kind::Started, body)) => {
            let started: ExecStarted =
                serde_json::from_slice(&body).map_err(|e| HostError::Protocol(e.to_string()))?;
            if req.detach {
                // The relay lets go of the connection once the command is started.
                wait_closed(&mut conn);
            }
            Ok((conn, started))
        }
        Some((Kind::Error, body)) => Err(HostError::Exec(error_message(&body))),
        Some((k, _)) => Err(HostError::Protocol(format!(
            "unexpected {k:?} frame before start"
        ))),
        None => Err(HostError::Protocol(
            "the init closed the connection before the command started".into(),
        )),
    }
}

/// Waits (up to 2 s) until the sandbox side of an exec connection is closed: its relay
/// sends the last frame and then exits. Until then the sandbox holds a socket whose
/// peer is on the host, which a live checkpoint taken right after the exec could not
/// dump; an exec is complete when its relay is gone.
pub fn wait_closed(conn: &mut UnixStream) {
    use std::io::Read;
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(2)));
    let mut buf = [0u8; 512];
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

pub fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

/// Runs `req` to completion and collects its output (binary-safe). `stdin`, when
/// given, is sent in full followed by end-of-file.
///
/// At most `limit` bytes of output (both streams together) are kept; the rest is still
/// read, so the command never blocks on a full pipe, and dropped.
pub fn exec(
    rootfs: &Path,
    req: &ExecRequest,
    stdin: Option<&[u8]>,
    limit: usize,
) -> Result<ExecOutput, HostError> {
    let mut req = req.clone();
    req.stdin = stdin.is_some();
    let (mut conn, started) = start_exec(rootfs, &req)?;
    if let Some(data) = stdin {
        let mut w = conn
            .try_clone()
            .map_err(|e| HostError::Protocol(e.to_string()))?;
        let data = data.to_vec();
        // A separate writer, so a command that writes before it reads cannot deadlock us.
        std::thread::spawn(move || {
            for chunk in data.chunks(64 * 1024) {
                if proto::write_frame(&mut w, Kind::Stdin, chunk).is_err() {
                    return;
                }
            }
            let _ = proto::write_frame(&mut w, Kind::StdinEof, &[]);
        });
    }
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut order: Vec<(bool, usize)> = Vec::new();
    let (mut total, mut kept): (u64, usize) = (0, 0);
    loop {
        match proto::read_frame(&mut conn).map_err(|e| HostError::Protocol(e.to_string()))? {
            Some((kind @ (Kind::Stdout | Kind::Stderr), d)) => {
                total += d.len() as u64;
                let keep = d.len().min(limit.saturating_sub(kept));
                let out = kind == Kind::Stdout;
                if keep > 0 {
                    if out { &mut stdout } else { &mut stderr }.extend_from_slice(&d[..keep]);
                    match order.last_mut() {
                        Some((o, n)) if *o == out => *n += keep,
                        _ => order.push((out, keep)),
                    }
                    kept += keep;
                }
            }
            Some((Kind::Exit, body)) => {
                let exit = serde_json::from_slice(&body)
                    .map_err(|e| HostError::Protocol(e.to_string()))?;
                wait_closed(&mut conn);
                return Ok(ExecOutput {
                    pid: started.pid,
                    exit,
                    stdout,
                    stderr,
                    truncated: total > kept as u64,
                    order,
                    total_bytes: total,
                });
            }
            Some((Kind::Error, body)) => return Err(HostError::Exec(error_message(&body))),
            Some(_) => {}
            None => {
                return Err(HostError::Protocol(
                    "connection closed before the command's exit was reported".into(),
                ))
            }
        }
    }
}
