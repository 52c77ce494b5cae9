//! E2B's protocol, answered with forkd: the control plane's REST API (`/sandboxes`,
//! `/v2/sandboxes`, ...) and envd, the in-sandbox API (Connect with the JSON codec, and
//! `/files`), translated into calls of forkd's own API. E2B's SDK, and the tools built
//! on it, then run on forkd unchanged.
//!
//! This crate is a client of forkd's API, like the CLI: each request is turned into
//! `forkd_api` calls made through a [`Forkd`] the daemon gives it, acting as the caller
//! (the API key of `X-API-KEY`, or, for envd, the key that made the sandbox once its
//! access token is checked), and the answers are turned back. It never reaches the
//! runtime, and keeps nothing that forkd's records do not hold but the commands it is
//! running (`process.rs`) and what it has read of a sandbox (`Sandboxes`). The wire it
//! answers is docs/E2B.md's.
//!
//! - `control.rs`: the control plane; `sandboxes.rs`: what a forkd sandbox is to it;
//! - `states.rs`: pauses, resumes, snapshots and forks (live checkpoints);
//! - `templates.rs`: template builds (forkd builds of an uploaded context);
//! - `envd.rs`: envd's routing, authentication, `/health` and `/files`; `rpc.rs`: the
//!   sandbox an envd call is for, and Connect's errors as answers;
//! - `process.rs`: envd's `process.Process` service (commands, PTYs);
//! - `filesystem.rs`: envd's `filesystem.Filesystem` service;
//! - `connect.rs`: the Connect protocol's envelopes and errors;
//! - `wire.rs`: the messages of both, in E2B's JSON forms.

#![forbid(unsafe_code)]

pub mod connect;
mod control;
mod envd;
mod filesystem;
mod process;
mod rpc;
mod sandboxes;
mod states;
mod templates;
mod wire;

use bytes::Bytes;
use forkd_api::client::{Client, ClientError};
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The body of every answer: whole, or streamed.
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// What this layer asks of forkd: its API, as the caller a request stands for.
pub trait Forkd: Send + Sync + 'static {
    /// forkd's API as the holder of the API key `key` (E2B's `X-API-KEY`: forkd's keys
    /// have E2B's form). `Err` says why not, and is answered 401.
    fn as_key(&self, key: &str) -> Result<Client, String>;
    /// forkd's API as the key that made sandbox `id`. envd's requests act for it once
    /// the sandbox's access token is checked; `Err` (no such sandbox, or one no key
    /// made) is answered as a sandbox that was not found.
    fn as_owner_of(&self, id: &str) -> Result<Client, String>;
}

/// How the layer is set up (the daemon's settings).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The largest request body: a file upload's bound.
    pub max_body: usize,
    /// Where `<port>-<id>.<domain>` Host names are routed to envd, if set.
    pub domain: Option<String>,
    /// Whether the listeners speak TLS (the scheme of the URLs this layer hands out).
    pub tls: bool,
}

/// The layer: its settings, the commands it runs, and what it has read of sandboxes.
pub struct Gateway {
    settings: Settings,
    processes: Arc<process::Table>,
    watchers: filesystem::Watchers,
    builds: templates::Builds,
    sandboxes: Sandboxes,
}

/// The envd version answered to the SDK, which turns its features on by it: stdin
/// (0.3.0), a default user (0.4.0), closing stdin (0.5.2), octet-stream uploads (0.5.7).
pub const ENVD_VERSION: &str = "0.5.7";

/// The port the SDK names envd by (`E2b-Sandbox-Port`, and Host names).
pub const ENVD_PORT: u16 = 49983;

/// The header envd's requests name their sandbox by.
const SANDBOX_HEADER: &str = "e2b-sandbox-id";

/// How long a request body may go without a byte arriving.
const BODY_IDLE: Duration = Duration::from_secs(30);

impl Gateway {
    pub fn new(settings: Settings) -> Gateway {
        Gateway {
            settings,
            processes: Arc::default(),
            watchers: Default::default(),
            builds: Default::default(),
            sandboxes: Sandboxes::default(),
        }
    }

    /// Whether a request is E2B's: envd's (it names a sandbox by header or Host name,
    /// or calls one of envd's services) or the control plane's (its paths). None of
    /// these meets forkd's own paths (`/v1/...`, `/metrics`).
    pub fn claims(&self, path: &str, headers: &hyper::HeaderMap) -> bool {
        self.envd_target(headers).is_some()
            || envd::is_envd_path(path)
            || control::is_control_path(path)
    }

    /// The sandbox an envd request is for: its `E2b-Sandbox-Id` header, else a Host
    /// name `<port>-<id>.<domain>` under the configured domain.
    fn envd_target(&self, headers: &hyper::HeaderMap) -> Option<String> {
        if let Some(v) = headers.get(SANDBOX_HEADER).and_then(|v| v.to_str().ok()) {
            return Some(v.trim().to_string());
        }
        let domain = self.settings.domain.as_deref()?;
        let host = headers.get(hyper::header::HOST)?.to_str().ok()?;
        let host = host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        let label = host.strip_suffix(domain)?.strip_suffix('.')?;
        let (port, id) = label.split_once('-')?;
        (port == ENVD_PORT.to_string() && !id.is_empty() && !id.contains('.'))
            .then(|| id.to_string())
    }

    /// Answers one E2B request.
    pub async fn serve(
        self: Arc<Self>,
        forkd: Arc<dyn Forkd>,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<Body> {
        // The control plane's paths first: some SDK versions send the sandbox header
        // with control-plane calls too.
        if control::is_control_path(req.uri().path()) {
            return control::serve(self, forkd, req).await;
        }
        match self.envd_target(req.headers()) {
            Some(id) => envd::serve(self, forkd, id, req).await,
            None => envd::refuse_unnamed(),
        }
    }
}

/// What the layer has read of a sandbox it serves envd for: its access token, its
/// default user, its users' homes, the environment its commands get. Derived from the sandbox's record (its labels) and its `/etc/passwd`, read once.
#[derive(Debug, Clone)]
pub(crate) struct SandboxFacts {
    pub token: String,
    pub user: String,
    pub homes: HashMap<String, String>,
    pub envs: Vec<(String, String)>,
}

#[derive(Default)]
pub(crate) struct Sandboxes {
    known: Mutex<HashMap<String, Arc<SandboxFacts>>>,
}

impl Sandboxes {
    fn get(&self, id: &str) -> Option<Arc<SandboxFacts>> {
        self.known.lock().unwrap().get(id).cloned()
    }

    fn put(&self, id: &str, facts: Arc<SandboxFacts>) {
        let mut known = self.known.lock().unwrap();
        // Bounded: a sandbox gone without a kill through this layer leaves its entry.
        if known.len() >= 65_536 {
            known.clear();
        }
        known.insert(id.to_string(), facts);
    }

    fn forget(&self, id: &str) {
        self.known.lock().unwrap().remove(id);
    }
}

/// Labels forkd keeps for an E2B sandbox (its record's labels).
pub(crate) mod labels {
    pub const TEMPLATE: &str = "e2b.template";
    /// The secret a sandbox's access token is derived from (with its id: see
    /// [`crate::access_token`]). A fork's sandboxes share it, each with a token of its
    /// own. A label only the sandbox's owner, who may use the sandbox anyway, reads.
    pub const SECRET: &str = "e2b.access-secret";
    /// On a checkpoint: the sandbox a pause stopped.
    pub const PAUSE_OF: &str = "e2b.pause-of";
    /// On a checkpoint: the sandbox whose fork it is.
    pub const FORK_OF: &str = "e2b.fork-of";
    /// On a checkpoint: a snapshot, and its name.
    pub const SNAPSHOT: &str = "e2b.snapshot";
    pub const META: &str = "e2b.meta.";
    pub const ENV: &str = "e2b.env.";
}

/// A whole body.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// An answer of `status` with a JSON body.
pub(crate) fn json(status: u16, value: &serde_json::Value) -> hyper::Response<Body> {
    with_type(status, "application/json", value.to_string())
}

pub(crate) fn with_type(
    status: u16,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(full(body));
    *r.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

pub(crate) fn empty(status: u16) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(full(Bytes::new()));
    *r.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    r
}

/// An error in the form E2B's REST answers carry: `{code, message}`, the code being the
/// status.
pub(crate) fn rest_error(status: u16, message: impl Into<String>) -> hyper::Response<Body> {
    json(
        status,
        &serde_json::json!({ "code": status, "message": message.into() }),
    )
}

/// forkd's answer to a call, as a status and message.
pub(crate) fn failure(e: &ClientError) -> (u16, String) {
    match e {
        ClientError::Api(a) => (a.status(), a.message.clone()),
        other => (502, other.to_string()),
    }
}

/// Runs a blocking call of forkd's client on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("the call's task failed: {e}"))
}

/// Reads a request body whole, at most `limit` bytes, refusing one that stalls.
pub(crate) async fn read_body(
    body: hyper::body::Incoming,
    limit: usize,
) -> Result<Vec<u8>, String> {
    let mut body = body;
    let mut out = Vec::new();
    loop {
        let frame = match tokio::time::timeout(BODY_IDLE, body.frame()).await {
            Err(_) => return Err(format!("no byte of the body came for {BODY_IDLE:?}")),
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err(format!("reading the body: {e}")),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(format!(
                    "the body is over the limit of {limit} bytes for this request"
                ));
            }
            out.extend_from_slice(&data);
        }
    }
}

/// A percent-decoded query.
pub(crate) fn query(uri: &hyper::Uri) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            forkd_api::url::decode(&s.replace('+', " ")).unwrap_or_else(|_| s.to_string())
        };
        out.insert(decode(k), decode(v));
    }
    out
}

/// The access token of sandbox `id` whose secret is `secret`: 32 hex digits of
/// SHA-256(`secret:id`).
pub(crate) fn access_token(secret: &str, id: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(format!("{secret}:{id}").as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `n` random bytes, hex.
pub(crate) fn random_hex(n: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("the kernel's random bytes");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two strings in time that depends on their lengths only.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envd_requests_are_told_by_header_or_host_name() {
        let g = Gateway::new(Settings {
            max_body: 1 << 20,
            domain: Some("e2b.example".into()),
            tls: false,
        });
        let mut h = hyper::HeaderMap::new();
        assert_eq!(g.envd_target(&h), None);
        h.insert(
            hyper::header::HOST,
            "49983-abc123.e2b.example:8443".parse().unwrap(),
        );
        assert_eq!(g.envd_target(&h).as_deref(), Some("abc123"));
        h.insert(
            hyper::header::HOST,
            "3000-abc123.e2b.example".parse().unwrap(),
        );
        assert_eq!(g.envd_target(&h), None, "only envd's port");
        h.insert(
            hyper::header::HOST,
            "49983-abc.evil.e2b.example".parse().unwrap(),
        );
        assert_eq!(g.envd_target(&h), None);
        h.insert(
            hyper::header::HOST,
            "49983-abc.e2b.example.evil".parse().unwrap(),
        );
        assert_eq!(g.envd_target(&h), None);
        h.insert(SANDBOX_HEADER, "xyz".parse().unwrap());
        assert_eq!(g.envd_target(&h).as_deref(), Some("xyz"));
        assert!(g.claims("/v1/version", &h), "a named sandbox is envd's");
        let none = hyper::HeaderMap::new();
        assert!(!g.claims("/v1/sandboxes", &none));
        assert!(!g.claims("/metrics", &none));
        assert!(g.claims("/v2/sandboxes", &none));
        assert!(g.claims("/sandboxes/abc/pause", &none));
        assert!(g.claims("/process.Process/Start", &none));
    }

    #[test]
    fn small_helpers() {
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
        assert_eq!(random_hex(16).len(), 32);
        let q = query(
            &"/files?path=%2Fhome%2Fuser%2Fa+b&username=root"
                .parse()
                .unwrap(),
        );
        assert_eq!(q["path"], "/home/user/a b");
        assert_eq!(q["username"], "root");
    }
}
