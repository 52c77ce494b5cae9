//! A loop volume that a full disk cannot turn read-only.
//!
//! A btrfs filesystem on a sparse image finds out that the disk under it is full only
//! when the loop device fails a write with an I/O error; btrfs then aborts its
//! transaction and forces the whole volume read-only, and every sandbox loses its
//! writes. So every byte the filesystem may use is allocated in the image before the
//! filesystem may use it:
//!
//! - the image's length is the most the volume may grow to ([`crate::SIZE_ENV`]), but the
//!   filesystem is told a smaller size (`mkfs.btrfs -b`, then the resize ioctl), and the
//!   image is allocated (`fallocate`) up to that size: btrfs never writes past it, and
//!   nothing it writes below it needs a block from the host;
//! - the volume is mounted `nodiscard`: a discard would punch holes in the image, and
//!   the next write there would need the host's space again;
//! - [`Volume::keep_ahead`], called by the daemon a few times a second, allocates more
//!   of the image and grows the filesystem before it fills, as long as the host keeps
//!   [`HOST_RESERVE_ENV`] free. When neither can grow, a writer gets `ENOSPC` from btrfs
//!   (a clean error, in that writer only) and the volume goes on.
//!
//! While the volume is full, every writer on it gets `ENOSPC`, the other sandboxes'
//! included: what bounds one sandbox's share is its disk limit.
//!
//! The cost: space the volume once used stays allocated to its image (no discard). A
//! volume that is the host's own btrfs is not managed here: btrfs answers `ENOSPC`
//! itself there.

use crate::{Volume, VolumeError};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Environment variable with the space the volume leaves free on the disk under it.
pub const HOST_RESERVE_ENV: &str = "FORKD_HOST_RESERVE";
/// Without [`HOST_RESERVE_ENV`]: 5% of the disk, at most 1 GiB.
const HOST_RESERVE_SHARE: u64 = 20;
const HOST_RESERVE_MAX: u64 = 1 << 30;
/// The size a new volume's filesystem starts at (or the whole image, if smaller).
pub const INITIAL_SIZE: u64 = 2 << 30;
/// The smallest filesystem a new volume starts with.
pub(crate) const MIN_INITIAL: u64 = 256 << 20;
/// Grow in steps of at least this much.
const MIN_STEP: u64 = 64 << 20;

/// Where the volume stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Space {
    /// The filesystem's size.
    pub fs_bytes: u64,
    /// What is free in it for new data: `statfs`'s `f_bavail`, less what btrfs's data
    /// space has promised or set aside and not yet counted as used (`bytes_may_use` for
    /// dirty data, `bytes_reserved` for extents being written, `bytes_pinned` for extents
    /// freed in the running transaction). A writer is refused `ENOSPC` against all of it,
    /// while `statfs` counts only the used bytes: with dirty data unbounded (Linux before
    /// 6.2 has no bdi `max_bytes`), a volume refusing every write showed 148 to 389 MiB
    /// free of 1012 MiB while its data in flight was written out.
    pub fs_free: u64,
    /// The most it may grow to (the image's length); equal to `fs_bytes` for a volume that
    /// is the host's own filesystem.
    pub max_bytes: u64,
    /// What the image has allocated on the disk under it.
    pub backed_bytes: u64,
    /// The disk under the image: its size and what is free on it.
    pub host_bytes: u64,
    pub host_free: u64,
    /// What the volume leaves free on that disk.
    pub host_reserve: u64,
}

impl Space {
    /// How far the filesystem may still grow: within the image, and keeping the host's
    /// reserve free.
    pub fn can_grow_to(&self) -> u64 {
        let budget = self.host_free.saturating_sub(self.host_reserve);
        // The bytes below fs_bytes not yet allocated come out of the budget first.
        let unbacked = self.fs_bytes.saturating_sub(self.backed_bytes);
        let end = self.fs_bytes + budget.saturating_sub(unbacked);
        end.min(self.max_bytes)
    }

    /// Whether the filesystem can still grow by a step.
    pub fn can_grow(&self) -> bool {
        self.can_grow_to() >= self.fs_bytes + MIN_STEP
    }

    /// The free space kept for the daemon's records and the sandboxes that are not
    /// filling the volume: a twentieth of it, from 256 MiB to 4 GiB, at most a quarter.
    pub fn reserve(&self) -> u64 {
        (self.fs_bytes / 20)
            .clamp(256 << 20, 4 << 30)
            .min(self.fs_bytes / 4)
    }

    /// Whether the volume is down to its reserve and cannot grow: the daemon then stops
    /// the largest writer (see the daemon's volume watcher).
    pub fn in_reserve(&self) -> bool {
        self.fs_free < self.reserve() && !self.can_grow()
    }

    /// Whether the volume is nearly full and cannot grow: writers are getting or about to
    /// get `ENOSPC`. The message says why, in plain words.
    pub fn pressure(&self) -> Option<String> {
        let low = (self.fs_bytes / 50).clamp(64 << 20, 1 << 30);
        if self.fs_free >= low || self.can_grow() {
            return None;
        }
        let why = if self.fs_bytes >= self.max_bytes {
            format!("it is at its most ({})", mib(self.max_bytes))
        } else {
            format!(
                "the disk under it has {} free and {} is kept for the host",
                mib(self.host_free),
                mib(self.host_reserve)
            )
        };
        Some(format!(
            "the volume is full: {} free of {}, and it cannot grow: {why}",
            mib(self.fs_free),
            mib(self.fs_bytes)
        ))
    }

    /// The size to grow to now, if the volume is filling and may grow.
    fn next_size(&self) -> Option<u64> {
        let low = (self.fs_bytes / 4).max(512 << 20);
        if self.fs_free >= low {
            return None;
        }
        let want = self.fs_bytes + (self.fs_bytes / 2).max(1 << 30);
        let to = want.min(self.can_grow_to());
        (to >= self.fs_bytes + MIN_STEP).then_some(to & !((1 << 20) - 1))
    }
}

/// Bytes in words: MiB, or GiB from 10 GiB on.
pub fn mib(b: u64) -> String {
    if b >= 10 << 30 {
        format!("{} GiB", b >> 30)
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// What [`Volume::keep_ahead`] did.
#[derive(Debug, Clone)]
pub struct Ahead {
    pub space: Space,
    /// The filesystem grew from, to.
    pub grew: Option<(u64, u64)>,
}

fn statvfs(path: &Path) -> Result<nix::sys::statvfs::Statvfs, VolumeError> {
    nix::sys::statvfs::statvfs(path)
        .map_err(|e| VolumeError::io("statfs", path)(std::io::Error::from_raw_os_error(e as i32)))
}

/// The host's reserve on a disk of `host_bytes`.
fn host_reserve(setting: Option<u64>, host_bytes: u64) -> u64 {
    setting.unwrap_or((host_bytes / HOST_RESERVE_SHARE).min(HOST_RESERVE_MAX))
}

/// What the disk holding `dir` can give the volume: its free space less the host's
/// reserve.
pub(crate) fn host_budget(dir: &Path, reserve: Option<u64>) -> Result<u64, VolumeError> {
    let v = statvfs(dir)?;
    let frsize = v.fragment_size();
    let reserve = host_reserve(reserve, v.blocks() * frsize);
    Ok((v.blocks_available() * frsize).saturating_sub(reserve))
}

impl Volume {
    /// Where the volume stands now.
    pub fn space(&self) -> Result<Space, VolumeError> {
        let vfs = statvfs(&self.root)?;
        let frsize = vfs.fragment_size();
        let promised: u64 = self.sysfs_dir().map_or(0, |d| {
            ["bytes_may_use", "bytes_reserved", "bytes_pinned"]
                .iter()
                .filter_map(|f| {
                    let text = std::fs::read_to_string(d.join("allocation/data").join(f)).ok()?;
                    text.trim().parse::<u64>().ok()
                })
                .sum()
        });
        let fs_free = (vfs.blocks_available() * frsize).saturating_sub(promised);
        let dir = File::open(&self.root).map_err(VolumeError::io("open", &self.root))?;
        let fs_bytes = match forkd_sys::btrfs::device_size(dir.as_fd(), 1) {
            Ok(d) => d.total_bytes,
            Err(_) => vfs.blocks() * frsize,
        };
        let Some(image) = &self.loop_image else {
            return Ok(Space {
                fs_bytes,
                fs_free,
                max_bytes: fs_bytes,
                backed_bytes: fs_bytes,
                host_bytes: fs_bytes,
                host_free: fs_free,
                host_reserve: 0,
            });
        };
        let meta = std::fs::metadata(image).map_err(VolumeError::io("stat", image))?;
        let host_dir = image.parent().unwrap_or(Path::new("/"));
        let host = statvfs(host_dir)?;
        let host_frsize = host.fragment_size();
        let host_bytes = host.blocks() * host_frsize;
        Ok(Space {
            fs_bytes,
            fs_free,
            max_bytes: meta.len(),
            backed_bytes: meta.blocks() * 512,
            host_bytes,
            host_free: host.blocks_available() * host_frsize,
            host_reserve: host_reserve(self.settings.host_reserve, host_bytes),
        })
    }

    /// Grows the filesystem before it fills, if the image and the host allow: allocates
    /// the image up to the new size, then tells btrfs. Cheap when nothing is to be done
    /// (two `statfs` and an ioctl).
    pub fn keep_ahead(&self) -> Result<Ahead, VolumeError> {
        let space = self.space()?;
        if self.loop_image.is_none() {
            return Ok(Ahead { space, grew: None });
        }
        let Some(to) = space.next_size() else {
            return Ok(Ahead { space, grew: None });
        };
        self.grow_to(space.fs_bytes, to)?;
        Ok(Ahead {
            space: self.space()?,
            grew: Some((space.fs_bytes, to)),
        })
    }

    /// Allocates the image from `from` to `to` and resizes the filesystem to `to`; never
    /// below its size now.
    fn grow_to(&self, from: u64, to: u64) -> Result<(), VolumeError> {
        let image = self.loop_image.as_ref().expect("a loop volume");
        let dir = File::open(&self.root).map_err(VolumeError::io("open", &self.root))?;
        let now = forkd_sys::btrfs::device_size(dir.as_fd(), 1)
            .map_err(VolumeError::io("read the size of", &self.root))?
            .total_bytes;
        if to <= now {
            return Ok(());
        }
        self.allocate(image, from.min(now), to)?;
        forkd_sys::btrfs::resize(dir.as_fd(), 1, to).map_err(VolumeError::io("resize", &self.root))
    }

    fn allocate(&self, image: &Path, from: u64, to: u64) -> Result<(), VolumeError> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(image)
            .map_err(VolumeError::io("open", image))?;
        nix::fcntl::fallocate(
            file.as_raw_fd(),
            nix::fcntl::FallocateFlags::empty(),
            from as i64,
            (to - from) as i64,
        )
        .map_err(|e| {
            VolumeError::io("allocate", image)(std::io::Error::from_raw_os_error(e as i32))
        })
    }

    /// Makes sure every byte the filesystem may use is allocated in its image (a volume
    /// made sparse by an older build, or one whose allocation a crash interrupted): the
    /// holes are filled if the host can spare them. Returns what it did, for the daemon's
    /// log; an error (no room to fill them) means the volume stays exposed to a full disk,
    /// which the caller reports.
    pub fn ensure_backed(&self) -> Result<Vec<String>, VolumeError> {
        let Some(image) = &self.loop_image else {
            return Ok(Vec::new());
        };
        let s = self.space()?;
        if s.backed_bytes >= s.fs_bytes {
            return Ok(Vec::new());
        }
        let missing = s.fs_bytes - s.backed_bytes;
        let budget = s.host_free.saturating_sub(s.host_reserve);
        if missing <= budget {
            // Fills the holes; allocated blocks keep their data.
            self.allocate(image, 0, s.fs_bytes)?;
            return Ok(vec![format!(
                "allocated the image's {} of holes under the filesystem ({})",
                mib(missing),
                image.display()
            )]);
        }
        // Not enough room to back it: said, left as it is (allocating part of it could
        // fill the disk; shrinking a filesystem moves its chunks, for as long as that
        // takes). Making the volume again (a new state root) gives one that is backed.
        Err(VolumeError::Unbacked {
            image: image.clone(),
            missing,
            free: s.host_free,
        })
    }

    /// Whether the volume is healthy: writable, and without device errors. Returns what
    /// is wrong, in words.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match statvfs(&self.root) {
            Ok(v) if v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) => out.push(format!(
                "the volume {} is read-only (btrfs stops writing after an I/O error: see the kernel log); unmount it and run `btrfs check` on {}",
                self.root.display(),
                self.loop_image.as_deref().unwrap_or(&self.root).display()
            )),
            Ok(_) => {}
            Err(e) => out.push(e.to_string()),
        }
        if let Some(errors) = crate::device_errors(&self.root) {
            if !errors.is_empty() {
                out.push(format!("the volume's device reports errors: {errors}"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(fs: u64, free: u64, max: u64, host_free: u64) -> Space {
        Space {
            fs_bytes: fs,
            fs_free: free,
            max_bytes: max,
            backed_bytes: fs,
            host_bytes: 100 << 30,
            host_free,
            host_reserve: 1 << 30,
        }
    }

    const G: u64 = 1 << 30;

    #[test]
    fn grows_before_it_fills_within_the_image_and_the_hosts_reserve() {
        // Plenty free: nothing to do.
        assert_eq!(space(2 * G, G, 256 * G, 50 * G).next_size(), None);
        // Filling: grows by half, at least 1 GiB.
        assert_eq!(
            space(2 * G, 100 << 20, 256 * G, 50 * G).next_size(),
            Some(3 * G)
        );
        assert_eq!(space(8 * G, G, 256 * G, 50 * G).next_size(), Some(12 * G));
        // Never past the image.
        assert_eq!(space(8 * G, G, 10 * G, 50 * G).next_size(), Some(10 * G));
        // Never into the host's reserve.
        assert_eq!(
            space(8 * G, G, 256 * G, G + G / 2).next_size(),
            Some(8 * G + G / 2)
        );
        assert_eq!(space(8 * G, G, 256 * G, G).next_size(), None);
    }

    #[test]
    fn pressure_is_said_when_full_and_unable_to_grow() {
        assert_eq!(space(2 * G, 10 << 20, 256 * G, 50 * G).pressure(), None);
        let p = space(2 * G, 10 << 20, 256 * G, G).pressure().unwrap();
        assert!(
            p.contains("10 MiB free of 2048 MiB") && p.contains("kept for the host"),
            "{p}"
        );
        let p = space(2 * G, 10 << 20, 2 * G, 50 * G).pressure().unwrap();
        assert!(p.contains("at its most"), "{p}");
        assert_eq!(space(2 * G, G, 2 * G, G).pressure(), None);
    }
}
