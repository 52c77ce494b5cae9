//! Copying a directory tree into a staging directory, preserving owner,
//! mode, timestamps, extended attributes, symlinks and hard links; and the two
//! operations on overlay-form trees built on it: a layer applied onto a merged tree
//! ([`apply_layer`], how a base is made); [`crate::diff`] compares two upper
//! directories with the same copier.
//!
//! Both trees are walked through directory descriptors opened with
//! `O_NOFOLLOW`, so a symlink in the source is copied as a symlink and never
//! followed, even if the source changes during the copy. File contents go
//! through `std::io::copy`, which uses `copy_file_range` between files.
//!
//! Device nodes: the standard ones at `dev/NAME` ([`crate::devices`]) are
//! copied, any other under `dev/` is skipped and one anywhere else rejected;
//! sockets are skipped. Extended attributes of symlinks are not copied (none of
//! the hashed ones apply to symlinks).

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;

use crate::devices;
use crate::error::LayerError;
use crate::fsx::{self, XattrOf, OPAQUE};
use crate::progress::Counter;

/// Nesting limit: beyond it a tree is more likely a loop or an attack.
pub(crate) const MAX_DEPTH: usize = 1024;

#[derive(Debug, Default)]
pub(crate) struct Copied {
    pub skipped_devices: u64,
    pub skipped_sockets: u64,
    pub dropped_xattrs: u64,
}

pub(crate) struct Copier<'a, 'p> {
    src_root: &'a Path,
    dst_root: &'a Path,
    dst_root_fd: BorrowedFd<'a>,
    /// (dev, ino) of multiply-linked files already copied -> their relative path.
    links: HashMap<(u64, u64), CString>,
    summary: Copied,
    progress: &'a mut Counter<'p>,
    /// Copying an overlayfs upper directory: 0:0 character devices are whiteouts and
    /// are kept, as is `trusted.overlay.opaque`; overlay's other bookkeeping
    /// attributes (origin file handles, impurity marks) describe the old stack and
    /// are dropped.
    upper: bool,
    /// An exact copy of an upper directory: every extended attribute is kept, and
    /// sockets and device nodes are made again as they are rather than left out.
    exact: bool,
    /// Names left out at the top of the tree.
    skip_top: &'a [&'a str],
    /// Applying a layer onto a merged tree ([`apply_layer`]): entries replace what the
    /// tree holds at their names, whiteouts remove it, and overlay's attributes are
    /// not copied.
    apply: bool,
}

/// Copies the contents and the root metadata of `src` into the existing,
/// empty directory `dst`.
pub(crate) fn copy_tree(
    src: &Path,
    dst: &Path,
    progress: &mut Counter<'_>,
) -> Result<Copied, LayerError> {
    copy_with(src, dst, progress, CopyMode::Tree, &[])
}

/// Like [`copy_tree`], for an overlayfs upper directory (see [`Copier::upper`]),
/// leaving out the top-level names in `skip_top`.
pub(crate) fn copy_upper(
    src: &Path,
    dst: &Path,
    skip_top: &[&str],
    progress: &mut Counter<'_>,
) -> Result<Copied, LayerError> {
    copy_with(src, dst, progress, CopyMode::Upper, skip_top)
}

/// How small a tree [`copy_upper_exactly`] copies.
#[derive(Debug, Clone, Copy)]
pub struct Small {
    /// Entries of every type, the root excluded.
    pub entries: u64,
    /// Bytes of the regular files, as allocated: a file's extents, which a reflink
    /// copies one by one, are at most one for every 4 KiB of it.
    pub bytes: u64,
}

/// Copies a small overlayfs upper directory exactly (every extended attribute, every
/// whiteout) into the existing, empty directory `dst`, file contents shared with the
/// source where the filesystem can (`copy_file_range` reflinks on btrfs), if it is
/// within `small`. `Ok(false)`, with nothing copied, if it is larger; `Ok(false)`, with
/// `dst` partly filled, if it holds a file of a type it does not know. Sockets and
/// device nodes are made again as they are (which needs `CAP_MKNOD` for devices). A
/// checkpoint of a small layer is such a copy, which unlike a btrfs snapshot does not
/// commit the whole volume.
pub fn copy_upper_exactly(src: &Path, dst: &Path, small: Small) -> Result<bool, LayerError> {
    let src_fd =
        fsx::open_dir_path(src).map_err(|e| LayerError::io("opening directory", src, e))?;
    if !within(src_fd.as_fd(), src, small)? {
        return Ok(false);
    }
    let mut nothing = |_| {};
    let mut counter = Counter::new(&mut nothing);
    match copy_with(src, dst, &mut counter, CopyMode::Exact, &[]) {
        Ok(_) => Ok(true),
        Err(LayerError::UnsupportedFile { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Applies the overlay-form layer `layer` (whiteouts as 0:0 character devices, opaque
/// directories marked `trusted.overlay.opaque`) onto the merged tree `tree`, as
/// overlayfs would show the layer over it: a whiteout removes the name, an opaque
/// directory replaces the directory below it, any other directory merges into it (its
/// owner, mode, times and attributes from the layer), any other entry replaces what
/// is at its name. File contents are shared where the filesystem can (`copy_file_range`
/// reflinks on btrfs); the tree holds no whiteouts and no overlay attributes after.
/// Device nodes, sockets and fifos are made as they are: a layer is either sealed in
/// the store, which checked its nodes, or a sandbox's upper, which cannot make any.
pub fn apply_layer(
    layer: &Path,
    tree: &Path,
    progress: &mut dyn FnMut(crate::Progress),
) -> Result<(), LayerError> {
    let mut counter = Counter::new(progress);
    copy_with(layer, tree, &mut counter, CopyMode::Apply, &[]).map(|_| ())
}

/// Is the tree under `dir` within `small`? Stops counting as soon as it is not.
fn within(dir: BorrowedFd<'_>, path: &Path, small: Small) -> Result<bool, LayerError> {
    fn walk(
        dir: BorrowedFd<'_>,
        path: &Path,
        left: &mut Small,
        depth: usize,
    ) -> Result<bool, LayerError> {
        if depth > MAX_DEPTH {
            return Ok(false);
        }
        let names = fsx::read_names(dir)
            .map_err(|e| LayerError::io("reading directory", path, e.into()))?;
        for name in names {
            let Some(entries) = left.entries.checked_sub(1) else {
                return Ok(false);
            };
            left.entries = entries;
            let st = fsx::lstat_at(dir, &name)
                .map_err(|e| LayerError::io("reading metadata of", path, e.into()))?;
            match fsx::file_type(&st) {
                FileType::Directory => {
                    let sub = fsx::open_dir_at(dir, &name)
                        .map_err(|e| LayerError::io("opening directory", path, e.into()))?;
                    if !walk(sub.as_fd(), path, left, depth + 1)? {
                        return Ok(false);
                    }
                }
                FileType::RegularFile => {
                    let Some(bytes) = left.bytes.checked_sub(st.st_blocks as u64 * 512) else {
                        return Ok(false);
                    };
                    left.bytes = bytes;
                }
                _ => {}
            }
        }
        Ok(true)
    }
    let mut left = small;
    walk(dir, path, &mut left, 0)
}

/// What kind of copy [`copy_with`] makes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyMode {
    /// A tree: device nodes only the standard ones under `dev/`, sockets left out.
    Tree,
    /// An upper directory sealed as a layer (see [`Copier::upper`]).
    Upper,
    /// An upper directory as it is (see [`Copier::exact`]).
    Exact,
    /// A layer applied onto a merged tree (see [`Copier::apply`]).
    Apply,
}

fn copy_with(
    src: &Path,
    dst: &Path,
    progress: &mut Counter<'_>,
    mode: CopyMode,
    skip_top: &[&str],
) -> Result<Copied, LayerError> {
    let src_fd =
        fsx::open_dir_path(src).map_err(|e| LayerError::io("opening directory", src, e))?;
    let dst_fd =
        fsx::open_dir_path(dst).map_err(|e| LayerError::io("opening directory", dst, e))?;
    let mut c = Copier::new(src, dst, dst_fd.as_fd(), progress, mode, skip_top);
    c.dir(src_fd.as_fd(), dst_fd.as_fd(), &mut Vec::new(), 0)?;
    let st =
        rfs::fstat(&src_fd).map_err(|e| LayerError::io("reading metadata of", src, e.into()))?;
    if c.apply {
        c.replace_meta(src_fd.as_fd(), dst_fd.as_fd(), &st, b"")?;
    } else {
        c.meta_fd(src_fd.as_fd(), dst_fd.as_fd(), &st, b"")?;
    }
    c.progress.flush();
    Ok(c.summary)
}

fn timestamps(st: &rfs::Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}

impl<'a, 'p> Copier<'a, 'p> {
    /// A copier from `src` into `dst` (open as `dst_fd`) of the given kind.
    pub(crate) fn new(
        src: &'a Path,
        dst: &'a Path,
        dst_fd: BorrowedFd<'a>,
        progress: &'a mut Counter<'p>,
        mode: CopyMode,
        skip_top: &'a [&'a str],
    ) -> Self {
        Copier {
            src_root: src,
            dst_root: dst,
            dst_root_fd: dst_fd,
            links: HashMap::new(),
            summary: Copied::default(),
            progress,
            upper: mode != CopyMode::Tree,
            exact: matches!(mode, CopyMode::Exact | CopyMode::Apply),
            skip_top,
            apply: mode == CopyMode::Apply,
        }
    }
}

impl Copier<'_, '_> {
    pub(crate) fn src_err(
        &self,
        step: &'static str,
        rel: &[u8],
        e: impl Into<std::io::Error>,
    ) -> LayerError {
        LayerError::io(step, self.src_root.join(fsx::os(rel)), e.into())
    }
    pub(crate) fn dst_err(
        &self,
        step: &'static str,
        rel: &[u8],
        e: impl Into<std::io::Error>,
    ) -> LayerError {
        LayerError::io(step, self.dst_root.join(fsx::os(rel)), e.into())
    }
    fn src_path(&self, rel: &[u8]) -> PathBuf {
        self.src_root.join(fsx::os(rel))
    }

    /// The names in the source directory `src` at `rel`, sorted; refused past
    /// [`MAX_DEPTH`].
    pub(crate) fn names_at(
        &self,
        src: BorrowedFd<'_>,
        rel: &[u8],
        depth: usize,
    ) -> Result<Vec<CString>, LayerError> {
        if depth > MAX_DEPTH {
            return Err(LayerError::TooDeep {
                limit: MAX_DEPTH,
                path: self.src_path(rel),
            });
        }
        let mut names =
            fsx::read_names(src).map_err(|e| self.src_err("reading directory", rel, e))?;
        names.sort();
        Ok(names)
    }

    /// Copies the children of `src` into `dst`; `rel` is their relative path.
    fn dir(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        rel: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), LayerError> {
        let names = self.names_at(src, rel, depth)?;
        let base = rel.len();
        for name in names {
            if depth == 0
                && self
                    .skip_top
                    .iter()
                    .any(|s| s.as_bytes() == name.as_bytes())
            {
                continue;
            }
            if base > 0 {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
            let res = self.one(src, dst, &name, rel, depth);
            rel.truncate(base);
            res?;
        }
        Ok(())
    }

    pub(crate) fn one(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CString,
        rel: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), LayerError> {
        let st =
            fsx::lstat_at(src, name).map_err(|e| self.src_err("reading metadata of", rel, e))?;
        if self.apply && self.applied_in_place(src, dst, name, &st, rel, depth)? {
            return Ok(());
        }
        match fsx::file_type(&st) {
            FileType::Directory => {
                let s = fsx::open_dir_at(src, name)
                    .map_err(|e| self.src_err("opening directory", rel, e))?;
                rfs::mkdirat(dst, name, Mode::from_raw_mode(0o700))
                    .map_err(|e| self.dst_err("creating directory", rel, e))?;
                let d = fsx::open_dir_at(dst, name)
                    .map_err(|e| self.dst_err("opening directory", rel, e))?;
                self.dir(s.as_fd(), d.as_fd(), rel, depth + 1)?;
                self.meta_fd(s.as_fd(), d.as_fd(), &st, rel)?;
                self.progress.entry(0);
            }
            FileType::RegularFile => {
                if st.st_nlink > 1 {
                    if let Some(first) = self.links.get(&(st.st_dev, st.st_ino)) {
                        rfs::linkat(
                            self.dst_root_fd,
                            first.as_c_str(),
                            dst,
                            name,
                            AtFlags::empty(),
                        )
                        .map_err(|e| self.dst_err("creating hard link", rel, e))?;
                        self.progress.entry(0);
                        return Ok(());
                    }
                }
                let s = rfs::openat(
                    src,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| self.src_err("opening", rel, e))?;
                let d = rfs::openat(
                    dst,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| self.dst_err("creating", rel, e))?;
                let (mut sf, mut df) = (File::from(s), File::from(d));
                let n = std::io::copy(&mut sf, &mut df)
                    .map_err(|e| self.dst_err("copying into", rel, e))?;
                let s: OwnedFd = sf.into();
                let d: OwnedFd = df.into();
                self.meta_fd(s.as_fd(), d.as_fd(), &st, rel)?;
                if st.st_nlink > 1 {
                    let c = fsx::cstr(rel).map_err(|e| self.src_err("naming", rel, e))?;
                    self.links.insert((st.st_dev, st.st_ino), c);
                }
                self.progress.entry(n);
            }
            FileType::Symlink => {
                let target = rfs::readlinkat(src, name, Vec::new())
                    .map_err(|e| self.src_err("reading symlink", rel, e))?;
                rfs::symlinkat(target.as_c_str(), dst, name)
                    .map_err(|e| self.dst_err("creating symlink", rel, e))?;
                self.meta_at(dst, name, &st, rel, false)?;
                self.progress.entry(0);
            }
            FileType::Fifo => {
                rfs::mknodat(dst, name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
                    .map_err(|e| self.dst_err("creating fifo", rel, e))?;
                self.meta_at(dst, name, &st, rel, true)?;
                self.progress.entry(0);
            }
            FileType::CharacterDevice if self.upper && st.st_rdev == 0 => {
                rfs::mknodat(dst, name, FileType::CharacterDevice, Mode::empty(), 0)
                    .map_err(|e| self.dst_err("creating whiteout", rel, e))?;
                self.meta_at(dst, name, &st, rel, true)?;
                self.progress.entry(0);
            }
            kind @ (FileType::CharacterDevice | FileType::BlockDevice | FileType::Socket)
                if self.exact =>
            {
                // As they are: a socket's node (what binding it left on disk), a device
                // node with its numbers, as a snapshot would hold them.
                rfs::mknodat(dst, name, kind, Mode::from_raw_mode(0o600), st.st_rdev)
                    .map_err(|e| self.dst_err("creating node", rel, e))?;
                self.meta_at(dst, name, &st, rel, true)?;
                self.progress.entry(0);
            }
            FileType::CharacterDevice
                if devices::is_standard(rel, rfs::major(st.st_rdev), rfs::minor(st.st_rdev)) =>
            {
                rfs::mknodat(
                    dst,
                    name,
                    FileType::CharacterDevice,
                    Mode::from_raw_mode(0o600),
                    st.st_rdev,
                )
                .map_err(|e| self.dst_err("creating device node", rel, e))?;
                self.meta_at(dst, name, &st, rel, true)?;
                self.progress.entry(0);
            }
            FileType::CharacterDevice | FileType::BlockDevice => {
                if rel.split(|b| *b == b'/').next() == Some(b"dev") {
                    self.summary.skipped_devices += 1;
                } else {
                    return Err(LayerError::UnsupportedFile {
                        kind: "device node",
                        path: self.src_path(rel),
                    });
                }
            }
            FileType::Socket => self.summary.skipped_sockets += 1,
            FileType::Unknown => {
                return Err(LayerError::UnsupportedFile {
                    kind: "file of unknown type",
                    path: self.src_path(rel),
                })
            }
        }
        Ok(())
    }

    /// What applying a layer does before an entry is made at `name`: a directory over a
    /// directory (unless opaque) merges into it, here; anything else first removes what
    /// the tree holds at that name, and a whiteout then stops. `true` when the entry is
    /// done with.
    fn applied_in_place(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CString,
        st: &rfs::Stat,
        rel: &mut Vec<u8>,
        depth: usize,
    ) -> Result<bool, LayerError> {
        let kind = fsx::file_type(st);
        let existing = match fsx::lstat_at(dst, name) {
            Ok(e) => Some(fsx::file_type(&e)),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(self.dst_err("reading metadata of", rel, e)),
        };
        if kind == FileType::Directory && existing == Some(FileType::Directory) {
            let s = fsx::open_dir_at(src, name)
                .map_err(|e| self.src_err("opening directory", rel, e))?;
            let opaque = fsx::is_opaque(s.as_fd())
                .map_err(|e| self.src_err("reading extended attributes of", rel, e))?;
            if !opaque {
                let d = fsx::open_dir_at(dst, name)
                    .map_err(|e| self.dst_err("opening directory", rel, e))?;
                self.dir(s.as_fd(), d.as_fd(), rel, depth + 1)?;
                self.replace_meta(s.as_fd(), d.as_fd(), st, rel)?;
                self.progress.entry(0);
                return Ok(true);
            }
        }
        if existing.is_some() {
            fsx::remove_at(dst, name).map_err(|e| self.dst_err("removing", rel, e))?;
        }
        let whiteout = kind == FileType::CharacterDevice && st.st_rdev == 0;
        if whiteout {
            self.progress.entry(0);
        }
        Ok(whiteout)
    }

    /// [`Copier::meta_fd`] onto a directory that was already there: its extended
    /// attributes become the layer's (overlayfs shows the topmost directory's).
    fn replace_meta(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        st: &rfs::Stat,
        rel: &[u8],
    ) -> Result<(), LayerError> {
        let theirs = fsx::read_xattrs(XattrOf::Fd(src), |_| true)
            .map_err(|e| self.src_err("reading extended attributes of", rel, e))?;
        let ours = fsx::read_xattrs(XattrOf::Fd(dst), |_| true)
            .map_err(|e| self.dst_err("reading extended attributes of", rel, e))?;
        for (name, _) in ours {
            if theirs.iter().any(|(n, _)| *n == name) && !name.starts_with(b"trusted.overlay.") {
                continue;
            }
            let cname = fsx::cstr(&name).map_err(|e| self.dst_err("naming", rel, e))?;
            match rfs::fremovexattr(dst, &cname) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(e) => return Err(self.dst_err("removing extended attribute of", rel, e)),
            }
        }
        self.meta_fd(src, dst, st, rel)
    }

    /// Owner, mode, xattrs and times from `st`/`src` onto the open `dst`.
    pub(crate) fn meta_fd(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        st: &rfs::Stat,
        rel: &[u8],
    ) -> Result<(), LayerError> {
        // chown first: it clears setuid/setgid bits that chmod then restores.
        rfs::fchown(
            dst,
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
        )
        .map_err(|e| self.dst_err("changing owner of", rel, e))?;
        rfs::fchmod(dst, Mode::from_raw_mode(st.st_mode & 0o7777))
            .map_err(|e| self.dst_err("setting mode of", rel, e))?;
        let (upper, exact, apply) = (self.upper, self.exact, self.apply);
        let xattrs = fsx::read_xattrs(XattrOf::Fd(src), |n| {
            if apply {
                return !n.starts_with(b"trusted.overlay.");
            }
            exact || !upper || !n.starts_with(b"trusted.overlay.") || n == OPAQUE
        })
        .map_err(|e| self.src_err("reading extended attributes of", rel, e))?;
        for (name, value) in xattrs {
            if let Err(e) = fsx::write_xattr(XattrOf::Fd(dst), &name, &value) {
                // Attributes that do not change what the layer means (an
                // SELinux label from another host, say) may be refused by
                // this filesystem; the hashed ones must survive, and every one
                // in an exact copy.
                if self.exact || fsx::is_significant_xattr(&name) || name.starts_with(b"user.") {
                    return Err(self.dst_err("setting extended attribute of", rel, e));
                }
                self.summary.dropped_xattrs += 1;
            }
        }
        rfs::futimens(dst, &timestamps(st)).map_err(|e| self.dst_err("setting times of", rel, e))
    }

    /// Owner (and mode unless a symlink) and times for an entry that cannot be
    /// opened for writing (symlinks, fifos).
    fn meta_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &CString,
        st: &rfs::Stat,
        rel: &[u8],
        chmod: bool,
    ) -> Result<(), LayerError> {
        rfs::chownat(
            dir,
            name,
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| self.dst_err("changing owner of", rel, e))?;
        if chmod {
            rfs::chmodat(
                dir,
                name,
                Mode::from_raw_mode(st.st_mode & 0o7777),
                AtFlags::empty(),
            )
            .map_err(|e| self.dst_err("setting mode of", rel, e))?;
        }
        rfs::utimensat(dir, name, &timestamps(st), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e: Errno| self.dst_err("setting times of", rel, e))
    }
}
