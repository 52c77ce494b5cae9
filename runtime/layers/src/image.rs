//! Images: named, ordered stacks of layers plus the run configuration that
//! came with them.
//!
//! # On-disk layout
//!
//! `<root>/<file name>.json`, one record per image, written atomically
//! (temporary file, fsync, rename, fsync of the directory). The file name is
//! the image name with `/` spelled `+`, `:` spelled `@` and `@` spelled `%`; `+` and
//! `%` are not allowed in a name, so the mapping is one-to-one and a name never becomes
//! a path.
//! Temporary files start with `.`, which a name cannot.
//!
//! Record: `{"version": 1, "name": .., "layers": [bottom .. top], "created":
//! unix seconds, "source": "..", "config": {"env": [..], "cmd": [..],
//! "entrypoint": [..], "working_dir": .., "user": ..}}`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::ImageError;
use crate::id::LayerId;

const RECORD_VERSION: u32 = 1;
/// A name and `.json` fit one file name (255 bytes).
const MAX_NAME: usize = 240;

/// The run configuration an image carries (from its OCI or Docker config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `NAME=value` strings.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// LABELs (a Dockerfile's, or an OCI config's).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// EXPOSEd ports, `PORT/PROTO`. Recorded only: sandboxes publish nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
    /// The shell that shell-form commands run under (SHELL); `/bin/sh -c` if empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shell: Vec<String>,
    /// STOPSIGNAL. Recorded only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// VOLUME paths. Recorded only: a sandbox's files all live in its layers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
}

/// A named stack of layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    pub name: String,
    /// Bottom layer first (the order of OCI manifests; overlayfs wants the
    /// reverse in `lowerdir`).
    pub layers: Vec<LayerId>,
    /// When the image was imported, in seconds since the Unix epoch.
    pub created: u64,
    /// Where it came from, e.g. `oci:/path` or `docker-archive:/path.tar`.
    pub source: String,
    #[serde(default)]
    pub config: ImageConfig,
    /// For a pulled image: the digest of what its reference named on the registry (an
    /// index or a manifest), so a pull of the same tag can tell it is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Record {
    version: u32,
    #[serde(flatten)]
    image: Image,
}

/// Checks an image name: 1 to 240 characters of `[A-Za-z0-9._:/@-]`, not
/// starting with `.` or `-`, with no empty, `.` or `..` path component.
pub fn validate_image_name(name: &str) -> Result<(), ImageError> {
    let bad = |reason| {
        Err(ImageError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return bad("must be 1 to 240 characters");
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'/' | b'-' | b'@'))
    {
        return bad("only letters, digits and . _ : / - @ are allowed");
    }
    if name.starts_with('.') || name.starts_with('-') {
        return bad("must not start with '.' or '-'");
    }
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("no empty, '.' or '..' path components");
    }
    Ok(())
}

fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '/' => '+',
            ':' => '@',
            '@' => '%',
            c => c,
        })
        .collect()
}

fn name_from_stem(stem: &str) -> String {
    stem.chars()
        .map(|c| match c {
            '+' => '/',
            '@' => ':',
            '%' => '@',
            c => c,
        })
        .collect()
}

/// A directory of image records.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
}

impl ImageStore {
    /// Opens (creating if needed) the store at `root`, removing temporary
    /// files left by a crash.
    pub fn open(root: &Path) -> Result<Self, ImageError> {
        fs::create_dir_all(root).map_err(|e| io("creating", root, e))?;
        let rd = fs::read_dir(root).map_err(|e| io("reading directory", root, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| io("reading directory", root, e))?;
            if ent.file_name().to_string_lossy().starts_with('.') {
                let p = ent.path();
                fs::remove_file(&p).map_err(|e| io("removing stale", &p, e))?;
            }
        }
        Ok(ImageStore {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.root.join(format!("{}.json", file_stem(name)))
    }

    /// Reads one image.
    pub fn get(&self, name: &str) -> Result<Image, ImageError> {
        validate_image_name(name)?;
        let path = self.record_path(name);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::NotFound(name.to_owned()))
            }
            Err(e) => return Err(io("reading", &path, e)),
        };
        parse_record(&path, &bytes)
    }

    /// True when an image of that name is stored.
    pub fn contains(&self, name: &str) -> bool {
        validate_image_name(name).is_ok() && self.record_path(name).is_file()
    }

    /// All images, ordered by name.
    pub fn list(&self) -> Result<Vec<Image>, ImageError> {
        let rd = fs::read_dir(&self.root).map_err(|e| io("reading directory", &self.root, e))?;
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| io("reading directory", &self.root, e))?;
            let fname = ent.file_name();
            let Some(stem) = fname.to_str().and_then(|f| f.strip_suffix(".json")) else {
                continue;
            };
            if validate_image_name(&name_from_stem(stem)).is_err() {
                continue;
            }
            let path = ent.path();
            let bytes = fs::read(&path).map_err(|e| io("reading", &path, e))?;
            out.push(parse_record(&path, &bytes)?);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Writes (or replaces) an image record atomically.
    pub fn put(&self, image: &Image) -> Result<(), ImageError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        validate_image_name(&image.name)?;
        let path = self.record_path(&image.name);
        let tmp = self.root.join(format!(
            ".{}.{}.{}.tmp",
            file_stem(&image.name),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let record = Record {
            version: RECORD_VERSION,
            image: image.clone(),
        };
        let json = serde_json::to_vec_pretty(&record).expect("image record serializes");
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.write_all(b"\n")?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io("writing", &tmp, e));
        }
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io("renaming into place", &path, e));
        }
        let dir = fs::File::open(&self.root).map_err(|e| io("opening", &self.root, e))?;
        dir.sync_all().map_err(|e| io("syncing", &self.root, e))
    }

    /// Deletes an image record (its layers stay until collected).
    pub fn remove(&self, name: &str) -> Result<(), ImageError> {
        validate_image_name(name)?;
        let path = self.record_path(name);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ImageError::NotFound(name.to_owned()))
            }
            Err(e) => Err(io("removing", &path, e)),
        }
    }
}

fn io(step: &'static str, path: &Path, source: std::io::Error) -> ImageError {
    ImageError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

fn parse_record(path: &Path, bytes: &[u8]) -> Result<Image, ImageError> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let v: Version = serde_json::from_slice(bytes).map_err(|source| ImageError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    if v.version != RECORD_VERSION {
        return Err(ImageError::Version {
            path: path.to_path_buf(),
            version: v.version,
            supported: RECORD_VERSION,
        });
    }
    let r: Record = serde_json::from_slice(bytes).map_err(|source| ImageError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(r.image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in [
            "busybox",
            "library/debian:12",
            "a",
            "x.y_z-1/2:3",
            &"a".repeat(128),
        ] {
            assert!(validate_image_name(good).is_ok(), "{good:?} refused");
        }
        for bad in [
            "",
            ".hidden",
            "-flag",
            "a/../b",
            "../x",
            "a//b",
            "a/",
            "/abs",
            "a/./b",
            "sp ace",
            "pct%",
            "plus+",
            &"a".repeat(241),
        ] {
            assert!(validate_image_name(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(file_stem("library/debian:12"), "library+debian@12");
        assert_eq!(name_from_stem("library+debian@12"), "library/debian:12");
        let pinned = format!("docker.io/library/busybox@sha256:{}", "0".repeat(64));
        assert!(validate_image_name(&pinned).is_ok());
        assert_eq!(name_from_stem(&file_stem(&pinned)), pinned);
        assert!(!file_stem(&pinned).contains(':') && !file_stem(&pinned).contains('/'));
    }

    #[test]
    fn put_get_list_remove() {
        let d = tempfile::tempdir().unwrap();
        let store = ImageStore::open(d.path()).unwrap();
        let id: LayerId = "ab".repeat(32).parse().unwrap();
        let img = Image {
            name: "library/debian:12".into(),
            layers: vec![id],
            created: 5,
            source: "dir:/x".into(),
            config: ImageConfig {
                env: vec!["PATH=/bin".into()],
                cmd: vec!["sh".into()],
                ..Default::default()
            },
            digest: None,
        };
        store.put(&img).unwrap();
        assert!(d.path().join("library+debian@12.json").is_file());
        assert_eq!(store.get("library/debian:12").unwrap(), img);
        let mut second = img.clone();
        second.name = "alpha".into();
        store.put(&second).unwrap();
        let names: Vec<_> = store.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["alpha", "library/debian:12"]);
        store.remove("alpha").unwrap();
        assert!(matches!(store.get("alpha"), Err(ImageError::NotFound(_))));
        assert!(matches!(
            store.remove("alpha"),
            Err(ImageError::NotFound(_))
        ));
        // No temporary files left.
        let leftovers: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn refuses_unknown_record_version() {
        let d = tempfile::tempdir().unwrap();
        let store = ImageStore::open(d.path()).unwrap();
        fs::write(d.path().join("x.json"), br#"{"version": 9, "name": "x"}"#).unwrap();
        assert!(matches!(
            store.get("x"),
            Err(ImageError::Version { version: 9, .. })
        ));
    }
}
