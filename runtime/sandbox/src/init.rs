//! The init: PID 1 of every sandbox.
//!
//! It is a session leader, reaps every orphan, and is the ancestor of every process the
//! sandbox runs, because CRIU checkpoints the tree rooted at the init and silently drops
//! anything that entered the namespaces from outside. It listens on
//! `/.forkd/run/init.sock`; each connection carries one exec (see [`crate::proto`]) and
//! is served by a forked relay process (see [`crate::relay`]), so a long command never
//! blocks the next one and the init itself stays a tiny, single-threaded loop.
//!
//! A detached command's relay hands the command over (one JSON line on the hand-over
//! pipe: pid, log name, start time) and exits; the init, which adopts it then, reaps it
//! and writes its exit to `/.forkd/logs/<name>.exit`. The line is written before the
//! relay exits, and the command becomes the init's child only when the relay has
//! exited, so by the time the init reaps the command its line is in the pipe: the init
//! reads the pipe before it looks a reaped pid up.
//!
//! Signals: SIGTERM (sent by `forkd stop`) is passed on to every process of the
//! sandbox (found in the sandbox's own `/proc`, see [`terminate_the_others`]); the init
//! exits once they are gone, and the kernel then kills whatever is left in the pid
//! namespace.

use crate::relay;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;

const SOCKET: &str = crate::layout::CONTROL_SOCKET_PATH;

/// Tells the set-up that the control socket listens on `ready`, the descriptor a fresh
/// init is handed (a restored one has none), and closes it, so that nothing this init
/// starts inherits it.
fn say_listening(ready: Option<i32>) {
    let Some(fd) = ready else {
        return;
    };
    if fd > 2 && nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok() {
        let f = forkd_sys::own_fd(fd);
        let _ = nix::unistd::write(&f, b"1");
    }
}

/// Entry point of `/.forkd/init __init`: `ready` is the descriptor on which a fresh init
/// tells its set-up that it listens (one byte; [`crate::layout::READY_FD_ENV`]). Never
/// returns.
pub fn init_main(ready: Option<i32>) -> ! {
    match serve(ready) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("forkd-init: {e}");
            std::process::exit(1)
        }
    }
}

fn serve(ready: Option<i32>) -> std::io::Result<()> {
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    mask.thread_block()?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    let _ = std::fs::remove_file(SOCKET);
    let listener = UnixListener::bind(SOCKET)?;
    std::fs::set_permissions(SOCKET, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    say_listening(ready);
    let (handover_rx, handover_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
    let mut detached = Handovers {
        rx: std::fs::File::from(handover_rx),
        partial: Vec::new(),
        by_pid: HashMap::new(),
    };
    let mut stopping = false;
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let accept_ready = fds[0].any().unwrap_or(false);
        let signal_ready = fds[1].any().unwrap_or(false);
        if signal_ready {
            while let Ok(Some(info)) = sigfd.read_signal() {
                if info.ssi_signo != Signal::SIGCHLD as u32 && !stopping {
                    stopping = true;
                    terminate_the_others();
                }
            }
            if reap_all(&mut detached) && stopping {
                return Ok(());
            }
        }
        if accept_ready && !stopping {
            while let Ok((conn, _)) = listener.accept() {
                match forkd_sys::fork_single_threaded() {
                    Ok(0) => {
                        drop(listener);
                        drop(sigfd);
                        let _ = mask.thread_unblock();
                        let tx = handover_tx.try_clone();
                        match tx {
                            Ok(tx) => relay::serve_connection(conn, tx),
                            Err(e) => {
                                eprintln!("forkd-init relay: hand-over pipe: {e}");
                                std::process::exit(1)
                            }
                        }
                    }
                    Ok(_) => drop(conn),
                    Err(e) => eprintln!("forkd-init: fork relay: {e}"),
                }
            }
        }
    }
}

/// Sends SIGTERM to every other process of the sandbox, found in its `/proc`, which
/// lists only the sandbox's pid namespace.
///
/// `kill(-1)` from PID 1 reaches the same processes, but the kernel finds them by
/// walking every process on the host while holding the lock that every fork and exit
/// on the host takes: with thousands of sandboxes alive that made each stop slower and
/// stalled the host's forks meanwhile. The directory is read again until a pass finds no
/// process it has not signalled, so a child forked while the first pass ran is reached
/// too. Falls back to `kill(-1)` when `/proc` is not this namespace's.
fn terminate_the_others() {
    let everyone = || {
        let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
    };
    if std::fs::read_link("/proc/self").map_or(true, |p| p.as_os_str() != "1") {
        return everyone();
    }
    let mut signalled = std::collections::HashSet::new();
    for _ in 0..16 {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return everyone();
        };
        let mut found_new = false;
        for pid in dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        {
            if pid > 1 && signalled.insert(pid) {
                found_new = true;
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        if !found_new {
            return;
        }
    }
}

/// Detached commands handed over by their relays, by pid.
struct Handovers {
    rx: std::fs::File,
    partial: Vec<u8>,
    by_pid: HashMap<i32, relay::Detached>,
}

impl Handovers {
    /// Takes in every complete line waiting in the pipe.
    fn read(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.rx.read(&mut buf) {
            if n == 0 {
                break;
            }
            self.partial.extend_from_slice(&buf[..n]);
        }
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            match serde_json::from_slice::<relay::Detached>(&line) {
                Ok(d) => {
                    self.by_pid.insert(d.pid, d);
                }
                Err(e) => eprintln!("forkd-init: bad hand-over line: {e}"),
            }
        }
    }

    /// Records the exit of `pid` if it is a handed-over command.
    fn exited(&mut self, pid: i32, status: WaitStatus) {
        if !self.by_pid.contains_key(&pid) {
            self.read();
        }
        let Some(d) = self.by_pid.remove(&pid) else {
            return;
        };
        let elapsed =
            std::time::Duration::from_micros(relay::now_us().saturating_sub(d.started_us));
        let exit = relay::exit_of(Some(status), false, elapsed);
        let path = format!("{}/{}.exit", crate::layout::LOG_DIR, d.name);
        if let Err(e) = std::fs::write(&path, serde_json::to_vec(&exit).unwrap_or_default()) {
            eprintln!("forkd-init: {path}: {e}");
        }
    }
}

/// Reaps every exited child, recording the exits of handed-over commands; returns true
/// when no child is left at all.
fn reap_all(detached: &mut Handovers) -> bool {
    detached.read();
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return false,
            Ok(ws) => {
                if let Some(pid) = ws.pid() {
                    detached.exited(pid.as_raw(), ws);
                }
            }
            Err(nix::errno::Errno::ECHILD) => return true,
            Err(_) => return false,
        }
    }
}
