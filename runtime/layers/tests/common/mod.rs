//! Shared helpers for the integration tests: root detection, a throwaway
//! state root, and a tar writer that can produce headers the `tar` crate's
//! safe setters would refuse.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use forkd_layers::{ImageStore, LayerStore, Progress};
use tar::{EntryType, Header};

/// True when running as root. Otherwise prints `SKIP <name>: needs root`,
/// or panics when `CI=true` so nothing is skipped silently there.
pub fn root_or_skip(name: &str) -> bool {
    forkd_testing::require_root(name)
}

pub struct State {
    pub dir: tempfile::TempDir,
    pub layers: LayerStore,
    pub images: ImageStore,
}

impl State {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let layers = LayerStore::open(&dir.path().join("layers")).unwrap();
        let images = ImageStore::open(&dir.path().join("images")).unwrap();
        State {
            dir,
            layers,
            images,
        }
    }

    pub fn layers_root(&self) -> PathBuf {
        self.dir.path().join("layers")
    }

    /// Names in the layer store root other than `tmp`.
    pub fn layer_dirs(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.layers_root())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "tmp")
            .collect();
        v.sort();
        v
    }

    /// Asserts the store holds no layer and an empty staging area.
    pub fn assert_empty(&self) {
        assert!(
            self.layer_dirs().is_empty(),
            "layers left: {:?}",
            self.layer_dirs()
        );
        let tmp: Vec<_> = fs::read_dir(self.layers_root().join("tmp"))
            .unwrap()
            .collect();
        assert!(tmp.is_empty(), "staging left: {tmp:?}");
        assert!(self.images.list().unwrap().is_empty());
    }
}

pub fn quiet() -> impl FnMut(Progress) {
    |_| {}
}

/// A name no other test or run uses, for "this must not appear" checks.
pub fn marker(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "forkd-evil-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Walks `dir` and reports whether any entry's name contains `needle`.
pub fn tree_contains_name(dir: &Path, needle: &str) -> bool {
    let Ok(rd) = fs::read_dir(dir) else {
        return false;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().contains(needle) {
            return true;
        }
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false)
            && tree_contains_name(&e.path(), needle)
        {
            return true;
        }
    }
    false
}

/// Builds tar archives entry by entry, writing path and link bytes verbatim.
pub struct TarWriter {
    b: tar::Builder<Vec<u8>>,
}

pub fn header(kind: EntryType, path: &[u8], size: u64, mode: u32) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    assert!(path.len() < 100, "test paths must fit the old header");
    let name = &mut h.as_old_mut().name;
    name.fill(0);
    name[..path.len()].copy_from_slice(path);
    h.set_cksum();
    h
}

impl Default for TarWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl TarWriter {
    pub fn new() -> Self {
        TarWriter {
            b: tar::Builder::new(Vec::new()),
        }
    }
    pub fn raw(&mut self, h: Header, data: &[u8]) -> &mut Self {
        self.b.append(&h, data).unwrap();
        self
    }
    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.raw(header(EntryType::Directory, path.as_bytes(), 0, mode), &[])
    }
    pub fn file(&mut self, path: &str, data: &[u8], mode: u32) -> &mut Self {
        self.raw(
            header(EntryType::Regular, path.as_bytes(), data.len() as u64, mode),
            data,
        )
    }
    pub fn file_owned(
        &mut self,
        path: &str,
        data: &[u8],
        mode: u32,
        uid: u64,
        gid: u64,
    ) -> &mut Self {
        let mut h = header(EntryType::Regular, path.as_bytes(), data.len() as u64, mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_cksum();
        self.raw(h, data)
    }
    fn link(&mut self, kind: EntryType, path: &str, target: &str) -> &mut Self {
        let mut h = header(kind, path.as_bytes(), 0, 0o777);
        h.set_link_name_literal(target.as_bytes()).unwrap();
        h.set_cksum();
        self.raw(h, &[])
    }
    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(EntryType::Symlink, path, target)
    }
    pub fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(EntryType::Link, path, target)
    }
    pub fn device(&mut self, kind: EntryType, path: &str, major: u32, minor: u32) -> &mut Self {
        let mut h = header(kind, path.as_bytes(), 0, 0o666);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        h.set_cksum();
        self.raw(h, &[])
    }
    pub fn fifo(&mut self, path: &str) -> &mut Self {
        self.raw(header(EntryType::Fifo, path.as_bytes(), 0, 0o600), &[])
    }
    /// PAX `SCHILY.xattr.*` records for the next entry.
    pub fn xattrs(&mut self, xattrs: &[(&str, &[u8])]) -> &mut Self {
        let records: Vec<(String, &[u8])> = xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
            .collect();
        self.b
            .append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), *v)))
            .unwrap();
        self
    }
    /// A file with PAX `SCHILY.xattr.*` records.
    pub fn file_with_xattrs(
        &mut self,
        path: &str,
        data: &[u8],
        mode: u32,
        xattrs: &[(&str, &[u8])],
    ) -> &mut Self {
        let records: Vec<(String, &[u8])> = xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
            .collect();
        self.b
            .append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), *v)))
            .unwrap();
        self.file(path, data, mode)
    }
    pub fn finish(self) -> Vec<u8> {
        self.b.into_inner().unwrap()
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 3).unwrap()
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The chain of an error, one cause per line, for assertions and messages.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

pub fn lget(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::lgetxattr(path, name, &mut buf) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

pub fn lset(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()).unwrap();
}
