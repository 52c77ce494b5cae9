//! Image references: `[registry/]repository[:tag][@sha256:hex]`, parsed by the grammar
//! the distribution registry and Docker use, and written back fully qualified.
//!
//! A reference whose first `/`-separated component has a `.` or a `:`, or is
//! `localhost`, names its registry; any other is a *short name*, which
//! [`crate::config::RegistriesConf::candidates`] expands (aliases, then the
//! unqualified-search registries, then Docker Hub as Docker does). On Docker Hub a
//! one-component repository is an official image under `library/`.

use std::fmt;
use std::str::FromStr;

use crate::error::RegistryError;

/// The registry short names default to, and the domain every tool writes Docker Hub's
/// references with (`busybox` is `docker.io/library/busybox:latest`).
pub const DOCKER_HUB: &str = "docker.io";
/// Where Docker Hub's registry API answers: `docker.io` itself is not an API endpoint.
/// Every client of it (Docker, containerd, podman) maps the one name to the other.
/// Docker Hub's names are the reference format's, so they are written here, once.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Docker Hub's older name, which references and credential files still use.
pub const DOCKER_HUB_LEGACY: &str = "index.docker.io";
/// The key Docker's credential files and helpers know Docker Hub by.
pub const DOCKER_HUB_CREDENTIALS_KEY: &str = "https://index.docker.io/v1/";
/// The tag a reference without tag or digest means.
pub const DEFAULT_TAG: &str = "latest";
const MAX_NAME: usize = 255;
const MAX_TAG: usize = 128;

/// A sha256 content digest (`sha256:` and 64 lowercase hex digits). Other algorithms
/// are refused by name when parsed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(hex(&sha2::Sha256::digest(bytes)))
    }

    pub fn from_hex(h: &str) -> Option<Digest> {
        is_hex64(h).then(|| Digest(h.to_owned()))
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

impl FromStr for Digest {
    type Err = RegistryError;
    fn from_str(s: &str) -> Result<Digest, RegistryError> {
        let bad = |why: &str| RegistryError::BadDigest {
            digest: s.to_owned(),
            reason: why.to_owned(),
        };
        let (alg, hex) = s.split_once(':').ok_or_else(|| bad("not ALGORITHM:HEX"))?;
        if alg != "sha256" {
            return Err(bad("only sha256 digests are supported"));
        }
        if !is_hex64(hex) {
            return Err(bad("a sha256 digest is 64 lowercase hex digits"));
        }
        Ok(Digest(hex.to_owned()))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A reference as written: the registry is absent for a short name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub registry: Option<String>,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

/// A fully qualified reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `host[:port]`, as written (Docker Hub as `docker.io`).
    pub registry: String,
    /// The repository path on that registry (`library/busybox`).
    pub repository: String,
    /// The tag, unless only a digest was given.
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses a fully qualified reference; a short name is an error (see
    /// [`Parsed::parse`] and the registries configuration for those).
    pub fn parse_qualified(s: &str) -> Result<Reference, RegistryError> {
        let p = Parsed::parse(s)?;
        match p.registry.clone() {
            Some(r) => Ok(p.qualify(&r)),
            None => Err(RegistryError::BadReference {
                reference: s.to_owned(),
                reason: "a registry is required here (host/repository)".into(),
            }),
        }
    }

    /// `registry/repository`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// What the registry is asked for: the digest if there is one, else the tag.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => DEFAULT_TAG.to_owned(),
        }
    }

    /// The same repository on another registry (a mirror, a rewritten location).
    pub fn with_location(&self, registry: &str, repository: &str) -> Reference {
        Reference {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag: self.tag.clone(),
            digest: self.digest.clone(),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl Parsed {
    /// Parses `[registry/]repository[:tag][@digest]`. A reference without tag or
    /// digest gets [`DEFAULT_TAG`].
    pub fn parse(s: &str) -> Result<Parsed, RegistryError> {
        let bad = |why: &str| RegistryError::BadReference {
            reference: s.to_owned(),
            reason: why.to_owned(),
        };
        if s.is_empty() {
            return Err(bad("empty"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d.parse::<Digest>()?)),
            None => (s, None),
        };
        // A tag follows the last ':' after the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&rest[..at], Some(&rest[at + 1..]))
            }
            None => (rest, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(bad(
                    "a tag is 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'",
                ));
            }
        }
        if name.len() > MAX_NAME {
            return Err(bad("the name is longer than 255 characters"));
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                if !valid_domain(first) {
                    return Err(bad("the registry is not a valid host[:port]"));
                }
                (Some(first.to_owned()), path)
            }
            _ => (None, name),
        };
        if path.is_empty() || !path.split('/').all(valid_path_component) {
            return Err(bad(
                "repository path components are lowercase letters and digits, joined by '.', '_', '__' or dashes",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_owned()),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_TAG.to_owned()),
        };
        Ok(Parsed {
            registry,
            repository: path.to_owned(),
            tag,
            digest,
        })
    }

    /// The reference on `registry`, with Docker Hub's conventions applied there
    /// (`index.docker.io` is `docker.io`; `busybox` is `library/busybox`).
    pub fn qualify(&self, registry: &str) -> Reference {
        let registry = if registry == DOCKER_HUB_LEGACY {
            DOCKER_HUB
        } else {
            registry
        };
        let repository = if registry == DOCKER_HUB && !self.repository.contains('/') {
            format!("library/{}", self.repository)
        } else {
            self.repository.clone()
        };
        Reference {
            registry: registry.to_owned(),
            repository,
            tag: self.tag.clone(),
            digest: self.digest.clone(),
        }
    }

    pub fn is_short(&self) -> bool {
        self.registry.is_none()
    }
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_TAG
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn valid_path_component(c: &str) -> bool {
    // [a-z0-9]+ ((\.|_|__|-+) [a-z0-9]+)*
    let b = c.as_bytes();
    if b.is_empty() || !is_alnum_lower(b[0]) || !is_alnum_lower(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum_lower(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !is_alnum_lower(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn is_alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn valid_domain(d: &str) -> bool {
    let valid_port =
        |p: &str| !p.is_empty() && p.len() <= 5 && p.bytes().all(|c| c.is_ascii_digit());
    if let Some(rest) = d.strip_prefix('[') {
        // [IPv6] or [IPv6]:port
        let Some((h, after)) = rest.split_once(']') else {
            return false;
        };
        let host_ok = !h.is_empty() && h.bytes().all(|c| c.is_ascii_hexdigit() || c == b':');
        return host_ok && (after.is_empty() || after.strip_prefix(':').is_some_and(valid_port));
    }
    let (host, port) = match d.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    port.map_or(true, valid_port)
        && !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> String {
        let p = Parsed::parse(s).unwrap();
        let reg = p.registry.clone().unwrap_or_else(|| DOCKER_HUB.to_owned());
        p.qualify(&reg).to_string()
    }

    #[test]
    fn short_names_expand_as_docker_does() {
        assert_eq!(q("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(
            q("python:3.13-slim-bookworm"),
            "docker.io/library/python:3.13-slim-bookworm"
        );
        assert_eq!(
            q("swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"),
            "docker.io/swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
        );
        assert_eq!(
            q("index.docker.io/library/ubuntu:24.04"),
            "docker.io/library/ubuntu:24.04"
        );
        assert_eq!(q("docker.io/ubuntu"), "docker.io/library/ubuntu:latest");
    }

    #[test]
    fn registries_ports_tags_and_digests() {
        let d = "sha256:".to_owned() + &"ab".repeat(32);
        let p = Parsed::parse(&format!("127.0.0.1:5000/team/app:v1@{d}")).unwrap();
        assert_eq!(p.registry.as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(p.repository, "team/app");
        assert_eq!(p.tag.as_deref(), Some("v1"));
        assert_eq!(p.digest.as_ref().unwrap().to_string(), d);
        let p = Parsed::parse(&format!("localhost/app@{d}")).unwrap();
        assert_eq!(p.registry.as_deref(), Some("localhost"));
        assert_eq!(p.tag, None, "a digest alone has no tag");
        let p = Parsed::parse("localhost:5000/app").unwrap();
        assert_eq!(p.registry.as_deref(), Some("localhost:5000"));
        assert_eq!(p.tag.as_deref(), Some("latest"));
        let p = Parsed::parse("[::1]:5000/app:1").unwrap();
        assert_eq!(p.registry.as_deref(), Some("[::1]:5000"));
        assert_eq!(
            Parsed::parse("ghcr.io/x/y").unwrap().registry.as_deref(),
            Some("ghcr.io")
        );
    }

    #[test]
    fn bad_references_are_refused_with_the_reason() {
        for (s, why) in [
            ("", "empty"),
            ("Busybox", "lowercase"),
            ("a//b", "lowercase"),
            ("app:", "a tag is"),
            ("app:-x", "a tag is"),
            ("app@md5:00", "only sha256"),
            ("app@sha256:abc", "64 lowercase hex"),
            ("exa mple.com/app", "registry"),
            ("a/../b", "lowercase"),
            ("a/-b", "lowercase"),
        ] {
            let e = Parsed::parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
        }
        assert!(Parsed::parse(&format!("a:{}", "x".repeat(129))).is_err());
        assert!(Parsed::parse(&"a".repeat(256)).is_err());
    }

    #[test]
    fn path_components_follow_the_grammar() {
        for ok in ["a", "a.b", "a_b", "a__b", "a---b", "0x"] {
            assert!(valid_path_component(ok), "{ok}");
        }
        for bad in ["a..b", "a___b", "_a", "a_", "a-._b", "A"] {
            assert!(!valid_path_component(bad), "{bad}");
        }
    }
}
