//! Tree hash: identical trees built differently hash alike; every hashed
//! property changes the hash.

mod common;

use std::fs;
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::Path;

use common::*;
use forkd_layers::tree_hash;

fn build(root: &Path, reversed: bool) {
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    let mut steps: Vec<Box<dyn Fn()>> = vec![
        Box::new(|| {
            fs::create_dir(root.join("etc")).unwrap();
            fs::write(root.join("etc/passwd"), b"root:x:0:0::/root:/bin/sh\n").unwrap();
        }),
        Box::new(|| {
            fs::create_dir_all(root.join("usr/bin")).unwrap();
            fs::write(root.join("usr/bin/tool"), vec![0x7f; 100_000]).unwrap();
            fs::set_permissions(
                root.join("usr/bin/tool"),
                fs::Permissions::from_mode(0o4755),
            )
            .unwrap();
            symlink("usr/bin", root.join("bin")).unwrap();
            lset(&root.join("usr"), "trusted.overlay.opaque", b"y");
        }),
        Box::new(|| {
            fs::create_dir(root.join("home")).unwrap();
            fs::write(root.join("home/notes"), b"owned by 1000").unwrap();
            chown(root.join("home/notes"), Some(1000), Some(1000)).unwrap();
        }),
    ];
    if reversed {
        steps.reverse();
    }
    for s in &steps {
        s();
    }
}

#[test]
fn identical_trees_built_differently_hash_alike() {
    if !root_or_skip("identical_trees_built_differently_hash_alike") {
        return;
    }
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    build(a.path(), false);
    build(b.path(), true);
    // Hard links hash as plain files with the same content.
    fs::write(a.path().join("etc/copy"), b"root:x:0:0::/root:/bin/sh\n").unwrap();
    fs::hard_link(b.path().join("etc/passwd"), b.path().join("etc/copy")).unwrap();
    assert_eq!(tree_hash(a.path()).unwrap(), tree_hash(b.path()).unwrap());
}

#[test]
fn every_hashed_property_changes_the_hash() {
    if !root_or_skip("every_hashed_property_changes_the_hash") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    build(r, false);
    let base = tree_hash(r).unwrap();
    let mut seen = vec![base];
    let mut check = |what: &str| {
        let h = tree_hash(r).unwrap();
        assert!(
            !seen.contains(&h),
            "changing {what} did not change the hash"
        );
        seen.push(h);
    };

    fs::set_permissions(r.join("usr/bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    check("mode (setuid bit)");
    chown(r.join("home/notes"), Some(1001), None).unwrap();
    check("owner");
    chown(r.join("home/notes"), None, Some(1001)).unwrap();
    check("group");
    fs::write(r.join("etc/passwd"), b"root:x:0:0::/root:/bin/bash\n").unwrap();
    check("content");
    fs::remove_file(r.join("bin")).unwrap();
    symlink("usr/sbin", r.join("bin")).unwrap();
    check("symlink target");
    lset(
        &r.join("usr/bin/tool"),
        "security.capability",
        &[
            1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ],
    );
    check("security.capability");
    lset(&r.join("usr"), "trusted.overlay.opaque", b"x");
    check("trusted.overlay.opaque value");
    fs::rename(r.join("home/notes"), r.join("home/notez")).unwrap();
    check("a name");
    fs::create_dir(r.join("empty")).unwrap();
    check("an empty directory");
    fs::set_permissions(r, fs::Permissions::from_mode(0o700)).unwrap();
    check("the root's mode");

    // Not hashed: timestamps and xattrs outside the significant set.
    let before = tree_hash(r).unwrap();
    let f = fs::File::options()
        .write(true)
        .open(r.join("etc/passwd"))
        .unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
    lset(&r.join("etc/passwd"), "user.comment", b"irrelevant");
    assert_eq!(tree_hash(r).unwrap(), before);
}
