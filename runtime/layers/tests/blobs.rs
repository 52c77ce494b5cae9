//! Layers streamed in as compressed blobs, and the blob index.

mod common;

use common::*;
use forkd_layers::tree_hash;

fn layer_tar() -> Vec<u8> {
    let mut t = TarWriter::new();
    t.dir("etc", 0o755)
        .file("etc/motd", b"hello\n", 0o644)
        .file("etc/.wh.gone", b"", 0o644);
    t.finish()
}

#[test]
fn a_blob_is_extracted_as_it_streams_and_its_diff_id_is_the_tars_digest() {
    if !root_or_skip("a_blob_is_extracted_as_it_streams_and_its_diff_id_is_the_tars_digest") {
        return;
    }
    let st = State::new();
    let tar = layer_tar();
    let mut ids = Vec::new();
    for blob in [gzip(&tar), zstd(&tar), tar.clone()] {
        let pending = st.layers.stage_blob(&blob[..], &mut quiet()).unwrap();
        assert_eq!(pending.diff_id, sha256_hex(&tar));
        assert_eq!(pending.tar_bytes, tar.len() as u64);
        ids.push(st.layers.seal_pending(pending, &mut quiet()).unwrap());
    }
    assert!(
        ids.iter().all(|i| *i == ids[0]),
        "one tree whatever the compression"
    );
    let tree = st.layers.path(&ids[0]);
    assert_eq!(std::fs::read(tree.join("etc/motd")).unwrap(), b"hello\n");
    // The OCI whiteout became an overlayfs one (a 0/0 character device).
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(tree.join("etc/gone"))
        .unwrap()
        .file_type()
        .is_char_device());
    assert_eq!(tree_hash(&tree).unwrap(), ids[0].tree_hash());
}

#[test]
fn a_dropped_pending_layer_and_a_broken_blob_leave_nothing() {
    if !root_or_skip("a_dropped_pending_layer_and_a_broken_blob_leave_nothing") {
        return;
    }
    let st = State::new();
    let pending = st
        .layers
        .stage_blob(&gzip(&layer_tar())[..], &mut quiet())
        .unwrap();
    drop(pending);
    let mut cut = gzip(&layer_tar());
    cut.truncate(cut.len() / 2);
    assert!(st.layers.stage_blob(&cut[..], &mut quiet()).is_err());
    st.assert_empty();
}

#[test]
fn the_index_maps_blobs_to_diff_ids_to_layers_while_the_layer_lives() {
    if !root_or_skip("the_index_maps_blobs_to_diff_ids_to_layers_while_the_layer_lives") {
        return;
    }
    let st = State::new();
    let tar = layer_tar();
    let blob = gzip(&tar);
    let (blob_hex, diff) = (sha256_hex(&blob), sha256_hex(&tar));
    assert!(st.layers.layer_of_blob(&blob_hex).is_none());
    let pending = st.layers.stage_blob(&blob[..], &mut quiet()).unwrap();
    let id = st.layers.seal_pending(pending, &mut quiet()).unwrap();
    st.layers.record_blob(&blob_hex, &diff, &id).unwrap();
    assert_eq!(st.layers.layer_of_blob(&blob_hex), Some((diff.clone(), id)));
    assert_eq!(st.layers.layer_of_diff(&diff), Some(id));
    // Another compression of the same tar is found by its diff_id.
    assert!(st.layers.layer_of_blob(&sha256_hex(&zstd(&tar))).is_none());
    assert!(
        st.layers.record_blob("../x", &diff, &id).is_err(),
        "keys are digests, never paths"
    );
    assert!(st.layers.layer_of_blob("../../etc/passwd").is_none());
    assert_eq!(st.layers.prune_index().unwrap(), 0);
    st.layers.remove(&id).unwrap();
    assert!(
        st.layers.layer_of_blob(&blob_hex).is_none(),
        "a removed layer is not found"
    );
    assert_eq!(st.layers.prune_index().unwrap(), 2);
}
