//! Layer store: imports from directories and tar streams, dedupe, adoption,
//! listing, prefix lookup, verification, removal and crash cleanup.

mod common;

use std::fs;
use std::os::unix::fs::{chown, symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use forkd_layers::{tree_hash, LayerError, LayerId, Progress, TarFlavor};

/// A small root filesystem with the awkward cases: setuid, foreign owners,
/// hard links, symlinks (one absolute), a fifo, xattrs, an empty directory.
fn sample_rootfs(root: &Path) {
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    for d in ["bin", "etc", "usr/lib", "tmp", "var/empty", "home/user"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(root.join("bin/busybox"), vec![0x42; 1_000_000]).unwrap();
    fs::set_permissions(root.join("bin/busybox"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::hard_link(root.join("bin/busybox"), root.join("bin/sh")).unwrap();
    symlink("busybox", root.join("bin/ls")).unwrap();
    symlink("/etc/hostname", root.join("etc/hostname-link")).unwrap();
    fs::write(root.join("etc/hostname"), b"sandbox\n").unwrap();
    fs::write(root.join("home/user/.profile"), b"export A=1\n").unwrap();
    chown(root.join("home/user"), Some(1000), Some(1000)).unwrap();
    chown(root.join("home/user/.profile"), Some(1000), Some(100)).unwrap();
    fs::write(root.join("usr/lib/libcap.so"), b"\x7fELF").unwrap();
    lset(
        &root.join("usr/lib/libcap.so"),
        "security.capability",
        &[
            1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ],
    );
    lset(&root.join("usr/lib/libcap.so"), "user.note", b"kept");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("tmp/fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
}

#[test]
fn import_dir_preserves_everything_hashed() {
    if !root_or_skip("import_dir_preserves_everything_hashed") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    sample_rootfs(src.path());
    let mut events = Vec::new();
    let id = st
        .layers
        .import_dir(src.path(), &mut |p| events.push(p))
        .unwrap();
    assert_eq!(id.tree_hash(), tree_hash(src.path()).unwrap());
    assert!(events.iter().any(|e| matches!(e, Progress::Step(_))));
    let tree = st.layers.path(&id);
    assert!(st.layers.exists(&id));

    let bb = fs::metadata(tree.join("bin/busybox")).unwrap();
    assert_eq!(bb.mode() & 0o7777, 0o4755);
    assert_eq!(
        bb.ino(),
        fs::metadata(tree.join("bin/sh")).unwrap().ino(),
        "hard link kept"
    );
    assert_eq!(
        fs::read_link(tree.join("etc/hostname-link")).unwrap(),
        Path::new("/etc/hostname")
    );
    let prof = fs::metadata(tree.join("home/user/.profile")).unwrap();
    assert_eq!((prof.uid(), prof.gid()), (1000, 100));
    assert!(fs::symlink_metadata(tree.join("tmp/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(
        fs::metadata(tree.join("tmp")).unwrap().mode() & 0o7777,
        0o1777
    );
    assert_eq!(
        lget(&tree.join("usr/lib/libcap.so"), "user.note").as_deref(),
        Some(&b"kept"[..])
    );
    assert!(tree.join("var/empty").is_dir());

    assert_eq!(
        fs::metadata(st.layers_root()).unwrap().mode() & 0o777,
        0o700,
        "store root is private"
    );
    let info = st.layers.info(&id).unwrap();
    assert_eq!(info.id, id);
    assert_eq!(info.size_bytes, 1_000_000 + 8 + 11 + 4);
    assert_eq!(st.layers.list().unwrap(), vec![info]);
    st.layers.verify(&id).unwrap();
}

#[test]
fn import_dir_keeps_standard_dev_nodes_skips_and_refuses_others() {
    if !root_or_skip("import_dir_keeps_standard_dev_nodes_skips_and_refuses_others") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    fs::create_dir(src.path().join("dev")).unwrap();
    let mknod_dev = |p: &Path, minor: u32| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            p,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, minor),
        )
        .unwrap()
    };
    let mknod = |p: &Path| mknod_dev(p, 3);
    // A standard node is kept; another under dev/ (here /dev/mem's numbers) is not.
    mknod(&src.path().join("dev/null"));
    mknod_dev(&src.path().join("dev/mem"), 1);
    let mut notes = Vec::new();
    let id = st
        .layers
        .import_dir(src.path(), &mut |p| {
            if let Progress::Note(n) = p {
                notes.push(n)
            }
        })
        .unwrap();
    assert!(st.layers.path(&id).join("dev").is_dir());
    let null = fs::symlink_metadata(st.layers.path(&id).join("dev/null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!(null.rdev(), rustix::fs::makedev(1, 3));
    assert!(!st.layers.path(&id).join("dev/mem").exists());
    assert_eq!(
        notes.iter().filter(|n| n.contains("device")).count(),
        1,
        "{notes:?}"
    );

    mknod(&src.path().join("null-elsewhere"));
    let err = st.layers.import_dir(src.path(), &mut quiet()).unwrap_err();
    assert!(matches!(err, LayerError::UnsupportedFile { .. }), "{err}");
    assert!(err.to_string().contains("null-elsewhere"), "{err}");
    assert_eq!(st.layer_dirs().len(), 1);
    assert_eq!(
        fs::read_dir(st.layers_root().join("tmp")).unwrap().count(),
        0
    );
}

/// Tars a directory the way `tar --numeric-owner -cf - .` would.
fn tar_of(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}

#[test]
fn tar_gzip_zstd_and_dir_imports_agree_and_dedupe() {
    if !root_or_skip("tar_gzip_zstd_and_dir_imports_agree_and_dedupe") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    sample_rootfs(src.path());
    // The tar crate writes no xattrs without its "xattr" feature and cannot
    // store fifos from a directory walk portably: keep the tree to what it can.
    fs::remove_file(src.path().join("tmp/fifo")).unwrap();
    rustix::fs::lremovexattr(src.path().join("usr/lib/libcap.so"), "security.capability").unwrap();
    rustix::fs::lremovexattr(src.path().join("usr/lib/libcap.so"), "user.note").unwrap();
    let plain = tar_of(src.path());

    let from_dir = st.layers.import_dir(src.path(), &mut quiet()).unwrap();
    let from_tar = st
        .layers
        .import_tar(&plain[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap();
    let from_gz = st
        .layers
        .import_tar(&gzip(&plain)[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap();
    let from_zst = st
        .layers
        .import_tar(&zstd(&plain)[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap();
    assert_eq!(from_dir, from_tar);
    assert_eq!(from_dir, from_gz);
    assert_eq!(from_dir, from_zst);
    assert_eq!(st.layer_dirs(), vec![from_dir.to_string()], "one copy only");
    assert_eq!(
        fs::read_dir(st.layers_root().join("tmp")).unwrap().count(),
        0
    );
    let t = st.layers.path(&from_tar);
    assert_eq!(
        fs::metadata(t.join("bin/busybox")).unwrap().ino(),
        fs::metadata(t.join("bin/sh")).unwrap().ino()
    );
}

#[test]
fn tar_entries_keep_owner_mode_fifo_and_safe_xattrs() {
    if !root_or_skip("tar_entries_keep_owner_mode_fifo_and_safe_xattrs") {
        return;
    }
    let st = State::new();
    let mut w = TarWriter::new();
    w.dir("./", 0o755)
        .file_owned("usr/bin/sudo", b"#!", 0o4711, 0, 0)
        .file_owned("home/u/f", b"data", 0o640, 1234, 5678)
        .fifo("run/initctl")
        .file_with_xattrs(
            "usr/bin/ping",
            b"elf",
            0o755,
            &[
                (
                    "security.capability",
                    &[
                        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    ],
                ),
                ("trusted.overlay.opaque", b"y"),
                ("user.x", b"1"),
            ],
        )
        .device(tar::EntryType::Char, "dev/null", 1, 3)
        .device(tar::EntryType::Char, "dev/mem", 1, 1)
        .device(tar::EntryType::Char, "dev/zero", 1, 9)
        // A later entry replaces an earlier one.
        .file("etc/motd", b"old", 0o644)
        .file("etc/motd", b"new", 0o600);
    let id = st
        .layers
        .import_tar(&w.finish()[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap();
    let t = st.layers.path(&id);
    assert_eq!(
        fs::metadata(t.join("usr/bin/sudo")).unwrap().mode() & 0o7777,
        0o4711
    );
    let f = fs::metadata(t.join("home/u/f")).unwrap();
    assert_eq!((f.uid(), f.gid(), f.mode() & 0o7777), (1234, 5678, 0o640));
    assert_eq!(
        fs::metadata(t.join("home")).unwrap().mode() & 0o7777,
        0o755,
        "implicit parents are 0755"
    );
    assert!(fs::symlink_metadata(t.join("run/initctl"))
        .unwrap()
        .file_type()
        .is_fifo());
    let ping = t.join("usr/bin/ping");
    assert!(lget(&ping, "security.capability").is_some());
    assert_eq!(lget(&ping, "user.x").as_deref(), Some(&b"1"[..]));
    assert_eq!(
        lget(&ping, "trusted.overlay.opaque"),
        None,
        "overlay xattrs from a rootfs tar are ignored"
    );
    // The standard node is kept; /dev/mem's numbers, and urandom's under zero's name,
    // are not.
    let null = fs::symlink_metadata(t.join("dev/null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!(null.rdev(), rustix::fs::makedev(1, 3));
    assert!(!t.join("dev/mem").exists());
    assert!(!t.join("dev/zero").exists());
    assert_eq!(fs::read(t.join("etc/motd")).unwrap(), b"new");
    assert_eq!(
        fs::metadata(t.join("etc/motd")).unwrap().mode() & 0o7777,
        0o600
    );
    assert_eq!(
        fs::metadata(t.join("etc/motd")).unwrap().mtime(),
        1_700_000_000
    );
}

#[test]
fn adopt_dir_moves_without_copy_and_dedupes() {
    if !root_or_skip("adopt_dir_moves_without_copy_and_dedupes") {
        return;
    }
    let st = State::new();
    let scratch = st.dir.path().join("sandboxes");
    fs::create_dir(&scratch).unwrap();
    let upper = scratch.join("upper");
    fs::create_dir(&upper).unwrap();
    fs::write(upper.join("changed"), vec![1u8; 4096]).unwrap();
    // Overlay whiteout and opaque dir, as the kernel leaves them in an upper.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        upper.join("deleted"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        0,
    )
    .unwrap();
    fs::create_dir(upper.join("opaque")).unwrap();
    lset(&upper.join("opaque"), "trusted.overlay.opaque", b"y");
    let ino = fs::metadata(upper.join("changed")).unwrap().ino();
    let expect = tree_hash(&upper).unwrap();

    let id = st.layers.adopt_dir(&upper).unwrap();
    assert_eq!(id.tree_hash(), expect);
    assert!(!upper.exists());
    let t = st.layers.path(&id);
    assert_eq!(
        fs::metadata(t.join("changed")).unwrap().ino(),
        ino,
        "renamed, not copied"
    );
    assert!(fs::symlink_metadata(t.join("deleted"))
        .unwrap()
        .file_type()
        .is_char_device());

    // Same content again: the directory is dropped, the id reused.
    let again = scratch.join("upper2");
    fs::create_dir(&again).unwrap();
    fs::write(again.join("changed"), vec![1u8; 4096]).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        again.join("deleted"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        0,
    )
    .unwrap();
    fs::create_dir(again.join("opaque")).unwrap();
    lset(&again.join("opaque"), "trusted.overlay.opaque", b"y");
    fs::set_permissions(&again, fs::metadata(t).unwrap().permissions()).unwrap();
    assert_eq!(st.layers.adopt_dir(&again).unwrap(), id);
    assert!(!again.exists());
    assert_eq!(st.layer_dirs().len(), 1);
    assert_eq!(
        fs::read_dir(st.layers_root().join("tmp")).unwrap().count(),
        0
    );
}

#[test]
fn adopt_dir_refuses_another_filesystem_and_keeps_the_dir() {
    if !root_or_skip("adopt_dir_refuses_another_filesystem_and_keeps_the_dir") {
        return;
    }
    let st = State::new();
    // /dev/shm is a tmpfs, the state root is not (unless /tmp is tmpfs too).
    let shm = Path::new("/dev/shm");
    if !shm.is_dir()
        || fs::metadata(shm).unwrap().dev() == fs::metadata(st.dir.path()).unwrap().dev()
    {
        println!(
            "SKIP adopt_dir_refuses_another_filesystem_and_keeps_the_dir: no second filesystem"
        );
        return;
    }
    let other = tempfile::tempdir_in(shm).unwrap();
    fs::write(other.path().join("f"), b"x").unwrap();
    let err = st.layers.adopt_dir(other.path()).unwrap_err();
    assert!(matches!(err, LayerError::CrossDevice { .. }), "{err}");
    assert!(other.path().join("f").exists());
    st.assert_empty();
}

#[test]
fn prefix_lookup_remove_and_verify() {
    if !root_or_skip("prefix_lookup_remove_and_verify") {
        return;
    }
    let st = State::new();
    let mut ids = Vec::new();
    for i in 0..3 {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("n"), format!("{i}")).unwrap();
        ids.push(st.layers.import_dir(d.path(), &mut quiet()).unwrap());
    }
    for id in &ids {
        assert_eq!(st.layers.resolve_prefix(&id.short()).unwrap(), *id);
        assert_eq!(st.layers.resolve_prefix(&id.to_string()).unwrap(), *id);
    }
    assert!(matches!(
        st.layers.resolve_prefix("abc"),
        Err(LayerError::BadPrefix { .. })
    ));
    assert!(matches!(
        st.layers.resolve_prefix("ABCDEF012345"),
        Err(LayerError::BadPrefix { .. })
    ));
    let absent = (0..16)
        .map(|i| format!("{i:x}").repeat(12))
        .find(|p| !ids.iter().any(|id| id.to_string().starts_with(p.as_str())))
        .unwrap();
    assert!(matches!(
        st.layers.resolve_prefix(&absent),
        Err(LayerError::NoMatch { .. })
    ));

    // Tampering is detected.
    fs::write(st.layers.path(&ids[0]).join("n"), b"tampered").unwrap();
    assert!(matches!(
        st.layers.verify(&ids[0]),
        Err(LayerError::Corrupt { .. })
    ));

    st.layers.remove(&ids[0]).unwrap();
    assert!(!st.layers.exists(&ids[0]));
    assert!(matches!(
        st.layers.remove(&ids[0]),
        Err(LayerError::NotFound(_))
    ));
    assert_eq!(st.layers.list().unwrap().len(), 2);
    assert_eq!(
        fs::read_dir(st.layers_root().join("tmp")).unwrap().count(),
        0
    );
}

#[test]
fn ambiguous_prefix_lists_matches() {
    let st = State::new();
    // Fake two sealed layers sharing a 12-character prefix.
    let a: LayerId = format!("{}{}", "a".repeat(12), "0".repeat(52))
        .parse()
        .unwrap();
    let b: LayerId = format!("{}{}", "a".repeat(12), "1".repeat(52))
        .parse()
        .unwrap();
    for id in [a, b] {
        fs::create_dir_all(st.layers.path(&id)).unwrap();
    }
    // Layers without an info file are still listed.
    let listed: Vec<LayerId> = st
        .layers
        .list()
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(listed, vec![a, b]);
    let err = st.layers.resolve_prefix(&"a".repeat(12)).unwrap_err();
    assert!(
        matches!(&err, LayerError::AmbiguousPrefix { matches, .. } if matches.len() == 2),
        "{err}"
    );
    assert_eq!(
        st.layers
            .resolve_prefix(&format!("{}1", "a".repeat(12)))
            .unwrap(),
        b
    );
}

#[test]
fn open_removes_staging_left_by_a_crash_but_not_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("layers");
    let store = forkd_layers::LayerStore::open(&root).unwrap();
    // A crashed import: an unlocked staging directory with content.
    let stale = root.join("tmp/import-1-2-3");
    fs::create_dir_all(stale.join("tree/deep")).unwrap();
    fs::write(stale.join("tree/deep/f"), b"x").unwrap();
    fs::write(root.join("tmp/stray-file"), b"x").unwrap();
    // A live import elsewhere: locked.
    let live = root.join("tmp/import-live");
    fs::create_dir(&live).unwrap();
    let fd = rustix::fs::open(
        &live,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive).unwrap();

    drop(store);
    forkd_layers::LayerStore::open(&root).unwrap();
    assert!(!stale.exists());
    assert!(!root.join("tmp/stray-file").exists());
    assert!(
        live.exists(),
        "a locked staging directory belongs to a live import"
    );
    drop(fd);
    forkd_layers::LayerStore::open(&root).unwrap();
    assert!(!live.exists());
}

#[test]
fn overlay_flavor_keeps_whiteouts_and_overlay_xattrs() {
    if !root_or_skip("overlay_flavor_keeps_whiteouts_and_overlay_xattrs") {
        return;
    }
    let st = State::new();
    // The opaque marker travels as a PAX xattr on a directory entry.
    let mut w = TarWriter::new();
    w.device(tar::EntryType::Char, "etc/removed", 0, 0)
        .xattrs(&[("trusted.overlay.opaque", b"y")])
        .dir("var/cache", 0o755);
    let bytes = w.finish();

    let id = st
        .layers
        .import_tar(&bytes[..], TarFlavor::Overlay, &mut quiet())
        .unwrap();
    let t = st.layers.path(&id);
    let wh = fs::symlink_metadata(t.join("etc/removed")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    assert_eq!(
        lget(&t.join("var/cache"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );

    // The same bytes as a plain rootfs: the 0:0 device is refused.
    let err = st
        .layers
        .import_tar(&bytes[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap_err();
    assert!(chain(&err).contains("etc/removed"), "{}", chain(&err));
}

#[test]
fn progress_is_throttled() {
    if !root_or_skip("progress_is_throttled") {
        return;
    }
    let st = State::new();
    let mut w = TarWriter::new();
    for i in 0..5000 {
        w.file(&format!("d{}/f{i}", i % 10), b"", 0o644);
    }
    let mut files_events = Vec::new();
    let mut steps = Vec::new();
    st.layers
        .import_tar(&w.finish()[..], TarFlavor::Rootfs, &mut |p| match p {
            Progress::Files(n) => files_events.push(n),
            Progress::Step(s) => steps.push(s),
            _ => {}
        })
        .unwrap();
    assert_eq!(files_events, vec![4096, 5000], "steps: {steps:?}");
    assert_eq!(steps, vec!["extracting", "hashing"]);
}
