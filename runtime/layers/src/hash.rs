//! Tree hash: a SHA-256 over a canonical description of a directory tree, so
//! that two trees with the same hash are the same filesystem state. Layer
//! ids are tree hashes.
//!
//! # Format `forkd-tree-v1`
//!
//! The walk never follows symlinks (the root itself may be given through
//! one). Every entry, including the root directory (whose path is empty), is
//! described by one record; records are ordered by their path as raw bytes
//! (plain byte-wise comparison of the full relative path). All integers are
//! little-endian; `bytes(x)` is `u32 length` followed by the bytes of `x`.
//!
//! ```text
//! stream  = "forkd-tree-v1\0" record*
//! record  = bytes(path)            relative, '/'-separated, no leading '/'
//!           u8   type              'd' dir, 'f' regular, 'l' symlink,
//!                                  'c' char device, 'b' block device,
//!                                  'p' fifo, 's' socket
//!           u32  mode & 0o7777     permission, setuid/setgid/sticky bits
//!           u32  uid
//!           u32  gid
//!           payload
//!           u32  xattr count, then per xattr (sorted by name bytes):
//!                bytes(name) bytes(value)
//! payload = 'f': u64 size, [u8; 32] SHA-256 of the content
//!           'l': bytes(target)
//!           'c','b': u32 major, u32 minor
//!           'd','p','s': nothing
//! hash    = SHA-256(stream)
//! ```
//!
//! Sockets are left out (they are not content and cannot travel in an archive); the
//! `'s'` type is kept in the grammar for completeness but never written.
//!
//! Only the extended attributes that change what overlayfs or the kernel
//! does with the tree are included: `trusted.overlay.opaque`,
//! `trusted.overlay.redirect`, `security.capability`. Timestamps, inode
//! numbers and link counts are not: hard links hash as independent regular
//! files with the same content. A new format gets a new header string.
//!
//! File contents are read in 256 KiB blocks by a small pool of scoped
//! threads; hard-linked inodes are read once.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use crate::error::{io_at, LayerError};
use crate::fsx::{self, XattrOf};
use crate::id::TreeHash;

/// The header that starts every hashed stream.
pub const TREE_FORMAT: &str = "forkd-tree-v1";

const READ_BUF: usize = 256 * 1024;
/// Upper bound on hashing threads (the walk itself is single-threaded).
const MAX_THREADS: usize = 4;
/// Below this many files, threads cost more than they save.
const PARALLEL_MIN_FILES: usize = 64;

/// Counts gathered while hashing, stored with a layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TreeStats {
    /// Entries below the root (all types).
    pub entries: u64,
    /// Bytes of regular-file content, each inode counted once.
    pub bytes: u64,
}

#[derive(Debug)]
enum Payload {
    Dir,
    File { size: u64, digest: [u8; 32] },
    Symlink(Vec<u8>),
    Device { block: bool, major: u32, minor: u32 },
    Fifo,
    Socket,
}

#[derive(Debug)]
struct Node {
    path: Vec<u8>,
    mode: u32,
    uid: u32,
    gid: u32,
    payload: Payload,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    dev: u64,
    ino: u64,
    nlink: u64,
}

/// Computes the `forkd-tree-v1` hash of the tree rooted at `dir`.
pub fn tree_hash(dir: &Path) -> Result<TreeHash, LayerError> {
    hash_tree(dir).map(|(h, _)| h)
}

pub(crate) fn hash_tree(root: &Path) -> Result<(TreeHash, TreeStats), LayerError> {
    let meta = fs::metadata(root).map_err(io_at("reading metadata of", root))?;
    if !meta.is_dir() {
        return Err(LayerError::io(
            "hashing",
            root,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a directory"),
        ));
    }
    let mut nodes = Vec::new();
    nodes.push(node_for(root, Vec::new(), &meta)?);
    walk(root, &mut nodes)?;
    hash_contents(root, &mut nodes)?;
    nodes.sort_unstable_by(|a, b| a.path.cmp(&b.path));

    let mut stats = TreeStats::default();
    let mut seen = std::collections::HashSet::new();
    let mut h = Sha256::new();
    h.update(TREE_FORMAT.as_bytes());
    h.update([0u8]);
    for n in &nodes {
        if !n.path.is_empty() {
            stats.entries += 1;
        }
        if let Payload::File { size, .. } = n.payload {
            if n.nlink <= 1 || seen.insert((n.dev, n.ino)) {
                stats.bytes += size;
            }
        }
        write_record(&mut h, n);
    }
    Ok((TreeHash(h.finalize().into()), stats))
}

fn put_bytes(h: &mut Sha256, b: &[u8]) {
    let len = u32::try_from(b.len()).expect("path, link or xattr longer than 4 GiB");
    h.update(len.to_le_bytes());
    h.update(b);
}

fn write_record(h: &mut Sha256, n: &Node) {
    put_bytes(h, &n.path);
    let kind = match n.payload {
        Payload::Dir => b'd',
        Payload::File { .. } => b'f',
        Payload::Symlink(_) => b'l',
        Payload::Device { block: false, .. } => b'c',
        Payload::Device { block: true, .. } => b'b',
        Payload::Fifo => b'p',
        Payload::Socket => b's',
    };
    h.update([kind]);
    h.update(n.mode.to_le_bytes());
    h.update(n.uid.to_le_bytes());
    h.update(n.gid.to_le_bytes());
    match &n.payload {
        Payload::File { size, digest } => {
            h.update(size.to_le_bytes());
            h.update(digest);
        }
        Payload::Symlink(target) => put_bytes(h, target),
        Payload::Device { major, minor, .. } => {
            h.update(major.to_le_bytes());
            h.update(minor.to_le_bytes());
        }
        Payload::Dir | Payload::Fifo | Payload::Socket => {}
    }
    h.update((n.xattrs.len() as u32).to_le_bytes());
    for (name, value) in &n.xattrs {
        put_bytes(h, name);
        put_bytes(h, value);
    }
}

fn abs_path(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(fsx::os(rel))
    }
}

fn node_for(root: &Path, rel: Vec<u8>, meta: &fs::Metadata) -> Result<Node, LayerError> {
    let path = abs_path(root, &rel);
    let ft = meta.file_type();
    use std::os::unix::fs::FileTypeExt;
    let payload = if ft.is_dir() {
        Payload::Dir
    } else if ft.is_file() {
        Payload::File {
            size: meta.size(),
            digest: [0; 32],
        }
    } else if ft.is_symlink() {
        let t = fs::read_link(&path).map_err(io_at("reading symlink", &path))?;
        Payload::Symlink(t.as_os_str().as_bytes().to_vec())
    } else if ft.is_char_device() || ft.is_block_device() {
        let rdev = meta.rdev();
        Payload::Device {
            block: ft.is_block_device(),
            major: rustix::fs::major(rdev),
            minor: rustix::fs::minor(rdev),
        }
    } else if ft.is_fifo() {
        Payload::Fifo
    } else {
        Payload::Socket
    };
    let xattrs = fsx::read_xattrs(XattrOf::Path(&path), fsx::is_significant_xattr)
        .map_err(io_at("reading extended attributes of", &path))?;
    Ok(Node {
        path: rel,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        payload,
        xattrs,
        dev: meta.dev(),
        ino: meta.ino(),
        nlink: meta.nlink(),
    })
}

fn walk(root: &Path, nodes: &mut Vec<Node>) -> Result<(), LayerError> {
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = stack.pop() {
        let dir = abs_path(root, &rel);
        let rd = fs::read_dir(&dir).map_err(io_at("reading directory", &dir))?;
        for ent in rd {
            let ent = ent.map_err(io_at("reading directory", &dir))?;
            let mut child = rel.clone();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(ent.file_name().as_bytes());
            // DirEntry::metadata does not follow symlinks.
            let meta = ent
                .metadata()
                .map_err(io_at("reading metadata of", &ent.path()))?;
            let is_dir = meta.is_dir();
            // Sockets are not content: a process binds its own, and no archive can
            // carry one. Leaving them out keeps a tree's hash the same after export.
            if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
                continue;
            }
            let node = node_for(root, child, &meta)?;
            if is_dir {
                stack.push(node.path.clone());
            }
            nodes.push(node);
        }
    }
    Ok(())
}

/// Fills in the content digest of every regular file.
fn hash_contents(root: &Path, nodes: &mut [Node]) -> Result<(), LayerError> {
    // One job per distinct inode; hard links share the first one's digest.
    let mut first_of: HashMap<(u64, u64), usize> = HashMap::new();
    let mut jobs: Vec<usize> = Vec::new();
    let mut aliases: Vec<(usize, usize)> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        if !matches!(n.payload, Payload::File { .. }) {
            continue;
        }
        if n.nlink > 1 {
            if let Some(&first) = first_of.get(&(n.dev, n.ino)) {
                aliases.push((i, first));
                continue;
            }
            first_of.insert((n.dev, n.ino), i);
        }
        jobs.push(i);
    }

    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_THREADS);
    let results: Vec<(usize, [u8; 32])> = if threads == 1 || jobs.len() < PARALLEL_MIN_FILES {
        let mut buf = vec![0u8; READ_BUF];
        let mut out = Vec::with_capacity(jobs.len());
        for &i in &jobs {
            out.push((i, hash_file(root, &nodes[i], &mut buf)?));
        }
        out
    } else {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let shared: &[Node] = nodes;
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| -> Result<Vec<(usize, [u8; 32])>, LayerError> {
                        let mut buf = vec![0u8; READ_BUF];
                        let mut out = Vec::new();
                        loop {
                            if failed.load(Ordering::Relaxed) {
                                return Ok(out);
                            }
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&i) = jobs.get(k) else {
                                return Ok(out);
                            };
                            match hash_file(root, &shared[i], &mut buf) {
                                Ok(d) => out.push((i, d)),
                                Err(e) => {
                                    failed.store(true, Ordering::Relaxed);
                                    return Err(e);
                                }
                            }
                        }
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(jobs.len());
            let mut first_err = None;
            for w in workers {
                match w.join().expect("hash worker panicked") {
                    Ok(v) => all.extend(v),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(all),
            }
        })?
    };

    for (i, d) in results {
        if let Payload::File { digest, .. } = &mut nodes[i].payload {
            *digest = d;
        }
    }
    for (i, first) in aliases {
        let d = match nodes[first].payload {
            Payload::File { digest, .. } => digest,
            _ => unreachable!("alias of a non-file"),
        };
        if let Payload::File { digest, .. } = &mut nodes[i].payload {
            *digest = d;
        }
    }
    Ok(())
}

fn hash_file(root: &Path, node: &Node, buf: &mut [u8]) -> Result<[u8; 32], LayerError> {
    let path = abs_path(root, &node.path);
    let Payload::File { size, .. } = node.payload else {
        unreachable!("hash_file on a non-file");
    };
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .map_err(io_at("opening", &path))?;
    let meta = f.metadata().map_err(io_at("reading metadata of", &path))?;
    if meta.ino() != node.ino || meta.dev() != node.dev {
        return Err(LayerError::Changed { path });
    }
    let mut h = Sha256::new();
    let mut total = 0u64;
    loop {
        let n = match f.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(LayerError::io("reading", &path, e)),
        };
        h.update(&buf[..n]);
        total += n as u64;
    }
    if total != size {
        return Err(LayerError::Changed { path });
    }
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn build(dir: &Path, order_reversed: bool) {
        let mut steps: Vec<Box<dyn Fn()>> = vec![
            Box::new(|| fs::create_dir_all(dir.join("a/b")).unwrap()),
            Box::new(|| fs::write(dir.join("top.txt"), b"hello").unwrap()),
            Box::new(|| symlink("../top.txt", dir.join("a/link")).unwrap()),
            Box::new(|| fs::write(dir.join("a-b"), b"sorting").unwrap()),
        ];
        if order_reversed {
            steps.swap(1, 3);
        }
        for s in &steps {
            s();
        }
        fs::write(dir.join("a/b/deep"), vec![7u8; 300_000]).unwrap();
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn stable_across_creation_order_and_mtime() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        build(a.path(), false);
        std::thread::sleep(std::time::Duration::from_millis(20));
        build(b.path(), true);
        let (ha, sa) = hash_tree(a.path()).unwrap();
        let (hb, sb) = hash_tree(b.path()).unwrap();
        assert_eq!(ha, hb);
        assert_eq!(sa, sb);
        assert_eq!(sa.entries, 6);
        assert_eq!(sa.bytes, 5 + 7 + 300_000);
    }

    #[test]
    fn changes_with_content_mode_and_symlink_target() {
        let d = tempfile::tempdir().unwrap();
        build(d.path(), false);
        let base = tree_hash(d.path()).unwrap();

        fs::write(d.path().join("top.txt"), b"hellO").unwrap();
        let content = tree_hash(d.path()).unwrap();
        assert_ne!(base, content);
        fs::write(d.path().join("top.txt"), b"hello").unwrap();
        assert_eq!(tree_hash(d.path()).unwrap(), base);

        fs::set_permissions(d.path().join("top.txt"), fs::Permissions::from_mode(0o4755)).unwrap();
        assert_ne!(tree_hash(d.path()).unwrap(), base);
        fs::set_permissions(d.path().join("top.txt"), fs::Permissions::from_mode(0o644)).unwrap();

        let link = d.path().join("a/link");
        fs::remove_file(&link).unwrap();
        symlink("../top.txT", &link).unwrap();
        assert_ne!(tree_hash(d.path()).unwrap(), base);
    }

    #[test]
    fn many_files_hash_in_parallel_deterministically() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..300 {
            fs::write(d.path().join(format!("f{i:03}")), format!("{i}").repeat(i)).unwrap();
        }
        let h1 = tree_hash(d.path()).unwrap();
        let h2 = tree_hash(d.path()).unwrap();
        assert_eq!(h1, h2);
    }

    #[test]
    fn rejects_a_file_root() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file");
        fs::write(&f, b"x").unwrap();
        assert!(tree_hash(&f).is_err());
    }
}
