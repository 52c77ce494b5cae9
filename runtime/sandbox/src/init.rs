//! The init: PID 1 of every sandbox.
//!
//! It is a session leader, reaps every orphan, and is the ancestor of every process the
//! sandbox runs, because CRIU checkpoints the tree rooted at the init and silently drops
//! anything that entered the namespaces from outside. It listens on
//! `/.forkd/run/init.sock`; each connection carries one exec (see [`crate::proto`]) and
//! is served by a forked relay process (see [`crate::relay`]), so a long command never
//! blocks the next one and the init itself stays a tiny, single-threaded loop.
//!
//! Signals: SIGTERM (sent by `forkd stop`) is passed on to every process of the
//! sandbox; the init exits once they are gone, and the kernel then kills whatever is
//! left in the pid namespace.

use crate::relay;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;

const SOCKET: &str = "/.forkd/run/init.sock";

/// Entry point of `/.forkd/init __init`. Never returns.
pub fn init_main() -> ! {
    match serve() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("forkd-init: {e}");
            std::process::exit(1)
        }
    }
}

fn serve() -> std::io::Result<()> {
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
                    // kill(-1) from PID 1 reaches every other process in the namespace.
                    let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
                }
            }
            if reap_all() && stopping {
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
                        relay::serve_connection(conn)
                    }
                    Ok(_) => drop(conn),
                    Err(e) => eprintln!("forkd-init: fork relay: {e}"),
                }
            }
        }
    }
}

/// Reaps every exited child; returns true when no child is left at all.
fn reap_all() -> bool {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return false,
            Ok(_) => continue,
            Err(nix::errno::Errno::ECHILD) => return true,
            Err(_) => return false,
        }
    }
}
