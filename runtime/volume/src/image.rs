//! The image file behind a volume that forkd loop-mounts: made (allocated under a
//! smaller filesystem that grows into it), recognised, and the loop devices and their
//! writeback directory found.

use super::*;

/// Does `image` exist and carry a btrfs signature?
pub(crate) fn image_is_formatted(image: &Path) -> Result<bool, VolumeError> {
    let mut file = match File::open(image) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(VolumeError::io("open", image)(e)),
    };
    let mut magic = [0u8; 8];
    let read = file
        .seek(SeekFrom::Start(SIGNATURE_OFFSET))
        .and_then(|_| file.read_exact(&mut magic));
    match read {
        Ok(()) => Ok(&magic == SIGNATURE),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(VolumeError::io("read", image)(e)),
    }
}

/// Formats an image of `size` bytes (a filesystem of at most [`INITIAL_SIZE`], allocated)
/// under a temporary name and renames it to `image` once it is complete and synced.
pub(crate) fn make_image(
    image: &Path,
    size: u64,
    host_reserve: Option<u64>,
) -> Result<(), VolumeError> {
    require_tools()?;
    let partial = image.with_extension("img.partial");
    for stale in [image, partial.as_path()] {
        match fs::remove_file(stale) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(VolumeError::io("remove", stale)(e)),
        }
    }
    // The filesystem starts smaller than the image, within what the disk can spare, and
    // grows as the image is allocated under it (see `space`).
    let dir = image.parent().unwrap_or(Path::new("/"));
    let budget = space::host_budget(dir, host_reserve)?;
    let initial = size.min(INITIAL_SIZE).min(budget) & !((1 << 20) - 1);
    if initial < space::MIN_INITIAL {
        return Err(VolumeError::NoRoom {
            dir: dir.to_path_buf(),
            budget,
            need: space::MIN_INITIAL,
        });
    }
    let made = format_image(&partial, size, initial);
    if made.is_err() {
        // Nothing half-made stays behind (an allocation that failed half-way holds space).
        let _ = fs::remove_file(&partial);
    }
    made?;
    fs::rename(&partial, image).map_err(VolumeError::io("rename", &partial))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(VolumeError::io("sync", dir))
}

/// Makes `partial` an image of `size` bytes holding a btrfs filesystem of `initial`
/// bytes, allocated.
fn format_image(partial: &Path, size: u64, initial: u64) -> Result<(), VolumeError> {
    let file = File::create_new(partial).map_err(VolumeError::io("create", partial))?;
    file.set_len(size)
        .map_err(VolumeError::io("size", partial))?;
    run(
        Path::new("mkfs.btrfs"),
        &[
            "-q".as_ref(),
            "-b".as_ref(),
            initial.to_string().as_ref(),
            partial.as_os_str(),
        ],
    )?;
    nix::fcntl::fallocate(
        file.as_raw_fd(),
        nix::fcntl::FallocateFlags::empty(),
        0,
        initial as i64,
    )
    .map_err(|e| VolumeError::io("allocate", partial)(io::Error::from_raw_os_error(e as i32)))?;
    file.sync_all().map_err(VolumeError::io("sync", partial))
}

/// The writeback device directory in sysfs (where [`Volume::tune`] sets the dirty
/// bound) of the btrfs filesystem mounted at `mount_dir` from a loop device.
pub fn bdi_of_mount(mount_dir: &Path) -> Option<PathBuf> {
    let mount = mountinfo::mount_at(mount_dir).ok()??;
    bdi_of_device(&mount.source)
}

/// The writeback device (`/sys/class/bdi/...`) of the btrfs filesystem on `device`:
/// each btrfs filesystem lists its devices and links its bdi under `/sys/fs/btrfs/<uuid>`.
pub(crate) fn bdi_of_device(device: &str) -> Option<PathBuf> {
    let name = device.strip_prefix("/dev/")?;
    fs::read_dir("/sys/fs/btrfs")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|fs_dir| fs_dir.join("devices").join(name).exists())
        .and_then(|fs_dir| fs::canonicalize(fs_dir.join("bdi")).ok())
}

/// The nonzero error counters (`write_errs 3, flush_errs 1`) of the devices of the btrfs
/// filesystem holding `mount_dir`, or `None` where the kernel does not list them
/// (before 5.14).
pub fn device_errors(mount_dir: &Path) -> Option<String> {
    let fs_dir = sysfs_dir_of(mount_dir)?;
    let mut found = false;
    let mut errors = Vec::new();
    for dev in fs::read_dir(fs_dir.join("devinfo")).ok()?.flatten() {
        let Ok(text) = fs::read_to_string(dev.path().join("error_stats")) else {
            continue;
        };
        found = true;
        for line in text.lines() {
            if let Some((k, v)) = line.split_once(' ') {
                if v.trim() != "0" {
                    errors.push(format!("{k} {}", v.trim()));
                }
            }
        }
    }
    found.then(|| errors.join(", "))
}

/// `/sys/fs/btrfs/<uuid>` of the btrfs filesystem holding `path`.
pub(crate) fn sysfs_dir_of(path: &Path) -> Option<PathBuf> {
    let dir = File::open(path).ok()?;
    let uuid = btrfs::filesystem_uuid(dir.as_fd()).ok()?;
    let d = Path::new("/sys/fs/btrfs").join(uuid);
    d.is_dir().then_some(d)
}

/// The file behind the loop device `device` (`/dev/loopN`), if it is one.
pub(crate) fn loop_backing_file(device: &str) -> Option<PathBuf> {
    let name = device.strip_prefix("/dev/")?;
    if !name.starts_with("loop") {
        return None;
    }
    let text = fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}

/// Every loop device (`/dev/loopN`) backed by `image`.
pub(crate) fn loop_devices_of(image: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut devices: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.starts_with("loop"))
        .map(|name| format!("/dev/{name}"))
        .filter(|device| loop_backing_file(device).as_deref() == Some(image))
        .collect();
    devices.sort();
    devices
}
