//! A layer tarball (any compression forkd detects) imported into a layer store: an error
//! or a whole layer, never a panic, and nothing left in the store's staging area.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use forkd_layers::{LayerStore, TarFlavor};

fuzz_target!(|data: &[u8]| {
    let root = common::scratch("layer_tar").join("store");
    let store = LayerStore::open(&root).expect("open the store");
    for flavor in [TarFlavor::Rootfs, TarFlavor::OciLayer, TarFlavor::Overlay] {
        if let Ok(id) = store.import_tar(data, flavor, &mut |_| {}) {
            store.verify(&id).expect("an imported layer verifies");
            store.remove(&id).expect("remove the layer");
        }
    }
    let left = std::fs::read_dir(root.join("tmp")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "staging left behind");
});
