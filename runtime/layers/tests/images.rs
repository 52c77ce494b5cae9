//! Image import from every supported source, checked end to end.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use forkd_layers::{import_image, ImageConfig, ImageError, ImportError, LayerId};

const CONFIG_JSON: &str = r#"{"architecture":"amd64","os":"linux",
 "config":{"Env":["PATH=/usr/bin:/bin","LANG=C.UTF-8"],"Cmd":["/bin/sh","-l"],"Entrypoint":["/init"],"WorkingDir":"/root","User":"1000:1000"},
 "rootfs":{"type":"layers","diff_ids":[]},"history":[]}"#;

fn expected_config() -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "LANG=C.UTF-8".into()],
        cmd: vec!["/bin/sh".into(), "-l".into()],
        entrypoint: vec!["/init".into()],
        working_dir: Some("/root".into()),
        user: Some("1000:1000".into()),
        ..Default::default()
    }
}

fn layer1() -> Vec<u8> {
    let mut w = TarWriter::new();
    w.dir("etc", 0o755)
        .file("etc/a", b"a", 0o644)
        .file("etc/b", b"b", 0o644)
        .dir("opt", 0o755)
        .file("opt/x", b"x", 0o644)
        .file("opt/y", b"y", 0o644)
        .dir("bin", 0o755)
        .file("bin/sh", b"#!shell", 0o755)
        .file("keep", b"old", 0o644);
    w.finish()
}

fn layer2() -> Vec<u8> {
    let mut w = TarWriter::new();
    w.file("etc/.wh.a", b"", 0o644)
        .dir("opt", 0o755)
        .file("opt/.wh..wh..opq", b"", 0o644)
        .file("opt/new", b"new", 0o644)
        // Same-layer content wins over its whiteout, whatever the order.
        .file("keep", b"new", 0o644)
        .file(".wh.keep", b"", 0o644);
    w.finish()
}

struct Blob {
    digest: String,
    size: usize,
}

fn put_blob(dir: &Path, data: &[u8]) -> Blob {
    let hex = sha256_hex(data);
    let p = dir.join("blobs/sha256").join(&hex);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
    Blob {
        digest: format!("sha256:{hex}"),
        size: data.len(),
    }
}

fn blob_path(dir: &Path, b: &Blob) -> PathBuf {
    dir.join("blobs/sha256")
        .join(b.digest.strip_prefix("sha256:").unwrap())
}

fn config_with_diff_ids(ids: &[String]) -> String {
    CONFIG_JSON.replace(
        r#""diff_ids":[]"#,
        &format!(r#""diff_ids":{}"#, serde_json::to_string(ids).unwrap()),
    )
}

/// Writes an OCI layout with a gzip layer and a zstd layer; returns the
/// layer blobs and the manifest blob.
fn oci_layout(dir: &Path) -> (Vec<Blob>, Blob) {
    let (l1, l2) = (layer1(), layer2());
    let diff_ids = vec![
        format!("sha256:{}", sha256_hex(&l1)),
        format!("sha256:{}", sha256_hex(&l2)),
    ];
    let b1 = put_blob(dir, &gzip(&l1));
    let b2 = put_blob(dir, &zstd(&l2));
    let cfg = put_blob(dir, config_with_diff_ids(&diff_ids).as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg.digest, "size": cfg.size},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": b1.digest, "size": b1.size},
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", "digest": b2.digest, "size": b2.size},
        ],
    });
    let mb = put_blob(dir, serde_json::to_string(&manifest).unwrap().as_bytes());
    write_index(dir, &[&mb]);
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    (vec![b1, b2], mb)
}

fn write_index(dir: &Path, manifests: &[&Blob]) {
    let list: Vec<_> = manifests
        .iter()
        .map(|m| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": m.digest, "size": m.size,
                "annotations": {"org.opencontainers.image.ref.name": "test"},
            })
        })
        .collect();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": list});
    fs::write(
        dir.join("index.json"),
        serde_json::to_string(&index).unwrap(),
    )
    .unwrap();
}

fn tar_dir(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}

fn check_layers(st: &State, layers: &[LayerId]) {
    assert_eq!(layers.len(), 2);
    let top = st.layers.path(&layers[1]);
    let wh = fs::symlink_metadata(top.join("etc/a")).unwrap();
    assert!(
        wh.file_type().is_char_device() && wh.rdev() == 0,
        "etc/a is a whiteout"
    );
    assert_eq!(
        lget(&top.join("opt"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(fs::read(top.join("opt/new")).unwrap(), b"new");
    assert_eq!(fs::read(top.join("keep")).unwrap(), b"new");
    assert!(!top.join(".wh.keep").exists() && !top.join("etc/.wh.a").exists());
    overlay_view(st, layers);
}

/// Mounts the layers as a read-only overlay and checks the merged view.
fn overlay_view(st: &State, layers: &[LayerId]) {
    let mnt = st.dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let lower = layers
        .iter()
        .rev()
        .map(|l| st.layers.path(l).display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let ok = Command::new("mount")
        .args([
            "-t",
            "overlay",
            "overlay",
            "-o",
            &format!("lowerdir={lower}"),
        ])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !forkd_testing::require("overlay view", ok, "cannot mount overlayfs here") {
        return;
    }
    let view = || {
        assert!(!mnt.join("etc/a").exists(), "whiteout hides etc/a");
        assert_eq!(fs::read(mnt.join("etc/b")).unwrap(), b"b");
        assert!(!mnt.join("opt/x").exists(), "opaque dir hides opt/x");
        assert_eq!(fs::read(mnt.join("opt/new")).unwrap(), b"new");
        assert_eq!(fs::read(mnt.join("keep")).unwrap(), b"new");
        assert_eq!(fs::read(mnt.join("bin/sh")).unwrap(), b"#!shell");
    };
    let res = std::panic::catch_unwind(view);
    let _ = Command::new("umount").arg(&mnt).status();
    if let Err(p) = res {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn oci_layout_directory_and_archive() {
    if !root_or_skip("oci_layout_directory_and_archive") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    oci_layout(src.path());
    let img = import_image(
        &st.layers,
        &st.images,
        src.path(),
        "test/oci:1",
        &mut quiet(),
    )
    .unwrap();
    assert_eq!(img.config, expected_config());
    assert!(img.source.starts_with("oci:"), "{}", img.source);
    check_layers(&st, &img.layers);
    assert_eq!(st.images.get("test/oci:1").unwrap(), img);

    // The same layout as a tarball, zstd-compressed: same layers, no new copies.
    let file = st.dir.path().join("image.oci.tar.zst");
    fs::write(&file, zstd(&tar_dir(src.path()))).unwrap();
    let again = import_image(&st.layers, &st.images, &file, "test/oci:2", &mut quiet()).unwrap();
    assert_eq!(again.layers, img.layers);
    assert!(again.source.starts_with("oci-archive:"), "{}", again.source);
    assert_eq!(st.layer_dirs().len(), 2);
    assert_eq!(
        fs::read_dir(st.layers_root().join("tmp")).unwrap().count(),
        0
    );
    assert_eq!(st.images.list().unwrap().len(), 2);
}

#[test]
fn oci_blob_tampering_is_caught_and_leaves_nothing() {
    if !root_or_skip("oci_blob_tampering_is_caught_and_leaves_nothing") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    let (layers, _) = oci_layout(src.path());
    // Same size, different bytes in the second layer (past the zstd header).
    let p = blob_path(src.path(), &layers[1]);
    let mut data = fs::read(&p).unwrap();
    let last = data.len() - 1;
    data[last] ^= 0xff;
    fs::write(&p, &data).unwrap();
    let err = import_image(&st.layers, &st.images, src.path(), "bad", &mut quiet()).unwrap_err();
    // The damaged stream may fail to decompress or fail the digest check;
    // either way the error names the blob and nothing is kept.
    let msg = chain(&err);
    assert!(
        msg.contains(layers[1].digest.strip_prefix("sha256:").unwrap()),
        "{msg}"
    );
    st.assert_empty();

    // A plain digest mismatch: swap in different, valid content.
    let other = zstd(&layer1());
    fs::write(&p, &other).unwrap();
    let err = import_image(&st.layers, &st.images, src.path(), "bad", &mut quiet()).unwrap_err();
    assert!(
        matches!(&err, ImportError::DigestMismatch { digest, .. } | ImportError::SizeMismatch { digest, .. } if *digest == layers[1].digest),
        "{}",
        chain(&err)
    );
    st.assert_empty();
}

#[test]
fn oci_index_with_two_images_is_refused_with_a_list() {
    if !root_or_skip("oci_index_with_two_images_is_refused_with_a_list") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    let (_, m1) = oci_layout(src.path());
    let m2 = put_blob(src.path(), br#"{"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}"#);
    write_index(src.path(), &[&m1, &m2]);
    let err = import_image(&st.layers, &st.images, src.path(), "two", &mut quiet()).unwrap_err();
    let msg = chain(&err);
    assert!(
        matches!(err, ImportError::Ambiguous { count: 2, .. }),
        "{msg}"
    );
    assert!(
        msg.contains(&m1.digest) && msg.contains(&m2.digest),
        "{msg}"
    );
    st.assert_empty();
}

/// Writes a `docker save` style directory: `<hex>.json` config and
/// `<id>/layer.tar` layers (the first gzipped, as newer Docker does).
fn docker_save(dir: &Path, diff_ids: Option<Vec<String>>) {
    let (l1, l2) = (layer1(), layer2());
    let ids = diff_ids.unwrap_or_else(|| {
        vec![
            format!("sha256:{}", sha256_hex(&l1)),
            format!("sha256:{}", sha256_hex(&l2)),
        ]
    });
    let cfg = config_with_diff_ids(&ids);
    let cfg_name = format!("{}.json", sha256_hex(cfg.as_bytes()));
    fs::write(dir.join(&cfg_name), &cfg).unwrap();
    for (name, data) in [("l1", gzip(&l1)), ("l2", l2)] {
        fs::create_dir_all(dir.join(name)).unwrap();
        fs::write(dir.join(name).join("layer.tar"), data).unwrap();
    }
    let manifest = serde_json::json!([{
        "Config": cfg_name,
        "RepoTags": ["test:latest"],
        "Layers": ["l1/layer.tar", "l2/layer.tar"],
    }]);
    fs::write(
        dir.join("manifest.json"),
        serde_json::to_string(&manifest).unwrap(),
    )
    .unwrap();
    fs::write(dir.join("repositories"), b"{}").unwrap();
}

#[test]
fn docker_save_archive() {
    if !root_or_skip("docker_save_archive") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    docker_save(src.path(), None);
    let file = st.dir.path().join("saved.tar");
    fs::write(&file, tar_dir(src.path())).unwrap();
    let img = import_image(
        &st.layers,
        &st.images,
        &file,
        "docker/test:latest",
        &mut quiet(),
    )
    .unwrap();
    assert!(img.source.starts_with("docker-archive:"), "{}", img.source);
    assert_eq!(img.config, expected_config());
    check_layers(&st, &img.layers);

    // The same layers through OCI dedupe onto these.
    let oci = tempfile::tempdir().unwrap();
    oci_layout(oci.path());
    let o = import_image(&st.layers, &st.images, oci.path(), "oci", &mut quiet()).unwrap();
    assert_eq!(o.layers, img.layers);
}

#[test]
fn docker_save_with_wrong_diff_id_or_symlinked_layer_is_refused() {
    if !root_or_skip("docker_save_with_wrong_diff_id_or_symlinked_layer_is_refused") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    docker_save(
        src.path(),
        Some(vec![
            format!("sha256:{}", "0".repeat(64)),
            format!("sha256:{}", "1".repeat(64)),
        ]),
    );
    let file = st.dir.path().join("saved.tar");
    fs::write(&file, tar_dir(src.path())).unwrap();
    let err = import_image(&st.layers, &st.images, &file, "bad", &mut quiet()).unwrap_err();
    assert!(
        matches!(&err, ImportError::DigestMismatch { digest, .. } if digest.contains("l1/layer.tar")),
        "{}",
        chain(&err)
    );
    st.assert_empty();

    // A layer that is a symlink to a host file must not be read.
    let src = tempfile::tempdir().unwrap();
    docker_save(src.path(), None);
    fs::remove_file(src.path().join("l2/layer.tar")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.path().join("l2/layer.tar")).unwrap();
    fs::write(&file, tar_dir(src.path())).unwrap();
    let err = import_image(&st.layers, &st.images, &file, "bad", &mut quiet()).unwrap_err();
    assert!(chain(&err).contains("l2/layer.tar"), "{}", chain(&err));
    st.assert_empty();
}

#[test]
fn rootfs_directory_and_tarballs() {
    if !root_or_skip("rootfs_directory_and_tarballs") {
        return;
    }
    let st = State::new();
    let src = tempfile::tempdir().unwrap();
    fs::create_dir_all(src.path().join("usr/bin")).unwrap();
    fs::write(src.path().join("usr/bin/env"), b"#!").unwrap();
    std::os::unix::fs::symlink("usr/bin", src.path().join("bin")).unwrap();
    let dir_img = import_image(&st.layers, &st.images, src.path(), "rootfs", &mut quiet()).unwrap();
    assert_eq!(dir_img.layers.len(), 1);
    assert_eq!(dir_img.config, ImageConfig::default());
    assert!(dir_img.source.starts_with("dir:"));

    let plain = tar_dir(src.path());
    for (name, bytes) in [
        ("r.tar", plain.clone()),
        ("r.tar.gz", gzip(&plain)),
        ("r.tar.zst", zstd(&plain)),
    ] {
        let f = st.dir.path().join(name);
        fs::write(&f, bytes).unwrap();
        let img = import_image(&st.layers, &st.images, &f, "rootfs-tar", &mut quiet()).unwrap();
        assert_eq!(img.layers, dir_img.layers, "{name}");
        assert!(img.source.starts_with("tar:"));
    }
    assert_eq!(st.layer_dirs().len(), 1);
    assert_eq!(
        st.images.list().unwrap().len(),
        2,
        "re-import replaces the record"
    );
    assert_eq!(
        fs::read_dir(st.layers_root().join("tmp")).unwrap().count(),
        0
    );
}

#[test]
fn unsupported_sources_and_bad_names() {
    let st = State::new();
    let xz = st.dir.path().join("r.tar.xz");
    fs::write(&xz, b"\xfd7zXZ\0rest").unwrap();
    let err = import_image(&st.layers, &st.images, &xz, "x", &mut quiet()).unwrap_err();
    assert!(
        matches!(
            err,
            ImportError::UnsupportedCompression { format: "xz", .. }
        ),
        "{}",
        chain(&err)
    );

    let junk = st.dir.path().join("junk.bin");
    fs::write(&junk, vec![0x55u8; 2048]).unwrap();
    let err = import_image(&st.layers, &st.images, &junk, "x", &mut quiet()).unwrap_err();
    assert!(chain(&err).contains("malformed tar"), "{}", chain(&err));

    for bad in ["../escape", "", ".x", "a//b"] {
        let err =
            import_image(&st.layers, &st.images, st.dir.path(), bad, &mut quiet()).unwrap_err();
        assert!(
            matches!(err, ImportError::Image(ImageError::InvalidName { .. })),
            "{bad:?}: {err}"
        );
    }
    let err = import_image(
        &st.layers,
        &st.images,
        Path::new("/nonexistent/forkd"),
        "x",
        &mut quiet(),
    )
    .unwrap_err();
    assert!(chain(&err).contains("/nonexistent/forkd"));
    st.assert_empty();
}
