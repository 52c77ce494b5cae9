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
//! Challenges are [`crate::challenge`]'s, blobs [`crate::blob`]'s, and what every request
//! shares (retries, headers, error excerpts) [`crate::http`]'s.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ureq::http::Response;
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
use ureq::{Agent, Body};

use crate::auth::{AuthFiles, Credential};
use crate::config::{Endpoint, RegistriesConf};
use crate::error::RegistryError;
use crate::http::{
    authority, backoff, excerpt, header, lock, retry_after, retryable, transient, Call,
    RetryPolicy, Token,
};
use crate::manifest::{self, Document, Manifest, Platform};
use crate::reference::{Digest, Reference, DOCKER_HUB, DOCKER_HUB_API};

const MAX_REDIRECTS: usize = 5;
const USER_AGENT: &str = concat!("forkd/", env!("CARGO_PKG_VERSION"));

/// What a client needs to know: where to pull from, with which credentials and CAs.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub registries: RegistriesConf,
    pub auth: AuthFiles,
    /// Directories with a `HOST[:PORT]/` directory of `*.crt` CAs and `*.cert`/`*.key`
    /// client pairs (containers-certs.d(5)).
    pub certs_dirs: Vec<PathBuf>,
    pub retry: RetryPolicy,
    /// The caller's credentials, when its request brought any: then the only ones used.
    pub given: Option<crate::auth::Given>,
    pub connect_timeout: Duration,
    /// Longest silence while reading an answer.
    pub read_timeout: Duration,
}

/// Where registries' certificates are looked for unless told otherwise.
pub const DEFAULT_CERTS_DIRS: &[&str] = &["/etc/containers/certs.d", "/etc/docker/certs.d"];

/// [`DEFAULT_CERTS_DIRS`], or `FORKD_CERTS_DIRS` (colon-separated).
pub fn default_certs_dirs() -> Vec<PathBuf> {
    match std::env::var("FORKD_CERTS_DIRS") {
        Ok(v) if !v.is_empty() => v.split(':').map(PathBuf::from).collect(),
        _ => DEFAULT_CERTS_DIRS.iter().map(PathBuf::from).collect(),
    }
}

impl ClientConfig {
    /// The machine's configuration: registries.conf, the credential files, certs.d.
    pub fn from_env() -> Result<ClientConfig, RegistryError> {
        let path = std::env::var_os(crate::config::ENV_PATH)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(crate::config::DEFAULT_PATH));
        ClientConfig::with(&path, default_certs_dirs())
    }

    /// The configuration with registries.conf at `registries_conf` and certificates in
    /// `certs_dirs` (a daemon's settings); the credential files as the process's
    /// environment names them.
    pub fn with(
        registries_conf: &std::path::Path,
        certs_dirs: Vec<PathBuf>,
    ) -> Result<ClientConfig, RegistryError> {
        Ok(ClientConfig {
            registries: RegistriesConf::load_from(registries_conf)?,
            auth: AuthFiles::from_env(),
            certs_dirs,
            retry: RetryPolicy::default(),
            given: None,
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

/// A registry client. Shared by the threads of a pull (`&Client` is `Send + Sync`).
pub struct Client {
    pub(crate) config: ClientConfig,
    /// One agent (connection pool, TLS setup) per host and verification setting.
    pub(crate) agents: Mutex<HashMap<(String, bool), Agent>>,
    /// Bearer tokens by (registry, repository).
    pub(crate) tokens: Mutex<HashMap<(String, String), Token>>,
    /// Credentials looked up, by (registry, repository).
    pub(crate) creds: Mutex<HashMap<(String, String), Option<Credential>>>,
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

    pub(crate) fn api_host(registry: &str) -> &str {
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

    pub(crate) fn agent(&self, host: &str, verify: bool) -> Result<Agent, RegistryError> {
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

    pub(crate) fn credential(&self, ep: &Endpoint) -> Result<Option<Credential>, RegistryError> {
        let key = (
            ep.reference.registry.clone(),
            ep.reference.repository.clone(),
        );
        if let Some(c) = lock(&self.creds).get(&key) {
            return Ok(c.clone());
        }
        let c = match &self.config.given {
            Some(given) => crate::auth::given_for(given, &key.0),
            None => self.config.auth.lookup(&key.0, &key.1)?,
        };
        lock(&self.creds).insert(key, c.clone());
        Ok(c)
    }

    /// Sends one request, following redirects; the `Authorization` header goes only to
    /// the registry's own host.
    pub(crate) fn send_once(
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
    pub(crate) fn base_url(&self, call: &Call<'_>) -> Result<String, RegistryError> {
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

    /// A request to `path` under the endpoint's repository (`manifests/..`, `blobs/..`),
    /// with authentication and retries. Answers every status but the ones handled.
    pub(crate) fn request(
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
}
