//! A checkpoint archive (`forkd checkpoint export`'s format) unpacked and verified by the
//! daemon's reader: refused with an error or verified whole, never a panic; whatever
//! the reader staged or added to the layer store is removable.
#![no_main]

mod common;

use forkd_layers::LayerStore;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch("checkpoint_archive");
    let layers = LayerStore::open(&dir.join("layers")).expect("open the layer store");
    let src = dir.join("fuzz.forkd");
    std::fs::write(&src, data).expect("write the archive");
    let stage = dir.join("stage");
    let _ = std::fs::remove_dir_all(&stage);
    let mut added = Vec::new();
    let file = std::fs::File::open(&src).expect("open the archive");
    let _ = forkd::daemon::unpack_and_verify(&layers, &src, file, &stage, &mut added);
    for l in added {
        layers.remove(&l).expect("remove an added layer");
    }
    std::fs::remove_dir_all(&stage).expect("remove the stage");
});
