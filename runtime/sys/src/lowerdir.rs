//! Lower layers for overlayfs on kernels without `lowerdir+` (before Linux 6.8).
//!
//! There the whole stack goes in one `lowerdir` string, which `fsconfig` takes up to
//! 255 bytes long, `:` separating layers, `\` escaping, and (through the legacy mount
//! options of kernels whose overlayfs predates the new mount API) no `,` at all. Layer
//! paths are long and may hold any of those bytes. So the layers are not named by their
//! paths: a private directory holds a symbolic link to each layer under a one-byte name
//! that is none of those bytes, and the `lowerdir` string is those names joined by `:`,
//! resolved against that directory as the calling thread's working directory. 128
//! one-byte names and 127 separators are 255 bytes: the same depth limit as
//! `FORKD_MAX_LAYERS`' default, whatever the paths. The upper and work directories get
//! two-byte names the same way. The overlay is still built with `fsopen`..`fsmount` as a
//! detached mount: nothing enters a mount table.
//!
//! The working directory is the thread's own: the first use on a thread unshares its
//! filesystem attributes (`unshare(CLONE_FS)`), so the other threads of the daemon keep
//! theirs, and it is put back to `/` when the mount is made.

use std::cell::Cell;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::check;

/// The deepest stack one `lowerdir` string can name.
pub const MAX_LINKED_LOWERS: usize = 128;
/// The link names of the upper and work directories (two bytes: never a layer's).
pub(crate) const UPPER_LINK: &str = "up";
pub(crate) const WORK_LINK: &str = "wk";

/// One-byte names that neither overlayfs (`:` separates, `\` escapes) nor the legacy
/// mount options (`,` separates, `=` splits) read as anything but a name (and not `.`,
/// the directory itself).
fn names() -> Vec<u8> {
    (0x21u8..=0x7e)
        .chain(0xa1..=0xff)
        .filter(|b| !b":,\\/=.".contains(b))
        .take(MAX_LINKED_LOWERS)
        .collect()
}

/// A private directory of links to one overlay's layers; removed on drop.
pub(crate) struct LinkDir {
    path: PathBuf,
    dir: std::fs::File,
    /// The `lowerdir` value: the layers' link names, topmost first, joined by `:`.
    pub(crate) lowerdir: Vec<u8>,
}

impl LinkDir {
    /// Links `lowers` (topmost first) and, when given, the upper and work directories.
    pub(crate) fn new(lowers: &[&Path], upper: Option<(&Path, &Path)>) -> io::Result<LinkDir> {
        let names = names();
        if lowers.len() > names.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} layers: without lowerdir+ (Linux 6.8) an overlay takes at most {MAX_LINKED_LOWERS} (set FORKD_MAX_LAYERS to {MAX_LINKED_LOWERS} or less)",
                    lowers.len()
                ),
            ));
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "forkd-lowers-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("creating {}: {e}", path.display()))
                })?;
        }
        let dir = match std::fs::File::open(&path) {
            Ok(d) => d,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&path);
                return Err(e);
            }
        };
        let mut links = LinkDir {
            path,
            dir,
            lowerdir: Vec::with_capacity(lowers.len() * 2),
        };
        for (i, lower) in lowers.iter().enumerate() {
            let name = [names[i]];
            links.link(lower, OsStr::from_bytes(&name))?;
            if i > 0 {
                links.lowerdir.push(b':');
            }
            links.lowerdir.push(names[i]);
        }
        if let Some((upper, work)) = upper {
            links.link(upper, OsStr::new(UPPER_LINK))?;
            links.link(work, OsStr::new(WORK_LINK))?;
        }
        Ok(links)
    }

    fn link(&self, target: &Path, name: &OsStr) -> io::Result<()> {
        let abs = if target.is_absolute() {
            target.to_path_buf()
        } else {
            std::env::current_dir()?.join(target)
        };
        std::os::unix::fs::symlink(&abs, self.path.join(name)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("linking {} in {}: {e}", abs.display(), self.path.display()),
            )
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Makes this directory the calling thread's working directory until the guard
    /// drops.
    pub(crate) fn enter(&self) -> io::Result<Cwd> {
        private_fs()?;
        // SAFETY: a plain descriptor argument.
        check(unsafe { libc::fchdir(self.dir.as_raw_fd()) } as libc::c_long)?;
        Ok(Cwd)
    }
}

impl Drop for LinkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Puts the thread's working directory back to `/` when dropped.
pub(crate) struct Cwd;

impl Drop for Cwd {
    fn drop(&mut self) {
        // SAFETY: a NUL-terminated literal.
        unsafe { libc::chdir(c"/".as_ptr()) };
    }
}

thread_local! {
    static PRIVATE_FS: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread working-directory state of its own (once per thread).
fn private_fs() -> io::Result<()> {
    if PRIVATE_FS.with(Cell::get) {
        return Ok(());
    }
    // SAFETY: unsharing CLONE_FS affects only the calling thread's cwd, root and umask.
    check(unsafe { libc::unshare(libc::CLONE_FS) } as libc::c_long)
        .map_err(|e| io::Error::new(e.kind(), format!("unshare(CLONE_FS): {e}")))?;
    PRIVATE_FS.with(|p| p.set(true));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::{fd_path, overlay_with, LowerMode};
    use std::collections::BTreeMap;
    use std::os::fd::AsFd;

    /// Every file under `root` and its contents.
    fn tree(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut todo = vec![root.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let p = e.path();
                if e.file_type().unwrap().is_dir() {
                    todo.push(p);
                } else {
                    out.insert(
                        p.strip_prefix(root).unwrap().to_path_buf(),
                        std::fs::read(&p).unwrap(),
                    );
                }
            }
        }
        out
    }

    /// The fallback against `lowerdir+` on the same stacks (or, on a kernel without it,
    /// against the union made by hand): the deepest one, with layer paths holding every
    /// byte the option strings give a meaning to.
    #[test]
    fn linked_lowers_give_the_trees_lowerdir_plus_gives() {
        if !forkd_testing::require_root("linked_lowers_give_the_trees_lowerdir_plus_gives") {
            return;
        }
        let scratch = std::env::temp_dir().join(format!("forkd-sys-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let hostile = format!("a:b,c\\d=e f\ng{}", "x".repeat(150));
        let lowers: Vec<PathBuf> = (0..MAX_LINKED_LOWERS)
            .map(|i| {
                let d = scratch.join(format!("layers/{i:03}-{hostile}"));
                std::fs::create_dir_all(d.join("sub")).unwrap();
                std::fs::write(d.join("generation"), format!("{i}")).unwrap();
                std::fs::write(d.join(format!("sub/only-{i}")), format!("{i}")).unwrap();
                d
            })
            .collect();
        let refs: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
        let total: usize = refs.iter().map(|p| p.as_os_str().len() + 1).sum();
        assert!(
            total > 4096,
            "the paths would not fit one lowerdir string, or a page"
        );
        let linked = overlay_with(&refs, None, LowerMode::Links).unwrap();
        let b = tree(&fd_path(linked.as_fd()));
        // What lowerdir+ builds; on a kernel without it (before 6.8), the union the
        // overlay must show, made here: the layers bottom up, each over the ones below.
        let a = if crate::probe::lowerdir_plus() == Some(true) {
            let appended = overlay_with(&refs, None, LowerMode::Append).unwrap();
            tree(&fd_path(appended.as_fd()))
        } else {
            refs.iter().rev().fold(BTreeMap::new(), |mut union, layer| {
                union.extend(tree(layer));
                union
            })
        };
        assert_eq!(a.len(), MAX_LINKED_LOWERS + 1);
        assert_eq!(a, b);
        assert_eq!(b[Path::new("generation")], b"0", "the topmost layer wins");

        // Writable: changes land in the upper directory, whose path is hostile too.
        let upper = scratch.join(format!("rw/upper-{hostile}"));
        let work = scratch.join(format!("rw/work-{hostile}"));
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let rw = overlay_with(&refs[..3], Some((&upper, &work)), LowerMode::Links).unwrap();
        std::fs::write(fd_path(rw.as_fd()).join("generation"), "new").unwrap();
        assert_eq!(std::fs::read(upper.join("generation")).unwrap(), b"new");
        assert_eq!(std::fs::read(lowers[0].join("generation")).unwrap(), b"0");
        drop((linked, rw));

        // One layer more than one string can name is refused by name.
        let more: Vec<&Path> = refs.iter().copied().chain([refs[0]]).collect();
        let e = overlay_with(&more, None, LowerMode::Links)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("at most 128") && e.contains("FORKD_MAX_LAYERS"),
            "{e}"
        );
        // The links are gone, and the thread's working directory is / again. (Another
        // test of this process may be building an overlay with links this moment, on a
        // kernel without lowerdir+: its directory lives for that build only.)
        let left = || -> Vec<_> {
            std::fs::read_dir(std::env::temp_dir())
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("forkd-lowers-{}-", std::process::id()))
                })
                .map(|e| e.path())
                .collect()
        };
        let mut tries = 0;
        while !left().is_empty() && tries < 50 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            tries += 1;
        }
        assert!(left().is_empty(), "{:?}", left());
        assert_eq!(std::env::current_dir().unwrap(), Path::new("/"));
        std::fs::remove_dir_all(&scratch).unwrap();
    }

    #[test]
    fn names_are_single_bytes_that_nothing_parses() {
        let n = names();
        assert_eq!(n.len(), MAX_LINKED_LOWERS);
        let mut sorted = n.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), n.len(), "distinct");
        for b in b":,\\/=.\0 " {
            assert!(!n.contains(b), "{b}");
        }
        // 128 names and 127 separators fit the 255 bytes fsconfig takes.
        assert_eq!(n.len() * 2 - 1, 255);
    }
}
