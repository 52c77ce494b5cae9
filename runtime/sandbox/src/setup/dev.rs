//! The sandbox's own `/dev`: the device nodes, directories and links a program expects,
//! made without following a symlink the image put there.

use super::*;

/// What the root's own `dev/` directory must hold besides the device nodes.
enum DevEntry {
    Dir(u32),
    Symlink(&'static str),
}

const DEV_ENTRIES: &[(&str, DevEntry)] = &[
    ("pts", DevEntry::Dir(0o755)),
    // POSIX shared memory: a directory of the root filesystem, so it is part of the
    // writable layer and of checkpoints like any other file.
    ("shm", DevEntry::Dir(0o1777)),
    ("ptmx", DevEntry::Symlink("pts/ptmx")),
    ("fd", DevEntry::Symlink("/proc/self/fd")),
    ("stdin", DevEntry::Symlink("/proc/self/fd/0")),
    ("stdout", DevEntry::Symlink("/proc/self/fd/1")),
    ("stderr", DevEntry::Symlink("/proc/self/fd/2")),
];

/// Makes `root/dev` what a sandbox needs (see [`make_dev`]). The daemon uses it to give
/// its runtime layer, the topmost lower layer of every sandbox, a ready `/dev`, so that a
/// sandbox's set-up normally finds everything in place and writes nothing.
pub fn populate_dev(root: &Path) -> std::io::Result<()> {
    make_dev(root).map_err(|(step, msg)| std::io::Error::other(format!("{step}: {msg}")))
}

/// Makes the root's `dev/` what a sandbox needs: the standard device nodes
/// ([`forkd_layers::devices::DEVICES`]), `pts/` (for a devpts instance), `shm/` and the
/// usual symlinks. `/dev` is not a mount: CRIU would save and restore a tmpfs there
/// with an external tar on every live checkpoint and fork (about 4 ms each way), while
/// the root filesystem is forkd's own to snapshot. Entries already right are left
/// alone: they normally come from the runtime layer ([`populate_dev`]), and only what a
/// sandbox removed or an image shadows is made again, in its writable layer.
/// Everything is done through a descriptor of `dev/` opened without following
/// symlinks, and no entry is ever followed: an image whose `dev` or `dev/null` is a
/// symlink cannot make this write outside the root.
pub(super) fn make_dev(root: &Path) -> StepResult<()> {
    use nix::errno::Errno;
    use nix::sys::stat::{fchmodat, fstatat, mkdirat, mknodat, FchmodatFlags};
    use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};
    let fail = |what: String, e: Errno| ("devices", format!("{what}: {e}"));
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let root_fd = nix::fcntl::open(root, dir_flags, Mode::empty())
        .map(forkd_sys::own_fd)
        .map_err(|e| fail(format!("open {}", root.display()), e))?;
    let rfd = root_fd.as_raw_fd();
    // Removes what is in the way of an entry (an empty directory included).
    let remove = |dir: i32, name: &str, st: &nix::sys::stat::FileStat| -> StepResult<()> {
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let how = if is_dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        unlinkat(Some(dir), name, how).map_err(|e| fail(format!("replace dev/{name}"), e))
    };
    let lstat = |dir: i32, name: &str| -> StepResult<Option<nix::sys::stat::FileStat>> {
        match fstatat(Some(dir), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(fail(format!("stat dev/{name}"), e)),
        }
    };
    let chmod_at = |dir: i32, name: &str, mode: u32| -> StepResult<()> {
        // mkdirat and mknodat honour the umask; set the mode exactly. The entry was
        // just made by this process, so following it is safe.
        fchmodat(
            Some(dir),
            name,
            Mode::from_bits_truncate(mode),
            FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| fail(format!("chmod dev/{name}"), e))
    };

    if let Some(st) = lstat(rfd, "dev")? {
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            unlinkat(Some(rfd), "dev", UnlinkatFlags::NoRemoveDir)
                .map_err(|e| fail("replace dev".into(), e))?;
        }
    }
    match mkdirat(Some(rfd), "dev", Mode::from_bits_truncate(0o755)) {
        Ok(()) => chmod_at(rfd, "dev", 0o755)?,
        Err(Errno::EEXIST) => {}
        Err(e) => return Err(fail("mkdir dev".into(), e)),
    }
    let dev_fd = nix::fcntl::openat(Some(rfd), "dev", dir_flags, Mode::empty())
        .map(forkd_sys::own_fd)
        .map_err(|e| fail("open dev".into(), e))?;
    let dfd = dev_fd.as_raw_fd();

    for d in forkd_layers::devices::DEVICES {
        let rdev = makedev(d.major.into(), d.minor.into());
        match lstat(dfd, d.name)? {
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == rdev => {
                continue
            }
            Some(st) => remove(dfd, d.name, &st)?,
            None => {}
        }
        mknodat(
            Some(dfd),
            d.name,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(d.mode),
            rdev,
        )
        .map_err(|e| fail(format!("mknod dev/{}", d.name), e))?;
        chmod_at(dfd, d.name, d.mode)?;
    }
    for (name, entry) in DEV_ENTRIES {
        let st = lstat(dfd, name)?;
        match entry {
            DevEntry::Dir(mode) => {
                if let Some(st) = &st {
                    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                        continue;
                    }
                    remove(dfd, name, st)?;
                }
                mkdirat(Some(dfd), *name, Mode::from_bits_truncate(*mode))
                    .map_err(|e| fail(format!("mkdir dev/{name}"), e))?;
                chmod_at(dfd, name, *mode)?;
            }
            DevEntry::Symlink(target) => {
                if let Some(st) = &st {
                    let same = st.st_mode & libc::S_IFMT == libc::S_IFLNK
                        && nix::fcntl::readlinkat(Some(dfd), *name)
                            .is_ok_and(|t| t.as_os_str() == *target);
                    if same {
                        continue;
                    }
                    remove(dfd, name, st)?;
                }
                symlinkat(*target, Some(dfd), *name)
                    .map_err(|e| fail(format!("symlink dev/{name}"), e))?;
            }
        }
    }
    Ok(())
}
