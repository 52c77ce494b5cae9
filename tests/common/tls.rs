//! A daemon listening on TCP with TLS, and the keys remote clients present to it.

use super::{free_port, make_pki, require, TestDaemon, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A daemon listening on loopback with TLS, beside its socket: its `FORKD_HOST`, the CA
/// that signed its certificate, and the test PKI's directory (client pair included).
pub struct Tls {
    pub host: String,
    pub ca: PathBuf,
    pub pki: PathBuf,
}

impl Tls {
    /// The environment a remote client needs, with `key`.
    pub fn env(&self, key: &str) -> Vec<(&'static str, String)> {
        vec![
            ("FORKD_HOST", self.host.clone()),
            ("FORKD_CA_CERT", self.ca.display().to_string()),
            ("FORKD_API_KEY", key.to_string()),
        ]
    }
}

/// Starts a daemon as [`TestDaemon::start_with_env`] does, also listening with TLS on a
/// free loopback port (certificates from [`make_pki`]); `None` after a SKIP line, or a
/// failure under CI, without openssl.
pub fn start_tls(name: &str, env: &[(&str, &str)]) -> Option<(TestDaemon, Tls)> {
    if !require(
        name,
        Path::new("/usr/bin/openssl").exists(),
        "openssl missing (run fixtures/setup.sh packages)",
    ) {
        return None;
    }
    let pki = PathBuf::from(format!("/tmp/forkd-test-{name}-pki-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&pki);
    make_pki(&pki);
    let port = free_port();
    let host = format!("tcp://127.0.0.1:{port}");
    let cert = pki.join("server.crt").display().to_string();
    let key = pki.join("server.key").display().to_string();
    let mut all: Vec<(&str, &str)> = vec![
        ("FORKD_LISTEN", &host),
        ("FORKD_TLS_CERT", &cert),
        ("FORKD_TLS_KEY", &key),
    ];
    all.extend_from_slice(env);
    let d = TestDaemon::start_with_env(name, &all);
    Some((
        d,
        Tls {
            host,
            ca: pki.join("ca.crt"),
            pki,
        },
    ))
}

/// A key made on the node with `forkd key create`, as an operator would.
pub fn make_key(root: &Path, name: &str, scope: &str) -> String {
    let out = Command::new(BIN)
        .args(["key", "create", name, "--scope", scope, "--root"])
        .arg(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "key create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
