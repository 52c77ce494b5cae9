//! What a state changed: the entries of a checkpoint's own layer (a tar in overlay form),
//! restricted to the task's workdir and filtered by the task's ignore globs.

use sha2::{Digest, Sha256};
use std::io::Read;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Relative to the workdir.
    pub path: String,
    /// `file:<sha256>`, `link:<target>`, `dir`, `deleted`, `other`.
    pub what: String,
}

/// Changes under `workdir` in a layer tar, ignoring paths that match `ignore`.
pub fn changes(tar_bytes: &[u8], workdir: &str, ignore: &[String]) -> anyhow::Result<Vec<Change>> {
    let prefix = format!("{}/", workdir.trim_matches('/'));
    let mut out = Vec::new();
    let mut a = tar::Archive::new(tar_bytes);
    for e in a.entries()? {
        let mut e = e?;
        let kind = e.header().entry_type();
        if kind == tar::EntryType::XHeader || kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let full = e
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        let Some(rel) = full.strip_prefix(&prefix) else {
            continue;
        };
        if rel.is_empty() || ignored(rel, ignore) {
            continue;
        }
        let what = match kind {
            tar::EntryType::Regular => {
                let mut h = Sha256::new();
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = e.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                }
                format!(
                    "file:{}",
                    h.finalize()
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                )
            }
            tar::EntryType::Symlink => format!(
                "link:{}",
                e.link_name()?
                    .map(|l| l.to_string_lossy().to_string())
                    .unwrap_or_default()
            ),
            tar::EntryType::Directory => "dir".into(),
            tar::EntryType::Char
                if e.header().device_major()? == Some(0)
                    && e.header().device_minor()? == Some(0) =>
            {
                "deleted".into()
            }
            _ => "other".into(),
        };
        out.push(Change {
            path: rel.to_string(),
            what,
        });
    }
    // A directory entry alone (copied up for a change below it) is not a change itself.
    let files: Vec<String> = out
        .iter()
        .filter(|c| c.what != "dir")
        .map(|c| c.path.clone())
        .collect();
    out.retain(|c| {
        c.what != "dir" || !files.iter().any(|f| f.starts_with(&format!("{}/", c.path)))
    });
    out.retain(|c| c.what != "dir");
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// A key equal for identical sets of changes.
pub fn content_key(changes: &[Change]) -> String {
    let mut h = Sha256::new();
    for c in changes {
        h.update(c.path.as_bytes());
        h.update([0]);
        h.update(c.what.as_bytes());
        h.update([b'\n']);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn ignored(path: &str, globs: &[String]) -> bool {
    globs
        .iter()
        .any(|g| glob(g, path) || glob(g, path.rsplit('/').next().unwrap_or(path)))
}

/// Glob match: `*` within a path segment, `**` across segments, `?` one character.
pub fn glob(pat: &str, text: &str) -> bool {
    fn rec(p: &[u8], t: &[u8]) -> bool {
        if p.is_empty() {
            return t.is_empty();
        }
        if p.starts_with(b"**") {
            let rest = p[2..].strip_prefix(b"/").unwrap_or(&p[2..]);
            return (0..=t.len()).any(|i| rec(rest, &t[i..]));
        }
        match p[0] {
            b'*' => (0..=t.len())
                .take_while(|&i| i == 0 || t[i - 1] != b'/')
                .any(|i| rec(&p[1..], &t[i..])),
            b'?' => !t.is_empty() && t[0] != b'/' && rec(&p[1..], &t[1..]),
            c => !t.is_empty() && t[0] == c && rec(&p[1..], &t[1..]),
        }
    }
    rec(pat.as_bytes(), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_gitignore_patterns() {
        assert!(glob("*.pyc", "a.pyc"));
        assert!(!glob("*.pyc", "d/a.pyc"));
        assert!(ignored("d/a.pyc", &["*.pyc".into()]));
        assert!(glob("**/__pycache__/**", "pkg/__pycache__/x.pyc"));
        assert!(glob(".pytest_cache/**", ".pytest_cache/v/cache/nodeids"));
        assert!(!glob("src/*.py", "src/a/b.py"));
    }

    #[test]
    fn changes_come_from_the_layer_tar() {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, kind: tar::EntryType, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if kind == tar::EntryType::Char {
                h.set_device_major(0).unwrap();
                h.set_device_minor(0).unwrap();
            }
            b.append_data(&mut h, path, data).unwrap();
        };
        add("testbed", tar::EntryType::Directory, b"");
        add("testbed/pkg", tar::EntryType::Directory, b"");
        add("testbed/pkg/a.py", tar::EntryType::Regular, b"x = 1\n");
        add("testbed/pkg/a.pyc", tar::EntryType::Regular, b"junk");
        add("testbed/gone.py", tar::EntryType::Char, b"");
        add("root/.bash_history", tar::EntryType::Regular, b"ls");
        let data = b.into_inner().unwrap();
        let c = changes(&data, "/testbed", &["*.pyc".into()]).unwrap();
        let paths: Vec<(&str, &str)> = c
            .iter()
            .map(|c| (c.path.as_str(), c.what.split(':').next().unwrap()))
            .collect();
        assert_eq!(paths, vec![("gone.py", "deleted"), ("pkg/a.py", "file")]);
        assert_eq!(
            content_key(&c),
            content_key(&changes(&data, "/testbed", &["*.pyc".into()]).unwrap())
        );
    }
}
