//! Safe tar extraction into a private staging directory.
//!
//! Archives are untrusted. Every entry is created relative to a descriptor of
//! the target directory, walking its parent path one component at a time
//! with `O_NOFOLLOW | O_DIRECTORY`, so nothing is ever written outside the
//! target or through a symlink, whatever earlier entries created. The rules:
//!
//! - Leading `/` and `./` are stripped; a `..` component anywhere, or a NUL
//!   byte, rejects the entry (and so the archive).
//! - A parent path that reaches a symlink or a non-directory rejects the entry.
//!   Symlinks themselves are created as data: their targets are never read.
//! - A hard link must name an entry already extracted (a regular file,
//!   symlink or fifo) by a path that passes the same rules.
//! - Device nodes: the standard ones at `dev/NAME` ([`crate::devices`]) are
//!   kept, any other under `dev/` is skipped and one anywhere else rejects the
//!   archive, except the overlay whiteouts this module makes itself. Fifos are
//!   kept, sockets cannot appear in tar.
//! - Owner, mode (including setuid/setgid/sticky), mtime and a safe subset
//!   of xattrs from PAX `SCHILY.xattr.*` records are applied.
//! - A later entry replaces an earlier one with the same path, as tar does.
//!
//! [`TarFlavor::OciLayer`] converts OCI whiteouts into overlayfs form:
//! `DIR/.wh.NAME` becomes a 0:0 character device `DIR/NAME`, and
//! `DIR/.wh..wh..opq` sets `trusted.overlay.opaque=y` on `DIR`. Following
//! the OCI spec, a whiteout never hides an entry of its own layer.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{self as rfs, AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use rustix::io::Errno;
use tar::EntryType;

use crate::devices;
use crate::error::LayerError;
use crate::fsx::{self, XattrOf};
use crate::progress::Counter;

/// How to read a tar stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TarFlavor {
    /// A plain root filesystem: `.wh.` names are ordinary files.
    Rootfs,
    /// An OCI image layer: OCI whiteouts become overlayfs whiteouts.
    OciLayer,
    /// A tar of a tree in overlayfs form, as stored in this crate's layers:
    /// 0:0 character devices are whiteouts and the overlay xattrs
    /// `trusted.overlay.opaque` and `trusted.overlay.redirect` are kept.
    Overlay,
}

mod links;
mod paths;

const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";
const COPY_BUF: usize = 256 * 1024;

/// What compression a stream uses, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
    Xz,
    Bzip2,
}

pub(crate) fn sniff(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Compression::Xz
    } else if head.starts_with(b"BZh") {
        Compression::Bzip2
    } else {
        Compression::None
    }
}

/// Wraps `r` in the decompressor its first bytes call for (gzip, zstd, or none; xz and
/// bzip2 are refused).
pub fn decompress<'a, R: Read + 'a>(mut r: R) -> io::Result<(Box<dyn Read + 'a>, Compression)> {
    let mut head = [0u8; 6];
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    let kind = sniff(&head[..n]);
    let br = BufReader::with_capacity(COPY_BUF, io::Cursor::new(head[..n].to_vec()).chain(r));
    let r: Box<dyn Read + 'a> = match kind {
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(br)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(br)?),
        Compression::Xz | Compression::Bzip2 => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{kind:?} compression is not supported; decompress the archive first"),
            ))
        }
        Compression::None => Box::new(br),
    };
    Ok((r, kind))
}

/// Summary of one extraction.
#[derive(Debug, Default)]
pub(crate) struct Extracted {
    pub skipped_devices: u64,
    pub dropped_xattrs: u64,
}

/// Extracts the tar stream `r` into the empty directory `target`.
pub(crate) fn extract_tar<R: Read>(
    r: R,
    target: &Path,
    flavor: TarFlavor,
    progress: &mut Counter<'_>,
) -> Result<Extracted, LayerError> {
    let root = fsx::open_dir_path(target).map_err(|e| LayerError::io("opening", target, e))?;
    let mut x = Extractor {
        root,
        root_path: target.to_path_buf(),
        flavor,
        cache: None,
        dir_times: Vec::new(),
        summary: Extracted::default(),
        buf: vec![0u8; COPY_BUF],
    };
    let mut archive = tar::Archive::new(r);
    let entries = archive.entries().map_err(|e| LayerError::Tar {
        offset: 0,
        context: "at the first header".into(),
        source: e,
    })?;
    let mut next_offset = 0u64;
    let mut last: Option<Vec<u8>> = None;
    for (idx, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| LayerError::Tar {
            offset: next_offset,
            context: match &last {
                Some(p) => format!("header after entry #{idx} {:?}", String::from_utf8_lossy(p)),
                None => "first header".into(),
            },
            source: e,
        })?;
        let size = entry.size();
        next_offset = entry
            .raw_file_position()
            .saturating_add(size.div_ceil(512).saturating_mul(512));
        let path = entry.path_bytes().into_owned();
        let written = x.entry(&mut entry, &path)?;
        progress.entry(written);
        last = Some(path);
    }
    x.finish()?;
    progress.flush();
    Ok(x.summary)
}

struct Extractor {
    root: OwnedFd,
    root_path: PathBuf,
    flavor: TarFlavor,
    /// The last parent directory resolved, by relative path.
    cache: Option<(Vec<u8>, Rc<OwnedFd>)>,
    /// Directory mtimes, applied at the end once nothing is added below them.
    dir_times: Vec<(Vec<u8>, i64)>,
    summary: Extracted,
    buf: Vec<u8>,
}

/// Entry metadata from the header, validated.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Splits an archive path into components, refusing anything that could
/// leave the target.
pub(crate) fn normalize(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte");
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("path has a '..' component"),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn join(comps: &[&[u8]]) -> Vec<u8> {
    comps.join(&b'/')
}

enum Slot {
    Empty,
    ExistingDir,
}

impl Extractor {
    fn io(&self, step: &'static str, rel: &[u8], e: impl Into<io::Error>) -> LayerError {
        LayerError::io(step, self.root_path.join(fsx::os(rel)), e.into())
    }

    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        raw: &[u8],
    ) -> Result<u64, LayerError> {
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            return Ok(0);
        }
        let comps = normalize(raw).map_err(|r| LayerError::entry(raw, r))?;
        let meta = self.meta(entry, raw)?;

        if self.flavor == TarFlavor::OciLayer {
            for c in comps.iter().rev().skip(1) {
                if c.starts_with(WHITEOUT_PREFIX) {
                    return Err(LayerError::entry(raw, "whiteout name used as a directory"));
                }
            }
            if let Some(last) = comps.last() {
                if *last == OPAQUE_MARKER {
                    return self.opaque(&comps[..comps.len() - 1], raw).map(|_| 0);
                }
                if let Some(hidden) = last.strip_prefix(WHITEOUT_PREFIX) {
                    if hidden.is_empty() || hidden == b"." || hidden == b".." {
                        return Err(LayerError::entry(raw, "whiteout of an invalid name"));
                    }
                    let mut target = comps[..comps.len() - 1].to_vec();
                    target.push(hidden);
                    return self.whiteout(&target, raw, None).map(|_| 0);
                }
            }
        }

        if comps.is_empty() {
            // The archive's own root ("./" or "/").
            if !kind.is_dir() {
                return Err(LayerError::entry(raw, "the root entry is not a directory"));
            }
            let fd = self
                .root
                .try_clone()
                .map_err(|e| self.io("duplicating", b"", e))?;
            self.apply_meta(fd.as_fd(), b"", &meta)?;
            self.dir_times.push((Vec::new(), meta.mtime));
            return Ok(0);
        }

        let rel = join(&comps);
        let (parent_comps, name) = comps.split_at(comps.len() - 1);
        let name =
            fsx::cstr(name[0]).map_err(|_| LayerError::entry(raw, "path contains a NUL byte"))?;

        match kind {
            EntryType::Directory => {
                let dir = self.parent(parent_comps, true, raw)?;
                if let Slot::Empty = self.prepare(&dir, &name, &rel, true)? {
                    rfs::mkdirat(&*dir, &name, Mode::from_raw_mode(0o700))
                        .map_err(|e| self.io("creating directory", &rel, e))?;
                }
                let fd = fsx::open_dir_at(dir.as_fd(), &name)
                    .map_err(|e| self.io("opening directory", &rel, e))?;
                self.apply_meta(fd.as_fd(), &rel, &meta)?;
                self.dir_times.push((rel, meta.mtime));
                Ok(0)
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let dir = self.parent(parent_comps, true, raw)?;
                self.prepare(&dir, &name, &rel, false)?;
                let fd = rfs::openat(
                    &*dir,
                    &name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| self.io("creating", &rel, e))?;
                let mut file = File::from(fd);
                let expected = entry.size();
                let written = self.copy(entry, &mut file, &rel)?;
                if written != expected {
                    return Err(LayerError::entry(
                        raw,
                        format!("truncated: header says {expected} bytes, archive holds {written}"),
                    ));
                }
                self.apply_meta(file.as_fd(), &rel, &meta)?;
                set_times_fd(file.as_fd(), meta.mtime)
                    .map_err(|e| self.io("setting times of", &rel, e))?;
                Ok(written)
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| LayerError::entry(raw, "symlink without a target"))?
                    .into_owned();
                if target.is_empty() || target.contains(&0) {
                    return Err(LayerError::entry(
                        raw,
                        "symlink with an empty or NUL-containing target",
                    ));
                }
                let dir = self.parent(parent_comps, true, raw)?;
                self.prepare(&dir, &name, &rel, false)?;
                rfs::symlinkat(fsx::os(&target), &*dir, &name)
                    .map_err(|e| self.io("creating symlink", &rel, e))?;
                self.chown_at(&dir, &name, &rel, &meta)?;
                set_times_at(&dir, &name, meta.mtime)
                    .map_err(|e| self.io("setting times of", &rel, e))?;
                Ok(0)
            }
            EntryType::Link => {
                let target_raw = entry
                    .link_name_bytes()
                    .ok_or_else(|| LayerError::entry(raw, "hard link without a target"))?
                    .into_owned();
                self.hardlink(parent_comps, &name, &rel, &target_raw, raw)?;
                Ok(0)
            }
            EntryType::Fifo => self.node(parent_comps, &name, &rel, raw, &meta, FileType::Fifo, 0),
            EntryType::Char | EntryType::Block => {
                let major = entry.header().device_major().ok().flatten().unwrap_or(0);
                let minor = entry.header().device_minor().ok().flatten().unwrap_or(0);
                if self.flavor == TarFlavor::Overlay
                    && kind == EntryType::Char
                    && major == 0
                    && minor == 0
                {
                    return self.whiteout(&comps, raw, Some(&meta)).map(|_| 0);
                }
                if kind == EntryType::Char && devices::is_standard(&rel, major, minor) {
                    let dev = rfs::makedev(major, minor);
                    return self.node(
                        parent_comps,
                        &name,
                        &rel,
                        raw,
                        &meta,
                        FileType::CharacterDevice,
                        dev,
                    );
                }
                if comps[0] == b"dev" {
                    self.summary.skipped_devices += 1;
                    return Ok(0);
                }
                Err(LayerError::entry(
                    raw,
                    "device nodes are only accepted under dev/ (where only the standard ones are kept)",
                ))
            }
            other => Err(LayerError::entry(
                raw,
                format!("unsupported entry type {other:?}"),
            )),
        }
    }

    /// A fifo or a device node, with the entry's owner, mode and mtime.
    #[allow(clippy::too_many_arguments)]
    fn node(
        &mut self,
        parent_comps: &[&[u8]],
        name: &CString,
        rel: &[u8],
        raw: &[u8],
        meta: &Meta,
        kind: FileType,
        dev: rfs::Dev,
    ) -> Result<u64, LayerError> {
        let dir = self.parent(parent_comps, true, raw)?;
        self.prepare(&dir, name, rel, false)?;
        rfs::mknodat(&*dir, name, kind, Mode::from_raw_mode(0o600), dev)
            .map_err(|e| self.io("creating node", rel, e))?;
        self.chown_at(&dir, name, rel, meta)?;
        rfs::chmodat(
            &*dir,
            name,
            Mode::from_raw_mode(meta.mode),
            AtFlags::empty(),
        )
        .map_err(|e| self.io("setting mode of", rel, e))?;
        set_times_at(&dir, name, meta.mtime).map_err(|e| self.io("setting times of", rel, e))?;
        Ok(0)
    }

    fn meta<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        raw: &[u8],
    ) -> Result<Meta, LayerError> {
        let h = entry.header();
        let bad = |what: &str, e: io::Error| {
            LayerError::entry(raw, format!("malformed {what} field: {e}"))
        };
        let mode = h.mode().map_err(|e| bad("mode", e))? & 0o7777;
        let id = |v: u64, what: &str| -> Result<u32, LayerError> {
            u32::try_from(v)
                .ok()
                .filter(|v| *v != u32::MAX)
                .ok_or_else(|| LayerError::entry(raw, format!("{what} {v} out of range")))
        };
        let uid = id(h.uid().map_err(|e| bad("uid", e))?, "uid")?;
        let gid = id(h.gid().map_err(|e| bad("gid", e))?, "gid")?;
        let mtime = i64::try_from(h.mtime().map_err(|e| bad("mtime", e))?).unwrap_or(i64::MAX);
        let mut xattrs = Vec::new();
        if let Some(exts) = entry
            .pax_extensions()
            .map_err(|e| bad("PAX extension", e))?
        {
            for ext in exts {
                let ext = ext.map_err(|e| bad("PAX extension", e))?;
                let Some(name) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") else {
                    continue;
                };
                if self.xattr_allowed(name) {
                    xattrs.push((name.to_vec(), ext.value_bytes().to_vec()));
                } else {
                    self.summary.dropped_xattrs += 1;
                }
            }
        }
        Ok(Meta {
            mode,
            uid,
            gid,
            mtime,
            xattrs,
        })
    }

    /// Archive xattrs are data from an untrusted source: only those with a
    /// well-understood effect are applied.
    fn xattr_allowed(&self, name: &[u8]) -> bool {
        if name == b"security.capability" || name.starts_with(b"user.") {
            return true;
        }
        self.flavor == TarFlavor::Overlay
            && (name == b"trusted.overlay.opaque" || name == b"trusted.overlay.redirect")
    }

    fn copy<R: Read>(
        &mut self,
        from: &mut R,
        to: &mut File,
        rel: &[u8],
    ) -> Result<u64, LayerError> {
        let mut total = 0u64;
        loop {
            let n = match from.read(&mut self.buf) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(LayerError::Tar {
                        offset: total,
                        context: format!(
                            "reading the content of {:?}",
                            String::from_utf8_lossy(rel)
                        ),
                        source: e,
                    })
                }
            };
            to.write_all(&self.buf[..n])
                .map_err(|e| self.io("writing", rel, e))?;
            total += n as u64;
        }
    }

    fn apply_meta(&mut self, fd: BorrowedFd<'_>, rel: &[u8], m: &Meta) -> Result<(), LayerError> {
        // chown first: it clears setuid/setgid bits that chmod then restores.
        rfs::fchown(fd, Some(Uid::from_raw(m.uid)), Some(Gid::from_raw(m.gid)))
            .map_err(|e| self.io("changing owner of", rel, e))?;
        rfs::fchmod(fd, Mode::from_raw_mode(m.mode))
            .map_err(|e| self.io("setting mode of", rel, e))?;
        for (name, value) in &m.xattrs {
            fsx::write_xattr(XattrOf::Fd(fd), name, value)
                .map_err(|e| self.io("setting extended attribute of", rel, e))?;
        }
        Ok(())
    }

    fn chown_at(
        &self,
        dir: &OwnedFd,
        name: &CString,
        rel: &[u8],
        m: &Meta,
    ) -> Result<(), LayerError> {
        rfs::chownat(
            dir,
            name,
            Some(Uid::from_raw(m.uid)),
            Some(Gid::from_raw(m.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| self.io("changing owner of", rel, e))
    }

    fn finish(&mut self) -> Result<(), LayerError> {
        let times = std::mem::take(&mut self.dir_times);
        for (rel, mtime) in times.iter().rev() {
            let comps: Vec<&[u8]> = if rel.is_empty() {
                Vec::new()
            } else {
                rel.split(|b| *b == b'/').collect()
            };
            // A directory replaced by a later entry no longer needs a time.
            let fd = match self.existing(&comps, rel) {
                Ok(Some(fd)) => fd,
                Ok(None) | Err(LayerError::BadEntry { .. }) => continue,
                Err(e) => return Err(e),
            };
            set_times_fd(fd.as_fd(), *mtime).map_err(|e| self.io("setting times of", rel, e))?;
        }
        self.cache = None;
        Ok(())
    }
}

fn timestamps(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

fn set_times_fd(fd: BorrowedFd<'_>, mtime: i64) -> Result<(), Errno> {
    rfs::futimens(fd, &timestamps(mtime))
}

fn set_times_at(dir: &OwnedFd, name: &CString, mtime: i64) -> Result<(), Errno> {
    rfs::utimensat(dir, name, &timestamps(mtime), AtFlags::SYMLINK_NOFOLLOW)
}

#[cfg(test)]
mod tests;
