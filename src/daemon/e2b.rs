//! E2B's protocol on the daemon's listeners: the daemon hands E2B's requests to the
//! `forkd-e2b` crate, a client of this API, and gives it connections to the API that
//! act for the key a request stands for ([`Acting`]). Each is one end of a socket pair
//! whose other end goes to the server on a channel ([`E2b::connections`], as grants'
//! sockets do), which serves it like any other connection (the router authenticates
//! nothing more, and admits, audits and answers its requests as that key's own), so the
//! translation reaches exactly what its caller's key may.

use super::server::conn::Caller;
use super::Daemon;
use crate::api::client::Client;
use crate::api::transport::{Dial, Endpoint};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// A connection to the API that a translation dialled, for the server to serve as
/// `caller`'s.
pub struct Dialed {
    pub stream: UnixStream,
    pub caller: Caller,
}

/// The E2B layer, and the connections it dials.
pub struct E2b {
    pub gateway: Arc<forkd_e2b::Gateway>,
    to_serve: tokio::sync::mpsc::UnboundedSender<Dialed>,
    dialed: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Dialed>>>,
}

impl E2b {
    pub fn new(config: &super::config::Config) -> E2b {
        let (to_serve, dialed) = tokio::sync::mpsc::unbounded_channel();
        E2b {
            gateway: Arc::new(forkd_e2b::Gateway::new(settings(config))),
            to_serve,
            dialed: std::sync::Mutex::new(Some(dialed)),
        }
    }

    /// The connections translations dial, each as it is made, for the server (once).
    pub fn connections(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Dialed>> {
        self.dialed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// The layer's settings, from the daemon's.
fn settings(config: &super::config::Config) -> forkd_e2b::Settings {
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
        let (near, far) = UnixStream::pair()?;
        far.set_nonblocking(true)?;
        let caller = Caller::Acting {
            key: self.key.clone(),
            peer: self.peer,
        };
        self.daemon
            .e2b
            .to_serve
            .send(Dialed {
                stream: far,
                caller,
            })
            .map_err(|_| std::io::Error::other("the daemon's server has stopped"))?;
        Ok(near)
    }

    fn describe(&self) -> String {
        format!("the daemon, for key {} of {}", self.key.name, self.peer)
    }
}
