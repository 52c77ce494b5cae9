//! btrfs subvolumes and snapshots, through the filesystem's own ioctls.
//!
//! forkd keeps every sandbox's writable overlay layer in a btrfs subvolume, so that a
//! filesystem checkpoint is a read-only snapshot of that subvolume: the kernel shares
//! the whole tree copy-on-write, and the cost does not depend on how much data the
//! layer holds.
//!
//! The ioctl numbers and argument structures are those of the kernel UAPI header
//! `linux/btrfs.h`; they are stable ABI. Every call names its target as a directory
//! descriptor plus one path component, like the `*at` system calls, so that a path can
//! never be re-resolved between checks.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::check;

/// `statfs.f_type` of a btrfs filesystem.
pub const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;

/// Inode number of the root directory of every btrfs subvolume
/// (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOLUME_ROOT_INODE: u64 = 256;

const BTRFS_IOCTL_MAGIC: u32 = 0x94;
/// `BTRFS_PATH_NAME_MAX`: `btrfs_ioctl_vol_args.name` holds this many bytes plus a NUL.
const PATH_NAME_MAX: usize = 4087;
/// `BTRFS_SUBVOL_NAME_MAX`: `btrfs_ioctl_vol_args_v2.name` holds this many bytes plus a
/// NUL.
const SUBVOL_NAME_MAX: usize = 4039;
/// `BTRFS_SUBVOL_RDONLY`: the subvolume (or snapshot) refuses every modification.
const SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2` (the unions are spelled as their largest member).
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    /// `size` and `qgroup_inherit`, or `unused[4]`.
    unused: [u64; 4],
    /// `name`, or `devid` / `subvolid`.
    name: [u8; SUBVOL_NAME_MAX + 1],
}

const _: () = assert!(std::mem::size_of::<VolArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == 4096);

/// The kernel's `_IOC(dir, type, nr, size)` encoding (x86, arm, riscv layout).
const fn ioc(dir: u32, nr: u32, size: usize) -> libc::c_ulong {
    ((dir << 30) | ((size as u32) << 16) | (BTRFS_IOCTL_MAGIC << 8) | nr) as libc::c_ulong
}
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

const IOC_SNAP_DESTROY: libc::c_ulong = ioc(IOC_WRITE, 15, std::mem::size_of::<VolArgs>());
const IOC_SUBVOL_CREATE: libc::c_ulong = ioc(IOC_WRITE, 14, std::mem::size_of::<VolArgs>());
const IOC_SNAP_CREATE_V2: libc::c_ulong = ioc(IOC_WRITE, 23, std::mem::size_of::<VolArgsV2>());
const IOC_SUBVOL_GETFLAGS: libc::c_ulong = ioc(IOC_READ, 25, std::mem::size_of::<u64>());
const IOC_SUBVOL_SETFLAGS: libc::c_ulong = ioc(IOC_WRITE, 26, std::mem::size_of::<u64>());
const IOC_RESIZE: libc::c_ulong = ioc(IOC_WRITE, 3, std::mem::size_of::<VolArgs>());
const IOC_DEV_INFO: libc::c_ulong =
    ioc(IOC_WRITE | IOC_READ, 30, std::mem::size_of::<DevInfoArgs>());

/// `struct btrfs_ioctl_dev_info_args` (`fsid` of newer headers is in `unused`).
#[repr(C)]
struct DevInfoArgs {
    devid: u64,
    uuid: [u8; 16],
    bytes_used: u64,
    total_bytes: u64,
    unused: [u64; 379],
    path: [u8; 1024],
}
const _: () = assert!(std::mem::size_of::<DevInfoArgs>() == 4096);

const IOC_INO_LOOKUP: libc::c_ulong = ioc(IOC_WRITE | IOC_READ, 18, 4096);
const IOC_QUOTA_CTL: libc::c_ulong = ioc(IOC_WRITE | IOC_READ, 40, 16);
const IOC_QGROUP_LIMIT: libc::c_ulong = ioc(IOC_READ, 43, 48);
/// `BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA` (Linux 6.7).
const QUOTA_CTL_ENABLE_SIMPLE: u64 = 4;
/// `BTRFS_QGROUP_LIMIT_MAX_EXCL`.
const QGROUP_LIMIT_MAX_EXCL: u64 = 1 << 1;

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}
const _: () = assert!(std::mem::size_of::<InoLookupArgs>() == 4096);

/// `struct btrfs_ioctl_qgroup_limit_args` with its `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}
const _: () = assert!(std::mem::size_of::<QgroupLimitArgs>() == 48);

const IOC_FS_INFO: libc::c_ulong = ioc(IOC_READ, 31, 1024);

/// The filesystem id (as `/sys/fs/btrfs/<uuid>` names it) of the btrfs filesystem
/// holding `fd`.
pub fn filesystem_uuid(fd: BorrowedFd<'_>) -> io::Result<String> {
    let mut args = Box::new([0u8; 1024]);
    // SAFETY: FS_INFO writes one btrfs_ioctl_fs_info_args (1024 bytes) into `args`.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), IOC_FS_INFO, args.as_mut_ptr()) };
    check(ret as libc::c_long)?;
    // max_id (u64), num_devices (u64), then fsid[16].
    let id = &args[16..32];
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// The id of the subvolume holding the file open as `fd` (its tree id).
pub fn subvolume_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut args = Box::new(InoLookupArgs {
        treeid: 0,
        objectid: SUBVOLUME_ROOT_INODE,
        name: [0; 4080],
    });
    // SAFETY: INO_LOOKUP reads and writes one btrfs_ioctl_ino_lookup_args, which `args`
    // is, alive and writable for the whole call.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), IOC_INO_LOOKUP, &mut *args) };
    check(ret as libc::c_long)?;
    Ok(args.treeid)
}

/// Turns on btrfs's simple quotas (Linux 6.7) on the filesystem `fs`: each extent is
/// charged to the subvolume that wrote it, for as long as it exists, whoever shares it
/// later (snapshots, reflinks). Idempotent. `EINVAL` on kernels without them.
pub fn enable_simple_quotas(fs: BorrowedFd<'_>) -> io::Result<()> {
    let mut args = [QUOTA_CTL_ENABLE_SIMPLE, 0u64];
    // SAFETY: QUOTA_CTL reads and writes one btrfs_ioctl_quota_ctl_args (two u64), which
    // `args` is.
    let ret = unsafe { libc::ioctl(fs.as_raw_fd(), IOC_QUOTA_CTL, args.as_mut_ptr()) };
    check(ret as libc::c_long)?;
    Ok(())
}

/// Limits what the subvolume holding `subvolume` may be charged to `max_bytes` (`None`:
/// no limit). Past it, writes there fail with `EDQUOT`.
pub fn set_quota_limit(subvolume: BorrowedFd<'_>, max_bytes: Option<u64>) -> io::Result<()> {
    let args = QgroupLimitArgs {
        // 0: the subvolume of the descriptor.
        qgroupid: 0,
        flags: QGROUP_LIMIT_MAX_EXCL,
        max_rfer: 0,
        max_excl: max_bytes.unwrap_or(u64::MAX),
        rsv_rfer: 0,
        rsv_excl: 0,
    };
    // SAFETY: QGROUP_LIMIT reads one btrfs_ioctl_qgroup_limit_args, which `args` is.
    let ret = unsafe { libc::ioctl(subvolume.as_raw_fd(), IOC_QGROUP_LIMIT, &args) };
    check(ret as libc::c_long)?;
    Ok(())
}

/// One device of a btrfs filesystem as the kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSize {
    /// The size the filesystem uses of the device (what a resize sets).
    pub total_bytes: u64,
    /// What its chunks take of it.
    pub bytes_used: u64,
}

/// The size of device `devid` of the btrfs filesystem `fs` (any descriptor in it).
pub fn device_size(fs: BorrowedFd<'_>, devid: u64) -> io::Result<DeviceSize> {
    let mut args = Box::new(DevInfoArgs {
        devid,
        uuid: [0; 16],
        bytes_used: 0,
        total_bytes: 0,
        unused: [0; 379],
        path: [0; 1024],
    });
    // SAFETY: DEV_INFO reads and writes one btrfs_ioctl_dev_info_args, which `args` is,
    // alive and writable for the whole call.
    let ret = unsafe { libc::ioctl(fs.as_raw_fd(), IOC_DEV_INFO, &mut *args) };
    check(ret as libc::c_long)?;
    Ok(DeviceSize {
        total_bytes: args.total_bytes,
        bytes_used: args.bytes_used,
    })
}

/// Sets the size the btrfs filesystem `fs` uses of its device `devid` to `bytes`
/// (growing is immediate; shrinking moves the chunks beyond the new end first).
pub fn resize(fs: BorrowedFd<'_>, devid: u64, bytes: u64) -> io::Result<()> {
    let mut args = Box::new(VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    });
    let spec = format!("{devid}:{bytes}");
    args.name[..spec.len()].copy_from_slice(spec.as_bytes());
    // SAFETY: RESIZE reads one btrfs_ioctl_vol_args, which `args` is, alive for the call.
    let ret = unsafe { libc::ioctl(fs.as_raw_fd(), IOC_RESIZE, &*args) };
    check(ret as libc::c_long)?;
    // A positive answer is btrfs's own error (another exclusive operation runs): nothing
    // was resized.
    if ret > 0 {
        return Err(io::Error::other(format!(
            "btrfs refused the resize ({ret}: another exclusive operation is running)"
        )));
    }
    Ok(())
}

/// Copies `name` into a fixed-size, NUL-padded ioctl name field, refusing anything but a
/// single path component (the kernel would refuse it too, with a vaguer `EINVAL`).
fn copy_name(name: &CStr, field: &mut [u8]) -> io::Result<()> {
    let bytes = name.to_bytes();
    let refuse = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("subvolume name {name:?} {why}"),
        ))
    };
    if bytes.is_empty() || bytes == b"." || bytes == b".." {
        return refuse("is not a file name");
    }
    if bytes.contains(&b'/') {
        return refuse("must be a single path component");
    }
    // NAME_MAX: longer names could never be looked up again.
    if bytes.len() > 255 || bytes.len() >= field.len() {
        return refuse("is longer than 255 bytes");
    }
    field[..bytes.len()].copy_from_slice(bytes);
    field[bytes.len()..].fill(0);
    Ok(())
}

fn vol_args(name: &CStr) -> io::Result<Box<VolArgs>> {
    let mut args = Box::new(VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    });
    copy_name(name, &mut args.name)?;
    Ok(args)
}

/// Creates an empty subvolume `name` in the directory `parent` (which must be on btrfs).
pub fn create_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let args = vol_args(name)?;
    // SAFETY: SUBVOL_CREATE reads one btrfs_ioctl_vol_args, which `args` is (layout and
    // size checked above), NUL-terminated, and alive for the whole call.
    let ret = unsafe { libc::ioctl(parent.as_raw_fd(), IOC_SUBVOL_CREATE, &*args) };
    check(ret as libc::c_long)?;
    Ok(())
}

/// Snapshots the subvolume whose root directory is open as `src` into a new subvolume
/// `name` in the directory `dst_parent`. With `readonly` the snapshot refuses every
/// write (`EROFS`), which makes it a stable checkpoint.
///
/// The cost does not depend on the size of the subvolume: the snapshot shares every
/// extent and tree block copy-on-write. The kernel flushes `src`'s dirty data first.
pub fn snapshot(
    src: BorrowedFd<'_>,
    dst_parent: BorrowedFd<'_>,
    name: &CStr,
    readonly: bool,
) -> io::Result<()> {
    let mut args = Box::new(VolArgsV2 {
        fd: i64::from(src.as_raw_fd()),
        transid: 0,
        flags: if readonly { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: [0; SUBVOL_NAME_MAX + 1],
    });
    copy_name(name, &mut args.name)?;
    // SAFETY: SNAP_CREATE_V2 reads one btrfs_ioctl_vol_args_v2, which `args` is (layout
    // and size checked above), NUL-terminated, with no qgroup pointer (flags do not ask
    // for one), and alive for the whole call. `src` stays open for the call.
    let ret = unsafe { libc::ioctl(dst_parent.as_raw_fd(), IOC_SNAP_CREATE_V2, &*args) };
    check(ret as libc::c_long)?;
    Ok(())
}

/// Deletes the subvolume (or snapshot) `name` in the directory `parent`, with whatever
/// it contains, except subvolumes nested inside it (`ENOTEMPTY`). A read-only snapshot
/// has its read-only flag cleared first if the kernel refuses to delete it as it is.
pub fn delete_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let args = vol_args(name)?;
    let destroy = || {
        // SAFETY: SNAP_DESTROY reads one btrfs_ioctl_vol_args, which `args` is, alive for
        // the whole call.
        let ret = unsafe { libc::ioctl(parent.as_raw_fd(), IOC_SNAP_DESTROY, &*args) };
        check(ret as libc::c_long)
    };
    match destroy() {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EROFS)) => {
            let subvolume = openat_dir(parent, name)?;
            if !is_readonly(subvolume.as_fd())? {
                return Err(e);
            }
            set_readonly(subvolume.as_fd(), false)?;
            drop(subvolume);
            destroy().map(drop)
        }
        Err(e) => Err(e),
    }
}

/// Is the subvolume whose root directory is open as `subvolume` read-only?
pub fn is_readonly(subvolume: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(subvolume_flags(subvolume)? & SUBVOL_RDONLY != 0)
}

fn subvolume_flags(subvolume: BorrowedFd<'_>) -> io::Result<u64> {
    let mut flags: u64 = 0;
    // SAFETY: SUBVOL_GETFLAGS writes one u64 to the pointer, which is valid and writable.
    let ret = unsafe { libc::ioctl(subvolume.as_raw_fd(), IOC_SUBVOL_GETFLAGS, &mut flags) };
    check(ret as libc::c_long)?;
    Ok(flags)
}

/// Makes the subvolume whose root directory is open as `subvolume` read-only or
/// writable again.
pub fn set_readonly(subvolume: BorrowedFd<'_>, readonly: bool) -> io::Result<()> {
    let flags = subvolume_flags(subvolume)?;
    let flags = if readonly {
        flags | SUBVOL_RDONLY
    } else {
        flags & !SUBVOL_RDONLY
    };
    // SAFETY: SUBVOL_SETFLAGS reads one u64 from the pointer, which is valid.
    let ret = unsafe { libc::ioctl(subvolume.as_raw_fd(), IOC_SUBVOL_SETFLAGS, &flags) };
    check(ret as libc::c_long)?;
    Ok(())
}

/// Is `path` on a btrfs filesystem?
pub fn is_btrfs(path: &Path) -> io::Result<bool> {
    Ok(filesystem_type(path)? == BTRFS_SUPER_MAGIC)
}

/// Is `path` the root directory of a btrfs subvolume (the filesystem's top level
/// included)? Does not follow a final symbolic link.
pub fn is_subvolume(path: &Path) -> io::Result<bool> {
    let meta = std::fs::symlink_metadata(path)?;
    Ok(meta.is_dir() && meta.ino() == SUBVOLUME_ROOT_INODE && is_btrfs(path)?)
}

/// `statfs(path).f_type`.
pub fn filesystem_type(path: &Path) -> io::Result<i64> {
    let path = crate::mount::c_path(path)?;
    // SAFETY: statfs is plain old data; all-zero is a valid value for it.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `buf` is writable for the whole call.
    check(unsafe { libc::statfs(path.as_ptr(), &mut buf) } as libc::c_long)?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
    Ok(buf.f_type as i64)
}

/// Opens the directory `name` in `parent` (not following a symbolic link).
fn openat_dir(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated and lives for the whole call; no memory is
    // written.
    let fd = check(unsafe {
        libc::openat(
            parent.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    } as libc::c_long)?;
    Ok(crate::own_fd(fd as RawFd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // Values as the C macros expand on x86_64.
        assert_eq!(IOC_SUBVOL_CREATE, 0x5000_940e);
        assert_eq!(IOC_SNAP_DESTROY, 0x5000_940f);
        assert_eq!(IOC_SNAP_CREATE_V2, 0x5000_9417);
        assert_eq!(IOC_SUBVOL_GETFLAGS, 0x8008_9419);
        assert_eq!(IOC_SUBVOL_SETFLAGS, 0x4008_941a);
    }

    #[test]
    fn names_must_be_one_component() {
        let mut field = [0u8; 16];
        for bad in [c"", c".", c"..", c"a/b", c"/a"] {
            let e = copy_name(bad, &mut field).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        copy_name(c"snap-1", &mut field).unwrap();
        assert_eq!(&field[..7], b"snap-1\0");
    }

    #[test]
    fn tmp_is_not_a_subvolume() {
        if is_btrfs(Path::new("/tmp")).unwrap() {
            return;
        }
        assert!(!is_subvolume(Path::new("/tmp")).unwrap());
    }
}
