//! Small descriptor-based filesystem helpers shared by the copier, the tar
//! extractor and the store: opening directories without following symlinks,
//! reading and writing extended attributes, removing trees relative to a
//! directory descriptor, and opening a file strictly beneath a root.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags, XattrFlags};
use rustix::io::Errno;

/// Flags for opening a directory component: never follow a symlink, never
/// leak the descriptor into a child.
pub(crate) const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Extended attributes that change what a tree means to overlayfs or to the
/// kernel's permission checks. These are hashed, and failing to copy one is
/// an error.
pub(crate) const SIGNIFICANT_XATTRS: [&[u8]; 3] = [
    b"trusted.overlay.opaque",
    b"trusted.overlay.redirect",
    b"security.capability",
];

/// overlayfs's mark of an opaque directory (value `y`).
pub(crate) const OPAQUE: &[u8] = b"trusted.overlay.opaque";

/// Whether the directory open as `dir` is marked opaque.
pub(crate) fn is_opaque(dir: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(read_xattrs(XattrOf::Fd(dir), |n| n == OPAQUE)?
        .iter()
        .any(|(_, v)| v.as_slice() == b"y"))
}

pub(crate) fn is_significant_xattr(name: &[u8]) -> bool {
    SIGNIFICANT_XATTRS.contains(&name)
}

/// Opens a directory given by a (trusted) path. Symlinks in the path itself
/// are followed: this is the caller-chosen root, not archive data.
pub(crate) fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    Ok(rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the directory `name` inside `dir`, refusing symlinks.
pub(crate) fn open_dir_at<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    name: P,
) -> Result<OwnedFd, Errno> {
    rfs::openat(dir, name, DIR_FLAGS, Mode::empty())
}

/// `lstat` relative to a directory descriptor.
pub(crate) fn lstat_at<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    name: P,
) -> Result<rfs::Stat, Errno> {
    rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
}

pub(crate) fn file_type(st: &rfs::Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// Opens `rel` (a relative path) strictly beneath `root`: no `..` escapes,
/// no symlinks anywhere in the path, no magic links. Used to read files out
/// of untrusted trees (an extracted archive, a user's OCI layout).
pub(crate) fn open_file_beneath(root: &Path, rel: &str) -> io::Result<File> {
    let dir = open_dir_path(root)?;
    let fd = rfs::openat2(
        dir.as_fd(),
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| match e {
        Errno::XDEV | Errno::LOOP => io::Error::new(
            io::ErrorKind::InvalidInput,
            "path leaves the directory or goes through a symlink",
        ),
        e => e.into(),
    })?;
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Where to read or write extended attributes.
#[derive(Clone, Copy)]
pub(crate) enum XattrOf<'a> {
    Fd(BorrowedFd<'a>),
    /// A path whose final component is not followed (`l*xattr`).
    Path(&'a Path),
}

impl XattrOf<'_> {
    fn list(&self, buf: &mut [u8]) -> Result<usize, Errno> {
        match self {
            XattrOf::Fd(fd) => rfs::flistxattr(fd, buf),
            XattrOf::Path(p) => rfs::llistxattr(*p, buf),
        }
    }
    fn get(&self, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
        match self {
            XattrOf::Fd(fd) => rfs::fgetxattr(fd, name, buf),
            XattrOf::Path(p) => rfs::lgetxattr(*p, name, buf),
        }
    }
}

fn unsupported(e: Errno) -> bool {
    e == Errno::OPNOTSUPP || e == Errno::NOTSUP
}

/// Reads the extended attributes for which `keep(name)` is true, sorted by
/// name. A filesystem without xattr support reads as "none".
pub(crate) fn read_xattrs(
    of: XattrOf<'_>,
    keep: impl Fn(&[u8]) -> bool,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut list = vec![0u8; 512];
    let len = loop {
        match of.list(&mut list) {
            Ok(n) => break n,
            Err(Errno::RANGE) => {
                let n = list.len() * 4;
                list.resize(n, 0);
            }
            Err(e) if unsupported(e) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    };
    let mut out = Vec::new();
    if len == 0 {
        return Ok(out);
    }
    let mut value = vec![0u8; 256];
    for name in list[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if !keep(name) {
            continue;
        }
        let cname = CString::new(name).expect("xattr names from the kernel have no NUL");
        let n = loop {
            match of.get(&cname, &mut value) {
                Ok(n) => break Some(n),
                Err(Errno::RANGE) => {
                    let n = value.len() * 4;
                    value.resize(n, 0);
                }
                // Removed between list and get.
                Err(Errno::NODATA) => break None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(n) = n {
            out.push((name.to_vec(), value[..n].to_vec()));
        }
    }
    out.sort();
    Ok(out)
}

/// Sets one extended attribute.
pub(crate) fn write_xattr(of: XattrOf<'_>, name: &[u8], value: &[u8]) -> io::Result<()> {
    let cname = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name contains NUL"))?;
    match of {
        XattrOf::Fd(fd) => rfs::fsetxattr(fd, &cname, value, XattrFlags::empty())?,
        XattrOf::Path(p) => rfs::lsetxattr(p, &cname, value, XattrFlags::empty())?,
    }
    Ok(())
}

/// Removes `name` inside `dir` whatever it is; directories are removed
/// recursively through descriptors, so a symlink inside is removed, never
/// followed.
pub(crate) fn remove_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if file_type(&st) != FileType::Directory {
        return rfs::unlinkat(dir, name, AtFlags::empty());
    }
    let sub = open_dir_at(dir, name)?;
    let names = read_names(sub.as_fd())?;
    for child in &names {
        remove_at(sub.as_fd(), child)?;
    }
    drop(sub);
    rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

/// The names in a directory, without `.` and `..`.
pub(crate) fn read_names(dir: BorrowedFd<'_>) -> Result<Vec<CString>, Errno> {
    let mut names = Vec::new();
    let mut rd = rfs::Dir::read_from(dir)?;
    while let Some(ent) = rd.read() {
        let ent = ent?;
        let n = ent.file_name();
        if n == c"." || n == c".." {
            continue;
        }
        names.push(n.to_owned());
    }
    Ok(names)
}

pub(crate) fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

pub(crate) fn cstr(bytes: &[u8]) -> Result<CString, Errno> {
    CString::new(bytes).map_err(|_| Errno::INVAL)
}
