//! The build context: the directory COPY and ADD read from, `.dockerignore`, source
//! globs, the content digest that keys a copy step's cache entry, and the tar that
//! carries the files into the step's sandbox.
//!
//! Safety rules. A source is a path inside the context: a leading `/` is dropped (as
//! Docker does) and a `..` component is refused outright. Paths are resolved one
//! component at a time without following symlinks; a symlink on the way to a source is
//! refused, and a symlink that is itself copied is copied as a link. So nothing outside
//! the context is ever read, whatever its symlinks point at.
//!
//! Ownership: entries are `0:0` unless `--chown` says otherwise (the host owner of a
//! context file means nothing inside an image). Modes are the files' own unless
//! `--chmod` overrides them. Modification times are kept in the tar but are not part of
//! the digest, so touching a file does not invalidate the cache; changing its bytes,
//! mode, type or name does.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// `.dockerignore`: patterns, last match wins, `!` re-includes.
#[derive(Debug, Clone, Default)]
pub struct Ignore {
    patterns: Vec<(bool, String)>,
}

impl Ignore {
    pub fn parse(text: &str) -> Ignore {
        let mut patterns = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (neg, pat) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            let cleaned: Vec<&str> = pat
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .collect();
            if cleaned.is_empty() {
                continue;
            }
            patterns.push((neg, cleaned.join("/")));
        }
        Ignore { patterns }
    }

    pub fn has_exceptions(&self) -> bool {
        self.patterns.iter().any(|(neg, _)| *neg)
    }

    /// True when `rel` (a `/`-separated path in the context) is excluded: the last
    /// pattern matching it or one of its parent directories decides.
    pub fn excluded(&self, rel: &str) -> bool {
        let mut out = false;
        for (neg, pat) in &self.patterns {
            let mut prefix = String::new();
            let mut hit = false;
            for (i, comp) in rel.split('/').enumerate() {
                if i > 0 {
                    prefix.push('/');
                }
                prefix.push_str(comp);
                if glob_match(pat, &prefix) {
                    hit = true;
                    break;
                }
            }
            if hit {
                out = !neg;
            }
        }
        out
    }
}

/// True when `s` has glob syntax.
pub fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

pub use forkd_glob::glob_match;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File { size: u64 },
    Symlink { target: PathBuf },
}

/// One thing a copy step writes: where it goes (relative to the step's destination)
/// and where it comes from in the context.
#[derive(Debug, Clone)]
pub struct Entry {
    pub dest_rel: String,
    pub src: PathBuf,
    pub kind: EntryKind,
    pub mode: u32,
    pub mtime: u64,
}

/// What a COPY or ADD takes from the context.
#[derive(Debug, Clone)]
pub struct Selection {
    pub entries: Vec<Entry>,
    /// The destination is a directory the entries go into; otherwise it is the path of
    /// the single entry.
    pub dest_is_dir: bool,
}

/// The build context directory.
#[derive(Debug, Clone)]
pub struct Context {
    root: PathBuf,
    ignore: Ignore,
}

fn clean_source(src: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for c in src.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(format!(
                    "source {src:?} leaves the build context ('..' is not allowed)"
                ))
            }
            c => out.push(c.to_string()),
        }
    }
    Ok(out)
}

impl Context {
    /// Opens a context directory, reading its `.dockerignore` if there is one.
    pub fn open(root: &Path) -> Result<Context, String> {
        let meta =
            fs::metadata(root).map_err(|e| format!("build context {}: {e}", root.display()))?;
        if !meta.is_dir() {
            return Err(format!(
                "build context {} is not a directory",
                root.display()
            ));
        }
        let ignore = match fs::read_to_string(root.join(".dockerignore")) {
            Ok(t) => Ignore::parse(&t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ignore::default(),
            Err(e) => {
                return Err(format!(
                    "read {}: {e}",
                    root.join(".dockerignore").display()
                ))
            }
        };
        Ok(Context {
            root: root.to_path_buf(),
            ignore,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn entry(&self, rel: &str, dest_rel: String) -> Result<Entry, String> {
        let src = self.root.join(rel);
        let m = fs::symlink_metadata(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        let kind = if m.file_type().is_symlink() {
            EntryKind::Symlink {
                target: fs::read_link(&src).map_err(|e| format!("{}: {e}", src.display()))?,
            }
        } else if m.is_dir() {
            EntryKind::Dir
        } else if m.is_file() {
            EntryKind::File { size: m.len() }
        } else {
            return Err(format!(
                "{rel} in the build context is neither a file, a directory nor a symlink"
            ));
        };
        Ok(Entry {
            dest_rel,
            src,
            kind,
            mode: m.permissions().mode() & 0o7777,
            mtime: m.mtime().max(0) as u64,
        })
    }

    /// Every path under `rel` (a directory), not excluded, sorted, relative to the
    /// context root.
    fn walk(&self, rel: &str, out: &mut Vec<String>) -> Result<(), String> {
        let dir = if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        };
        let mut names: Vec<String> = fs::read_dir(&dir)
            .map_err(|e| format!("read {}: {e}", dir.display()))?
            .map(|e| {
                e.map_err(|e| format!("read {}: {e}", dir.display()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
            })
            .collect::<Result<_, _>>()?;
        names.sort();
        for name in names {
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let excluded = self.ignore.excluded(&child);
            let m = fs::symlink_metadata(self.root.join(&child))
                .map_err(|e| format!("{child}: {e}"))?;
            if m.is_dir() {
                if excluded && !self.ignore.has_exceptions() {
                    continue;
                }
                let mut inner = Vec::new();
                self.walk(&child, &mut inner)?;
                if !excluded || !inner.is_empty() {
                    out.push(child);
                }
                out.extend(inner);
            } else if !excluded {
                out.push(child);
            }
        }
        Ok(())
    }

    /// Resolves a literal source path, refusing symlinks on the way.
    fn resolve(&self, src: &str, comps: &[String]) -> Result<String, String> {
        let mut cur = self.root.clone();
        for (i, c) in comps.iter().enumerate() {
            cur.push(c);
            let m = fs::symlink_metadata(&cur).map_err(|_| {
                format!("source {src:?}: no such file or directory in the build context")
            })?;
            if m.file_type().is_symlink() && i + 1 < comps.len() {
                return Err(format!(
                    "source {src:?}: {} is a symlink, and symlinks in the build context are not followed",
                    comps[..=i].join("/")
                ));
            }
        }
        let rel = comps.join("/");
        if !rel.is_empty() && self.ignore.excluded(&rel) {
            return Err(format!("source {src:?} is excluded by .dockerignore"));
        }
        Ok(rel)
    }

    /// Adds `rel` (a file, link, or a directory's contents) to `out`, placed under
    /// `base` in the destination.
    fn add_tree(&self, rel: &str, base: &str, out: &mut Vec<Entry>) -> Result<(), String> {
        let top = self.entry(rel, base.to_string())?;
        if top.kind != EntryKind::Dir {
            out.push(top);
            return Ok(());
        }
        let mut all = Vec::new();
        self.walk(rel, &mut all)?;
        for p in all {
            let tail = if rel.is_empty() {
                p.as_str()
            } else {
                &p[rel.len() + 1..]
            };
            let dest = if base.is_empty() {
                tail.to_string()
            } else {
                format!("{base}/{tail}")
            };
            out.push(self.entry(&p, dest)?);
        }
        Ok(())
    }

    /// What `COPY sources... dest` takes, following Docker's rules: a directory source
    /// copies its contents; several sources, a wildcard, a directory, or a destination
    /// ending in `/` make the destination a directory.
    pub fn select(&self, sources: &[String], dest: &str) -> Result<Selection, String> {
        let mut entries = Vec::new();
        let mut dest_is_dir = dest.ends_with('/') || sources.len() > 1;
        for src in sources {
            if src.contains("://") {
                return Err(format!(
                    "source {src:?} is a URL: build steps have no network"
                ));
            }
            let comps = clean_source(src)?;
            if has_glob(src) {
                dest_is_dir = true;
                let pattern = comps.join("/");
                let mut all = Vec::new();
                self.walk("", &mut all)?;
                let mut matched: Vec<String> = Vec::new();
                for p in all {
                    // Under a directory already matched: that directory brings it.
                    if matched.iter().any(|m| p.starts_with(&format!("{m}/"))) {
                        continue;
                    }
                    if glob_match(&pattern, &p) {
                        matched.push(p);
                    }
                }
                if matched.is_empty() {
                    return Err(format!(
                        "source {src:?}: no file in the build context matches"
                    ));
                }
                for m in matched {
                    let name = m.rsplit('/').next().unwrap_or(&m).to_string();
                    let is_dir = fs::symlink_metadata(self.root.join(&m))
                        .map(|x| x.is_dir())
                        .unwrap_or(false);
                    self.add_tree(&m, if is_dir { "" } else { &name }, &mut entries)?;
                }
                continue;
            }
            let rel = self.resolve(src, &comps)?;
            let is_dir = fs::symlink_metadata(self.root.join(&rel))
                .map(|m| m.is_dir())
                .unwrap_or(false);
            if is_dir {
                dest_is_dir = true;
                self.add_tree(&rel, "", &mut entries)?;
            } else {
                let name = comps.last().cloned().unwrap_or_default();
                self.add_tree(&rel, &name, &mut entries)?;
            }
        }
        if !dest_is_dir && entries.len() != 1 {
            dest_is_dir = true;
        }
        // Later sources win over earlier ones at the same destination, as when copied
        // one after another.
        let mut seen = std::collections::HashSet::new();
        let mut deduped: Vec<Entry> = entries
            .into_iter()
            .rev()
            .filter(|e| seen.insert(e.dest_rel.clone()))
            .collect();
        deduped.reverse();
        deduped.sort_by(|a, b| a.dest_rel.cmp(&b.dest_rel));
        Ok(Selection {
            entries: deduped,
            dest_is_dir,
        })
    }
}

/// Parses `--chmod` (octal).
pub fn parse_chmod(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(format!("--chmod={s} is not an octal mode")),
    }
}

fn lookup(db: &str, name: &str) -> Option<(u32, u32)> {
    db.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() >= 3 && f[0] == name {
            let id = f[2].parse().ok()?;
            let gid = f.get(3).and_then(|g| g.parse().ok()).unwrap_or(id);
            Some((id, gid))
        } else {
            None
        }
    })
}

/// Resolves `--chown=USER[:GROUP]` (names or numbers) against the image's
/// `/etc/passwd` and `/etc/group`. A user without a group gets the same number as gid.
pub fn resolve_owner(spec: &str, passwd: &str, group: &str) -> Result<(u32, u32), String> {
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let uid = match u.parse::<u32>() {
        Ok(n) => n,
        Err(_) => lookup(passwd, u)
            .map(|(id, _)| id)
            .ok_or_else(|| format!("--chown: no user {u:?} in the image's /etc/passwd"))?,
    };
    let gid = match g {
        None => uid,
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => lookup(group, g)
                .map(|(id, _)| id)
                .ok_or_else(|| format!("--chown: no group {g:?} in the image's /etc/group"))?,
        },
    };
    Ok((uid, gid))
}

fn hash_file(path: &Path) -> Result<String, String> {
    let mut f = fs::File::open(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("read {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Selection {
    /// SHA-256 over every entry's destination, type, mode, and content (or link
    /// target): what the copied files are, not when they were touched.
    pub fn digest(&self) -> Result<String, String> {
        let mut h = Sha256::new();
        h.update(if self.dest_is_dir { b"dir\0" } else { b"one\0" });
        for e in &self.entries {
            h.update(e.dest_rel.as_bytes());
            h.update([0]);
            h.update(format!("{:o}\0", e.mode).as_bytes());
            match &e.kind {
                EntryKind::Dir => h.update(b"d\0"),
                EntryKind::File { size } => {
                    h.update(format!("f{size}\0{}\0", hash_file(&e.src)?).as_bytes())
                }
                EntryKind::Symlink { target } => {
                    h.update(b"l");
                    h.update(target.as_os_str().as_encoded_bytes());
                    h.update([0]);
                }
            }
        }
        Ok(hex(&h.finalize()))
    }

    /// A tar of the entries, owned `owner`, with modes from `chmod` when given.
    pub fn tar(&self, owner: (u32, u32), chmod: Option<u32>) -> Result<Vec<u8>, String> {
        let mut b = tar::Builder::new(Vec::new());
        for e in &self.entries {
            let mut hdr = tar::Header::new_gnu();
            hdr.set_uid(owner.0 as u64);
            hdr.set_gid(owner.1 as u64);
            hdr.set_mtime(e.mtime);
            hdr.set_mode(chmod.unwrap_or(e.mode));
            let err = |x: std::io::Error| format!("pack {}: {x}", e.src.display());
            match &e.kind {
                EntryKind::Dir => {
                    hdr.set_entry_type(tar::EntryType::Directory);
                    hdr.set_size(0);
                    b.append_data(&mut hdr, &e.dest_rel, std::io::empty())
                        .map_err(err)?;
                }
                EntryKind::File { .. } => {
                    let f = fs::File::open(&e.src).map_err(err)?;
                    let len = f.metadata().map_err(err)?.len();
                    hdr.set_entry_type(tar::EntryType::Regular);
                    hdr.set_size(len);
                    b.append_data(&mut hdr, &e.dest_rel, f.take(len))
                        .map_err(err)?;
                }
                EntryKind::Symlink { target } => {
                    hdr.set_entry_type(tar::EntryType::Symlink);
                    hdr.set_size(0);
                    hdr.set_mode(0o777);
                    b.append_link(&mut hdr, &e.dest_rel, target).map_err(err)?;
                }
            }
        }
        b.into_inner().map_err(|e| format!("pack: {e}"))
    }
}

/// What an ADD source is, from its first bytes: `Some("tar" | "gzip" | "zstd" | "xz" |
/// "bzip2")` for an archive, `None` for a plain file.
pub fn archive_kind(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(&[0x1f, 0x8b]) {
        Some("gzip")
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some("zstd")
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Some("xz")
    } else if head.starts_with(b"BZh") {
        Some("bzip2")
    } else if head.len() >= 262 && &head[257..262] == b"ustar" {
        Some("tar")
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
