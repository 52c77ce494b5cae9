//! API keys. A key is `e2b_` and 40 lowercase hex digits (160 bits from the kernel's
//! random source): E2B's form, so that a surface speaking E2B's protocol takes the same
//! keys. The store is one file in the node's state root, `keys.json`, mode 0600, holding
//! each key's name, scope, creation time and SHA-256 digest, never the key. Changes take
//! the file's lock, write a temporary file and rename it over the old one, so a reader
//! sees the old set or the new one. The daemon reads the file again whenever it changed
//! ([`Keys::verify`]), so `forkd key rm` takes effect at the next request.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The key file's name in the state root.
pub const FILE: &str = "keys.json";
/// What every key starts with.
pub const PREFIX: &str = "e2b_";
const HEX_DIGITS: usize = 40;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Every operation of the API.
    Full,
    /// Images, and only the sandboxes and checkpoints this key made.
    Own,
}

impl std::str::FromStr for Scope {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "full" => Ok(Scope::Full),
            "own" => Ok(Scope::Own),
            _ => Err(Error::Invalid(format!("scope {s:?}: expected full or own"))),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scope::Full => "full",
            Scope::Own => "own",
        })
    }
}

/// A key as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Key {
    /// What owns what the key makes: made with the key, never reused, so a new key of a
    /// removed one's name owns nothing of the old one's.
    pub id: String,
    pub name: String,
    pub scope: Scope,
    /// Seconds since the epoch.
    pub created: u64,
    /// The key's SHA-256, hex.
    pub sha256: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    keys: Vec<Key>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: {step}: {source}")]
    Io {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {0}", path = .1.display())]
    Corrupt(String, PathBuf),
}

fn io<'a>(path: &'a Path, step: &'static str) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        path: path.to_path_buf(),
        step,
        source,
    }
}

/// A key's name: 1 to 64 of `a-z A-Z 0-9 . _ -`, not starting with a dot.
pub fn check_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "key name {name:?}: expected 1 to 64 of letters, digits, '.', '_' and '-', not starting with '.'"
        )))
    }
}

fn digest(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `s` has a key's form.
pub fn well_formed(s: &str) -> bool {
    s.strip_prefix(PREFIX).is_some_and(|h| {
        h.len() == HEX_DIGITS
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Equal, in time that depends only on the lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What tells one version of the file from another: inode, mtime (s, ns), size.
type Stamp = (u64, i64, i64, u64);

/// The store of one state root.
pub struct Keys {
    path: PathBuf,
    /// The keys as last read, with the file's stamp then.
    seen: Mutex<(Option<Stamp>, Arc<Vec<Key>>)>,
}

impl Keys {
    pub fn at(root: &Path) -> Keys {
        Keys {
            path: root.join(FILE),
            seen: Mutex::new((None, Arc::new(Vec::new()))),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The keys now in the file (none when there is no file), read again only when the
    /// file changed.
    pub fn current(&self) -> Result<Arc<Vec<Key>>, Error> {
        let stamp = match std::fs::metadata(&self.path) {
            Ok(m) => Some((m.ino(), m.mtime(), m.mtime_nsec(), m.size())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&self.path, "stat")(e)),
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.0 != stamp || stamp.is_none() && !seen.1.is_empty() {
            let keys = Arc::new(read(&self.path)?.keys);
            *seen = (stamp, keys);
        }
        Ok(seen.1.clone())
    }

    /// The key `secret` is, if the store holds it.
    pub fn verify(&self, secret: &str) -> Result<Option<Key>, Error> {
        if !well_formed(secret) {
            return Ok(None);
        }
        let d = digest(secret);
        let keys = self.current()?;
        // Every digest is compared, whichever matches.
        let mut found = None;
        for k in keys.iter() {
            if same(k.sha256.as_bytes(), d.as_bytes()) {
                found = Some(k.clone());
            }
        }
        Ok(found)
    }

    /// Makes key `name`; returns it (the only time it is seen) and its record.
    pub fn create(&self, name: &str, scope: Scope, now: u64) -> Result<(String, Key), Error> {
        check_name(name)?;
        let secret = new_secret()?;
        let key = Key {
            id: hex(&random::<8>()?),
            name: name.to_string(),
            scope,
            created: now,
            sha256: digest(&secret),
        };
        self.change(|file| {
            if file.keys.iter().any(|k| k.name == name) {
                return Err(Error::Invalid(format!(
                    "a key named {name:?} exists: remove it first (forkd key rm {name})"
                )));
            }
            file.keys.push(key.clone());
            Ok(())
        })?;
        Ok((secret, key))
    }

    /// Removes key `name`; returns its record.
    pub fn remove(&self, name: &str) -> Result<Key, Error> {
        let mut gone = None;
        self.change(|file| {
            let i = file
                .keys
                .iter()
                .position(|k| k.name == name)
                .ok_or_else(|| Error::Invalid(format!("no key named {name:?}")))?;
            gone = Some(file.keys.remove(i));
            Ok(())
        })?;
        Ok(gone.expect("set by the change"))
    }

    /// Reads, changes and replaces the file under its lock.
    fn change(&self, f: impl FnOnce(&mut File) -> Result<(), Error>) -> Result<(), Error> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io(dir, "create the state root"))?;
        let lock_path = dir.join(".keys.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io(&lock_path, "open the lock"))?;
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| io(&lock_path, "lock")(e.into()))?;
        let mut file = read(&self.path)?;
        f(&mut file)?;
        let tmp = dir.join(format!(".keys.json.{}", std::process::id()));
        let body = serde_json::to_vec_pretty(&file).expect("keys serialise");
        let written = (|| {
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            out.write_all(&body)?;
            out.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&self.path, "write")(e));
        }
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<File, Error> {
    let mut text = String::new();
    match std::fs::File::open(path) {
        Ok(mut f) => {
            let mode = f.metadata().map_err(io(path, "stat"))?.mode();
            if mode & 0o077 != 0 {
                return Err(Error::Corrupt(
                    format!(
                        "mode {:o} lets others read the key digests: chmod 600 it",
                        mode & 0o777
                    ),
                    path.to_path_buf(),
                ));
            }
            f.read_to_string(&mut text).map_err(io(path, "read"))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(File::default()),
        Err(e) => return Err(io(path, "open")(e)),
    }
    let file: File = serde_json::from_str(&text)
        .map_err(|e| Error::Corrupt(format!("not a key file: {e}"), path.to_path_buf()))?;
    for k in &file.keys {
        check_name(&k.name).map_err(|e| Error::Corrupt(e.to_string(), path.to_path_buf()))?;
        if k.id.len() != 16 || !k.id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Corrupt(
                format!("key {:?}: id is not 16 hex digits", k.name),
                path.to_path_buf(),
            ));
        }
        if k.sha256.len() != 64 || !k.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Corrupt(
                format!("key {:?}: sha256 is not 64 hex digits", k.name),
                path.to_path_buf(),
            ));
        }
    }
    Ok(file)
}

/// `N` bytes from the kernel's random source.
fn random<const N: usize>() -> Result<[u8; N], Error> {
    let mut raw = [0u8; N];
    let urandom = Path::new("/dev/urandom");
    std::fs::File::open(urandom)
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(io(urandom, "read"))?;
    Ok(raw)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn new_secret() -> Result<String, Error> {
    Ok(format!("{PREFIX}{}", hex(&random::<{ HEX_DIGITS / 2 }>()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_made_verified_listed_and_removed() {
        let dir = std::env::temp_dir().join(format!("forkd-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let keys = Keys::at(&dir);
        assert!(keys.current().unwrap().is_empty());
        let (a, rec) = keys.create("harness-1", Scope::Own, 7).unwrap();
        assert!(well_formed(&a), "{a}");
        assert_eq!(rec.scope, Scope::Own);
        let text = std::fs::read_to_string(keys.path()).unwrap();
        assert!(
            !text.contains(&a[PREFIX.len()..]),
            "the key itself is never stored"
        );
        let mode = std::fs::metadata(keys.path()).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(keys.verify(&a).unwrap().unwrap().name, "harness-1");
        let (b, rec_b) = keys.create("admin", Scope::Full, 8).unwrap();
        assert_ne!(rec.id, rec_b.id);
        assert_ne!(a, b);
        assert!(
            keys.create("admin", Scope::Full, 9).is_err(),
            "names are unique"
        );
        let mut wrong = a.clone();
        wrong.pop();
        wrong.push(if a.ends_with('0') { '1' } else { '0' });
        assert!(keys.verify(&wrong).unwrap().is_none());
        assert!(keys.verify("Bearer nonsense").unwrap().is_none());
        // Another writer (the CLI) removes one: the next check reads the file again.
        Keys::at(&dir).remove("harness-1").unwrap();
        assert!(keys.verify(&a).unwrap().is_none());
        assert_eq!(keys.verify(&b).unwrap().unwrap().scope, Scope::Full);
        assert!(keys.remove("harness-1").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_and_forms_are_checked() {
        for bad in ["", "..", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        check_name("ci-runner_1.a").unwrap();
        assert!(well_formed(&format!("e2b_{}", "0a".repeat(20))));
        assert!(!well_formed(&format!("e2b_{}", "0A".repeat(20))));
        assert!(!well_formed(&format!("e2b_{}", "0a".repeat(19))));
        assert!("everything".parse::<Scope>().is_err());
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        let dir = std::env::temp_dir().join(format!("forkd-keys-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let keys = Keys::at(&dir);
        keys.create("a", Scope::Full, 1).unwrap();
        std::fs::set_permissions(
            keys.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        let e = Keys::at(&dir).current().unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
