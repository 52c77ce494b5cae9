//! The API's connections: every listener (the daemon's Unix socket, the grants' sockets,
//! TCP with or without TLS) hands each connection to hyper with the [`Caller`] it stands
//! for, and hyper hands each request to the router (`routes::answer`), which authenticates
//! and admits it (`access.rs`). Bounds that keep a slow or hostile peer cheap are set
//! here, once for every listener. See docs/DESIGN.md, "Reach".

pub mod access;
pub mod audit;
pub mod conn;
mod tls;

use super::config::Listen;
pub use conn::{Caller, Peer, HEAD_TIMEOUT, MAX_HEAD};

use super::grants::GrantSocket;
use super::{log, routes, Daemon};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};

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
        // A peer that vanished without a word (its host gone) is found out.
        let _ = nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::KeepAlive, &true);
        let peer = match Peer::of(stream.as_fd(), true) {
            Ok(p) => p.holding(slot),
            Err(e) => {
                log::warn(&format!("accept from {addr}: {e}"));
                continue;
            }
        };
        let daemon = daemon.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
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

/// Serves one connection until its peer closes it, or it breaks a bound. A Unix
/// socket's connection carries one request (the API's contract there since its first
/// version); a TCP connection is kept alive between requests.
pub async fn serve_connection<I>(daemon: Arc<Daemon>, io: I, caller: Caller, peer: Peer)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let keep_alive = peer.is_tcp();
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

/// Serves each connection a protocol translation dials (see `E2b::connections`), as the
/// caller it acts for, until `dialed` ends.
pub async fn serve_dialed(
    daemon: Arc<Daemon>,
    mut dialed: tokio::sync::mpsc::UnboundedReceiver<super::e2b::Dialed>,
) {
    use std::os::fd::AsFd;
    while let Some(d) = dialed.recv().await {
        let peer = match Peer::of(d.stream.as_fd(), false) {
            Ok(p) => p,
            Err(e) => {
                log::warn(&format!("a dialled connection: {e}"));
                continue;
            }
        };
        match tokio::net::UnixStream::from_std(d.stream) {
            Ok(s) => {
                tokio::spawn(serve_connection(daemon.clone(), s, d.caller, peer));
            }
            Err(e) => log::warn(&format!("a dialled connection: {e}")),
        }
    }
}

/// Serves each grant's socket as it is made (see `Grants::sockets`) until `sockets` ends.
pub async fn serve_grants(
    daemon: Arc<Daemon>,
    mut sockets: tokio::sync::mpsc::UnboundedReceiver<GrantSocket>,
) {
    while let Some(socket) = sockets.recv().await {
        serve_grant(&daemon, socket);
    }
}

/// Serves a grant's socket until the grant ends: each connection as the daemon's own,
/// with the grant as its caller.
fn serve_grant(daemon: &Arc<Daemon>, socket: GrantSocket) {
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
