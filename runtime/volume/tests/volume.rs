//! The btrfs volume against the real kernel: a loop-mounted image on a temporary state
//! root (ext4 here, so the image path is exercised), subvolumes, read-only snapshots,
//! overlays stacked on snapshots, and clean unmounting.

use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use forkd_sys::mount::mount_overlay;
use forkd_volume::{mountinfo, Settings, Volume, VolumeError};

/// True when running as root. Otherwise prints `SKIP <name>: needs root`, or panics
/// when `CI=true` so nothing is skipped silently there.
fn root_or_skip(name: &str) -> bool {
    if !forkd_testing::require_root(name) {
        return false;
    }
    forkd_volume::require_tools().expect("btrfs tools");
    true
}

/// A temporary state root; on drop, whatever is still mounted below it is detached
/// (so a failed test leaves no mount behind) before the directory is removed.
struct StateRoot(tempfile::TempDir);

impl StateRoot {
    fn new() -> Self {
        StateRoot(tempfile::tempdir().unwrap())
    }

    fn path(&self) -> PathBuf {
        fs::canonicalize(self.0.path()).unwrap()
    }
}

impl Drop for StateRoot {
    fn drop(&mut self) {
        let mut mounts = mountinfo::mounts_below(&self.path()).unwrap_or_default();
        mounts.reverse();
        for mount in mounts {
            let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn umount(path: &Path) {
    nix::mount::umount2(path, nix::mount::MntFlags::empty()).unwrap();
}

fn loop_devices_listing(image: &Path) -> Vec<String> {
    let out = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&*image.to_string_lossy()))
        .map(str::to_owned)
        .collect()
}

fn backing_files() -> Vec<String> {
    let mut files = Vec::new();
    for entry in fs::read_dir("/sys/block").unwrap() {
        let path = entry.unwrap().path().join("loop/backing_file");
        if let Ok(text) = fs::read_to_string(path) {
            files.push(text.trim().to_owned());
        }
    }
    files
}

#[test]
fn subvolumes_and_read_only_snapshots() {
    if !root_or_skip("subvolumes_and_read_only_snapshots") {
        return;
    }
    let state = StateRoot::new();
    let volume = Volume::open(&state.path(), &Settings::default()).unwrap();
    assert_eq!(volume.path(), state.path().join("vol"));
    assert_eq!(
        volume.loop_image(),
        Some(state.path().join("volume.img").as_path())
    );
    assert!(forkd_sys::btrfs::is_btrfs(volume.path()).unwrap());
    assert!(!forkd_sys::btrfs::is_btrfs(&state.path()).unwrap());

    volume.create_subvolume(Path::new("layer")).unwrap();
    let layer = volume.path().join("layer");
    assert!(forkd_sys::btrfs::is_subvolume(&layer).unwrap());
    fs::create_dir(layer.join("dir")).unwrap();
    fs::write(layer.join("dir/file"), "before").unwrap();
    fs::write(layer.join("kept"), "kept").unwrap();

    let snap = volume.path().join("snap");
    volume.snapshot_readonly(&layer, &snap).unwrap();
    assert!(forkd_sys::btrfs::is_subvolume(&snap).unwrap());
    let snap_dir = fs::File::open(&snap).unwrap();
    assert!(forkd_sys::btrfs::is_readonly(snap_dir.as_fd()).unwrap());
    drop(snap_dir);
    assert_eq!(fs::read_to_string(snap.join("dir/file")).unwrap(), "before");

    for attempt in [
        fs::write(snap.join("dir/file"), "changed"),
        fs::write(snap.join("new"), "x"),
        fs::remove_file(snap.join("kept")),
    ] {
        assert_eq!(attempt.unwrap_err().raw_os_error(), Some(libc::EROFS));
    }

    fs::write(layer.join("dir/file"), "after").unwrap();
    fs::remove_file(layer.join("kept")).unwrap();
    assert_eq!(fs::read_to_string(snap.join("dir/file")).unwrap(), "before");
    assert_eq!(fs::read_to_string(snap.join("kept")).unwrap(), "kept");

    // Snapshotting a plain directory is refused with a clear error.
    fs::create_dir(volume.path().join("plain")).unwrap();
    let e = volume
        .snapshot_readonly(Path::new("plain"), Path::new("snap2"))
        .unwrap_err();
    assert!(matches!(e, VolumeError::NotSubvolume { .. }), "{e}");
    // Paths outside the volume are refused.
    let e = volume.create_subvolume(Path::new("../escape")).unwrap_err();
    assert!(matches!(e, VolumeError::OutsideVolume { .. }), "{e}");

    volume.delete_subvolume(&snap).unwrap();
    volume.delete_subvolume(&layer).unwrap();
    volume.delete_subvolume(Path::new("plain")).unwrap();
    assert!(!snap.exists() && !layer.exists());
    // Deleting what is already gone is not an error.
    volume.delete_subvolume(&snap).unwrap();

    volume.unmount().unwrap();
}

#[test]
fn delete_handles_nested_subvolumes_and_plain_trees() {
    if !root_or_skip("delete_handles_nested_subvolumes_and_plain_trees") {
        return;
    }
    let state = StateRoot::new();
    let volume = Volume::open(&state.path(), &Settings::default()).unwrap();
    let sandbox = volume.path().join("sandbox");
    fs::create_dir_all(sandbox.join("meta/deep")).unwrap();
    fs::write(sandbox.join("meta/deep/file"), "x").unwrap();
    volume.create_subvolume(&sandbox.join("upper")).unwrap();
    fs::write(sandbox.join("upper/file"), "x").unwrap();
    volume
        .create_subvolume(&sandbox.join("upper/nested"))
        .unwrap();
    fs::write(sandbox.join("upper/nested/file"), "x").unwrap();
    volume
        .snapshot_readonly(&sandbox.join("upper"), &sandbox.join("checkpoint"))
        .unwrap();

    volume.delete_subvolume(&sandbox).unwrap();
    assert!(!sandbox.exists());
    volume.unmount().unwrap();
}

#[test]
fn open_is_idempotent_and_unmount_releases_the_loop_device() {
    if !root_or_skip("open_is_idempotent_and_unmount_releases_the_loop_device") {
        return;
    }
    let state = StateRoot::new();
    let first = Volume::open(&state.path(), &Settings::default()).unwrap();
    fs::write(first.path().join("marker"), "1").unwrap();
    let image = first.loop_image().unwrap().to_path_buf();
    assert_eq!(loop_devices_listing(&image).len(), 1);

    let second = Volume::open(&state.path(), &Settings::default()).unwrap();
    assert_eq!(second.path(), first.path());
    assert_eq!(second.loop_image(), first.loop_image());
    let mounts_at_vol = mountinfo::mounts()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point == first.path())
        .count();
    assert_eq!(mounts_at_vol, 1, "a second open must not mount again");
    assert_eq!(loop_devices_listing(&image).len(), 1);

    // A state root that is itself on btrfs is used as it is.
    let nested = first.path().join("nested-state");
    let direct = Volume::open(&nested, &Settings::default()).unwrap();
    assert_eq!(direct.path(), nested);
    assert_eq!(direct.loop_image(), None);
    direct.create_subvolume(Path::new("sub")).unwrap();
    assert!(forkd_sys::btrfs::is_subvolume(&nested.join("sub")).unwrap());
    direct.unmount().unwrap(); // nothing of its own to unmount
    assert!(nested.join("sub").exists());

    // Busy: a mount below the volume blocks unmounting, and says which.
    let inner = first.path().join("busy");
    fs::create_dir(&inner).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &inner,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let e = second.unmount().unwrap_err();
    assert!(matches!(e, VolumeError::Busy { .. }), "{e}");
    assert!(e.to_string().contains(&*inner.to_string_lossy()), "{e}");
    umount(&inner);

    first.unmount().unwrap();
    assert!(mountinfo::mounts_below(&state.path()).unwrap().is_empty());
    assert!(
        loop_devices_listing(&image).is_empty(),
        "losetup still lists the image"
    );
    assert!(
        !backing_files()
            .iter()
            .any(|f| f == &*image.to_string_lossy()),
        "a loop device still has the image as backing file"
    );

    // The data survives a remount.
    let again = Volume::open(&state.path(), &Settings::default()).unwrap();
    assert_eq!(
        fs::read_to_string(again.path().join("marker")).unwrap(),
        "1"
    );
    again.unmount().unwrap();
}

#[test]
fn a_half_made_image_is_made_again() {
    if !root_or_skip("a_half_made_image_is_made_again") {
        return;
    }
    let state = StateRoot::new();
    // A crash before mkfs finished: a sized file without a btrfs signature, and one
    // left under the temporary name.
    let image = state.path().join("volume.img");
    fs::File::create(&image)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    fs::write(state.path().join("volume.img.partial"), "junk").unwrap();

    let volume = Volume::open(&state.path(), &Settings::default()).unwrap();
    assert!(!state.path().join("volume.img.partial").exists());
    volume.create_subvolume(Path::new("works")).unwrap();
    // As long as the most it may grow to, allocated only under its filesystem (which
    // starts at INITIAL_SIZE), so a full disk cannot fail a write btrfs already made.
    let meta = fs::metadata(&image).unwrap();
    assert_eq!(meta.len(), 256 << 30, "default size");
    let initial = forkd_volume::INITIAL_SIZE.min(meta.len());
    let allocated = meta.blocks() * 512;
    assert!(
        allocated >= initial && allocated < initial + (64 << 20),
        "{allocated} bytes allocated, expected the filesystem's {initial}"
    );
    assert_eq!(volume.space().unwrap().fs_bytes, initial);
    volume.unmount().unwrap();
}

/// The overlay that a branch mounts: lower layers are read-only snapshots, the upper
/// and work directories share one fresh subvolume.
#[test]
fn overlay_on_snapshots_writes_into_the_upper_subvolume() {
    if !root_or_skip("overlay_on_snapshots_writes_into_the_upper_subvolume") {
        return;
    }
    let state = StateRoot::new();
    let volume = Volume::open(&state.path(), &Settings::default()).unwrap();
    let v = volume.path().to_path_buf();
    let merged = v.join("merged");
    fs::create_dir(&merged).unwrap();
    let new_layer = |name: &str| {
        volume.create_subvolume(Path::new(name)).unwrap();
        fs::create_dir(v.join(name).join("upper")).unwrap();
        fs::create_dir(v.join(name).join("work")).unwrap();
        (v.join(name).join("upper"), v.join(name).join("work"))
    };

    // Generation 0, checkpointed.
    let (upper0, _) = new_layer("gen0");
    fs::write(upper0.join("file"), "gen0").unwrap();
    fs::write(upper0.join("doomed"), "gen0").unwrap();
    volume
        .snapshot_readonly(&v.join("gen0"), &v.join("ckpt0"))
        .unwrap();

    // Generation 1 runs on top of the checkpoint.
    let (upper1, work1) = new_layer("gen1");
    let lower0 = v.join("ckpt0/upper");
    mount_overlay(&[&lower0], Some((&upper1, &work1)), &merged).unwrap();
    assert_eq!(fs::read_to_string(merged.join("file")).unwrap(), "gen0");
    fs::write(merged.join("file"), "gen1").unwrap(); // a copy-up
    fs::write(merged.join("added"), "gen1").unwrap();
    fs::remove_file(merged.join("doomed")).unwrap(); // a whiteout
    assert_eq!(fs::read_to_string(upper1.join("file")).unwrap(), "gen1");
    assert_eq!(fs::read_to_string(lower0.join("file")).unwrap(), "gen0");
    assert!(lower0.join("doomed").exists());
    assert!(!lower0.join("added").exists());

    // Checkpoint generation 1 while mounted (its processes would be frozen), then look
    // at both checkpoints through a read-only overlay.
    volume
        .snapshot_readonly(&v.join("gen1"), &v.join("ckpt1"))
        .unwrap();
    umount(&merged);
    let lower1 = v.join("ckpt1/upper");
    mount_overlay(&[&lower1, &lower0], None, &merged).unwrap();
    assert_eq!(fs::read_to_string(merged.join("file")).unwrap(), "gen1");
    assert_eq!(fs::read_to_string(merged.join("added")).unwrap(), "gen1");
    assert!(!merged.join("doomed").exists());
    let e = fs::write(merged.join("x"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    umount(&merged);

    for name in ["ckpt1", "gen1", "ckpt0", "gen0"] {
        volume.delete_subvolume(Path::new(name)).unwrap();
    }
    volume.unmount().unwrap();
}

/// Why upper and work share one subvolume: overlayfs copies up by renaming from the
/// work directory into the upper one, and btrfs refuses renames between subvolumes.
#[test]
fn work_dir_outside_the_upper_subvolume_breaks_copy_up() {
    if !root_or_skip("work_dir_outside_the_upper_subvolume_breaks_copy_up") {
        return;
    }
    let state = StateRoot::new();
    let volume = Volume::open(&state.path(), &Settings::default()).unwrap();
    let v = volume.path().to_path_buf();
    volume.create_subvolume(Path::new("base")).unwrap();
    fs::write(v.join("base/file"), "base").unwrap();
    volume
        .snapshot_readonly(&v.join("base"), &v.join("ckpt"))
        .unwrap();
    volume.create_subvolume(Path::new("upper")).unwrap();
    for dir in ["work", "merged"] {
        fs::create_dir(v.join(dir)).unwrap();
    }
    let merged = v.join("merged");
    mount_overlay(
        &[&v.join("ckpt")],
        Some((&v.join("upper"), &v.join("work"))),
        &merged,
    )
    .unwrap();
    let e = fs::write(merged.join("file"), "changed").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
    umount(&merged);
    volume.unmount().unwrap();
}

/// Writes `bytes` of incompressible data into `dir/data` and syncs it.
fn fill(dir: &Path, bytes: usize) {
    let mut file = fs::File::create(dir.join("data")).unwrap();
    let mut block = vec![0u8; 1 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in block.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    for i in 0..bytes / block.len() {
        block[0] = i as u8;
        file.write_all(&block).unwrap();
    }
    file.sync_all().unwrap();
}

fn time_snapshots(volume: &Volume, src: &str, samples: usize) -> Vec<Duration> {
    let mut times = Vec::new();
    for i in 0..samples {
        let dst = format!("{src}-snap{i}");
        let start = Instant::now();
        volume
            .snapshot_readonly(Path::new(src), Path::new(&dst))
            .unwrap();
        times.push(start.elapsed());
    }
    for i in 0..samples {
        volume
            .delete_subvolume(Path::new(&format!("{src}-snap{i}")))
            .unwrap();
    }
    times.sort();
    times
}

#[test]
fn snapshot_time_does_not_grow_with_the_data() {
    if !root_or_skip("snapshot_time_does_not_grow_with_the_data") {
        return;
    }
    let state = StateRoot::new();
    let volume = Volume::open(&state.path(), &Settings::default()).unwrap();
    for (name, bytes) in [("small", 1usize << 20), ("large", 1 << 30)] {
        volume.create_subvolume(Path::new(name)).unwrap();
        fill(&volume.path().join(name), bytes);
    }
    // Warm-up, then samples of each size interleaved in the same run.
    time_snapshots(&volume, "small", 1);
    const SAMPLES: usize = 7;
    let small = time_snapshots(&volume, "small", SAMPLES);
    let large = time_snapshots(&volume, "large", SAMPLES);
    let show = |t: &[Duration]| {
        format!(
            "min {:?} p50 {:?} max {:?}",
            t[0],
            t[t.len() / 2],
            t[t.len() - 1]
        )
    };
    println!("snapshot of a subvolume holding 1 MiB: {}", show(&small));
    println!("snapshot of a subvolume holding 1 GiB: {}", show(&large));

    // Dirty data is written out by the snapshot itself, so that cost follows what was
    // written since the last sync, not the size of the layer.
    volume.create_subvolume(Path::new("dirty")).unwrap();
    let mut file = fs::File::create(volume.path().join("dirty/data")).unwrap();
    let block = vec![0x5au8; 1 << 20];
    for _ in 0..64 {
        file.write_all(&block).unwrap();
    }
    drop(file); // closing does not write the data out
    let start = Instant::now();
    volume
        .snapshot_readonly(Path::new("dirty"), Path::new("dirty-snap"))
        .unwrap();
    println!(
        "snapshot of a subvolume with 64 MiB not yet written out: {:?}",
        start.elapsed()
    );

    for name in ["dirty-snap", "dirty", "small", "large"] {
        volume.delete_subvolume(Path::new(name)).unwrap();
    }
    volume.unmount().unwrap();
}
