//! A relay runs one exec inside a sandbox, as a child of the init.
//!
//! It reads the [`ExecRequest`], starts the command in a new session (on a fresh
//! pseudo-terminal when asked), and shuttles stdin/stdout/stderr between the command
//! and the connection as frames. For a command run to completion the relay is a child
//! subreaper, so every descendant of the command that is orphaned comes back to it
//! instead of escaping to the init: a timeout (or the client hanging up) therefore kills
//! the command's whole tree, grandchildren that changed session included, and nothing
//! else.
//!
//! Detached commands write their output to `/.forkd/logs/<name>.log`. The relay hands
//! the command over to the init (its pid, log name and start time, one line on the
//! init's hand-over pipe) and exits: the init adopts the command, reaps it and records
//! its exit status in `/.forkd/logs/<name>.exit`. So a sandbox running one command holds
//! two processes of forkd's, not three (every branch restores them all). A detached
//! command's orphans (a daemon whose parent exited) are adopted by the init too, where
//! CRIU can restore them with their dead leaders.

use crate::proto::{self, ExecExit, ExecRequest, ExecStarted, Kind};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod tree;
pub(crate) use tree::{exit_of, now_us};
use tree::{kill_tree, reap};

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const CHUNK: usize = 64 * 1024;

/// Serves one connection and exits.
pub fn serve_connection(conn: UnixStream, handover: OwnedFd) -> ! {
    let mut conn = Some(conn);
    let code = match run(&mut conn) {
        Ok(None) => 0,
        Ok(Some(detached)) => {
            // Written before this relay exits, so before the command can be the init's
            // to reap (see crate::init).
            let line = format!("{}\n", serde_json::to_string(&detached).unwrap_or_default());
            let mut pipe = File::from(handover);
            match pipe.write_all(line.as_bytes()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("forkd-init relay: hand over command {}: {e}", detached.pid);
                    1
                }
            }
        }
        Err(message) => {
            let body = serde_json::json!({ "message": message }).to_string();
            if let Some(c) = conn.as_mut() {
                let _ = proto::write_frame(c, Kind::Error, body.as_bytes());
            }
            1
        }
    };
    // Closed before exiting rather than by the exit: the kernel tears the address space
    // down before it closes descriptors, and the daemon counts the exec as finished only
    // when the connection closes (see host::wait_closed).
    drop(conn);
    std::process::exit(code)
}

/// A detached command handed over to the init: what it needs to record its exit.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Detached {
    pub pid: i32,
    /// The log's name: the exit goes to `/.forkd/logs/<name>.exit`.
    pub name: String,
    /// When it started, in microseconds since the epoch.
    pub started_us: u64,
}

/// Where the relay of kept command `pid` takes the clients that attach to it.
fn attach_socket(pid: i32) -> String {
    format!("{}/attach-{pid}.sock", crate::layout::RUN_DIR)
}

/// Hands the client over to the relay of kept command `pid` (the connection's
/// descriptor, over that relay's attach socket), which serves it from here on.
fn hand_over(conn: &mut Option<UnixStream>, pid: i32) -> Result<Option<Detached>, String> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let target = UnixStream::connect(attach_socket(pid))
        .map_err(|_| format!("no kept command with pid {pid} runs in this sandbox"))?;
    let client = conn.as_ref().ok_or("no client to hand over")?;
    let fds = [client.as_raw_fd()];
    sendmsg::<()>(
        target.as_raw_fd(),
        &[std::io::IoSlice::new(b"a")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| format!("hand the client to command {pid}: {e}"))?;
    // Ours is closed; the kept command's relay holds the connection now.
    conn.take();
    Ok(None)
}

/// A client handed over on the attach socket: the connection's descriptor.
fn take_client(listener: &std::os::unix::net::UnixListener) -> Option<UnixStream> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let (s, _) = listener.accept().ok()?;
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        s.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    let mut fds = msg.cmsgs().ok()?.flat_map(|c| match c {
        ControlMessageOwned::ScmRights(fds) => fds,
        _ => Vec::new(),
    });
    let fd = fds.next()?;
    let client = UnixStream::from(forkd_sys::own_fd(fd));
    for extra in fds {
        drop(forkd_sys::own_fd(extra));
    }
    client.set_nonblocking(false).ok()?;
    Some(client)
}

fn run(conn_slot: &mut Option<UnixStream>) -> Result<Option<Detached>, String> {
    let first = conn_slot.as_mut().ok_or("no client")?;
    let req = match proto::read_frame(first).map_err(|e| format!("read request: {e}"))? {
        Some((Kind::Request, body)) => serde_json::from_slice::<ExecRequest>(&body)
            .map_err(|e| format!("bad exec request: {e}"))?,
        Some((k, _)) => return Err(format!("expected a request frame, got {k:?}")),
        None => return Ok(None),
    };
    req.validate()?;
    if let Some(pid) = req.attach {
        return hand_over(conn_slot, pid);
    }
    // A command run to completion keeps its orphans below the relay, so that a timeout
    // or a hang-up kills its whole tree. A detached command's orphans go to the init
    // instead, as a daemon's do on a real machine: CRIU restores a process whose session
    // or group leader has exited only when it is a child of the tree's root (it recreates
    // the dead leader as a helper there), so a daemon adopted by a relay could be
    // checkpointed but never restored ("Can't find a session leader").
    if !req.detach {
        nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("set subreaper: {e}"))?;
    }
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.thread_block()
        .map_err(|e| format!("block SIGCHLD: {e}"))?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("signalfd: {e}"))?;

    let mut cmd = build_command(&req)?;
    if req.detach {
        drop(sigfd);
        return run_detached(first, &req, cmd);
    }
    // Standard streams: a pty, or three pipes.
    let pty_master;
    // With merge_stderr, both streams share one pipe; this is its read end.
    let mut merged_out: Option<OwnedFd> = None;
    if req.tty {
        let pty = nix::pty::openpty(None, None).map_err(|e| format!("openpty: {e}"))?;
        let slave = pty.slave;
        cmd.stdin(Stdio::from(slave.try_clone().map_err(|e| e.to_string())?))
            .stdout(Stdio::from(slave.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(slave));
        forkd_sys::session_leader(&mut cmd, true);
        pty_master = Some(pty.master);
    } else {
        pty_master = None;
        cmd.stdin(if req.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if req.merge_stderr {
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| format!("pipe: {e}"))?;
            cmd.stdout(Stdio::from(w.try_clone().map_err(|e| e.to_string())?))
                .stderr(Stdio::from(w));
            merged_out = Some(r);
        }
        forkd_sys::session_leader(&mut cmd, false);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| spawn_error(&req, e))?;
    // The command holds the child's ends of its streams (a shared pipe's write end, a
    // pty's slave): drop them here, so that end of output is seen when the child's go.
    drop(cmd);
    let pid = child.id() as i32;
    let mut stdin: Option<File> = child.stdin.take().map(|p| File::from(OwnedFd::from(p)));
    let mut out: Option<OwnedFd> = match &pty_master {
        Some(m) => Some(m.try_clone().map_err(|e| e.to_string())?),
        None => merged_out.or_else(|| child.stdout.take().map(OwnedFd::from)),
    };
    let mut err: Option<OwnedFd> = child.stderr.take().map(OwnedFd::from);
    if req.tty {
        stdin = pty_master
            .as_ref()
            .map(|m| m.try_clone().map(File::from))
            .transpose()
            .map_err(|e| e.to_string())?;
    }
    send(
        first,
        Kind::Started,
        &ExecStarted {
            pid,
            log_path: None,
        },
    )?;
    // A kept command's relay takes clients that attach to it on a socket of its own.
    let attach = if req.keep {
        let path = attach_socket(pid);
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path)
            .map_err(|e| format!("listen on {path}: {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        Some((l, path))
    } else {
        None
    };
    let conn = conn_slot;

    let deadline = req.timeout_ms.map(|ms| started + Duration::from_millis(ms));
    let mut status: Option<WaitStatus> = None;
    let mut timed_out = false;
    let mut drain_until: Option<Instant> = None;
    let mut buf = vec![0u8; CHUNK];
    // Stdin the command has not taken yet. It is written only when the command's end
    // can take some without blocking, and no more is read from the client meanwhile:
    // a blocking write could wait on a command that is itself waiting for this loop
    // to read its output (`cat` of more than two pipes' worth).
    let mut pending = Pending::default();
    if let Some(c) = conn.as_ref() {
        c.set_nonblocking(false).ok();
    }
    loop {
        if status.is_some() && out.is_none() && err.is_none() {
            break;
        }
        if let Some(t) = drain_until {
            if Instant::now() >= t {
                break;
            }
        }
        let now = Instant::now();
        let mut wait = deadline
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(3600));
        if let Some(t) = drain_until {
            wait = wait.min(t.saturating_duration_since(now));
        }
        let timeout = PollTimeout::try_from(wait.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::NONE);
        let mut fds = Vec::with_capacity(4);
        fds.push(PollFd::new(sigfd.as_fd(), PollFlags::POLLIN));
        let conn_idx = match conn.as_ref() {
            Some(c) if status.is_none() && pending.data.is_empty() => {
                fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let attach_idx = match &attach {
            Some((l, _)) if status.is_none() => {
                fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let stdin_idx = match &stdin {
            Some(fd) if !pending.data.is_empty() => {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let out_idx = out.as_ref().map(|fd| {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        let err_idx = err.as_ref().map(|fd| {
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        let ready = |i: Option<usize>| i.map(|i| fds[i].any().unwrap_or(false)).unwrap_or(false);
        let (sig_ready, conn_ready, out_ready, err_ready, stdin_ready) = (
            fds[0].any().unwrap_or(false),
            ready(conn_idx),
            ready(out_idx),
            ready(err_idx),
            ready(stdin_idx),
        );
        let attach_ready = ready(attach_idx);
        drop(fds);

        if stdin_ready && !pending.feed(&stdin) {
            // The command closed its end: what it did not take is dropped.
            stdin = None;
            pending = Pending::default();
        }
        if out_ready && !pump(&mut out, &mut buf, conn, Kind::Stdout)? {
            out = None;
        }
        if err_ready && !pump(&mut err, &mut buf, conn, Kind::Stderr)? {
            err = None;
        }
        if let (true, Some(c)) = (conn_ready, conn.as_mut()) {
            match proto::read_frame(c) {
                Ok(Some((Kind::Stdin, data))) => {
                    if stdin.is_some() {
                        pending.data = data;
                        pending.at = 0;
                    }
                }
                // (Read only once nothing is pending: the end comes after all of it.)
                Ok(Some((Kind::StdinEof, _))) => end_stdin(&mut stdin, req.tty),
                Ok(Some((Kind::Resize, data))) if data.len() == 4 => {
                    if let Some(m) = &pty_master {
                        let rows = u16::from_be_bytes([data[0], data[1]]);
                        let cols = u16::from_be_bytes([data[2], data[3]]);
                        let _ = forkd_sys::set_window_size(m.as_fd(), rows, cols);
                    }
                }
                Ok(Some((Kind::Signal, data))) if data.len() == 1 => {
                    match Signal::try_from(i32::from(data[0])) {
                        // A kill ends the whole tree, as a timeout does: orphans would
                        // otherwise hold the output open.
                        Ok(Signal::SIGKILL) => kill_tree(pid, &mut status),
                        Ok(sig) if status.is_none() => {
                            let _ = kill(Pid::from_raw(pid), sig);
                        }
                        _ => {}
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    *conn = None;
                    if !req.keep {
                        // The client hung up: nobody is left to see the command, end it.
                        kill_tree(pid, &mut status);
                    }
                    // A kept command runs on, its output dropped until a client attaches.
                }
            }
        }
        // After the current client's frames: the one that attaches replaces it.
        if attach_ready {
            if let Some(mut c) = attach.as_ref().and_then(|(l, _)| take_client(l)) {
                // The client attached before, if any, is let go: one client at a time.
                if send(
                    &mut c,
                    Kind::Started,
                    &ExecStarted {
                        pid,
                        log_path: None,
                    },
                )
                .is_ok()
                {
                    *conn = Some(c);
                    pending = Pending::default();
                }
            }
        }
        if sig_ready {
            let _ = drain_signals(&sigfd);
            reap(pid, &mut status);
        }
        if status.is_none() {
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    timed_out = true;
                    kill_tree(pid, &mut status);
                }
            }
        }
        if status.is_some() && drain_until.is_none() {
            // Descendants may keep the pipes open; give them a moment, not forever.
            drain_until = Some(Instant::now() + Duration::from_millis(100));
        }
    }
    // The command exited (or was killed): collect whatever is still readable.
    for (fd, kind) in [(&mut out, Kind::Stdout), (&mut err, Kind::Stderr)] {
        if let Some(f) = fd.as_ref() {
            let _ = nix::fcntl::fcntl(
                f.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            );
        }
        while fd.is_some() && pump(fd, &mut buf, conn, kind).unwrap_or(false) {}
    }
    if timed_out {
        kill_tree(pid, &mut status);
    }
    if let Some((l, path)) = attach {
        drop(l);
        let _ = std::fs::remove_file(path);
    }
    let exit = exit_of(status, timed_out, started.elapsed());
    if let Some(c) = conn.as_mut() {
        send(c, Kind::Exit, &exit)?;
    }
    Ok(None)
}

fn run_detached(
    conn: &mut UnixStream,
    req: &ExecRequest,
    mut cmd: Command,
) -> Result<Option<Detached>, String> {
    let name = req
        .log
        .clone()
        .unwrap_or_else(|| format!("exec-{}", crate::id::random_hex(6)));
    let log_path = format!("{}/{name}.log", crate::layout::LOG_DIR);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("open {log_path}: {e}"))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().map_err(|e| e.to_string())?))
        .stderr(Stdio::from(log));
    forkd_sys::session_leader(&mut cmd, false);
    let started_us = now_us();
    let child = cmd.spawn().map_err(|e| spawn_error(req, e))?;
    let pid = child.id() as i32;
    send(
        conn,
        Kind::Started,
        &ExecStarted {
            pid,
            log_path: Some(log_path),
        },
    )?;
    Ok(Some(Detached {
        pid,
        name,
        started_us,
    }))
}

fn spawn_error(req: &ExecRequest, e: std::io::Error) -> String {
    let prog = req.command_line().first().cloned().unwrap_or_default();
    match e.kind() {
        std::io::ErrorKind::NotFound => format!("{prog}: command not found"),
        std::io::ErrorKind::PermissionDenied => format!("{prog}: permission denied"),
        _ => format!("start {prog}: {e}"),
    }
}

fn send<T: serde::Serialize>(conn: &mut UnixStream, kind: Kind, value: &T) -> Result<(), String> {
    let body = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    proto::write_frame(conn, kind, &body).map_err(|e| format!("write to client: {e}"))
}

/// Reads one chunk from `fd` and forwards it; false at end of stream.
fn pump(
    fd: &mut Option<OwnedFd>,
    buf: &mut [u8],
    conn: &mut Option<UnixStream>,
    kind: Kind,
) -> Result<bool, String> {
    let Some(f) = fd.as_ref() else {
        return Ok(false);
    };
    match nix::unistd::read(f.as_raw_fd(), buf) {
        Ok(0) => Ok(false),
        Ok(n) => {
            // A client that went away is handled by the poll loop; keep draining. With
            // no client (a kept command), the output is dropped.
            if let Some(c) = conn.as_mut() {
                let _ = proto::write_frame(c, kind, &buf[..n]);
            }
            Ok(true)
        }
        Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => Ok(false),
        // EIO is how a pty reports that its last writer has gone.
        Err(_) => Ok(false),
    }
}

/// Stdin received from the client and not yet written to the command.
#[derive(Default)]
struct Pending {
    data: Vec<u8>,
    /// How much of `data` is written.
    at: usize,
}

impl Pending {
    /// Writes what one ready descriptor takes without blocking: at most `PIPE_BUF`
    /// bytes, which a pipe with room for anything takes whole. False once the command's
    /// end is closed.
    fn feed(&mut self, stdin: &Option<File>) -> bool {
        let Some(fd) = stdin else {
            return false;
        };
        let end = (self.at + libc::PIPE_BUF).min(self.data.len());
        match nix::unistd::write(fd, &self.data[self.at..end]) {
            Ok(n) => {
                self.at += n;
                if self.at == self.data.len() {
                    self.data = Vec::new();
                    self.at = 0;
                }
                true
            }
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => true,
            Err(_) => false,
        }
    }
}

/// The end of the client's stdin: the end of the pipe, or on a terminal the EOF
/// character.
fn end_stdin(stdin: &mut Option<File>, tty: bool) {
    if tty {
        if let Some(fd) = stdin {
            let _ = (&*fd).write_all(&[4]);
        }
    } else {
        *stdin = None;
    }
}

fn drain_signals(sigfd: &SignalFd) -> usize {
    let mut n = 0;
    while let Ok(Some(_)) = sigfd.read_signal() {
        n += 1;
    }
    n
}

/// Builds the command: program, environment, working directory and identity.
fn build_command(req: &ExecRequest) -> Result<Command, String> {
    // Checked again here rather than trusted: the request came over a socket that
    // processes inside the sandbox can reach too.
    req.validate()?;
    let argv = req.command_line();
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| "argv is empty".to_string())?;
    let (uid, gid, home) = resolve_user(req.user.as_deref())?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd.env_clear();
    cmd.env("PATH", DEFAULT_PATH).env("HOME", &home);
    if crate::rseq_off() {
        // Before the request's own variables, which may set it otherwise.
        cmd.env(crate::RSEQ_OFF.0, crate::RSEQ_OFF.1);
    }
    if let Ok(h) = nix::unistd::gethostname() {
        cmd.env("HOSTNAME", h);
    }
    if req.tty {
        cmd.env("TERM", "xterm-256color");
    }
    for kv in &req.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("env entry {kv:?} is not KEY=VALUE"))?;
        cmd.env(k, v);
    }
    cmd.current_dir(req.cwd.as_deref().unwrap_or("/"));
    if uid != 0 || gid != 0 {
        cmd.gid(gid).uid(uid);
        // Supplementary groups are dropped (std does this when uid/gid change as root).
    }
    Ok(cmd)
}

/// Resolves `NAME`, `UID` or `UID:GID` against the sandbox's own /etc/passwd.
fn resolve_user(spec: Option<&str>) -> Result<(u32, u32, String), String> {
    let Some(spec) = spec.filter(|s| !s.is_empty()) else {
        return Ok((0, 0, "/root".into()));
    };
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entry = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 6 && (f[0] == user || f[2] == user)).then(|| {
            (
                f[2].parse::<u32>().ok(),
                f[3].parse::<u32>().ok(),
                f[5].to_string(),
            )
        })
    });
    let (uid, default_gid, home) = match (entry, user.parse::<u32>()) {
        (Some((Some(u), g, h)), _) => (u, g.unwrap_or(u), h),
        (_, Ok(u)) => (u, u, "/".to_string()),
        _ => {
            return Err(format!(
                "user {user:?} not found in the sandbox's /etc/passwd"
            ))
        }
    };
    let gid = match group {
        None => default_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
                groups
                    .lines()
                    .find_map(|l| {
                        let f: Vec<&str> = l.split(':').collect();
                        (f.len() >= 3 && f[0] == g)
                            .then(|| f[2].parse::<u32>().ok())
                            .flatten()
                    })
                    .ok_or_else(|| format!("group {g:?} not found in the sandbox's /etc/group"))?
            }
        },
    };
    Ok((uid, gid, home))
}

#[cfg(test)]
mod tests;
