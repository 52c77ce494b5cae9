//! Registry credentials, from the files podman and Docker users already have.
//!
//! Looked up in order, the first that knows the registry wins:
//! 1. the containers auth file, containers-auth.json(5): `REGISTRY_AUTH_FILE` if set,
//!    else `$XDG_RUNTIME_DIR/containers/auth.json`, `/run/containers/UID/auth.json` and
//!    `$XDG_CONFIG_HOME/containers/auth.json` (`~/.config/...`);
//! 2. Docker's `$DOCKER_CONFIG/config.json` (`~/.docker/config.json`).
//!
//! In each file: a `credHelpers` entry for the registry runs
//! `docker-credential-NAME get`; else the most specific `auths` key
//! (`host/namespace/repo`, then shorter, then `host`; Docker's URL keys such as
//! `https://host/v1/` mean `host`) gives `auth` (base64 `user:password`) or an
//! `identitytoken`; else `credsStore` names the helper for every registry.
//!
//! `forkd login` writes the containers auth file as podman does (mode 0600, atomically).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::error::RegistryError;
use crate::reference::{DOCKER_HUB, DOCKER_HUB_API, DOCKER_HUB_CREDENTIALS_KEY, DOCKER_HUB_LEGACY};

/// A user name and secret for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub secret: String,
    /// The secret is an OAuth refresh token (Docker's `identitytoken`).
    pub identity_token: bool,
    /// Where it came from, for messages: a file, or a helper.
    pub from: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        write!(f, "Credential({} from {})", self.username, self.from)
    }
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct AuthFile {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    creds_store: Option<String>,
    /// Everything else in the file, kept when it is rewritten.
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
struct AuthEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auth: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identitytoken: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

/// Credentials a request brought (its caller's), by registry host. Where a request
/// brings them, they are the only ones used: the daemon's own files are not looked at.
pub type Given = BTreeMap<String, Credential>;

/// The credential `given` holds for `registry` (Docker Hub by any of its names).
pub fn given_for(given: &Given, registry: &str) -> Option<Credential> {
    aliases(registry)
        .iter()
        .find_map(|name| given.iter().find(|(k, _)| normalize_key(k) == *name))
        .map(|(_, c)| c.clone())
}

/// The caller's own credential for the registry `reference` names, from the files of
/// this process's environment (as [`AuthFiles::from_env`]): what a client sends with a
/// pull. None for a short name, whose registry is the daemon's registries.conf's to say.
pub fn for_reference(reference: &str) -> Result<Option<(String, Credential)>, RegistryError> {
    let parsed = crate::reference::Parsed::parse(reference)?;
    let Some(registry) = &parsed.registry else {
        return Ok(None);
    };
    let r = parsed.qualify(registry);
    Ok(AuthFiles::from_env()
        .lookup(&r.registry, &r.repository)?
        .map(|c| (r.registry.clone(), c)))
}

/// The files credentials are looked up in, in order.
#[derive(Debug, Clone, Default)]
pub struct AuthFiles {
    pub files: Vec<PathBuf>,
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

fn uid() -> u32 {
    // The owner of /proc/self is this process's uid; no unsafe call needed.
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0)
}

/// The containers auth file `forkd login` writes: `REGISTRY_AUTH_FILE`, else
/// `$XDG_RUNTIME_DIR/containers/auth.json`, else `/run/containers/UID/auth.json`.
pub fn login_file() -> PathBuf {
    if let Some(p) = std::env::var_os("REGISTRY_AUTH_FILE") {
        return PathBuf::from(p);
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("containers/auth.json"),
        _ => PathBuf::from(format!("/run/containers/{}/auth.json", uid())),
    }
}

impl AuthFiles {
    /// The files this process's environment names.
    pub fn from_env() -> AuthFiles {
        let mut files = Vec::new();
        if let Some(p) = std::env::var_os("REGISTRY_AUTH_FILE") {
            files.push(PathBuf::from(p));
        } else {
            if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
                files.push(PathBuf::from(d).join("containers/auth.json"));
            }
            files.push(PathBuf::from(format!(
                "/run/containers/{}/auth.json",
                uid()
            )));
            match std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
                Some(d) => files.push(PathBuf::from(d).join("containers/auth.json")),
                None => {
                    if let Some(h) = home() {
                        files.push(h.join(".config/containers/auth.json"));
                    }
                }
            }
        }
        match std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
            Some(d) => files.push(PathBuf::from(d).join("config.json")),
            None => {
                if let Some(h) = home() {
                    files.push(h.join(".docker/config.json"));
                }
            }
        }
        files.dedup();
        AuthFiles { files }
    }

    /// The credential for `repository` on `registry`, if any file has one.
    pub fn lookup(
        &self,
        registry: &str,
        repository: &str,
    ) -> Result<Option<Credential>, RegistryError> {
        for path in &self.files {
            let Some(file) = read_file(path)? else {
                continue;
            };
            if let Some(c) = lookup_in(&file, path, registry, repository)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }
}

fn read_file(path: &Path) -> Result<Option<AuthFile>, RegistryError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => return Ok(None),
        Err(e) => {
            return Err(RegistryError::Io {
                step: "reading",
                path: path.to_path_buf(),
                source: e,
            })
        }
    };
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Some(AuthFile::default()));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| RegistryError::Config {
            path: path.to_path_buf(),
            reason: format!("not a credentials file: {e}"),
        })
}

/// The names a registry may be written as in a file's keys.
fn aliases(registry: &str) -> Vec<String> {
    if registry == DOCKER_HUB {
        vec![
            DOCKER_HUB.into(),
            DOCKER_HUB_LEGACY.into(),
            DOCKER_HUB_API.into(),
        ]
    } else {
        vec![registry.to_owned()]
    }
}

/// A key as a host or a `host/path`, with a URL's scheme and a Docker `/v1/`-style
/// API path dropped.
fn normalize_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .map(|rest| rest.split('/').next().unwrap_or(rest))
        .unwrap_or(key);
    k.trim_end_matches('/').to_owned()
}

fn helper_server_url(registry: &str) -> String {
    if registry == DOCKER_HUB {
        DOCKER_HUB_CREDENTIALS_KEY.into()
    } else {
        registry.to_owned()
    }
}

fn lookup_in(
    file: &AuthFile,
    path: &Path,
    registry: &str,
    repository: &str,
) -> Result<Option<Credential>, RegistryError> {
    let names = aliases(registry);
    for (k, helper) in &file.cred_helpers {
        if names.contains(&normalize_key(k)) {
            return run_helper(helper, registry);
        }
    }
    // Most specific key first: host/a/b/c, host/a/b, host/a, host.
    let keys: BTreeMap<String, &AuthEntry> = file
        .auths
        .iter()
        .map(|(k, v)| (normalize_key(k), v))
        .collect();
    for name in &names {
        let mut scope = format!("{name}/{repository}");
        loop {
            if let Some(entry) = keys.get(&scope) {
                if let Some(c) = decode_entry(entry, path, registry)? {
                    return Ok(Some(c));
                }
            }
            match scope.rfind('/') {
                Some(i) => scope.truncate(i),
                None => break,
            }
        }
    }
    if let Some(store) = &file.creds_store {
        return run_helper(store, registry);
    }
    Ok(None)
}

fn decode_entry(
    e: &AuthEntry,
    path: &Path,
    registry: &str,
) -> Result<Option<Credential>, RegistryError> {
    let bad = |reason: &str| RegistryError::Credentials {
        registry: registry.to_owned(),
        from: path.display().to_string(),
        reason: reason.to_owned(),
    };
    if let Some(token) = e.identitytoken.as_ref().filter(|t| !t.is_empty()) {
        let username = match &e.auth {
            Some(a) if !a.is_empty() => split_auth(a).map(|(u, _)| u).unwrap_or_default(),
            _ => String::new(),
        };
        return Ok(Some(Credential {
            username,
            secret: token.clone(),
            identity_token: true,
            from: path.display().to_string(),
        }));
    }
    match e.auth.as_deref() {
        None | Some("") => Ok(None),
        Some(a) => {
            let (username, secret) =
                split_auth(a).ok_or_else(|| bad("\"auth\" is not base64 of user:password"))?;
            Ok(Some(Credential {
                username,
                secret,
                identity_token: false,
                from: path.display().to_string(),
            }))
        }
    }
}

fn split_auth(a: &str) -> Option<(String, String)> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(a.trim())
        .ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

#[derive(Deserialize)]
struct HelperAnswer {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// Runs `docker-credential-NAME get` with the registry on its stdin.
fn run_helper(name: &str, registry: &str) -> Result<Option<Credential>, RegistryError> {
    let program = format!("docker-credential-{name}");
    let bad = |reason: String| RegistryError::Credentials {
        registry: registry.to_owned(),
        from: program.clone(),
        reason,
    };
    if name.is_empty()
        || !name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Err(bad(format!("{name:?} is not a helper name")));
    }
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| bad(format!("cannot run it: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(helper_server_url(registry).as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| bad(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // The helper protocol's way of saying it has nothing for this registry.
        if stdout.contains("credentials not found")
            || String::from_utf8_lossy(&out.stderr).contains("credentials not found")
        {
            return Ok(None);
        }
        return Err(bad(format!(
            "exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let a: HelperAnswer =
        serde_json::from_str(stdout.trim()).map_err(|e| bad(format!("bad answer: {e}")))?;
    if a.secret.is_empty() {
        return Ok(None);
    }
    Ok(Some(Credential {
        identity_token: a.username == "<token>",
        username: a.username,
        secret: a.secret,
        from: program,
    }))
}

/// Writes `username:secret` for `registry` (or `registry/namespace`) into `path`,
/// keeping everything else in it.
pub fn store_login(
    path: &Path,
    key: &str,
    username: &str,
    secret: &str,
) -> Result<(), RegistryError> {
    let mut file = read_file(path)?.unwrap_or_default();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{secret}"));
    file.auths.insert(
        key.to_owned(),
        AuthEntry {
            auth: Some(auth),
            ..Default::default()
        },
    );
    write_file(path, &file)
}

/// Removes `key` from `path`; whether it was there.
pub fn remove_login(path: &Path, key: &str) -> Result<bool, RegistryError> {
    let Some(mut file) = read_file(path)? else {
        return Ok(false);
    };
    let before = file.auths.len();
    file.auths.retain(|k, _| normalize_key(k) != key);
    if file.auths.len() == before {
        return Ok(false);
    }
    write_file(path, &file)?;
    Ok(true)
}

fn write_file(path: &Path, file: &AuthFile) -> Result<(), RegistryError> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let io = |step: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| RegistryError::Io {
            step,
            path: p,
            source,
        }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("creating", dir))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("auth.json");
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let json = serde_json::to_vec_pretty(file).expect("an auth file serializes");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("creating", &tmp))?;
    let written = f.write_all(&json).and_then(|_| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(RegistryError::Io {
            step: "writing",
            path: path.to_path_buf(),
            source: e,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("forkd-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_most_specific_key_of_the_first_file_wins() {
        let d = tmpdir("keys");
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let first = d.join("auth.json");
        std::fs::write(
            &first,
            serde_json::json!({"auths": {
                "127.0.0.1:5000": {"auth": b64("all:one")},
                "127.0.0.1:5000/team": {"auth": b64("team:two")},
            }})
            .to_string(),
        )
        .unwrap();
        let docker = d.join("config.json");
        std::fs::write(
            &docker,
            serde_json::json!({"auths": {
                DOCKER_HUB_CREDENTIALS_KEY: {"auth": b64("hub:three")},
                "127.0.0.1:5000": {"auth": b64("docker:four")},
                "broken.example": {"auth": "!!"},
            }})
            .to_string(),
        )
        .unwrap();
        let files = AuthFiles {
            files: vec![d.join("missing.json"), first.clone(), docker.clone()],
        };
        let c = files.lookup("127.0.0.1:5000", "team/app").unwrap().unwrap();
        assert_eq!((c.username.as_str(), c.secret.as_str()), ("team", "two"));
        assert_eq!(c.from, first.display().to_string());
        let c = files
            .lookup("127.0.0.1:5000", "other/app")
            .unwrap()
            .unwrap();
        assert_eq!(c.username, "all");
        let c = files
            .lookup(DOCKER_HUB, "library/busybox")
            .unwrap()
            .unwrap();
        assert_eq!((c.username.as_str(), c.secret.as_str()), ("hub", "three"));
        assert!(files.lookup("registry.example", "x/y").unwrap().is_none());
        let e = files.lookup("broken.example", "x").unwrap_err().to_string();
        assert!(
            e.contains("broken.example") && e.contains("config.json"),
            "{e}"
        );
        assert!(
            !format!("{c:?}").contains("three"),
            "Debug never shows the secret"
        );
    }

    #[test]
    fn login_and_logout_keep_the_rest_of_the_file() {
        let d = tmpdir("login");
        let f = d.join("containers/auth.json");
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, r#"{"auths":{"a.example":{"auth":"eDp5"}},"credHelpers":{"b.example":"pass"},"extra":1}"#).unwrap();
        store_login(&f, "127.0.0.1:5000", "u", "p:w").unwrap();
        let files = AuthFiles {
            files: vec![f.clone()],
        };
        let c = files.lookup("127.0.0.1:5000", "x").unwrap().unwrap();
        assert_eq!((c.username.as_str(), c.secret.as_str()), ("u", "p:w"));
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            text.contains("a.example") && text.contains("credHelpers") && text.contains("extra"),
            "{text}"
        );
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(remove_login(&f, "127.0.0.1:5000").unwrap());
        assert!(!remove_login(&f, "127.0.0.1:5000").unwrap());
        assert!(files.lookup("127.0.0.1:5000", "x").unwrap().is_none());
    }

    #[test]
    fn a_missing_helper_is_named() {
        let d = tmpdir("helper");
        let f = d.join("config.json");
        std::fs::write(
            &f,
            r#"{"credHelpers":{"127.0.0.1:5000":"forkd-test-none"}}"#,
        )
        .unwrap();
        let files = AuthFiles { files: vec![f] };
        let e = files.lookup("127.0.0.1:5000", "x").unwrap_err().to_string();
        assert!(e.contains("docker-credential-forkd-test-none"), "{e}");
    }
}
