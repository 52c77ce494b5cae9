//! A connection as the router sees it: who it is from ([`Caller`]), its peer watched for
//! hanging up ([`Peer`]), and an upgraded one handed over as a blocking stream.

use super::super::grants::Grant;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

/// How long a peer may take to send a request's head (and how long a kept-alive
/// connection may sit idle before its next one).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head hyper buffers.
pub const MAX_HEAD: usize = 64 << 10;

/// Who a connection's requests come from; what they may do is decided before routing.
#[derive(Clone)]
pub enum Caller {
    /// The daemon's own Unix socket: the node's operator.
    Node,
    /// A grant's socket: one sandbox, some operations, a step budget.
    Grant(Arc<Grant>),
    /// A TCP peer: each request must carry an API key.
    Remote(std::net::SocketAddr),
    /// A protocol translation served inside the daemon (E2B's), acting for a key it has
    /// authenticated, on behalf of the TCP peer `peer`: as that key's own request.
    Acting {
        key: Arc<forkd_keys::Key>,
        peer: std::net::SocketAddr,
    },
}

/// A connection's peer, watched for hanging up while its request runs: hyper is told to
/// keep answering a client that shut only its sending half (HTTP allows it, and raw
/// clients do it), so a client that went away is seen on the socket itself.
#[derive(Clone)]
pub struct Peer {
    fd: Arc<std::os::fd::OwnedFd>,
    /// On TCP the end of the peer's stream counts as gone (TLS has no half-close); on a
    /// Unix socket only a hang-up of both halves does.
    tcp: bool,
    /// The listener's slot the connection takes, held by every clone: an upgraded exec
    /// keeps it until its relay ends.
    slot: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
}

impl Peer {
    /// Watches the socket behind `fd` (a duplicate is kept).
    pub fn of(fd: std::os::fd::BorrowedFd<'_>, tcp: bool) -> std::io::Result<Peer> {
        Ok(Peer {
            fd: Arc::new(fd.try_clone_to_owned()?),
            tcp,
            slot: None,
        })
    }

    /// The peer, holding `slot` of its listener while it or any clone lives.
    pub fn holding(mut self, slot: tokio::sync::OwnedSemaphorePermit) -> Peer {
        self.slot = Some(Arc::new(slot));
        self
    }

    /// Whether the peer is on TCP (a connection kept alive between requests).
    pub fn is_tcp(&self) -> bool {
        self.tcp
    }

    /// Resolves once the peer has gone.
    pub async fn gone(&self) {
        loop {
            if self.is_gone() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn is_gone(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        // A hang-up or an error is reported whatever is asked for; on TCP the end of the
        // peer's stream (POLLRDHUP) is asked for too, even with bytes unread before it (a
        // TLS close_notify).
        let events = if self.tcp {
            PollFlags::from_bits_retain(libc::POLLRDHUP)
        } else {
            PollFlags::empty()
        };
        let mut fds = [PollFd::new(self.fd.as_fd(), events)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => match fds[0].revents() {
                // nix has no name for POLLRDHUP: a bit it cannot name is that one.
                None => true,
                Some(r) => r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR),
            },
            Err(_) => true,
        }
    }
}

/// The upgraded connection as a blocking Unix stream, which the exec relay reads and
/// writes from its own threads. A connection on a Unix socket is handed over as it is;
/// any other (TLS, TCP), or one with bytes hyper had already read, is bridged through a
/// socket pair whose far end a task copies to and from it.
pub fn into_std_stream(
    upgraded: hyper::upgrade::Upgraded,
) -> std::io::Result<std::os::unix::net::UnixStream> {
    match upgraded.downcast::<TokioIo<tokio::net::UnixStream>>() {
        Ok(parts) if parts.read_buf.is_empty() => {
            let s = parts.io.into_inner().into_std()?;
            s.set_nonblocking(false)?;
            Ok(s)
        }
        Ok(parts) => bridge(parts.io.into_inner(), parts.read_buf),
        Err(upgraded) => bridge(TokioIo::new(upgraded), bytes::Bytes::new()),
    }
}

fn bridge<S>(far: S, early: bytes::Bytes) -> std::io::Result<std::os::unix::net::UnixStream>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::AsyncWriteExt;
    let (near, inner) = std::os::unix::net::UnixStream::pair()?;
    inner.set_nonblocking(true)?;
    let inner = tokio::net::UnixStream::from_std(inner)?;
    tokio::spawn(async move {
        let (mut from_peer, mut to_peer) = tokio::io::split(far);
        let (mut from_relay, mut to_relay) = inner.into_split();
        if !early.is_empty() && to_relay.write_all(&early).await.is_err() {
            return;
        }
        let up = async {
            let _ = tokio::io::copy(&mut from_peer, &mut to_relay).await;
            let _ = to_relay.shutdown().await;
        };
        let down = async {
            let _ = tokio::io::copy(&mut from_relay, &mut to_peer).await;
            let _ = to_peer.shutdown().await;
        };
        tokio::pin!(up, down);
        tokio::select! {
            // The peer ended its side (stdin done): the output still flows, for as long
            // as the command runs.
            () = &mut up => down.await,
            // The relay ended (the command exited): the peer has a bound to say goodbye,
            // not for ever.
            () = &mut down => {
                let _ = tokio::time::timeout(HEAD_TIMEOUT, up).await;
            }
        }
    });
    Ok(near)
}
