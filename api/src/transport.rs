//! Where the client's connections go: the daemon's Unix socket, or a TCP listener with
//! TLS (or, on loopback only, without). Every connection is handed to the client as a
//! blocking Unix stream, so the request writer, the answer reader and the exec stream's
//! frames are one code for all: a TCP connection is a socket pair whose far end a small
//! tokio runtime (one thread, started at the first TCP connection) copies to and from the
//! TLS stream.
//!
//! Settings, read by [`Endpoint::from_env`]: `FORKD_HOST` (`tcp://HOST:PORT`, or
//! `unix:///PATH`), `FORKD_API_KEY`, `FORKD_CA_CERT` (PEM; the system's bundle when
//! unset), `FORKD_CLIENT_CERT` and `FORKD_CLIENT_KEY` (mutual TLS), `FORKD_TLS=off`
//! (plain TCP, to a loopback address only).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// How long a connection (and its TLS handshake) may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The system's CA bundle (Debian's), used when `FORKD_CA_CERT` is unset.
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A daemon's address.
#[derive(Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(Arc<Remote>),
    /// Connections a program makes itself: a protocol translation served inside the
    /// daemon reaches its API this way, as the caller it acts for (one request a
    /// connection, as on the socket).
    Dial(Arc<dyn Dial>),
}

/// Makes connections to the daemon's API for [`Endpoint::Dial`].
pub trait Dial: Send + Sync {
    /// A new connection, as a blocking Unix stream.
    fn dial(&self) -> std::io::Result<UnixStream>;
    /// What the connections reach, for messages.
    fn describe(&self) -> String;
}

/// A TCP endpoint: where, with what TLS, and the key every request carries.
pub struct Remote {
    pub host: String,
    pub port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
    pub key: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_string())
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(r) => write!(
                f,
                "tcp://{}:{}{}",
                r.host,
                r.port,
                if r.tls.is_some() { "" } else { " (plain)" }
            ),
            Endpoint::Dial(d) => f.write_str(&d.describe()),
        }
    }
}

impl Endpoint {
    /// The endpoint the flags and environment name: `--host`, else `--socket`, else
    /// `FORKD_HOST`, else `FORKD_SOCKET`, else the default socket. `env` answers a
    /// variable.
    pub fn choose(
        host: Option<&str>,
        socket: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Endpoint, String> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        if let Some(h) = host {
            return Endpoint::parse(h, &env);
        }
        if let Some(s) = socket {
            return Ok(Endpoint::Unix(s.to_path_buf()));
        }
        if let Some(h) = env("FORKD_HOST") {
            return Endpoint::parse(&h, &env);
        }
        Ok(Endpoint::Unix(
            env("FORKD_SOCKET")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(crate::defaults::DEFAULT_SOCKET)),
        ))
    }

    /// The endpoint of this process's environment (and no flags).
    pub fn from_env() -> Result<Endpoint, String> {
        Endpoint::choose(None, None, &|k| std::env::var(k).ok())
    }

    /// `tcp://HOST:PORT` or `unix:///PATH`, with the TLS and key settings from `env`.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Endpoint, String> {
        let text = text.trim();
        if let Some(path) = text.strip_prefix("unix://") {
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let Some(hostport) = text.strip_prefix("tcp://") else {
            return Err(format!(
                "host {text:?}: expected tcp://HOST:PORT or unix:///PATH"
            ));
        };
        let hostport = hostport.trim_end_matches('/');
        let (host, port) = hostport
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("host {text:?}: expected tcp://HOST:PORT"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let plain = matches!(env("FORKD_TLS").as_deref(), Some("off" | "0" | "false"));
        let tls = if plain {
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                return Err(format!(
                    "host {text:?}: FORKD_TLS=off is allowed for a loopback address only (an API key would travel in the clear)"
                ));
            }
            None
        } else {
            Some(Arc::new(client_tls(env)?))
        };
        Ok(Endpoint::Tcp(Arc::new(Remote {
            host,
            port,
            tls,
            key: env("FORKD_API_KEY").map(|k| k.trim().to_string()),
        })))
    }

    /// The key requests carry, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Endpoint::Unix(_) | Endpoint::Dial(_) => None,
            Endpoint::Tcp(r) => r.key.as_deref(),
        }
    }

    /// A new connection, as a blocking Unix stream.
    pub fn connect(&self) -> std::io::Result<UnixStream> {
        match self {
            Endpoint::Unix(p) => UnixStream::connect(p),
            Endpoint::Tcp(r) => bridge(r.clone()),
            Endpoint::Dial(d) => d.dial(),
        }
    }
}

fn pem_certs(path: &Path) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: read certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

fn client_tls(env: &dyn Fn(&str) -> Option<String>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    let ca = env("FORKD_CA_CERT").unwrap_or_else(|| SYSTEM_CA_BUNDLE.to_string());
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs(Path::new(&ca)).map_err(|e| format!("FORKD_CA_CERT: {e}"))? {
        // A bundle may hold certificates rustls cannot use; the others still count.
        let _ = roots.add(c);
    }
    if roots.is_empty() {
        return Err(format!("FORKD_CA_CERT: {ca}: no usable CA certificate"));
    }
    // ring, as the daemon and the registry client: no cmake in the build.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots);
    let mut config = match (env("FORKD_CLIENT_CERT"), env("FORKD_CLIENT_KEY")) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain =
                pem_certs(Path::new(&cert)).map_err(|e| format!("FORKD_CLIENT_CERT: {e}"))?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&key)
                .map_err(|e| format!("FORKD_CLIENT_KEY: {key}: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("FORKD_CLIENT_CERT and FORKD_CLIENT_KEY: {e}"))?
        }
        _ => {
            return Err("FORKD_CLIENT_CERT and FORKD_CLIENT_KEY go together".into());
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The runtime that carries TCP connections: one thread, made at the first.
fn runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("forkd-client-io")
        .enable_io()
        .enable_time()
        .build()?;
    Ok(RT.get_or_init(|| rt))
}

/// Connects to `r` (TLS handshake included) and returns the near end of a socket pair
/// whose far end is copied to and from the connection until either side closes.
fn bridge(r: Arc<Remote>) -> std::io::Result<UnixStream> {
    let rt = runtime()?;
    let (near, far) = UnixStream::pair()?;
    far.set_nonblocking(true)?;
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        let connected = async {
            let tcp = tokio::time::timeout(
                CONNECT_TIMEOUT,
                tokio::net::TcpStream::connect((r.host.as_str(), r.port)),
            )
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
            })??;
            tcp.set_nodelay(true)?;
            let far = tokio::net::UnixStream::from_std(far)?;
            Ok::<_, std::io::Error>((tcp, far))
        }
        .await;
        let (tcp, mut far) = match connected {
            Ok(x) => x,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        match &r.tls {
            None => {
                let _ = tx.send(Ok(()));
                let mut tcp = tcp;
                let _ = tokio::io::copy_bidirectional(&mut tcp, &mut far).await;
            }
            Some(config) => {
                let name = match rustls::pki_types::ServerName::try_from(r.host.clone()) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(format!(
                            "server name {}: {e}",
                            r.host
                        ))));
                        return;
                    }
                };
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let shaken = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
                    .await
                    .unwrap_or_else(|_| {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "handshake timed out",
                        ))
                    });
                match shaken {
                    Ok(mut tls) => {
                        let _ = tx.send(Ok(()));
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut far).await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(format!("TLS: {e}"))));
                    }
                }
            }
        }
    });
    rx.recv()
        .map_err(|_| std::io::Error::other("the connection task ended"))??;
    Ok(near)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn endpoints_are_chosen_in_order() {
        let e = Endpoint::choose(None, None, &env(&[])).unwrap();
        assert!(matches!(e, Endpoint::Unix(p) if p == Path::new(crate::defaults::DEFAULT_SOCKET)));
        let e = Endpoint::choose(None, None, &env(&[("FORKD_SOCKET", "/s")])).unwrap();
        assert!(matches!(e, Endpoint::Unix(p) if p == Path::new("/s")));
        let vars = env(&[
            ("FORKD_HOST", "tcp://127.0.0.1:7"),
            ("FORKD_TLS", "off"),
            ("FORKD_API_KEY", "k"),
        ]);
        let e = Endpoint::choose(None, None, &vars).unwrap();
        assert_eq!(e.key(), Some("k"));
        assert_eq!(e.to_string(), "tcp://127.0.0.1:7 (plain)");
        // A flag wins over the environment.
        let e = Endpoint::choose(None, Some(Path::new("/f")), &vars).unwrap();
        assert!(matches!(e, Endpoint::Unix(_)));
        let e = Endpoint::choose(Some("unix:///g"), None, &vars).unwrap();
        assert!(matches!(e, Endpoint::Unix(p) if p == Path::new("/g")));
    }

    #[test]
    fn bad_hosts_and_plain_tcp_elsewhere_are_refused() {
        let off = env(&[("FORKD_TLS", "off")]);
        for bad in ["http://x:1", "tcp://x", "tcp://x:port", "x:1"] {
            assert!(Endpoint::parse(bad, &off).is_err(), "{bad}");
        }
        let e = Endpoint::parse("tcp://10.1.2.3:7", &off).err().unwrap();
        assert!(e.contains("loopback"), "{e}");
        assert!(Endpoint::parse("tcp://[::1]:7", &off).is_ok());
        let missing = env(&[("FORKD_CA_CERT", "/nonexistent/ca.pem")]);
        let e = Endpoint::parse("tcp://127.0.0.1:7", &missing)
            .err()
            .unwrap();
        assert!(
            e.contains("FORKD_CA_CERT") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
    }
}
