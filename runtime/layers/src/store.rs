//! The content-addressed layer store.
//!
//! # On-disk layout
//!
//! ```text
//! <root>/
//!   tmp/                        staging area, same filesystem as the layers
//!     <kind>-<pid>-<n>/         one per import in progress, flock()ed
//!       tree/                   the tree being built
//!       info.json
//!   <64 hex>/                   one sealed layer, named by its tree hash
//!     tree/                     the layer contents: an overlayfs lowerdir
//!     info.json                 {"version":1,"format":"forkd-tree-v1",
//!                                "id":..,"size_bytes":..,"files":..,"created":..}
//! ```
//!
//! A layer appears by a single `rename` of a complete staging directory, so
//! a layer directory either exists whole or not at all. Before that rename
//! the filesystem is synced (`syncfs`), so a layer that exists after a crash
//! has its content. Removal renames the layer into `tmp/` first for the same
//! reason.
//!
//! Every staging directory holds an exclusive `flock` while its owner works
//! on it. [`LayerStore::open`] removes staging directories whose lock it can
//! take: they were left by a process that died. Sealed layers are never
//! modified; references are tracked by the callers (images, checkpoints).

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{self as rfs, FlockOperation};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::copy::copy_tree;
use crate::error::{errno_at, io_at, LayerError};
use crate::extract::{decompress, extract_tar, TarFlavor};
use crate::fsx;
use crate::hash::{hash_tree, TREE_FORMAT};
use crate::id::{is_lower_hex, LayerId};
use crate::progress::{Counter, Progress};

const TMP: &str = "tmp";
const TREE: &str = "tree";
const INFO: &str = "info.json";
const INFO_VERSION: u32 = 1;
/// Shortest prefix [`LayerStore::resolve_prefix`] accepts.
pub const MIN_PREFIX: usize = 12;

/// What the store knows about one layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub id: LayerId,
    /// Bytes of regular-file content (hard-linked inodes counted once).
    pub size_bytes: u64,
    /// Entries in the tree, of every type, excluding the root.
    pub files: u64,
    /// When the layer was sealed, in seconds since the Unix epoch.
    pub created: u64,
}

#[derive(Serialize, Deserialize)]
struct StoredInfo {
    version: u32,
    format: String,
    #[serde(flatten)]
    info: LayerInfo,
}

/// A directory of sealed, immutable layers.
#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
}

/// A private directory under `<root>/tmp` where a tree is built before it
/// is sealed. Removed on drop unless sealed.
pub(crate) struct Staging {
    dir: PathBuf,
    /// Holds the flock that marks this directory as in use.
    lock: OwnedFd,
    live: bool,
}

impl Staging {
    pub(crate) fn tree(&self) -> PathBuf {
        self.dir.join(TREE)
    }

    /// Removes the staging directory.
    pub(crate) fn discard(mut self) -> std::io::Result<()> {
        self.live = false;
        remove_all(&self.dir)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.live {
            let _ = remove_all(&self.dir);
        }
    }
}

fn remove_all(path: &Path) -> std::io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

pub(crate) use forkd_sys::clock::now_secs;

/// Makes `err` the result of a failed operation whose staging directory must
/// go; keeps both errors if the cleanup fails too.
pub(crate) fn abort(staging: Staging, err: LayerError) -> LayerError {
    let path = staging.dir.clone();
    match staging.discard() {
        Ok(()) => err,
        Err(cleanup) => LayerError::Cleanup {
            path,
            cleanup,
            original: Box::new(err),
        },
    }
}

fn fsync_dir(path: &Path) -> Result<(), LayerError> {
    let fd = fsx::open_dir_path(path).map_err(io_at("opening", path))?;
    rfs::fsync(&fd).map_err(errno_at("syncing", path))
}

impl LayerStore {
    /// Opens (creating if needed) the store at `root` and removes staging
    /// directories left behind by processes that died.
    ///
    /// The root is made private (mode 0700): layers hold setuid binaries
    /// from untrusted images, which host users must not be able to run.
    pub fn open(root: &Path) -> Result<Self, LayerError> {
        let tmp = root.join(TMP);
        fs::create_dir_all(&tmp).map_err(io_at("creating", &tmp))?;
        for dir in [root, tmp.as_path()] {
            let mode = fs::metadata(dir)
                .map_err(io_at("reading metadata of", dir))?
                .mode();
            if mode & 0o077 != 0 {
                fs::set_permissions(dir, fs::Permissions::from_mode(mode & 0o7700))
                    .map_err(io_at("setting mode of", dir))?;
            }
        }
        let store = LayerStore {
            root: root.to_path_buf(),
        };
        store.clean_stale()?;
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The layer's tree: a directory usable as an overlayfs lowerdir.
    pub fn path(&self, id: &LayerId) -> PathBuf {
        self.layer_dir(id).join(TREE)
    }

    fn layer_dir(&self, id: &LayerId) -> PathBuf {
        self.root.join(id.to_hex())
    }

    fn tmp(&self) -> PathBuf {
        self.root.join(TMP)
    }

    pub fn exists(&self, id: &LayerId) -> bool {
        fs::symlink_metadata(self.path(id))
            .map(|m| m.is_dir())
            .unwrap_or(false)
    }

    fn clean_stale(&self) -> Result<(), LayerError> {
        let tmp = self.tmp();
        let rd = fs::read_dir(&tmp).map_err(io_at("reading directory", &tmp))?;
        for ent in rd {
            let ent = ent.map_err(io_at("reading directory", &tmp))?;
            let path = ent.path();
            let is_dir = ent.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if is_dir {
                let Ok(fd) = fsx::open_dir_path(&path) else {
                    continue;
                };
                match rfs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => {}
                    // In use by a live import.
                    Err(Errno::WOULDBLOCK) => continue,
                    Err(e) => return Err(LayerError::io("locking", &path, e.into())),
                }
                remove_all(&path).map_err(io_at("removing stale", &path))?;
            } else {
                fs::remove_file(&path).map_err(io_at("removing stale", &path))?;
            }
        }
        Ok(())
    }

    /// Creates a locked, empty staging directory.
    pub(crate) fn staging(&self, kind: &str) -> Result<Staging, LayerError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = self.tmp();
        for _ in 0..16 {
            let n = SEQ.fetch_add(1, Ordering::Relaxed);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let dir = tmp.join(format!("{kind}-{}-{n}-{nanos:08x}", std::process::id()));
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(LayerError::io("creating", &dir, e)),
            }
            let fd = fsx::open_dir_path(&dir).map_err(io_at("opening", &dir))?;
            // A concurrent `open` may have taken the lock (and removed the
            // directory) between our mkdir and this flock: then try another
            // name.
            if rfs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_err() {
                continue;
            }
            let still_ours = fs::symlink_metadata(&dir)
                .ok()
                .zip(rfs::fstat(&fd).ok())
                .is_some_and(|(m, st)| m.ino() == st.st_ino && m.dev() == st.st_dev);
            if !still_ours {
                continue;
            }
            return Ok(Staging {
                dir,
                lock: fd,
                live: true,
            });
        }
        Err(LayerError::io(
            "creating a staging directory in",
            tmp,
            std::io::Error::other("too many collisions"),
        ))
    }

    fn staging_with_tree(&self, kind: &str) -> Result<Staging, LayerError> {
        let s = self.staging(kind)?;
        let tree = s.tree();
        if let Err(e) = fs::create_dir(&tree) {
            return Err(abort(s, LayerError::io("creating", tree, e)));
        }
        Ok(s)
    }

    /// Hashes the staged tree and moves it into place. On success the
    /// staging directory is gone (sealed, or discarded as a duplicate); on
    /// error it is left for the caller to restore or discard.
    pub(crate) fn seal(
        &self,
        staging: &mut Staging,
        progress: &mut Counter<'_>,
    ) -> Result<LayerId, LayerError> {
        progress.step("hashing");
        let tree = staging.tree();
        let (hash, stats) = hash_tree(&tree)?;
        let id = LayerId::from(hash);
        let dest = self.layer_dir(&id);
        if self.exists(&id) {
            progress.note(format!("layer {} already present", id.short()));
            staging.live = false;
            remove_all(&staging.dir).map_err(io_at("removing", &staging.dir))?;
            return Ok(id);
        }
        let info = StoredInfo {
            version: INFO_VERSION,
            format: TREE_FORMAT.to_owned(),
            info: LayerInfo {
                id,
                size_bytes: stats.bytes,
                files: stats.entries,
                created: now_secs(),
            },
        };
        let info_path = staging.dir.join(INFO);
        let mut f = fs::File::create(&info_path).map_err(io_at("creating", &info_path))?;
        let json = serde_json::to_vec_pretty(&info).expect("layer info serializes");
        f.write_all(&json).map_err(io_at("writing", &info_path))?;
        drop(f);
        // One syncfs is far cheaper than an fsync per file and makes the
        // whole tree durable before it becomes visible.
        rfs::syncfs(staging.lock.as_fd()).map_err(errno_at("syncing", &staging.dir))?;
        match fs::rename(&staging.dir, &dest) {
            Ok(()) => {}
            Err(e)
                if [Errno::EXIST, Errno::NOTEMPTY]
                    .iter()
                    .any(|x| e.raw_os_error() == Some(x.raw_os_error())) =>
            {
                // Sealed concurrently by someone else.
                staging.live = false;
                remove_all(&staging.dir).map_err(io_at("removing", &staging.dir))?;
                return Ok(id);
            }
            Err(e) => return Err(LayerError::io("moving into place", &dest, e)),
        }
        staging.live = false;
        fsync_dir(&self.root)?;
        Ok(id)
    }

    /// Seals `staging`, discarding it if sealing fails.
    pub(crate) fn seal_or_discard(
        &self,
        mut staging: Staging,
        progress: &mut Counter<'_>,
    ) -> Result<LayerId, LayerError> {
        match self.seal(&mut staging, progress) {
            Ok(id) => Ok(id),
            Err(e) => Err(abort(staging, e)),
        }
    }

    /// Copies the tree at `src` into the store. Device nodes under `dev/`
    /// and sockets are skipped (with a note); other device nodes are an
    /// error. Returns the existing id if the same tree is already stored.
    pub fn import_dir(
        &self,
        src: &Path,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<LayerId, LayerError> {
        self.import_dir_counted(src, &mut Counter::new(progress))
    }

    pub(crate) fn import_dir_counted(
        &self,
        src: &Path,
        counter: &mut Counter<'_>,
    ) -> Result<LayerId, LayerError> {
        let staging = self.staging_with_tree("import")?;
        counter.step(format!("copying {}", src.display()));
        let copied = match copy_tree(src, &staging.tree(), counter) {
            Ok(c) => c,
            Err(e) => return Err(abort(staging, e)),
        };
        if copied.skipped_devices > 0 {
            counter.note(format!(
                "skipped {} device nodes under dev/ (a sandbox has only the standard ones)",
                copied.skipped_devices
            ));
        }
        if copied.skipped_sockets > 0 {
            counter.note(format!("skipped {} sockets", copied.skipped_sockets));
        }
        if copied.dropped_xattrs > 0 {
            counter.note(format!(
                "dropped {} extended attributes this filesystem refused",
                copied.dropped_xattrs
            ));
        }
        self.seal_or_discard(staging, counter)
    }

    /// Copies an overlayfs upper directory (a sandbox's writes) into the store as a
    /// layer: whiteouts and opaque directories are kept, so the layer stacks on the
    /// lowers it was written over. Top-level names in `skip_top` are left out.
    pub fn import_upper(
        &self,
        src: &Path,
        skip_top: &[&str],
        progress: &mut dyn FnMut(Progress),
    ) -> Result<LayerId, LayerError> {
        let mut counter = Counter::new(progress);
        let staging = self.staging_with_tree("upper")?;
        counter.step(format!("copying {}", src.display()));
        if let Err(e) = crate::copy::copy_upper(src, &staging.tree(), skip_top, &mut counter) {
            return Err(abort(staging, e));
        }
        self.seal_or_discard(staging, &mut counter)
    }

    /// Extracts a tar stream into a staging directory (not sealed yet).
    pub(crate) fn stage_tar<R: std::io::Read>(
        &self,
        r: R,
        flavor: TarFlavor,
        counter: &mut Counter<'_>,
    ) -> Result<Staging, LayerError> {
        let staging = self.staging_with_tree("extract")?;
        counter.step("extracting");
        match extract_tar(r, &staging.tree(), flavor, counter) {
            Ok(x) => {
                if x.skipped_devices > 0 {
                    counter.note(format!(
                        "skipped {} device nodes under dev/ (a sandbox has only the standard ones)",
                        x.skipped_devices
                    ));
                }
                if x.dropped_xattrs > 0 {
                    counter.note(format!(
                        "ignored {} extended attributes outside security.capability and user.*",
                        x.dropped_xattrs
                    ));
                }
                Ok(staging)
            }
            Err(e) => Err(abort(staging, e)),
        }
    }

    /// Imports a tar stream (plain, gzip or zstd, detected from its first
    /// bytes). See [`TarFlavor`] for how whiteouts are treated and
    /// [`crate::extract`] for the safety rules.
    pub fn import_tar<R: std::io::Read>(
        &self,
        r: R,
        flavor: TarFlavor,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<LayerId, LayerError> {
        let mut counter = Counter::new(progress);
        let (r, _) = decompress(r).map_err(|e| LayerError::Tar {
            offset: 0,
            context: "detecting compression".into(),
            source: e,
        })?;
        let staging = self.stage_tar(r, flavor, &mut counter)?;
        self.seal_or_discard(staging, &mut counter)
    }

    /// Seals the directory `dir` (on the store's filesystem) into the store
    /// by renaming it, without copying. If the same tree is already stored,
    /// `dir` is removed and the existing id returned. On error `dir` is left
    /// where it was.
    pub fn adopt_dir(&self, dir: &Path) -> Result<LayerId, LayerError> {
        let meta = fs::symlink_metadata(dir).map_err(io_at("reading metadata of", dir))?;
        if !meta.is_dir() {
            return Err(LayerError::io(
                "adopting",
                dir,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a directory"),
            ));
        }
        let mut staging = self.staging("adopt")?;
        let tree = staging.tree();
        if let Err(e) = fs::rename(dir, &tree) {
            let err = if e.raw_os_error() == Some(Errno::XDEV.raw_os_error()) {
                LayerError::CrossDevice {
                    path: dir.to_path_buf(),
                }
            } else {
                LayerError::io("moving into the store", dir, e)
            };
            return Err(abort(staging, err));
        }
        let mut sink = |_| {};
        let mut counter = Counter::new(&mut sink);
        match self.seal(&mut staging, &mut counter) {
            Ok(id) => Ok(id),
            Err(e) => {
                // Give the caller its directory back before cleaning up.
                if let Err(back) = fs::rename(&tree, dir) {
                    staging.live = false; // keep the data: it is the only copy
                    return Err(LayerError::Cleanup {
                        path: tree,
                        cleanup: back,
                        original: Box::new(e),
                    });
                }
                Err(abort(staging, e))
            }
        }
    }

    /// Reads a layer's recorded info.
    pub fn info(&self, id: &LayerId) -> Result<LayerInfo, LayerError> {
        if !self.exists(id) {
            return Err(LayerError::NotFound(*id));
        }
        let path = self.layer_dir(id).join(INFO);
        let bytes = fs::read(&path).map_err(io_at("reading", &path))?;
        let stored: StoredInfo =
            serde_json::from_slice(&bytes).map_err(|source| LayerError::Metadata {
                path: path.clone(),
                source,
            })?;
        Ok(stored.info)
    }

    fn ids(&self) -> Result<Vec<LayerId>, LayerError> {
        let rd = fs::read_dir(&self.root).map_err(io_at("reading directory", &self.root))?;
        let mut ids = Vec::new();
        for ent in rd {
            let ent = ent.map_err(io_at("reading directory", &self.root))?;
            if let Some(id) = ent
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<LayerId>().ok())
            {
                ids.push(id);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// All sealed layers, ordered by id. A layer whose info file is missing
    /// or unreadable is described by walking its tree instead, so one damaged
    /// record does not hide the others.
    pub fn list(&self) -> Result<Vec<LayerInfo>, LayerError> {
        let mut out = Vec::new();
        for id in self.ids()? {
            match self.info(&id) {
                Ok(info) => out.push(info),
                Err(LayerError::NotFound(_)) => {}
                Err(LayerError::Io { .. } | LayerError::Metadata { .. }) => {
                    let tree = self.path(&id);
                    let (_, stats) = hash_tree(&tree)?;
                    let created = fs::metadata(&tree)
                        .map(|m| u64::try_from(m.mtime()).unwrap_or(0))
                        .unwrap_or(0);
                    out.push(LayerInfo {
                        id,
                        size_bytes: stats.bytes,
                        files: stats.entries,
                        created,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Finds the one layer whose id starts with `prefix` (at least
    /// [`MIN_PREFIX`] lowercase hex characters).
    pub fn resolve_prefix(&self, prefix: &str) -> Result<LayerId, LayerError> {
        if prefix.len() < MIN_PREFIX || prefix.len() > 64 || !is_lower_hex(prefix) {
            return Err(LayerError::BadPrefix {
                prefix: prefix.to_owned(),
            });
        }
        let matches: Vec<LayerId> = self
            .ids()?
            .into_iter()
            .filter(|id| id.to_hex().starts_with(prefix))
            .collect();
        match matches.len() {
            0 => Err(LayerError::NoMatch {
                prefix: prefix.to_owned(),
            }),
            1 => Ok(matches[0]),
            _ => Err(LayerError::AmbiguousPrefix {
                prefix: prefix.to_owned(),
                matches,
            }),
        }
    }

    /// Re-hashes a layer and checks it still matches its id.
    pub fn verify(&self, id: &LayerId) -> Result<(), LayerError> {
        if !self.exists(id) {
            return Err(LayerError::NotFound(*id));
        }
        let actual = crate::tree_hash(&self.path(id))?;
        if actual != id.tree_hash() {
            return Err(LayerError::Corrupt { id: *id, actual });
        }
        Ok(())
    }

    /// Deletes a layer. The caller checks that nothing references it.
    pub fn remove(&self, id: &LayerId) -> Result<(), LayerError> {
        let dir = self.layer_dir(id);
        if !self.exists(id) {
            return Err(LayerError::NotFound(*id));
        }
        // Move it out of sight first so a half-deleted layer is never seen
        // as a layer; the lock keeps `open` from racing the deletion.
        let staging = self.staging("remove")?;
        let doomed = staging.dir.join("layer");
        if let Err(e) = fs::rename(&dir, &doomed) {
            return Err(abort(
                staging,
                LayerError::io("moving out of the store", &dir, e),
            ));
        }
        let path = staging.dir.clone();
        staging.discard().map_err(io_at("removing", &path))
    }
}
