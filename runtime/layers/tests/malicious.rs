//! Hostile archives: each must fail with an error naming the entry, write
//! nothing outside the target, and leave nothing in the store.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use forkd_layers::{import_image, LayerError, TarFlavor};
use tar::EntryType;

/// Imports `tar` both as a layer stream and as an image archive file and
/// checks both fail cleanly, mentioning `entry`.
fn refused(tar: Vec<u8>, entry: &str) -> String {
    let st = State::new();
    let err = st
        .layers
        .import_tar(&tar[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap_err();
    let msg = chain(&err);
    assert!(msg.contains(entry), "error {msg:?} does not name {entry:?}");
    st.assert_empty();

    let err = st
        .layers
        .import_tar(&tar[..], TarFlavor::OciLayer, &mut quiet())
        .unwrap_err();
    assert!(chain(&err).contains(entry));
    st.assert_empty();

    let file = st.dir.path().join("evil.tar.gz");
    fs::write(&file, gzip(&tar)).unwrap();
    let err = import_image(&st.layers, &st.images, &file, "evil", &mut quiet()).unwrap_err();
    assert!(chain(&err).contains(entry), "{}", chain(&err));
    st.assert_empty();
    msg
}

fn outside_untouched(name: &str) {
    assert!(
        !Path::new("/tmp").join(name).exists(),
        "/tmp/{name} was created"
    );
    assert!(!Path::new("/").join(name).exists(), "/{name} was created");
}

#[test]
fn dotdot_path() {
    if !root_or_skip("dotdot_path") {
        return;
    }
    let m = marker("dotdot");
    let mut w = TarWriter::new();
    w.file("ok", b"fine", 0o644);
    let deep = format!("../../../../../../../../../../tmp/{m}");
    w.file(&deep, b"pwned", 0o644);
    let msg = refused(w.finish(), &deep);
    assert!(msg.contains(".."), "{msg}");
    outside_untouched(&m);
    // Also the plain one-level escape.
    let mut w = TarWriter::new();
    let one = format!("../{m}");
    w.file(&one, b"pwned", 0o644);
    refused(w.finish(), &one);
    outside_untouched(&m);
}

#[test]
fn absolute_path_with_dotdot() {
    if !root_or_skip("absolute_path_with_dotdot") {
        return;
    }
    let m = marker("abs");
    let mut w = TarWriter::new();
    let p = format!("/abs/../../tmp/{m}");
    w.file(&p, b"pwned", 0o644);
    refused(w.finish(), &p);
    outside_untouched(&m);
}

#[test]
fn absolute_path_is_taken_relative() {
    if !root_or_skip("absolute_path_is_taken_relative") {
        return;
    }
    let st = State::new();
    let m = marker("rel");
    let mut w = TarWriter::new();
    w.file(&format!("/tmp/{m}"), b"inside", 0o644);
    let id = st
        .layers
        .import_tar(&w.finish()[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap();
    assert_eq!(
        fs::read(st.layers.path(&id).join("tmp").join(&m)).unwrap(),
        b"inside"
    );
    outside_untouched(&m);
}

#[test]
fn write_through_symlink_to_outside_dir() {
    if !root_or_skip("write_through_symlink_to_outside_dir") {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let mut w = TarWriter::new();
    w.symlink("link", outside.path().to_str().unwrap());
    w.file("link/file", b"pwned", 0o644);
    let msg = refused(w.finish(), "link/file");
    assert!(msg.contains("symlink"), "{msg}");
    assert_eq!(
        fs::read_dir(outside.path()).unwrap().count(),
        0,
        "wrote through the symlink"
    );
}

#[test]
fn write_through_relative_symlink_loop_and_nested_links() {
    if !root_or_skip("write_through_relative_symlink_loop_and_nested_links") {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let mut w = TarWriter::new();
    w.dir("a", 0o755);
    w.symlink("a/up", "../..");
    w.file("a/up/escaped", b"pwned", 0o644);
    refused(w.finish(), "a/up/escaped");

    // A directory replaced by a symlink after being used as a parent.
    let mut w = TarWriter::new();
    w.dir("d", 0o755).file("d/one", b"1", 0o644);
    w.symlink("d", outside.path().to_str().unwrap());
    w.file("d/two", b"pwned", 0o644);
    refused(w.finish(), "d/two");
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn hardlink_to_host_file() {
    if !root_or_skip("hardlink_to_host_file") {
        return;
    }
    let before = fs::metadata("/etc/passwd")
        .map(|m| std::os::unix::fs::MetadataExt::nlink(&m))
        .ok();
    let mut w = TarWriter::new();
    w.hardlink("passwd", "/etc/passwd");
    let msg = refused(w.finish(), "passwd");
    assert!(msg.contains("not an entry extracted earlier"), "{msg}");
    let after = fs::metadata("/etc/passwd")
        .map(|m| std::os::unix::fs::MetadataExt::nlink(&m))
        .ok();
    assert_eq!(before, after);
}

#[test]
fn hardlink_with_dotdot() {
    if !root_or_skip("hardlink_with_dotdot") {
        return;
    }
    let mut w = TarWriter::new();
    w.file("x", b"data", 0o644);
    w.hardlink("y", "../x");
    let msg = refused(w.finish(), "\"y\"");
    assert!(msg.contains("hard link target"), "{msg}");
}

#[test]
fn hardlink_through_symlink() {
    if !root_or_skip("hardlink_through_symlink") {
        return;
    }
    let mut w = TarWriter::new();
    w.symlink("etc", "/etc");
    w.hardlink("shadow", "etc/shadow");
    let msg = refused(w.finish(), "shadow");
    assert!(msg.contains("symlink"), "{msg}");
}

#[test]
fn hardlink_before_target() {
    if !root_or_skip("hardlink_before_target") {
        return;
    }
    let mut w = TarWriter::new();
    w.hardlink("early", "late");
    w.file("late", b"data", 0o644);
    refused(w.finish(), "early");
}

#[test]
fn device_nodes() {
    if !root_or_skip("device_nodes") {
        return;
    }
    let mut w = TarWriter::new();
    w.device(EntryType::Char, "mem", 1, 1);
    let msg = refused(w.finish(), "mem");
    assert!(msg.contains("device"), "{msg}");
    let mut w = TarWriter::new();
    w.device(EntryType::Block, "usr/sda", 8, 0);
    refused(w.finish(), "usr/sda");
    // A whiteout-looking device in a plain rootfs is still a device.
    let mut w = TarWriter::new();
    w.device(EntryType::Char, "etc/gone", 0, 0);
    refused(w.finish(), "etc/gone");
}

#[test]
fn file_used_as_directory() {
    if !root_or_skip("file_used_as_directory") {
        return;
    }
    let mut w = TarWriter::new();
    w.file("f", b"x", 0o644);
    w.file("f/child", b"y", 0o644);
    let msg = refused(w.finish(), "f/child");
    assert!(msg.contains("non-directory"), "{msg}");
}

#[test]
fn truncated_entry() {
    if !root_or_skip("truncated_entry") {
        return;
    }
    let mut h = header(EntryType::Regular, b"big", 1 << 20, 0o644);
    h.set_cksum();
    let mut tar = h.as_bytes().to_vec();
    tar.extend_from_slice(&[7u8; 1000]);
    refused(tar, "big");
}

#[test]
fn malformed_header_names_the_offset() {
    if !root_or_skip("malformed_header_names_the_offset") {
        return;
    }
    let mut w = TarWriter::new();
    w.file("good", b"fine", 0o644);
    let mut tar = w.finish();
    // Append a header whose checksum is wrong.
    let mut bad = header(EntryType::Regular, b"broken", 0, 0o644)
        .as_bytes()
        .to_vec();
    bad[148..156].copy_from_slice(b"0000000\0");
    let at = 1024; // after "good": one header block plus one data block
    tar.splice(at..at, bad);
    let st = State::new();
    let err = st
        .layers
        .import_tar(&tar[..], TarFlavor::Rootfs, &mut quiet())
        .unwrap_err();
    assert!(
        matches!(err, LayerError::Tar { offset: 1024, .. }),
        "{}",
        chain(&err)
    );
    assert!(chain(&err).contains("good"), "{}", chain(&err));
    st.assert_empty();
}

#[test]
fn bad_whiteouts_in_oci_layers() {
    if !root_or_skip("bad_whiteouts_in_oci_layers") {
        return;
    }
    let st = State::new();
    for bad in ["dir/.wh...", "dir/.wh.", ".wh.dir/file"] {
        let mut w = TarWriter::new();
        w.file(bad, b"", 0o644);
        let err = st
            .layers
            .import_tar(&w.finish()[..], TarFlavor::OciLayer, &mut quiet())
            .unwrap_err();
        assert!(chain(&err).contains(bad), "{}", chain(&err));
        st.assert_empty();
    }
}

#[test]
fn null_byte_and_out_of_range_ids() {
    if !root_or_skip("null_byte_and_out_of_range_ids") {
        return;
    }
    let mut w = TarWriter::new();
    let mut h = header(EntryType::Regular, b"owner", 1, 0o644);
    h.set_uid(u32::MAX as u64);
    h.set_cksum();
    w.raw(h, b"x");
    let msg = refused(w.finish(), "owner");
    assert!(msg.contains("uid"), "{msg}");
}
