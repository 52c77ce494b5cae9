//! An archive coming out of a sandbox, unpacked on the host as `forkd cp SANDBOX:PATH
//! DEST` does (`forkd_sandbox::files::unpack`, `Side::Host`): refused with an error or
//! unpacked, never a panic, and nothing written outside the destination (a sibling
//! directory stays empty, whatever symlinks, hard links or `..` the archive holds).
#![no_main]

mod common;

use forkd_sandbox::files::{unpack, Side};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let dir = common::scratch("cp_archive");
    let outside = dir.join("outside");
    let dest = dir.join("dest");
    for d in [&outside, &dest] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d).expect("scratch directories");
    }
    // Into an existing directory, and as a new name.
    let _ = unpack(&dest, data, Side::Host { top: Path::new("x") });
    let _ = unpack(&dest.join("renamed"), data, Side::Host { top: Path::new("x") });
    let left: Vec<_> = std::fs::read_dir(&outside)
        .expect("list the sibling")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "the archive wrote outside its destination: {left:?}");
    assert!(!dir.join("escaped").exists(), "the archive wrote beside its destination");
});
