//! What one overlayfs upper directory changed over another ([`diff_uppers`]): a
//! branch's layer starts as its checkpoint's (a snapshot or a copy of it), so the
//! branch's own changes, a checkpoint's delta, are the difference of the two. The
//! entries that differ are copied with the copier of [`crate::copy`], as a layer is
//! sealed (whiteouts and opaque marks kept, overlay's other attributes dropped).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::copy::{Copier, CopyMode};
use crate::error::LayerError;
use crate::fsx::{self, XattrOf, OPAQUE};
use crate::progress::Counter;

/// Writes into the existing, empty directory `out` what `new` changed over `old`, both
/// overlayfs upper directories over the same lower layers (a branch's upper, which
/// started as a copy or snapshot of its checkpoint's, against that checkpoint's), as an
/// upper directory itself: over the lower layers and `old`, it reads as the lower
/// layers and `new`. An entry of `new` that `old` lacks or has otherwise (type, mode,
/// owner, times, attributes, contents or target) is copied (a directory with what it
/// holds that differs; an opaque one whole); a name `old` has and `new` lacks becomes a
/// whiteout. Entries are told equal by inode number and change time first (a snapshot
/// keeps both), then by their attributes and bytes.
pub fn diff_uppers(old: &Path, new: &Path, out: &Path) -> Result<(), LayerError> {
    let old_fd =
        fsx::open_dir_path(old).map_err(|e| LayerError::io("opening directory", old, e))?;
    let new_fd =
        fsx::open_dir_path(new).map_err(|e| LayerError::io("opening directory", new, e))?;
    let out_fd =
        fsx::open_dir_path(out).map_err(|e| LayerError::io("opening directory", out, e))?;
    let mut nothing = |_| {};
    let mut counter = Counter::new(&mut nothing);
    // What differs is copied as a layer is sealed: whiteouts and opaque marks kept.
    let mut c = Copier::new(new, out, out_fd.as_fd(), &mut counter, CopyMode::Upper, &[]);
    c.diff_dir(
        old_fd.as_fd(),
        new_fd.as_fd(),
        out_fd.as_fd(),
        &mut Vec::new(),
        0,
    )?;
    let st =
        rfs::fstat(&new_fd).map_err(|e| LayerError::io("reading metadata of", new, e.into()))?;
    c.meta_fd(new_fd.as_fd(), out_fd.as_fd(), &st, b"")
}

/// Whether two entries of the same name in two upper directories are the same.
fn same_entry(
    old_dir: BorrowedFd<'_>,
    new_dir: BorrowedFd<'_>,
    name: &CString,
    a: &rfs::Stat,
    b: &rfs::Stat,
) -> std::io::Result<bool> {
    if fsx::file_type(a) != fsx::file_type(b) {
        return Ok(false);
    }
    if a.st_ino == b.st_ino && a.st_ctime == b.st_ctime && a.st_ctime_nsec == b.st_ctime_nsec {
        return Ok(true);
    }
    if (a.st_mode, a.st_uid, a.st_gid, a.st_rdev) != (b.st_mode, b.st_uid, b.st_gid, b.st_rdev)
        || (a.st_mtime, a.st_mtime_nsec) != (b.st_mtime, b.st_mtime_nsec)
    {
        return Ok(false);
    }
    match fsx::file_type(a) {
        FileType::Symlink => Ok(rfs::readlinkat(old_dir, name, Vec::new())?
            == rfs::readlinkat(new_dir, name, Vec::new())?),
        FileType::RegularFile => {
            if a.st_size != b.st_size {
                return Ok(false);
            }
            let open = |dir| -> std::io::Result<File> {
                Ok(File::from(rfs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?))
            };
            let (fa, fb) = (open(old_dir)?, open(new_dir)?);
            let keep = |n: &[u8]| fsx::is_significant_xattr(n) || n.starts_with(b"user.");
            if fsx::read_xattrs(XattrOf::Fd(fa.as_fd()), keep)?
                != fsx::read_xattrs(XattrOf::Fd(fb.as_fd()), keep)?
            {
                return Ok(false);
            }
            same_bytes(fa, fb)
        }
        _ => Ok(true),
    }
}

fn same_bytes(mut a: File, mut b: File) -> std::io::Result<bool> {
    use std::io::Read;
    let (mut x, mut y) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let n = a.read(&mut x)?;
        let mut got = 0;
        while got < n {
            let m = b.read(&mut y[got..n])?;
            if m == 0 {
                return Ok(false);
            }
            got += m;
        }
        if n == 0 {
            return Ok(b.read(&mut y[..1])? == 0);
        }
        if x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

impl Copier<'_, '_> {
    /// [`diff_uppers`] of the directories `old` and `new` into `out`.
    fn diff_dir(
        &mut self,
        old: BorrowedFd<'_>,
        new: BorrowedFd<'_>,
        out: BorrowedFd<'_>,
        rel: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), LayerError> {
        let names = self.names_at(new, rel, depth)?;
        let base = rel.len();
        for name in &names {
            if base > 0 {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
            let res = self.diff_one(old, new, out, name, rel, depth);
            rel.truncate(base);
            res?;
        }
        // Names only the old one has: gone since, so whited out.
        let olds = fsx::read_names(old).map_err(|e| self.src_err("reading directory", rel, e))?;
        for name in olds.iter().filter(|n| names.binary_search(n).is_err()) {
            let st = fsx::lstat_at(old, name)
                .map_err(|e| self.src_err("reading metadata of", rel, e))?;
            if fsx::file_type(&st) == FileType::CharacterDevice && st.st_rdev == 0 {
                continue;
            }
            rfs::mknodat(out, name, FileType::CharacterDevice, Mode::empty(), 0)
                .map_err(|e| self.dst_err("creating whiteout", rel, e))?;
        }
        Ok(())
    }

    fn diff_one(
        &mut self,
        old: BorrowedFd<'_>,
        new: BorrowedFd<'_>,
        out: BorrowedFd<'_>,
        name: &CString,
        rel: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), LayerError> {
        let b =
            fsx::lstat_at(new, name).map_err(|e| self.src_err("reading metadata of", rel, e))?;
        let a = match fsx::lstat_at(old, name) {
            Ok(a) => Some(a),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(self.src_err("reading metadata of", rel, e)),
        };
        let dirs = a.as_ref().is_some_and(|a| {
            fsx::file_type(a) == FileType::Directory && fsx::file_type(&b) == FileType::Directory
        });
        if dirs {
            let (od, nd) = (
                fsx::open_dir_at(old, name)
                    .map_err(|e| self.src_err("opening directory", rel, e))?,
                fsx::open_dir_at(new, name)
                    .map_err(|e| self.src_err("opening directory", rel, e))?,
            );
            let became_opaque = fsx::is_opaque(nd.as_fd())
                .map_err(|e| self.src_err("reading extended attributes of", rel, e))?
                && !fsx::is_opaque(od.as_fd())
                    .map_err(|e| self.src_err("reading extended attributes of", rel, e))?;
            if !became_opaque {
                rfs::mkdirat(out, name, Mode::from_raw_mode(0o700))
                    .map_err(|e| self.dst_err("creating directory", rel, e))?;
                let o = fsx::open_dir_at(out, name)
                    .map_err(|e| self.dst_err("opening directory", rel, e))?;
                self.diff_dir(od.as_fd(), nd.as_fd(), o.as_fd(), rel, depth + 1)?;
                self.meta_fd(nd.as_fd(), o.as_fd(), &b, rel)?;
                // Over `old`, it merges: opaque there already (if at all), not here.
                let cname = fsx::cstr(OPAQUE).map_err(|e| self.dst_err("naming", rel, e))?;
                match rfs::fremovexattr(o.as_fd(), &cname) {
                    Ok(()) | Err(Errno::NODATA) => {}
                    Err(e) => return Err(self.dst_err("removing extended attribute of", rel, e)),
                }
                // A directory that holds no change and kept its attributes is left out.
                let empty = fsx::read_names(o.as_fd())
                    .map_err(|e| self.dst_err("reading directory", rel, e))?
                    .is_empty();
                let a = a.expect("a directory on both sides");
                let attrs = |fd: BorrowedFd<'_>| {
                    fsx::read_xattrs(XattrOf::Fd(fd), |n| !n.starts_with(b"trusted.overlay."))
                };
                let kept = (a.st_mode, a.st_uid, a.st_gid) == (b.st_mode, b.st_uid, b.st_gid)
                    && (a.st_mtime, a.st_mtime_nsec) == (b.st_mtime, b.st_mtime_nsec)
                    && attrs(od.as_fd())
                        .map_err(|e| self.src_err("reading extended attributes of", rel, e))?
                        == attrs(nd.as_fd())
                            .map_err(|e| self.src_err("reading extended attributes of", rel, e))?;
                if empty && kept {
                    drop(o);
                    rfs::unlinkat(out, name, AtFlags::REMOVEDIR)
                        .map_err(|e| self.dst_err("removing", rel, e))?;
                }
                return Ok(());
            }
        } else if let Some(a) = &a {
            let same =
                same_entry(old, new, name, a, &b).map_err(|e| self.src_err("comparing", rel, e))?;
            if same {
                return Ok(());
            }
        }
        self.one(new, out, name, rel, depth)
    }
}
