//! E2B's protocol on the daemon's listeners: the daemon hands E2B's requests to the
//! `forkd-e2b` crate, a client of this API, and gives it connections to the API that
//! act for the key a request stands for ([`Acting`]). Those connections are served
//! like any other (the router authenticates nothing more, and admits, audits and
//! answers them as that key's own requests), so the translation reaches exactly what
//! its caller's key may.

use super::server::{serve_connection, Caller, Peer};
use super::Daemon;
use crate::api::client::Client;
use crate::api::transport::{Dial, Endpoint};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// The layer's settings, from the daemon's.
pub fn settings(config: &super::config::Config) -> forkd_e2b::Settings {
    forkd_e2b::Settings {
        max_body: config.max_copy_bytes,
        domain: config.listen.e2b_domain.clone(),
        tls: config.listen.tls.is_some(),
    }
}

/// What the E2B layer may do for one request from `peer`.
pub struct Acting {
    pub daemon: Arc<Daemon>,
    pub peer: SocketAddr,
}

impl Acting {
    fn client(&self, key: forkd_keys::Key) -> Client {
        Client::at(Endpoint::Dial(Arc::new(Dialer {
            daemon: self.daemon.clone(),
            key: Arc::new(key),
            peer: self.peer,
        })))
    }
}

impl forkd_e2b::Forkd for Acting {
    fn as_key(&self, secret: &str) -> Result<Client, String> {
        match self.daemon.node.keys.verify(secret) {
            Ok(Some(key)) => Ok(self.client(key)),
            Ok(None) => Err("the API key is not one this daemon holds".into()),
            Err(e) => Err(format!("the daemon cannot read its keys: {e}")),
        }
    }

    fn as_owner_of(&self, id: &str) -> Result<Client, String> {
        let sb = self.daemon.sandboxes.get(id).map_err(|e| e.message)?;
        if sb.id.to_string() != id {
            // A prefix names no E2B sandbox: the SDK always sends the whole id.
            return Err(format!("no sandbox {id}"));
        }
        let owner = sb
            .record
            .locked()
            .owner
            .clone()
            .ok_or_else(|| format!("sandbox {id} was made by no key"))?;
        let keys = self
            .daemon
            .node
            .keys
            .current()
            .map_err(|e| format!("the daemon cannot read its keys: {e}"))?;
        let key = keys
            .iter()
            .find(|k| k.id == owner)
            .cloned()
            .ok_or_else(|| format!("the key that made sandbox {id} has been removed"))?;
        Ok(self.client(key))
    }
}

/// Connections to the API, each served as `key`'s on behalf of `peer`.
struct Dialer {
    daemon: Arc<Daemon>,
    key: Arc<forkd_keys::Key>,
    peer: SocketAddr,
}

impl Dial for Dialer {
    fn dial(&self) -> std::io::Result<UnixStream> {
        use std::os::fd::AsFd;
        let (near, far) = UnixStream::pair()?;
        far.set_nonblocking(true)?;
        let peer = Peer::of(far.as_fd(), false)?;
        let caller = Caller::Acting {
            key: self.key.clone(),
            peer: self.peer,
        };
        let daemon = self.daemon.clone();
        self.daemon.runtime.spawn(async move {
            if let Ok(far) = tokio::net::UnixStream::from_std(far) {
                serve_connection(daemon, far, caller, peer).await;
            }
        });
        Ok(near)
    }

    fn describe(&self) -> String {
        format!("the daemon, for key {} of {}", self.key.name, self.peer)
    }
}
