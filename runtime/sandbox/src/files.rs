//! `cp` in and out of a sandbox, carried out inside the sandbox itself.
//!
//! The daemon runs `/.forkd/init __tar PATH` or `/.forkd/init __untar DEST` through the
//! sandbox's init, like any exec, with the tar stream on stdout or stdin. The tool runs
//! in the sandbox's own mount namespace and root, so every path, symlinks included,
//! resolves inside the sandbox: there is no host path to escape to. Within the sandbox,
//! entries with `..` or absolute paths are still refused and symlinks are never
//! followed when writing, so a copy lands exactly where it was asked to.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

/// Writes a tar of `path` (a file, a directory tree, or a symlink, not followed) to
/// stdout; the archive's top entry is the path's last component.
pub fn tar_main(path: &str) -> ! {
    let code = match write_tar(Path::new(path), io::stdout().lock()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{path}: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn write_tar<W: Write>(path: &Path, out: W) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    let name = path
        .file_name()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    if meta.is_dir() {
        b.append_dir_all(&name, path)?;
    } else {
        b.append_path_with_name(path, &name)?;
    }
    b.into_inner()?.flush()
}

/// Reads a tar from stdin and writes it at `dest`: into `dest` when it is an existing
/// directory, otherwise as `dest` itself (the archive's top entry renamed).
pub fn untar_main(dest: &str) -> ! {
    let code = match unpack(Path::new(dest), io::stdin().lock(), Side::Sandbox) {
        Ok(n) => {
            println!("{n}");
            0
        }
        Err(e) => {
            eprintln!("{dest}: {e}");
            1
        }
    };
    std::process::exit(code)
}

/// Creates the directory `path` and its missing parents (mode 0755, owned by whoever
/// runs it: root for an image build's COPY and WORKDIR steps).
pub fn mkdirs_main(path: &str) -> ! {
    let code = if !path.starts_with('/') {
        eprintln!("{path}: not an absolute path");
        1
    } else {
        match std::fs::create_dir_all(path) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{path}: {e}");
                1
            }
        }
    };
    std::process::exit(code)
}

fn safe_relative(p: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("archive entry {} leaves its directory", p.display()),
                ))
            }
        }
    }
    Ok(out)
}

/// Where an archive is unpacked, which decides what of it is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side<'a> {
    /// Inside a sandbox (`__untar`): owners and modes as the archive says.
    Sandbox,
    /// On the host (`forkd cp SANDBOX:PATH DEST`), from an archive the sandbox made: it
    /// may have been made by any program there (the sandbox's root can replace
    /// `/.forkd/init` in its own layer), so owners are not kept (the files are the
    /// caller's), setuid and setgid bits are dropped, and unpacked into an existing
    /// directory every entry must be below `top`, the name of what was asked for (else a
    /// copy into a home directory could bring a `.bashrc` beside it).
    Host { top: &'a Path },
}

/// Unpacks a tar at `dest`: into `dest` when it is an existing directory, otherwise as
/// `dest` itself (the archive's top entry renamed). Never writes outside `dest` or
/// through a symlink, whatever earlier entries made: `..` and absolute paths, a parent
/// that is a symlink, hard links and device nodes are refused, naming the entry.
/// Returns the number of entries written.
pub fn unpack<R: Read>(dest: &Path, input: R, side: Side<'_>) -> io::Result<u64> {
    let (dir, rename) = match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => (dest.to_path_buf(), None),
        _ => {
            let parent = dest
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("/"));
            let name = dest.file_name().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "destination has no file name")
            })?;
            if !std::fs::metadata(parent)
                .map(|m| m.is_dir())
                .unwrap_or(false)
            {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("directory {} does not exist", parent.display()),
                ));
            }
            (parent.to_path_buf(), Some(PathBuf::from(name)))
        }
    };
    let mut archive = tar::Archive::new(input);
    archive.set_preserve_permissions(true);
    let host = matches!(side, Side::Host { .. });
    archive.set_preserve_ownerships(!host);
    if host {
        // Removed from every mode: setuid and setgid.
        archive.set_mask(0o6000);
    }
    archive.set_overwrite(true);
    let mut n = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let mut rel = safe_relative(&raw)?;
        let kind = entry.header().entry_type();
        let refused = match kind {
            tar::EntryType::Link => Some("a hard link"),
            tar::EntryType::Block | tar::EntryType::Char => Some("a device node"),
            _ => None,
        };
        if let Some(what) = refused {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("archive entry {} is {what}; refusing it", raw.display()),
            ));
        }
        if let (Side::Host { top }, None) = (side, &rename) {
            let whole_root = top == Path::new(".");
            if !whole_root && rel.components().next() != top.components().next() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "archive entry {} is not below {}, what was asked for; refusing it",
                        raw.display(),
                        top.display()
                    ),
                ));
            }
        }

        if let Some(new_top) = &rename {
            let rest: PathBuf = rel.components().skip(1).collect();
            // `join` of an empty path would add a trailing `/`, which a file cannot have.
            rel = if rest.as_os_str().is_empty() {
                new_top.clone()
            } else {
                new_top.join(rest)
            };
        }
        if rel.as_os_str().is_empty() {
            continue;
        }
        let target = dir.join(&rel);
        // Never write through a symlink: every parent below `dir` must be a real directory.
        let mut walk = dir.clone();
        for c in rel.parent().into_iter().flat_map(|p| p.components()) {
            walk.push(c);
            match std::fs::symlink_metadata(&walk) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{} is a symlink; refusing to write through it",
                            walk.display()
                        ),
                    ))
                }
                _ => {}
            }
        }
        if let Ok(m) = std::fs::symlink_metadata(&target) {
            if m.file_type().is_symlink() || (!m.is_dir() && entry.header().entry_type().is_dir()) {
                std::fs::remove_file(&target)?;
            }
        }
        entry.unpack(&target)?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_round_trip_into_directory_and_as_new_name() {
        let base = std::env::temp_dir().join(format!("forkd-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("src/sub")).unwrap();
        std::fs::write(base.join("src/sub/bin"), [0u8, 1, 2, 255]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", base.join("src/link")).unwrap();
        let mut buf = Vec::new();
        write_tar(&base.join("src"), &mut buf).unwrap();

        std::fs::create_dir_all(base.join("into")).unwrap();
        unpack(&base.join("into"), &buf[..], Side::Sandbox).unwrap();
        assert_eq!(
            std::fs::read(base.join("into/src/sub/bin")).unwrap(),
            [0u8, 1, 2, 255]
        );
        assert_eq!(
            std::fs::read_link(base.join("into/src/link")).unwrap(),
            Path::new("/etc/passwd")
        );

        unpack(&base.join("renamed"), &buf[..], Side::Sandbox).unwrap();
        assert_eq!(
            std::fs::read(base.join("renamed/sub/bin")).unwrap(),
            [0u8, 1, 2, 255]
        );
        // A single file, written under a new name.
        let mut one = Vec::new();
        write_tar(&base.join("src/sub/bin"), &mut one).unwrap();
        unpack(&base.join("copied.bin"), &one[..], Side::Sandbox).unwrap();
        assert_eq!(
            std::fs::read(base.join("copied.bin")).unwrap(),
            [0u8, 1, 2, 255]
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn entries_that_leave_their_directory_are_refused() {
        assert!(safe_relative(Path::new("../x")).is_err());
        assert!(safe_relative(Path::new("/abs")).is_err());
        assert_eq!(
            safe_relative(Path::new("./a/b")).unwrap(),
            PathBuf::from("a/b")
        );
    }

    #[test]
    fn writing_through_a_symlinked_directory_is_refused() {
        let base = std::env::temp_dir().join(format!("forkd-files-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("dest")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), base.join("dest/evil")).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, "evil/file", &[b'x'][..]).unwrap();
        let data = b.into_inner().unwrap();
        for side in [
            Side::Sandbox,
            Side::Host {
                top: Path::new("evil"),
            },
        ] {
            let err = unpack(&base.join("dest"), &data[..], side).unwrap_err();
            assert!(err.to_string().contains("symlink"), "{err}");
            assert!(!base.join("outside/file").exists());
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn hard_links_and_devices_are_refused_and_the_host_drops_setuid() {
        let base = std::env::temp_dir().join(format!("forkd-files-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("dest")).unwrap();
        let one = |kind: tar::EntryType, name: &str, link: Option<&str>, mode: u32| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(if kind == tar::EntryType::Regular {
                1
            } else {
                0
            });
            h.set_mode(mode);
            if let Some(l) = link {
                h.set_link_name(l).unwrap();
            }
            if kind == tar::EntryType::Char {
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
            }
            h.set_cksum();
            let data: &[u8] = if kind == tar::EntryType::Regular {
                b"x"
            } else {
                b""
            };
            b.append_data(&mut h, name, data).unwrap();
            b.into_inner().unwrap()
        };
        let link = one(tar::EntryType::Link, "h", Some("/etc/hostname"), 0o644);
        let err = unpack(
            &base.join("dest"),
            &link[..],
            Side::Host {
                top: Path::new("h"),
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("h is a hard link"), "{err}");
        let dev = one(tar::EntryType::Char, "null", None, 0o666);
        let err = unpack(
            &base.join("dest"),
            &dev[..],
            Side::Host {
                top: Path::new("null"),
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("null is a device node"), "{err}");
        assert!(std::fs::read_dir(base.join("dest"))
            .unwrap()
            .next()
            .is_none());
        use std::os::unix::fs::PermissionsExt;
        let suid = one(tar::EntryType::Regular, "tool", None, 0o4755);
        unpack(
            &base.join("dest"),
            &suid[..],
            Side::Host {
                top: Path::new("tool"),
            },
        )
        .unwrap();
        let mode = std::fs::metadata(base.join("dest/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
