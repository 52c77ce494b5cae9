//! The API's connections: every listener (the daemon's Unix socket, the grants' sockets,
//! TCP with or without TLS) hands each connection to hyper with the [`Caller`] it stands
//! for, and hyper hands each request to the router (`routes::answer`), which authenticates
//! and admits it (`access.rs`). Bounds that keep a slow or hostile peer cheap are set
//! here, once for every listener. See docs/DESIGN.md, "Reach".

pub mod access;
pub mod audit;
mod tls;

use super::grants::{Grant, GrantSocket};
use super::{log, routes, Daemon};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
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
}

/// The TCP listeners (`FORKD_LISTEN`) and what they share.
#[derive(Debug, Clone, Default)]
pub struct Listen {
    pub tcp: Vec<std::net::SocketAddr>,
    pub tls: Option<TlsFiles>,
    /// Connections each listener serves at once.
    pub max_connections: usize,
    pub audit_max_bytes: u64,
}

/// PEM files: the listeners' certificate chain and key, and the CA clients' certificates
/// must chain to (mutual TLS).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_ca: Option<std::path::PathBuf>,
}

/// Binds every TCP listener of `listen` (and reads the TLS files): an error names the
/// address or the file, and the daemon does not start.
pub async fn bind_tcp(
    listen: &Listen,
) -> anyhow::Result<Vec<(tokio::net::TcpListener, Option<tokio_rustls::TlsAcceptor>)>> {
    let acceptor = listen.tls.as_ref().map(tls::acceptor).transpose()?;
    let mut out = Vec::new();
    for addr in &listen.tcp {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("listen on tcp://{addr}: {e}"))?;
        out.push((l, acceptor.clone()));
    }
    Ok(out)
}

/// Serves one TCP listener until `stop` resolves: at most `max` connections at once
/// (the rest wait in the kernel's backlog), each with `HEAD_TIMEOUT` to finish its TLS
/// handshake.
pub async fn serve_tcp(
    daemon: Arc<Daemon>,
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    max: usize,
    stop: impl std::future::Future<Output = ()>,
) {
    use std::os::fd::AsFd;
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    tokio::pin!(stop);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    log::warn(&format!("accept on {:?}: {e}", listener.local_addr().ok()));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let peer = match Peer::of(stream.as_fd(), true) {
            Ok(p) => p,
            Err(e) => {
                log::warn(&format!("accept from {addr}: {e}"));
                continue;
            }
        };
        let daemon = daemon.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let caller = Caller::Remote(addr);
            match tls {
                None => serve_connection(daemon, stream, caller, peer).await,
                Some(acceptor) => {
                    // A failed or slow handshake ends the connection; rustls has sent
                    // the peer what alert it could.
                    let shaken = tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(stream)).await;
                    if let Ok(Ok(s)) = shaken {
                        serve_connection(daemon, s, caller, peer).await
                    }
                }
            }
        });
    }
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
}

impl Peer {
    /// Watches the socket behind `fd` (a duplicate is kept).
    pub fn of(fd: std::os::fd::BorrowedFd<'_>, tcp: bool) -> std::io::Result<Peer> {
        Ok(Peer {
            fd: Arc::new(fd.try_clone_to_owned()?),
            tcp,
        })
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
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::{AsFd, AsRawFd};
        // A hang-up or an error is reported whatever is asked for.
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => {
                let r = fds[0].revents().unwrap_or(PollFlags::POLLHUP);
                if r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
                    return true;
                }
            }
            Err(_) => return true,
        }
        // The end of the peer's stream: nothing left to read, and no more coming.
        self.tcp
            && matches!(
                recv(
                    self.fd.as_raw_fd(),
                    &mut [0u8; 1],
                    MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
                ),
                Ok(0)
            )
    }
}

/// Serves one connection until its peer closes it, or it breaks a bound. A Unix
/// socket's connection carries one request (the API's contract there since its first
/// version); a TCP connection is kept alive between requests.
pub async fn serve_connection<I>(daemon: Arc<Daemon>, io: I, caller: Caller, peer: Peer)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let keep_alive = peer.tcp;
    let service = hyper::service::service_fn(move |req| {
        let daemon = daemon.clone();
        let caller = caller.clone();
        let peer = peer.clone();
        async move { Ok::<_, Infallible>(routes::answer(daemon, caller, peer, req).await) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .half_close(true)
        .keep_alive(keep_alive);
    // A peer that went away, sent what is not HTTP (hyper answers 400 or 431 where it
    // can) or was too slow: the connection ends, and nothing more is owed.
    let _ = http
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await;
}

/// Serves the daemon's Unix socket until `stop` resolves.
pub async fn serve_unix(
    daemon: Arc<Daemon>,
    listener: tokio::net::UnixListener,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    use std::os::fd::AsFd;
                    match Peer::of(stream.as_fd(), false) {
                        Ok(peer) => {
                            tokio::spawn(serve_connection(daemon.clone(), stream, Caller::Node, peer));
                        }
                        Err(e) => log::warn(&format!("accept: {e}")),
                    }
                }
                Err(e) => log::warn(&format!("accept: {e}")),
            },
            () = &mut stop => break,
        }
    }
}

/// Serves a grant's socket until the grant ends: each connection as the daemon's own,
/// with the grant as its caller.
pub fn serve_grant(daemon: &Arc<Daemon>, socket: GrantSocket) {
    let GrantSocket {
        listener,
        grant,
        mut stopped,
    } = socket;
    let daemon = daemon.clone();
    daemon.runtime.clone().spawn(async move {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                log::warn(&format!("grant {}: serve: {e}", grant.id));
                return;
            }
        };
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        use std::os::fd::AsFd;
                        let caller = Caller::Grant(grant.clone());
                        match Peer::of(stream.as_fd(), false) {
                            Ok(peer) => {
                                tokio::spawn(serve_connection(daemon.clone(), stream, caller, peer));
                            }
                            Err(e) => log::warn(&format!("grant {}: accept: {e}", grant.id)),
                        }
                    }
                    Err(e) => log::warn(&format!("grant {}: accept: {e}", grant.id)),
                },
                _ = stopped.changed() => break,
            }
        }
    });
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

fn bridge<S>(mut far: S, early: bytes::Bytes) -> std::io::Result<std::os::unix::net::UnixStream>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::AsyncWriteExt;
    let (near, inner) = std::os::unix::net::UnixStream::pair()?;
    inner.set_nonblocking(true)?;
    let mut inner = tokio::net::UnixStream::from_std(inner)?;
    tokio::spawn(async move {
        if !early.is_empty() && inner.write_all(&early).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut far, &mut inner).await;
    });
    Ok(near)
}
