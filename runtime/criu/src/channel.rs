//! The channel a CRIU exchange runs over (CRIU's RPC, a template's requests): the socket
//! pair, waiting on it, and the log level asked of CRIU.

use crate::*;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

/// A socket pair as CRIU's RPC (and a template's requests) want it: SOCK_SEQPACKET, one
/// message per read.
pub(crate) fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), CriuError> {
    nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| io("socketpair")(e.into()))
}

/// Waits until `f` can be read or `deadline` passes; whether it can.
pub(crate) fn wait_readable(f: &std::fs::File, deadline: Instant) -> std::io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        // A deadline already past still looks once (a poll that does not wait).
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) if left.is_zero() => return Ok(false),
            Ok(0) => continue,
            Ok(_) => return Ok(true),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// CRIU's default log level: errors and warnings, which is what a failure report
/// needs. Level 4 (debug) logs every step and costs some 7 ms of a 35 ms restore.
pub const DEFAULT_LOG_LEVEL: i32 = 2;
