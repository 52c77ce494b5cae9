//! The registry client: manifests and blobs over the distribution API (`/v2/`).
//!
//! # A request
//! 1. The URL is `https://HOST/v2/REPO/...`; an endpoint allowed to be insecure (a
//!    loopback registry, or `insecure = true`) is tried with HTTPS without certificate
//!    checks first and, if that cannot connect, in plain HTTP, which is then kept for
//!    the host.
//! 2. A cached bearer token for the repository, or basic credentials, go with it.
//! 3. A `401` is answered once: a `Bearer` challenge gets a token from its realm
//!    (anonymous, with basic credentials, or with an identity token), a `Basic` one the
//!    credentials; a second `401` is an error naming where the credentials came from.
//! 4. `429`, `502`, `503` and `504`, and connections that fail, are retried with
//!    exponential backoff, waiting what `Retry-After` says when it says it.
//! 5. Redirects are followed here (at most 5): to another host or port, such as a CDN or
//!    an object store, no `Authorization` goes along.
//!
//! # A blob
//! [`BlobReader`] streams a blob: nothing is held whole in memory. It counts and hashes
//! what it hands out; a connection that drops (an error, or an end before the size)
//! is resumed with `Range: bytes=N-`, and a server that ignores the range has its first
//! N bytes read and dropped, so the consumer sees one unbroken stream either way. At
//! the end the digest is checked, and a mismatch is an error of the read itself.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::Digest as _;
use ureq::http::{Response, StatusCode};
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
use ureq::{Agent, Body};

use crate::auth::{AuthFiles, Credential};
use crate::config::{Endpoint, RegistriesConf};
use crate::error::RegistryError;
use crate::manifest::{self, Descriptor, Document, Manifest, Platform};
use crate::reference::{hex, Digest, Reference, DOCKER_HUB, DOCKER_HUB_API};

const MAX_REDIRECTS: usize = 5;
/// Resumes of one blob before it fails.
const MAX_RESUMES: u32 = 8;
const USER_AGENT: &str = concat!("forkd/", env!("CARGO_PKG_VERSION"));

/// How failed requests are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries of one request, the first included.
    pub attempts: u32,
    /// The first wait; each further one doubles.
    pub base: Duration,
    /// No wait is longer, `Retry-After` included.
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            base: Duration::from_millis(500),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// What a client needs to know: where to pull from, with which credentials and CAs.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub registries: RegistriesConf,
    pub auth: AuthFiles,
    /// Directories with a `HOST[:PORT]/` directory of `*.crt` CAs and `*.cert`/`*.key`
    /// client pairs (containers-certs.d(5)).
    pub certs_dirs: Vec<PathBuf>,
    pub retry: RetryPolicy,
    pub connect_timeout: Duration,
    /// Longest silence while reading an answer.
    pub read_timeout: Duration,
}

/// `/etc/containers/certs.d` and `/etc/docker/certs.d`, or `FORKD_CERTS_DIRS`
/// (colon-separated).
pub fn default_certs_dirs() -> Vec<PathBuf> {
    match std::env::var("FORKD_CERTS_DIRS") {
        Ok(v) if !v.is_empty() => v.split(':').map(PathBuf::from).collect(),
        _ => vec![
            PathBuf::from("/etc/containers/certs.d"),
            PathBuf::from("/etc/docker/certs.d"),
        ],
    }
}

impl ClientConfig {
    /// The machine's configuration: registries.conf, the credential files, certs.d.
    pub fn from_env() -> Result<ClientConfig, RegistryError> {
        Ok(ClientConfig {
            registries: RegistriesConf::load()?,
            auth: AuthFiles::from_env(),
            certs_dirs: default_certs_dirs(),
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(120),
        })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scheme {
    Https,
    Http,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Scheme::Https => "https",
            Scheme::Http => "http",
        }
    }
}

/// The scheme each insecure host answered on, for the life of the process: a registry
/// does not change between plain HTTP and TLS under a running daemon.
fn schemes() -> &'static Mutex<HashMap<String, Scheme>> {
    static SCHEMES: std::sync::OnceLock<Mutex<HashMap<String, Scheme>>> =
        std::sync::OnceLock::new();
    SCHEMES.get_or_init(|| Mutex::new(HashMap::new()))
}

struct Token {
    header: String,
    until: Instant,
}

/// A registry client. Shared by the threads of a pull (`&Client` is `Send + Sync`).
pub struct Client {
    config: ClientConfig,
    /// One agent (connection pool, TLS setup) per host and verification setting.
    agents: Mutex<HashMap<(String, bool), Agent>>,
    /// Bearer tokens by (registry, repository).
    tokens: Mutex<HashMap<(String, String), Token>>,
    /// Credentials looked up, by (registry, repository).
    creds: Mutex<HashMap<(String, String), Option<Credential>>>,
}

/// A manifest found for a reference.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Where it was found (a mirror, or the registry itself).
    pub endpoint: Endpoint,
    /// The reference asked for, fully qualified.
    pub reference: Reference,
    /// The digest of what the reference names there: an index or a manifest.
    pub digest: Digest,
    /// The digest of the platform's image manifest.
    pub manifest_digest: Digest,
    pub manifest: Manifest,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The parameters of a `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: HashMap<String, String>,
}

fn parse_challenge(h: &str) -> Option<Challenge> {
    let h = h.trim();
    let (scheme, rest) = h.split_once(' ').unwrap_or((h, ""));
    let mut params = HashMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if key.is_empty() || chars.next() != Some('=') {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
        }
        params.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// `host[:port]` of a URL.
fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

fn retry_after(resp: &Response<Body>) -> Option<Duration> {
    header(resp, "retry-after")?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

fn retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

fn excerpt(resp: Response<Body>) -> String {
    let mut body = resp.into_body();
    let bytes = body
        .with_config()
        .limit(4096)
        .read_to_vec()
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    // A registry's JSON errors: {"errors":[{"code":..,"message":..}]}.
    #[derive(serde::Deserialize)]
    struct Errs {
        errors: Vec<E>,
    }
    #[derive(serde::Deserialize)]
    struct E {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    if let Ok(e) = serde_json::from_slice::<Errs>(&bytes) {
        return e
            .errors
            .iter()
            .map(|e| format!("{} {}", e.code, e.message).trim().to_owned())
            .collect::<Vec<_>>()
            .join("; ");
    }
    text.chars().take(200).collect::<String>().trim().to_owned()
}

/// A request being made: what the error messages say.
struct Call<'a> {
    endpoint: &'a Endpoint,
    step: &'a str,
}

impl Call<'_> {
    fn reference(&self) -> String {
        self.endpoint.reference.to_string()
    }
}

impl Client {
    pub fn new(config: ClientConfig) -> Client {
        Client {
            config,
            agents: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            creds: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    fn api_host(registry: &str) -> &str {
        if registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            registry
        }
    }

    /// The CAs and client certificate certs.d has for `host`.
    fn tls_for(&self, host: &str, verify: bool) -> Result<TlsConfig, RegistryError> {
        let mut roots: Vec<Certificate<'static>> = Vec::new();
        let mut client = None;
        let system = std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .into_iter()
            .chain(
                [
                    "/etc/ssl/certs/ca-certificates.crt",
                    "/etc/pki/tls/certs/ca-bundle.crt",
                ]
                .map(PathBuf::from),
            );
        for f in system {
            if let Ok(pem) = std::fs::read(&f) {
                roots.extend(ureq::tls::parse_pem(&pem).filter_map(|i| match i {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                }));
                break;
            }
        }
        for dir in &self.config.certs_dirs {
            let d = dir.join(host);
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            let mut names: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
            names.sort();
            for p in &names {
                let bad = |reason: String| RegistryError::Config {
                    path: p.clone(),
                    reason,
                };
                match p.extension().and_then(|e| e.to_str()) {
                    Some("crt") => {
                        let pem = std::fs::read(p).map_err(|e| bad(e.to_string()))?;
                        let before = roots.len();
                        for item in ureq::tls::parse_pem(&pem) {
                            if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
                                roots.push(c);
                            }
                        }
                        if roots.len() == before {
                            return Err(bad("no PEM certificate in it".into()));
                        }
                    }
                    Some("cert") => {
                        let key_path = p.with_extension("key");
                        let pem = std::fs::read(p).map_err(|e| bad(e.to_string()))?;
                        let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
                            .filter_map(|i| match i {
                                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                                _ => None,
                            })
                            .collect();
                        let key_pem = std::fs::read(&key_path)
                            .map_err(|e| bad(format!("its key {}: {e}", key_path.display())))?;
                        let key = PrivateKey::from_pem(&key_pem)
                            .map_err(|e| bad(format!("its key {}: {e}", key_path.display())))?;
                        client = Some(ClientCert::new_with_certs(&certs, key));
                    }
                    _ => {}
                }
            }
        }
        // ring: aws-lc-rs, rustls's other provider, needs cmake to build. ring has no
        // post-quantum key exchange, which rustls now marks as deprecated.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&roots))
            .client_cert(client)
            .disable_verification(!verify)
            .unversioned_rustls_crypto_provider(provider)
            .build())
    }

    fn agent(&self, host: &str, verify: bool) -> Result<Agent, RegistryError> {
        let key = (host.to_owned(), verify);
        if let Some(a) = lock(&self.agents).get(&key) {
            return Ok(a.clone());
        }
        let tls = self.tls_for(host, verify)?;
        let config = Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(USER_AGENT)
            .tls_config(tls)
            .timeout_connect(Some(self.config.connect_timeout))
            .timeout_per_read(Some(self.config.read_timeout))
            .build();
        let agent = Agent::new_with_config(config);
        lock(&self.agents).insert(key, agent.clone());
        Ok(agent)
    }

    fn credential(&self, ep: &Endpoint) -> Result<Option<Credential>, RegistryError> {
        let key = (
            ep.reference.registry.clone(),
            ep.reference.repository.clone(),
        );
        if let Some(c) = lock(&self.creds).get(&key) {
            return Ok(c.clone());
        }
        let c = self.config.auth.lookup(&key.0, &key.1)?;
        lock(&self.creds).insert(key, c.clone());
        Ok(c)
    }

    /// Sends one request, following redirects; the `Authorization` header goes only to
    /// the registry's own host.
    fn send_once(
        &self,
        call: &Call<'_>,
        method: &str,
        url: &str,
        headers: &[(&str, String)],
        auth: Option<&str>,
    ) -> Result<Response<Body>, ureq::Error> {
        let home = authority(url).to_owned();
        let mut url = url.to_owned();
        let verify = !call.endpoint.insecure;
        for _ in 0..=MAX_REDIRECTS {
            let host = authority(&url).to_owned();
            let agent = self
                .agent(&host, verify || host != home)
                .map_err(|e| ureq::Error::Io(io::Error::other(e.to_string())))?;
            let mut req = match method {
                "HEAD" => agent.head(&url),
                _ => agent.get(&url),
            };
            for (k, v) in headers {
                req = req.header(*k, v);
            }
            if host == home {
                if let Some(a) = auth {
                    req = req.header("Authorization", a);
                }
            }
            let resp = req.call()?;
            let s = resp.status().as_u16();
            if matches!(s, 301 | 302 | 303 | 307 | 308) {
                if let Some(loc) = header(&resp, "location") {
                    url = if loc.starts_with("http://") || loc.starts_with("https://") {
                        loc.to_owned()
                    } else if loc.starts_with('/') {
                        let scheme = url.split("://").next().unwrap_or("https");
                        format!("{scheme}://{}{loc}", authority(&url))
                    } else {
                        let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
                        format!("{base}/{loc}")
                    };
                    continue;
                }
            }
            return Ok(resp);
        }
        Err(ureq::Error::Io(io::Error::other(format!(
            "more than {MAX_REDIRECTS} redirects"
        ))))
    }

    /// The base URL of an endpoint's registry, finding out the scheme of an insecure one.
    fn base_url(&self, call: &Call<'_>) -> Result<String, RegistryError> {
        let host = Self::api_host(&call.endpoint.reference.registry).to_owned();
        if !call.endpoint.insecure {
            return Ok(format!("https://{host}"));
        }
        if let Some(s) = lock(schemes()).get(&host) {
            return Ok(format!("{}://{host}", s.as_str()));
        }
        // Which scheme answers: an unverified TLS handshake first, then plain HTTP.
        let mut failures = Vec::new();
        for scheme in [Scheme::Https, Scheme::Http] {
            let url = format!("{}://{host}/v2/", scheme.as_str());
            match self.send_once(call, "GET", &url, &[], None) {
                Ok(_) => {
                    lock(schemes()).insert(host.clone(), scheme);
                    return Ok(format!("{}://{host}", scheme.as_str()));
                }
                Err(e) => failures.push(format!("{}: {e}", scheme.as_str())),
            }
        }
        Err(RegistryError::Transport {
            reference: call.reference(),
            step: call.step.to_owned(),
            url: format!("{host}/v2/"),
            reason: failures.join("; "),
        })
    }

    /// What the next request to the endpoint sends: a fresh bearer token for its
    /// repository, or the registry's basic credentials once a challenge asked for them.
    fn cached_auth(&self, ep: &Endpoint) -> Option<String> {
        let tokens = lock(&self.tokens);
        let repo = (
            ep.reference.registry.clone(),
            ep.reference.repository.clone(),
        );
        if let Some(t) = tokens.get(&repo).filter(|t| t.until > Instant::now()) {
            return Some(t.header.clone());
        }
        tokens
            .get(&(ep.reference.registry.clone(), String::new()))
            .map(|t| t.header.clone())
    }

    /// Answers a challenge: stores what the next request sends.
    fn authenticate(
        &self,
        call: &Call<'_>,
        challenge: &str,
        cred: &Option<Credential>,
    ) -> Result<(), RegistryError> {
        let ep = call.endpoint;
        let auth_err = |status: u16, reason: String| RegistryError::Auth {
            reference: call.reference(),
            status,
            reason,
        };
        let Some(ch) = parse_challenge(challenge) else {
            return Err(auth_err(401, format!("unreadable challenge {challenge:?}")));
        };
        let basic_of = |c: &Credential| {
            use base64::Engine as _;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.secret))
            )
        };
        match ch.scheme.as_str() {
            "basic" => {
                let Some(c) = cred else {
                    return Err(auth_err(401, self.no_credentials(ep)));
                };
                lock(&self.tokens).insert(
                    (ep.reference.registry.clone(), String::new()),
                    Token {
                        header: basic_of(c),
                        until: Instant::now() + Duration::from_secs(365 * 24 * 3600),
                    },
                );
                Ok(())
            }
            "bearer" => {
                let realm = ch
                    .params
                    .get("realm")
                    .ok_or_else(|| auth_err(401, "a Bearer challenge without a realm".into()))?;
                let scope = format!("repository:{}:pull", ep.reference.repository);
                let mut query = format!("scope={}", encode(&scope));
                if let Some(s) = ch.params.get("service") {
                    query = format!("service={}&{query}", encode(s));
                }
                let url = if realm.contains('?') {
                    format!("{realm}&{query}")
                } else {
                    format!("{realm}?{query}")
                };
                let token_host = authority(realm).to_owned();
                let agent = self.agent(&token_host, !ep.insecure)?;
                let transport = |e: ureq::Error| RegistryError::Transport {
                    reference: call.reference(),
                    step: "token".into(),
                    url: realm.clone(),
                    reason: e.to_string(),
                };
                let resp = match cred {
                    Some(c) if c.identity_token => {
                        let mut form = format!(
                            "grant_type=refresh_token&client_id=forkd&refresh_token={}&scope={}",
                            encode(&c.secret),
                            encode(&scope)
                        );
                        if let Some(s) = ch.params.get("service") {
                            form.push_str(&format!("&service={}", encode(s)));
                        }
                        agent
                            .post(realm.as_str())
                            .content_type("application/x-www-form-urlencoded")
                            .send(form.as_bytes())
                            .map_err(transport)?
                    }
                    Some(c) => agent
                        .get(&url)
                        .header("Authorization", basic_of(c))
                        .call()
                        .map_err(transport)?,
                    None => agent.get(&url).call().map_err(transport)?,
                };
                let status = resp.status().as_u16();
                if status == 401 || status == 403 {
                    let why = match cred {
                        Some(c) => format!("bad credentials from {}", c.from),
                        None => self.no_credentials(ep),
                    };
                    return Err(auth_err(status, why));
                }
                if status != 200 {
                    return Err(RegistryError::Http {
                        reference: call.reference(),
                        step: "token".into(),
                        url: realm.clone(),
                        status,
                        detail: excerpt(resp),
                    });
                }
                #[derive(serde::Deserialize)]
                struct Answer {
                    #[serde(default)]
                    token: Option<String>,
                    #[serde(default)]
                    access_token: Option<String>,
                    #[serde(default)]
                    expires_in: Option<u64>,
                }
                let bytes = resp
                    .into_body()
                    .with_config()
                    .limit(1 << 20)
                    .read_to_vec()
                    .map_err(transport)?;
                let a: Answer =
                    serde_json::from_slice(&bytes).map_err(|e| RegistryError::Invalid {
                        reference: call.reference(),
                        what: format!("token from {realm}"),
                        reason: e.to_string(),
                    })?;
                let token = a
                    .access_token
                    .or(a.token)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| RegistryError::Invalid {
                        reference: call.reference(),
                        what: format!("token from {realm}"),
                        reason: "no token in the answer".into(),
                    })?;
                // Renewed a little before it expires; 60 s when the server does not say.
                let life = a.expires_in.unwrap_or(60).max(10);
                lock(&self.tokens).insert(
                    (
                        ep.reference.registry.clone(),
                        ep.reference.repository.clone(),
                    ),
                    Token {
                        header: format!("Bearer {token}"),
                        until: Instant::now() + Duration::from_secs(life - life / 10),
                    },
                );
                Ok(())
            }
            other => Err(auth_err(
                401,
                format!("unsupported authentication scheme {other:?}"),
            )),
        }
    }

    fn no_credentials(&self, ep: &Endpoint) -> String {
        let files: Vec<String> = self
            .config
            .auth
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!(
            "the registry {} wants credentials and none were found (looked in {}; `forkd login {}` stores some)",
            ep.reference.registry,
            if files.is_empty() { "no files".into() } else { files.join(", ") },
            ep.reference.registry
        )
    }

    /// A request to `path` under the endpoint's repository (`manifests/..`, `blobs/..`),
    /// with authentication and retries. Answers every status but the ones handled.
    fn request(
        &self,
        call: &Call<'_>,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
    ) -> Result<Response<Body>, RegistryError> {
        let ep = call.endpoint;
        let base = self.base_url(call)?;
        let url = format!("{base}/v2/{}/{path}", ep.reference.repository);
        let cred = self.credential(ep)?;
        let policy = &self.config.retry;
        let mut answered_challenge = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let auth = self.cached_auth(ep);
            let wait = match self.send_once(call, method, &url, headers, auth.as_deref()) {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    if status == 401 && !answered_challenge {
                        answered_challenge = true;
                        let ch = header(&resp, "www-authenticate").unwrap_or("").to_owned();
                        if ch.is_empty() {
                            return Err(RegistryError::Auth {
                                reference: call.reference(),
                                status,
                                reason: "401 without a challenge".into(),
                            });
                        }
                        self.authenticate(call, &ch, &cred)?;
                        attempt -= 1;
                        continue;
                    }
                    if status == 401 || status == 403 {
                        let reason = match &cred {
                            Some(c) => {
                                format!("bad credentials from {} ({})", c.from, excerpt(resp))
                            }
                            None if status == 401 => self.no_credentials(ep),
                            None => format!("access denied ({})", excerpt(resp)),
                        };
                        return Err(RegistryError::Auth {
                            reference: call.reference(),
                            status,
                            reason,
                        });
                    }
                    if !retryable(status) || attempt >= policy.attempts {
                        return Ok(resp);
                    }
                    retry_after(&resp).unwrap_or_else(|| backoff(policy, attempt))
                }
                Err(e) => {
                    if attempt >= policy.attempts || !transient(&e) {
                        return Err(RegistryError::Transport {
                            reference: call.reference(),
                            step: call.step.to_owned(),
                            url,
                            reason: e.to_string(),
                        });
                    }
                    backoff(policy, attempt)
                }
            };
            std::thread::sleep(wait.min(policy.max_wait));
        }
    }

    /// Checks credentials against a registry as `docker login` does: `GET /v2/`, and for
    /// a bearer challenge a token for no repository. `Ok` when the registry accepts them
    /// (or asks for none).
    pub fn check_login(&self, registry: &str, cred: &Credential) -> Result<(), RegistryError> {
        let probe = Reference {
            registry: registry.to_owned(),
            repository: "forkd-login".into(),
            tag: None,
            digest: None,
        };
        let endpoint = self
            .config
            .registries
            .endpoints(&probe)?
            .pop()
            .expect("the registry itself is always last");
        let call = Call {
            endpoint: &endpoint,
            step: "login",
        };
        let shown = registry.to_owned();
        let transport = |url: &str, e: ureq::Error| RegistryError::Transport {
            reference: shown.clone(),
            step: "login".into(),
            url: url.to_owned(),
            reason: e.to_string(),
        };
        let base = self.base_url(&call)?;
        let url = format!("{base}/v2/");
        let resp = self
            .send_once(&call, "GET", &url, &[], None)
            .map_err(|e| transport(&url, e))?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let bad = |status: u16| RegistryError::Auth {
            reference: shown.clone(),
            status,
            reason: format!("bad credentials for {} ({})", cred.username, cred.from),
        };
        let challenge = header(&resp, "www-authenticate").and_then(parse_challenge);
        let basic = {
            use base64::Engine as _;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", cred.username, cred.secret))
            )
        };
        match challenge {
            Some(ch) if ch.scheme == "bearer" => {
                let realm = ch.params.get("realm").cloned().unwrap_or_default();
                let mut url = realm.clone();
                if let Some(svc) = ch.params.get("service") {
                    url.push(if url.contains('?') { '&' } else { '?' });
                    url.push_str(&format!("service={}", encode(svc)));
                }
                let agent = self.agent(authority(&realm), !endpoint.insecure)?;
                let resp = agent
                    .get(&url)
                    .header("Authorization", &basic)
                    .call()
                    .map_err(|e| transport(&realm, e))?;
                match resp.status().as_u16() {
                    200 => Ok(()),
                    s => Err(bad(s)),
                }
            }
            Some(ch) if ch.scheme == "basic" => {
                let resp = self
                    .send_once(&call, "GET", &url, &[], Some(&basic))
                    .map_err(|e| transport(&url, e))?;
                match resp.status().as_u16() {
                    200 => Ok(()),
                    s => Err(bad(s)),
                }
            }
            _ => Err(RegistryError::Http {
                reference: shown.clone(),
                step: "login".into(),
                url,
                status,
                detail: excerpt(resp),
            }),
        }
    }

    /// The digest a tag or digest names on an endpoint now, from one `HEAD` (the
    /// `Docker-Content-Digest` header); `None` if the registry does not say.
    pub fn head(&self, ep: &Endpoint) -> Result<Option<Digest>, RegistryError> {
        let call = Call {
            endpoint: ep,
            step: "manifest HEAD",
        };
        let resp = self.request(
            &call,
            "HEAD",
            &format!("manifests/{}", ep.reference.manifest_ref()),
            &[("Accept", manifest::ACCEPT.to_owned())],
        )?;
        match resp.status().as_u16() {
            200 => Ok(header(&resp, "docker-content-digest").and_then(|d| d.parse().ok())),
            404 => Err(RegistryError::ManifestUnknown {
                reference: call.reference(),
            }),
            s => Err(RegistryError::Http {
                reference: call.reference(),
                step: call.step.into(),
                url: ep.reference.name(),
                status: s,
                detail: String::new(),
            }),
        }
    }

    /// GETs a manifest or index by tag or digest, verifying its digest.
    fn get_manifest(
        &self,
        ep: &Endpoint,
        what: &str,
    ) -> Result<(Vec<u8>, Option<String>, Digest), RegistryError> {
        let call = Call {
            endpoint: ep,
            step: "manifest",
        };
        let resp = self.request(
            &call,
            "GET",
            &format!("manifests/{what}"),
            &[("Accept", manifest::ACCEPT.to_owned())],
        )?;
        let status = resp.status().as_u16();
        if status == 404 {
            let shown = match (&ep.reference.tag, what.starts_with("sha256:")) {
                (_, true) => format!("{}@{what}", ep.reference.name()),
                _ => format!("{}:{what}", ep.reference.name()),
            };
            return Err(RegistryError::ManifestUnknown { reference: shown });
        }
        if status != 200 {
            return Err(RegistryError::Http {
                reference: call.reference(),
                step: call.step.into(),
                url: format!("{}/manifests/{what}", ep.reference.name()),
                status,
                detail: excerpt(resp),
            });
        }
        let content_type = header(&resp, "content-type").map(str::to_owned);
        let promised = header(&resp, "docker-content-digest").map(str::to_owned);
        let bytes = resp
            .into_body()
            .with_config()
            .limit(manifest::MAX_MANIFEST)
            .read_to_vec()
            .map_err(|e| RegistryError::Transport {
                reference: call.reference(),
                step: "manifest".into(),
                url: format!("{}/manifests/{what}", ep.reference.name()),
                reason: e.to_string(),
            })?;
        let actual = Digest::of(&bytes);
        let expected: Option<Digest> = if what.starts_with("sha256:") {
            what.parse().ok()
        } else {
            promised.as_deref().and_then(|p| p.parse().ok())
        };
        if let Some(want) = expected {
            if want != actual {
                return Err(RegistryError::Mismatch {
                    reference: call.reference(),
                    what: "manifest digest".into(),
                    expected: want.to_string(),
                    actual: actual.to_string(),
                });
            }
        }
        Ok((bytes, content_type, actual))
    }

    /// Finds the image manifest of `reference` for `platform`, trying each endpoint
    /// (mirrors first) until one has it.
    pub fn resolve(
        &self,
        reference: &Reference,
        platform: &Platform,
    ) -> Result<Resolved, RegistryError> {
        let endpoints = self.config.registries.endpoints(reference)?;
        let mut last = None;
        for ep in endpoints {
            match self.resolve_at(&ep, reference, platform) {
                Ok(r) => return Ok(r),
                Err(e) if e.try_next_endpoint() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("there is always the registry itself"))
    }

    fn resolve_at(
        &self,
        ep: &Endpoint,
        reference: &Reference,
        platform: &Platform,
    ) -> Result<Resolved, RegistryError> {
        let shown = reference.to_string();
        let (bytes, ct, digest) = self.get_manifest(ep, &ep.reference.manifest_ref())?;
        let (manifest, manifest_digest) =
            match manifest::parse_document(&shown, ct.as_deref(), &bytes)? {
                Document::Manifest(m) => (m, digest.clone()),
                Document::Index(idx) => {
                    let d = manifest::select_platform(&shown, &idx, platform)?;
                    let md = manifest::descriptor_digest(&shown, &d)?;
                    let (bytes, ct, got) = self.get_manifest(ep, &md.to_string())?;
                    debug_assert_eq!(got, md);
                    match manifest::parse_document(&shown, ct.as_deref(), &bytes)? {
                        Document::Manifest(m) => (m, md),
                        Document::Index(_) => {
                            return Err(RegistryError::Unsupported {
                                reference: shown,
                                what: format!("the index entry for {platform} is itself an index"),
                            })
                        }
                    }
                }
            };
        Ok(Resolved {
            endpoint: ep.clone(),
            reference: reference.clone(),
            digest,
            manifest_digest,
            manifest,
        })
    }

    /// Fetches a small blob whole (an image config), verified.
    pub fn fetch_small(
        &self,
        ep: &Endpoint,
        d: &Descriptor,
        limit: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let shown = ep.reference.to_string();
        let digest = manifest::descriptor_digest(&shown, d)?;
        if d.size > limit {
            return Err(RegistryError::Invalid {
                reference: shown,
                what: format!("blob {digest}"),
                reason: format!("{} bytes, more than the {limit} allowed", d.size),
            });
        }
        let mut r = self.open_blob(ep, &digest, d.size)?;
        let mut out = Vec::with_capacity(d.size as usize);
        r.read_to_end(&mut out)
            .map_err(|e| RegistryError::Transport {
                reference: shown.clone(),
                step: format!("blob {digest}"),
                url: ep.reference.name(),
                reason: e.to_string(),
            })?;
        Ok(out)
    }

    /// Opens a streamed, resumable, verified read of a blob.
    pub fn open_blob(
        &self,
        ep: &Endpoint,
        digest: &Digest,
        size: u64,
    ) -> Result<BlobReader<'_>, RegistryError> {
        let mut r = BlobReader {
            client: self,
            endpoint: ep.clone(),
            digest: digest.clone(),
            size,
            body: None,
            skip: 0,
            offset: 0,
            hasher: sha2::Sha256::new(),
            resumes: 0,
            verified: false,
        };
        r.connect().map_err(|e| match e.into_inner() {
            Some(inner) => match inner.downcast::<RegistryError>() {
                Ok(re) => *re,
                Err(other) => RegistryError::Transport {
                    reference: ep.reference.to_string(),
                    step: format!("blob {digest}"),
                    url: ep.reference.name(),
                    reason: other.to_string(),
                },
            },
            None => RegistryError::Transport {
                reference: ep.reference.to_string(),
                step: format!("blob {digest}"),
                url: ep.reference.name(),
                reason: "connection failed".into(),
            },
        })?;
        Ok(r)
    }
}

/// Whether a failed request may succeed if tried again: a connection refused, reset or
/// timed out may; a certificate that does not verify, or a malformed answer, will not.
fn transient(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::TimedOut
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::Interrupted
        ),
        ureq::Error::Timeout(_) | ureq::Error::ConnectionFailed => true,
        _ => false,
    }
}

fn backoff(p: &RetryPolicy, attempt: u32) -> Duration {
    p.base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(p.max_wait)
}

/// A blob as a stream (see the module's header).
pub struct BlobReader<'c> {
    client: &'c Client,
    endpoint: Endpoint,
    digest: Digest,
    size: u64,
    body: Option<ureq::BodyReader<'static>>,
    /// Bytes of the current answer to drop before handing any out (a restart).
    skip: u64,
    offset: u64,
    hasher: sha2::Sha256,
    resumes: u32,
    verified: bool,
}

impl BlobReader<'_> {
    /// Bytes handed out so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Times the connection was resumed.
    pub fn resumes(&self) -> u32 {
        self.resumes
    }

    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// (Re)connects at the current offset.
    fn connect(&mut self) -> io::Result<()> {
        let call = Call {
            endpoint: &self.endpoint,
            step: "blob",
        };
        let mut headers = Vec::new();
        if self.offset > 0 {
            headers.push(("Range", format!("bytes={}-", self.offset)));
        }
        let resp = self
            .client
            .request(&call, "GET", &format!("blobs/{}", self.digest), &headers)
            .map_err(io::Error::other)?;
        let status = resp.status();
        let wanted_range = self.offset > 0;
        self.skip = 0;
        if status == StatusCode::PARTIAL_CONTENT {
            let start = header(&resp, "content-range")
                .and_then(|r| r.strip_prefix("bytes "))
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.parse::<u64>().ok());
            if start != Some(self.offset) {
                return Err(io::Error::other(RegistryError::Invalid {
                    reference: self.endpoint.reference.to_string(),
                    what: format!("blob {}", self.digest),
                    reason: format!(
                        "asked for bytes from {} and got a range from {start:?}",
                        self.offset
                    ),
                }));
            }
        } else if status == StatusCode::OK {
            // The whole blob again: a server that ignores ranges. Drop what was read.
            if wanted_range {
                self.skip = self.offset;
            }
        } else {
            let s = status.as_u16();
            let err = if s == 404 {
                RegistryError::Invalid {
                    reference: self.endpoint.reference.to_string(),
                    what: format!("blob {}", self.digest),
                    reason: "blob unknown to the registry".into(),
                }
            } else {
                RegistryError::Http {
                    reference: self.endpoint.reference.to_string(),
                    step: format!("blob {}", self.digest),
                    url: format!("{}/blobs/{}", self.endpoint.reference.name(), self.digest),
                    status: s,
                    detail: excerpt(resp),
                }
            };
            return Err(io::Error::other(err));
        }
        self.body = Some(resp.into_body().into_reader());
        Ok(())
    }

    fn check_end(&mut self) -> io::Result<()> {
        if self.verified {
            return Ok(());
        }
        let actual = hex(&std::mem::take(&mut self.hasher).finalize());
        self.verified = true;
        if actual != self.digest.hex() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                RegistryError::Mismatch {
                    reference: self.endpoint.reference.to_string(),
                    what: "blob".into(),
                    expected: self.digest.to_string(),
                    actual: format!("sha256:{actual}"),
                },
            ));
        }
        Ok(())
    }

    /// Reads what is left and checks the digest.
    pub fn finish(&mut self) -> io::Result<()> {
        io::copy(self, &mut io::sink())?;
        self.check_end()
    }

    fn resume_after(&mut self, why: io::Error) -> io::Result<()> {
        self.body = None;
        self.resumes += 1;
        if self.resumes > MAX_RESUMES {
            return Err(io::Error::new(
                why.kind(),
                format!(
                    "blob {}: gave up after {MAX_RESUMES} resumes: {why}",
                    self.digest
                ),
            ));
        }
        std::thread::sleep(
            backoff(&self.client.config.retry, self.resumes).min(Duration::from_secs(5)),
        );
        self.connect()
    }
}

impl Read for BlobReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.offset >= self.size {
                self.check_end()?;
                return Ok(0);
            }
            if buf.is_empty() {
                return Ok(0);
            }
            if self.body.is_none() {
                if let Err(e) = self.connect() {
                    self.resume_after(e)?;
                    continue;
                }
            }
            let body = self.body.as_mut().expect("connected");
            if self.skip > 0 {
                let mut scratch = [0u8; 16384];
                let n = (self.skip as usize).min(scratch.len());
                match body.read(&mut scratch[..n]) {
                    Ok(0) => {
                        let e = io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the connection ended early",
                        );
                        self.resume_after(e)?;
                    }
                    Ok(k) => self.skip -= k as u64,
                    Err(e) => self.resume_after(e)?,
                }
                continue;
            }
            let room = ((self.size - self.offset) as usize).min(buf.len());
            match body.read(&mut buf[..room]) {
                Ok(0) => {
                    let e = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "the connection ended at byte {} of {}",
                            self.offset, self.size
                        ),
                    );
                    self.resume_after(e)?;
                }
                Ok(n) => {
                    self.hasher.update(&buf[..n]);
                    self.offset += n as u64;
                    return Ok(n);
                }
                Err(e) => self.resume_after(e)?,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_parsed() {
        let c = parse_challenge(r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#).unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.example/token");
        assert_eq!(c.params["scope"], "repository:a/b:pull,push");
        let c = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.params["realm"], "Registry Realm");
    }

    #[test]
    fn urls_and_backoff() {
        assert_eq!(authority("https://a.example:5000/v2/x?y"), "a.example:5000");
        assert_eq!(authority("http://127.0.0.1/"), "127.0.0.1");
        assert_eq!(encode("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
        let p = RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            max_wait: Duration::from_secs(1),
        };
        assert_eq!(backoff(&p, 1), Duration::from_millis(100));
        assert_eq!(backoff(&p, 3), Duration::from_millis(400));
        assert_eq!(backoff(&p, 10), Duration::from_secs(1));
    }
}
