//! The exact copy of a small overlayfs upper directory that a checkpoint of a small
//! layer is made of (`forkd_layers::copy::copy_upper_exactly`).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{chown, symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use forkd_layers::copy::{copy_upper_exactly, Small};
use rustix::fs::{mknodat, FileType, Mode, CWD};

const ROOMY: Small = Small {
    entries: 128,
    bytes: 4 << 20,
};

/// An upper directory with every kind of entry a sandbox's writes leave.
fn sample_upper(root: &Path) {
    fs::create_dir_all(root.join("etc/opaque")).unwrap();
    fs::create_dir_all(root.join("run/app")).unwrap();
    fs::write(root.join("etc/config"), b"changed\n").unwrap();
    fs::set_permissions(root.join("etc/config"), fs::Permissions::from_mode(0o4751)).unwrap();
    chown(root.join("etc/config"), Some(1000), Some(100)).unwrap();
    fs::hard_link(root.join("etc/config"), root.join("etc/config-link")).unwrap();
    fs::write(root.join("etc/opaque/only"), vec![7u8; 300_000]).unwrap();
    symlink("../etc/config", root.join("run/link")).unwrap();
    // Overlay's marks: an opaque directory, a copied-up file's origin, a whiteout.
    lset(&root.join("etc/opaque"), "trusted.overlay.opaque", b"y");
    lset(
        &root.join("etc/config"),
        "trusted.overlay.origin",
        b"\x00\xfb\x21",
    );
    lset(&root.join("etc/config"), "user.note", b"kept");
    mknodat(
        CWD,
        &root.join("etc/removed"),
        FileType::CharacterDevice,
        Mode::empty(),
        0,
    )
    .unwrap();
    mknodat(
        CWD,
        &root.join("run/fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    // What a bound unix socket leaves on disk.
    mknodat(
        CWD,
        &root.join("run/app/sock"),
        FileType::Socket,
        Mode::from_raw_mode(0o755),
        0,
    )
    .unwrap();
    let old = rustix::fs::Timespec {
        tv_sec: 1_000_000_000,
        tv_nsec: 5,
    };
    rustix::fs::utimensat(
        CWD,
        root.join("etc/opaque/only"),
        &rustix::fs::Timestamps {
            last_access: old,
            last_modification: old,
        },
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
}

/// Everything about each entry that a copy must keep: type and mode, owner, size,
/// modification time, device numbers, extended attributes, contents or target, and
/// which names share an inode.
fn describe(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>, inodes: &mut Vec<u64>) {
        let mut names: Vec<_> = fs::read_dir(dir).unwrap().flatten().collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let p = e.path();
            let m = fs::symlink_metadata(&p).unwrap();
            let ino = match inodes.iter().position(|i| *i == m.ino()) {
                Some(k) => k,
                None => {
                    inodes.push(m.ino());
                    inodes.len() - 1
                }
            };
            let what = if m.file_type().is_symlink() {
                fs::read_link(&p).unwrap().display().to_string()
            } else if m.is_file() {
                format!("{:x}", md5_like(&fs::read(&p).unwrap()))
            } else {
                String::new()
            };
            let mut xattrs: Vec<String> = xattr_names(&p)
                .into_iter()
                .map(|n| format!("{n}={:?}", lget(&p, &n)))
                .collect();
            xattrs.sort();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            out.insert(
                rel,
                format!(
                    "mode {:o} owner {}:{} size {} mtime {}.{} rdev {} inode#{ino} {what} {xattrs:?}",
                    m.mode(),
                    m.uid(),
                    m.gid(),
                    if m.is_dir() { 0 } else { m.size() },
                    m.mtime(),
                    m.mtime_nsec(),
                    m.rdev(),
                ),
            );
            if m.is_dir() {
                walk(root, &p, out, inodes);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out, &mut Vec::new());
    out
}

/// A cheap content digest (FNV-1a): enough to tell two test files apart.
fn md5_like(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn xattr_names(path: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(path, &mut buf).unwrap();
    buf[..n]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

#[test]
fn a_small_upper_is_copied_exactly() {
    if !root_or_skip("a_small_upper_is_copied_exactly") {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    sample_upper(src.path());
    assert!(copy_upper_exactly(src.path(), dst.path(), ROOMY).unwrap());
    let (want, got) = (describe(src.path()), describe(dst.path()));
    assert_eq!(want.len(), 11, "{want:#?}");
    for (name, what) in &want {
        assert_eq!(got.get(name), Some(what), "{name}");
    }
    assert_eq!(want, got);
    // The overlay attributes a sealed layer drops are all kept here.
    assert!(got["etc/config"].contains("trusted.overlay.origin"));
    assert!(got["etc/opaque"].contains("trusted.overlay.opaque"));
}

#[test]
fn a_larger_upper_is_left_alone() {
    if !root_or_skip("a_larger_upper_is_left_alone") {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    sample_upper(src.path());
    // One entry too many, and fewer bytes than the files take.
    for small in [
        Small {
            entries: 10,
            bytes: 4 << 20,
        },
        Small {
            entries: 128,
            bytes: 300_000 - 4096 * 2,
        },
    ] {
        let dst = tempfile::tempdir().unwrap();
        assert!(
            !copy_upper_exactly(src.path(), dst.path(), small).unwrap(),
            "{small:?}"
        );
        assert_eq!(fs::read_dir(dst.path()).unwrap().count(), 0, "{small:?}");
    }
    // Exactly at the limits (the files' allocated bytes, a hard link counted for each
    // name), it is copied.
    let dst = tempfile::tempdir().unwrap();
    let blocks: u64 = ["etc/config", "etc/config-link", "etc/opaque/only"]
        .iter()
        .map(|f| fs::metadata(src.path().join(f)).unwrap().blocks() * 512)
        .sum();
    let exact = Small {
        entries: 11,
        bytes: blocks,
    };
    assert!(copy_upper_exactly(src.path(), dst.path(), exact).unwrap());
}

/// A lower tree for [`apply_layer`] to change: files, directories with attributes, a
/// hard-linked pair, a symlink.
fn sample_lower(root: &Path) {
    for d in [
        "etc/opaque/deep",
        "etc/merged",
        "var/was-dir/sub",
        "usr/bin",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(
        root.join("etc/opaque/old"),
        b"hidden by the opaque directory",
    )
    .unwrap();
    fs::write(root.join("etc/opaque/deep/older"), b"also hidden").unwrap();
    fs::write(root.join("etc/merged/kept"), b"stays").unwrap();
    fs::write(root.join("etc/merged/replaced"), b"old contents").unwrap();
    fs::write(root.join("etc/removed"), b"whited out").unwrap();
    fs::write(
        root.join("var/was-dir/sub/f"),
        b"under a directory a file replaces",
    )
    .unwrap();
    fs::write(root.join("usr/was-file"), b"a directory replaces this").unwrap();
    fs::write(root.join("usr/bin/tool"), vec![3u8; 70_000]).unwrap();
    fs::hard_link(root.join("usr/bin/tool"), root.join("usr/bin/tool-alias")).unwrap();
    symlink("tool", root.join("usr/bin/link")).unwrap();
    lset(
        &root.join("etc/merged"),
        "user.lower-only",
        b"dropped by the layer's own",
    );
    chown(root.join("etc/merged"), Some(7), Some(7)).unwrap();
}

/// A layer in overlay form over [`sample_lower`]: a whiteout, an opaque directory, a
/// directory that merges (with new owner, mode and attributes), a file where a
/// directory was and the reverse, a new hard-linked pair, a changed symlink.
fn sample_layer(root: &Path) {
    for d in [
        "etc/opaque",
        "etc/merged",
        "var",
        "usr/was-file/inside",
        "usr/bin",
    ] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    lset(&root.join("etc/opaque"), "trusted.overlay.opaque", b"y");
    fs::write(root.join("etc/opaque/new"), b"the opaque directory's own").unwrap();
    fs::write(root.join("etc/merged/replaced"), b"new contents").unwrap();
    fs::write(root.join("etc/merged/added"), b"added").unwrap();
    fs::hard_link(
        root.join("etc/merged/added"),
        root.join("etc/merged/added-too"),
    )
    .unwrap();
    fs::set_permissions(root.join("etc/merged"), fs::Permissions::from_mode(0o750)).unwrap();
    chown(root.join("etc/merged"), Some(1000), Some(1000)).unwrap();
    lset(&root.join("etc/merged"), "user.layer", b"the layer's");
    lset(
        &root.join("etc/merged/added"),
        "trusted.overlay.origin",
        b"\x00\xfb",
    );
    mknodat(
        CWD,
        &root.join("etc/removed"),
        FileType::CharacterDevice,
        Mode::empty(),
        0,
    )
    .unwrap();
    mknodat(
        CWD,
        &root.join("etc/never-there"),
        FileType::CharacterDevice,
        Mode::empty(),
        0,
    )
    .unwrap();
    fs::write(root.join("var/was-dir"), b"a file where a directory was").unwrap();
    fs::write(root.join("usr/was-file/inside/f"), b"in the new directory").unwrap();
    symlink("tool-alias", root.join("usr/bin/link")).unwrap();
}

#[test]
fn a_layer_applied_onto_a_tree_reads_as_the_overlay_of_both() {
    let name = "a_layer_applied_onto_a_tree_reads_as_the_overlay_of_both";
    if !root_or_skip(name) {
        return;
    }
    let (lower, layer, tree) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    sample_lower(lower.path());
    sample_layer(layer.path());
    // The tree starts as an exact copy of the lower one (times, links, attributes).
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(lower.path().join("."))
        .arg(tree.path())
        .status()
        .unwrap();
    assert!(cp.success());
    forkd_layers::copy::apply_layer(layer.path(), tree.path(), &mut |_| {}).unwrap();
    // What overlayfs itself shows of the layer over the lower tree.
    let mnt = forkd_sys::mount::overlay(&[layer.path(), lower.path()], None).unwrap();
    let merged = forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(&mnt));
    let (want, got) = (describe(&merged), describe(tree.path()));
    for (name, what) in &want {
        assert_eq!(got.get(name), Some(what), "{name}");
    }
    assert_eq!(want, got);
    // Nothing of overlay's own is left in the tree: no whiteout, no attribute.
    assert!(!tree.path().join("etc/removed").exists());
    assert!(fs::symlink_metadata(tree.path().join("etc/never-there")).is_err());
    assert_eq!(
        lget(&tree.path().join("etc/opaque"), "trusted.overlay.opaque"),
        None
    );
    assert_eq!(
        lget(
            &tree.path().join("etc/merged/added"),
            "trusted.overlay.origin"
        ),
        None
    );
    assert_eq!(
        lget(&tree.path().join("etc/merged"), "user.lower-only"),
        None
    );
    // The new pair is one file in the tree, as in the layer.
    let (a, b) = (
        fs::metadata(tree.path().join("etc/merged/added")).unwrap(),
        fs::metadata(tree.path().join("etc/merged/added-too")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
}

#[test]
fn the_diff_of_two_uppers_over_the_old_reads_as_the_new() {
    let name = "the_diff_of_two_uppers_over_the_old_reads_as_the_new";
    if !root_or_skip(name) {
        return;
    }
    let (lower, old, new, out) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    sample_lower(lower.path());
    // The old upper: what a checkpointed sandbox changed; the new one starts as an exact
    // copy of it (as a branch's layer does) and changes more.
    sample_layer(old.path());
    fs::create_dir_all(old.path().join("home/u")).unwrap();
    fs::write(old.path().join("home/u/kept"), b"untouched").unwrap();
    fs::write(old.path().join("home/u/edited"), b"before").unwrap();
    fs::write(old.path().join("home/u/removed"), b"goes").unwrap();
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(old.path().join("."))
        .arg(new.path())
        .status()
        .unwrap();
    assert!(cp.success());
    let n = new.path();
    fs::write(n.join("home/u/edited"), b"after").unwrap();
    fs::remove_file(n.join("home/u/removed")).unwrap();
    fs::write(n.join("home/u/added"), b"new").unwrap();
    fs::write(
        n.join("etc/opaque/new"),
        b"changed inside the opaque directory",
    )
    .unwrap();
    fs::set_permissions(
        n.join("etc/merged/added"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fs::remove_file(n.join("var/was-dir")).unwrap();
    fs::create_dir(n.join("var/was-dir")).unwrap();
    // As overlayfs makes a directory where a lower one was hidden: opaque.
    lset(&n.join("var/was-dir"), "trusted.overlay.opaque", b"y");
    fs::write(n.join("var/was-dir/again"), b"a directory again").unwrap();
    mknodat(
        CWD,
        &n.join("usr/bin/tool"),
        FileType::CharacterDevice,
        Mode::empty(),
        0,
    )
    .unwrap();
    forkd_layers::diff::diff_uppers(old.path(), new.path(), out.path()).unwrap();
    let want = {
        let m = forkd_sys::mount::overlay(&[new.path(), lower.path()], None).unwrap();
        describe(&forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(&m)))
    };
    let got = {
        let m = forkd_sys::mount::overlay(&[out.path(), old.path(), lower.path()], None).unwrap();
        describe(&forkd_sys::mount::fd_path(std::os::fd::AsFd::as_fd(&m)))
    };
    for (name, what) in &want {
        assert_eq!(got.get(name), Some(what), "{name}");
    }
    assert_eq!(want, got);
    // Only the changes are in the diff.
    assert!(!out.path().join("home/u/kept").exists());
    assert!(out.path().join("home/u/added").exists());
    assert!(!out.path().join("etc/opaque/deep").exists());
    assert!(
        !out.path().join("usr/was-file").exists(),
        "an unchanged directory is left out"
    );
}
