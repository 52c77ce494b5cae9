//! An image archive (`docker save`, OCI layout tarball, plain rootfs tarball) imported as
//! an image: an error or a whole image, never a panic.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use forkd_layers::{import_image, ImageStore, LayerStore};

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch("image_archive");
    let layers = LayerStore::open(&dir.join("layers")).expect("open the layer store");
    let images = ImageStore::open(&dir.join("images")).expect("open the image store");
    let src = dir.join("image.tar");
    std::fs::write(&src, data).expect("write the archive");
    if import_image(&layers, &images, &src, "fuzz", &mut |_| {}).is_ok() {
        let _ = images.remove("fuzz");
    }
});
