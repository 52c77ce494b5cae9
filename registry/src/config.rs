//! Where a reference is pulled from: `registries.conf` as containers-registries.conf(5)
//! version 2 defines it, which is what podman, buildah and skopeo users already have.
//!
//! What is read:
//! - `unqualified-search-registries`: the registries a short name is tried on, in order;
//! - `[aliases]`: short names bound to one fully qualified repository (also from the
//!   drop-in files, where distributions keep theirs);
//! - `[[registry]]` tables: `prefix` (a repository namespace, or `*.example.com`),
//!   `location` (where that namespace really lives), `insecure` (plain HTTP and
//!   unverified TLS allowed), `blocked` (refused), `mirror-by-digest-only`, and
//!   `[[registry.mirror]]` (`location`, `insecure`, `pull-from-mirror`: `all`,
//!   `digest-only`, `tag-only`), tried in order before the location itself.
//!
//! The file is `/etc/containers/registries.conf`, or `FORKD_REGISTRIES_CONF`; files in
//! the `registries.conf.d/` directory beside it are read after it in name order: a later
//! `[[registry]]` with the same prefix replaces the earlier one, a later
//! `unqualified-search-registries` replaces the list, aliases are merged. The version 1
//! format (`[registries.search]`) is refused by name. `short-name-mode` is read but
//! nothing here prompts: a short name with no alias is tried on each search registry in
//! turn, as podman does without a terminal in `permissive` mode.
//!
//! Registries with no entry, or an entry that does not say `insecure`, are reached over
//! verified HTTPS only, except loopback addresses (`localhost`, `127.0.0.0/8`, `::1`),
//! which may answer in plain HTTP as Docker allows; `insecure = false` makes a loopback
//! registry verified too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::RegistryError;
use crate::reference::{Parsed, Reference, DOCKER_HUB};

/// The system's file.
pub const DEFAULT_PATH: &str = "/etc/containers/registries.conf";
/// The environment variable that names another file.
pub const ENV_PATH: &str = "FORKD_REGISTRIES_CONF";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct File {
    #[serde(default)]
    unqualified_search_registries: Option<Vec<String>>,
    #[serde(default)]
    short_name_mode: Option<String>,
    #[serde(default)]
    registry: Vec<RegistryEntry>,
    #[serde(default)]
    aliases: BTreeMap<String, String>,
    /// Version 1's tables: present means a file of the old format.
    #[serde(default)]
    registries: Option<toml::Value>,
}

/// One `[[registry]]` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct RegistryEntry {
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub location: Option<String>,
    /// Absent: loopback registries may speak plain HTTP, others may not. Given, it
    /// decides for loopback ones too.
    #[serde(default)]
    pub insecure: Option<bool>,
    #[serde(default)]
    pub blocked: bool,
    #[serde(default)]
    pub mirror_by_digest_only: bool,
    #[serde(default)]
    pub mirror: Vec<Mirror>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct Mirror {
    pub location: String,
    #[serde(default)]
    pub insecure: Option<bool>,
    #[serde(default)]
    pub pull_from_mirror: Option<String>,
}

/// The merged configuration.
#[derive(Debug, Clone, Default)]
pub struct RegistriesConf {
    /// The files read, in order (for messages).
    pub files: Vec<PathBuf>,
    pub search: Vec<String>,
    pub short_name_mode: Option<String>,
    pub registries: Vec<RegistryEntry>,
    pub aliases: BTreeMap<String, String>,
}

/// One place to try a reference: a mirror or the registry itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The reference as that place names it.
    pub reference: Reference,
    /// Plain HTTP and unverified TLS allowed.
    pub insecure: bool,
    pub mirror: bool,
}

impl RegistriesConf {
    /// Reads `FORKD_REGISTRIES_CONF` or the system's file, and its drop-in directory. A
    /// missing file is an empty configuration.
    pub fn load() -> Result<RegistriesConf, RegistryError> {
        let path = std::env::var_os(ENV_PATH)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_PATH));
        Self::load_from(&path)
    }

    pub fn load_from(path: &Path) -> Result<RegistriesConf, RegistryError> {
        let mut conf = RegistriesConf::default();
        let mut files = Vec::new();
        if path.is_file() {
            files.push(path.to_path_buf());
        }
        let dropins = path.with_extension("conf.d");
        if let Ok(rd) = std::fs::read_dir(&dropins) {
            let mut more: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "conf") && p.is_file())
                .collect();
            more.sort();
            files.extend(more);
        }
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| RegistryError::Config {
                path: f.clone(),
                reason: e.to_string(),
            })?;
            conf.merge(&f, &text)?;
        }
        Ok(conf)
    }

    /// Adds one file's settings over what is there.
    pub fn merge(&mut self, path: &Path, text: &str) -> Result<(), RegistryError> {
        let bad = |reason: String| RegistryError::Config {
            path: path.to_path_buf(),
            reason,
        };
        let file: File = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if file.registries.is_some() {
            return Err(bad(
                "version 1 format ([registries.search] ...) is not supported; write version 2 ([[registry]] tables, unqualified-search-registries)".into(),
            ));
        }
        for r in &file.registry {
            let key = r.prefix.as_ref().or(r.location.as_ref());
            let Some(key) = key else {
                return Err(bad("a [[registry]] needs a prefix or a location".into()));
            };
            if key.contains("://") {
                return Err(bad(format!(
                    "{key:?}: a registry is host[:port][/path], without a scheme"
                )));
            }
            if key.starts_with("*.") && key.contains('/') {
                return Err(bad(format!("{key:?}: a wildcard prefix names hosts only")));
            }
            for m in &r.mirror {
                if !matches!(
                    m.pull_from_mirror.as_deref(),
                    None | Some("all" | "digest-only" | "tag-only")
                ) {
                    return Err(bad(format!(
                        "mirror {}: pull-from-mirror is all, digest-only or tag-only, not {:?}",
                        m.location,
                        m.pull_from_mirror.as_deref().unwrap_or_default()
                    )));
                }
            }
            self.registries
                .retain(|old| old.prefix.as_ref().or(old.location.as_ref()) != Some(key));
            self.registries.push(r.clone());
        }
        if let Some(s) = file.unqualified_search_registries {
            self.search = s;
        }
        if file.short_name_mode.is_some() {
            self.short_name_mode = file.short_name_mode;
        }
        for (k, v) in file.aliases {
            Parsed::parse(&v)
                .ok()
                .filter(|p| !p.is_short())
                .ok_or_else(|| {
                    bad(format!(
                        "alias {k:?} = {v:?}: not a fully qualified reference"
                    ))
                })?;
            self.aliases.insert(k, v);
        }
        self.files.push(path.to_path_buf());
        Ok(())
    }

    fn describe_files(&self) -> String {
        if self.files.is_empty() {
            "no registries.conf".into()
        } else {
            self.files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    }

    /// The fully qualified references a reference as written may mean, in the order to
    /// try them: itself if qualified; else its alias; else on each search registry; else
    /// on Docker Hub.
    pub fn candidates(&self, written: &str) -> Result<Vec<Reference>, RegistryError> {
        let p = Parsed::parse(written)?;
        if let Some(r) = &p.registry {
            return Ok(vec![p.qualify(r)]);
        }
        if let Some(alias) = self.aliases.get(&p.repository) {
            let a = Parsed::parse(alias)?;
            let base = a.qualify(a.registry.as_deref().unwrap_or(DOCKER_HUB));
            return Ok(vec![Reference {
                tag: p.tag.clone(),
                digest: p.digest.clone(),
                ..base
            }]);
        }
        if self.search.is_empty() {
            return Ok(vec![p.qualify(DOCKER_HUB)]);
        }
        Ok(self.search.iter().map(|r| p.qualify(r)).collect())
    }

    /// The entry whose prefix matches `r` best (the longest).
    pub fn entry_for(&self, r: &Reference) -> Option<&RegistryEntry> {
        let name = r.name();
        self.registries
            .iter()
            .filter_map(|e| {
                let prefix = e.prefix.as_ref().or(e.location.as_ref())?;
                matches_prefix(prefix, &r.registry, &name).then_some((prefix.len(), e))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, e)| e)
    }

    /// Where to fetch `r` from, in order: its mirrors that apply, then its location.
    /// A blocked registry is an error naming the file.
    pub fn endpoints(&self, r: &Reference) -> Result<Vec<Endpoint>, RegistryError> {
        let Some(entry) = self.entry_for(r) else {
            return Ok(vec![Endpoint {
                reference: r.clone(),
                insecure: is_loopback(&r.registry),
                mirror: false,
            }]);
        };
        if entry.blocked {
            return Err(RegistryError::Blocked {
                reference: r.to_string(),
                files: self.describe_files(),
            });
        }
        let prefix = entry
            .prefix
            .as_ref()
            .or(entry.location.as_ref())
            .expect("checked on load");
        let rewrite = |location: &str| -> Reference {
            let name = r.name();
            let rest = if prefix.starts_with("*.") {
                &name[r.registry.len()..]
            } else {
                &name[prefix.len()..]
            };
            let full = format!("{location}{rest}");
            let (reg, repo) = full.split_once('/').unwrap_or((&full, ""));
            r.with_location(reg, repo)
        };
        let by_digest = r.digest.is_some();
        let mut out = Vec::new();
        for m in &entry.mirror {
            let applies = match m.pull_from_mirror.as_deref() {
                Some("digest-only") => by_digest,
                Some("tag-only") => !by_digest,
                _ => !entry.mirror_by_digest_only || by_digest,
            };
            if applies {
                out.push(Endpoint {
                    reference: rewrite(&m.location),
                    insecure: m
                        .insecure
                        .unwrap_or_else(|| is_loopback(m.location.split('/').next().unwrap_or(""))),
                    mirror: true,
                });
            }
        }
        let location = entry.location.clone().unwrap_or_else(|| prefix.clone());
        let own = if prefix.starts_with("*.") {
            r.clone()
        } else {
            rewrite(&location)
        };
        out.push(Endpoint {
            insecure: entry.insecure.unwrap_or_else(|| is_loopback(&own.registry)),
            reference: own,
            mirror: false,
        });
        Ok(out)
    }
}

/// Whether `prefix` covers the repository `name` (`host/path`) on `host`.
fn matches_prefix(prefix: &str, host: &str, name: &str) -> bool {
    if let Some(suffix) = prefix.strip_prefix("*.") {
        let h = host.split(':').next().unwrap_or(host);
        return h.ends_with(&format!(".{suffix}"));
    }
    name == prefix || (name.starts_with(prefix) && name.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// Loopback registries may speak plain HTTP, as Docker allows them to.
pub fn is_loopback(host_port: &str) -> bool {
    let host = if let Some(rest) = host_port.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(text: &str) -> RegistriesConf {
        let mut c = RegistriesConf::default();
        c.merge(Path::new("/test/registries.conf"), text).unwrap();
        c
    }

    #[test]
    fn short_names_use_aliases_then_search_registries_then_docker_hub() {
        let c = conf(
            r#"
unqualified-search-registries = ["127.0.0.1:5000", "quay.example"]
[aliases]
"py" = "127.0.0.1:6000/lib/python"
"#,
        );
        let names = |s: &str| {
            c.candidates(s)
                .unwrap()
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names("py:3.13"), ["127.0.0.1:6000/lib/python:3.13"]);
        assert_eq!(
            names("busybox"),
            [
                "127.0.0.1:5000/busybox:latest",
                "quay.example/busybox:latest"
            ]
        );
        assert_eq!(names("registry.example/x/y:1"), ["registry.example/x/y:1"]);
        let empty = RegistriesConf::default();
        assert_eq!(
            empty.candidates("busybox").unwrap()[0].to_string(),
            "docker.io/library/busybox:latest"
        );
    }

    #[test]
    fn mirrors_come_first_and_prefixes_rewrite() {
        let c = conf(
            r#"
[[registry]]
prefix = "docker.io"
location = "docker.io"
[[registry.mirror]]
location = "127.0.0.1:5001/hub"
[[registry.mirror]]
location = "mirror.example/hub"
pull-from-mirror = "digest-only"

[[registry]]
prefix = "example.com/team"
location = "internal.example:8443/mirrored/team"
insecure = true

[[registry]]
prefix = "example.com/team/secret"
blocked = true

[[registry]]
prefix = "*.corp.example"
insecure = true
"#,
        );
        let hub = Reference::parse_qualified("docker.io/library/busybox:1").unwrap();
        let eps = c.endpoints(&hub).unwrap();
        let shown: Vec<_> = eps
            .iter()
            .map(|e| (e.reference.to_string(), e.insecure, e.mirror))
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "127.0.0.1:5001/hub/library/busybox:1".to_owned(),
                    true,
                    true
                ),
                ("docker.io/library/busybox:1".to_owned(), false, false)
            ],
            "a digest-only mirror is skipped for a tag"
        );
        let by_digest = Reference::parse_qualified(&format!(
            "docker.io/library/busybox@sha256:{}",
            "0".repeat(64)
        ))
        .unwrap();
        assert_eq!(c.endpoints(&by_digest).unwrap().len(), 3);

        let team = Reference::parse_qualified("example.com/team/app:2").unwrap();
        let eps = c.endpoints(&team).unwrap();
        assert_eq!(
            eps[0].reference.to_string(),
            "internal.example:8443/mirrored/team/app:2"
        );
        assert!(eps[0].insecure);
        // Not a prefix on a component boundary.
        let other = Reference::parse_qualified("example.com/teamwork/app").unwrap();
        assert_eq!(c.endpoints(&other).unwrap()[0].reference, other);
        let secret = Reference::parse_qualified("example.com/team/secret/x").unwrap();
        let e = c.endpoints(&secret).unwrap_err().to_string();
        assert!(
            e.contains("blocked") && e.contains("/test/registries.conf"),
            "{e}"
        );
        let wild = Reference::parse_qualified("r1.corp.example/a/b").unwrap();
        let eps = c.endpoints(&wild).unwrap();
        assert_eq!(eps[0].reference, wild);
        assert!(eps[0].insecure);
    }

    #[test]
    fn bad_files_are_refused_by_name() {
        let mut c = RegistriesConf::default();
        let p = Path::new("/x/registries.conf");
        let e = c
            .merge(p, "[registries.search]\nregistries = ['a']")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("version 1") && e.contains("/x/registries.conf"),
            "{e}"
        );
        let e = c
            .merge(p, "[[registry]]\ninsecure = true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("prefix or a location"), "{e}");
        let e = c
            .merge(p, "[[registry]]\nlocation='a.b'\n[[registry.mirror]]\nlocation='m.n'\npull-from-mirror='some'")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pull-from-mirror"), "{e}");
        let e = c
            .merge(p, "[aliases]\nx = 'short'")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fully qualified"), "{e}");
        assert!(c.merge(p, "this is = = not toml").is_err());
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
        ] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["example.com", "10.0.0.1:5000", "[fe80::1]:5000"] {
            assert!(!is_loopback(h), "{h}");
        }
    }
}
