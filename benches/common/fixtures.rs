//! Fixtures built by `fixtures/setup.sh`, the root-and-Debian precondition, and the QEMU
//! guest's command line and serial counter.

use super::env::skip;
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Where `fixtures/setup.sh` puts its fixtures: `$FORKD_CACHE`, or `/var/cache/forkd`.
pub fn cache_dir() -> PathBuf {
    forkd::api::defaults::cache()
}

/// A fixture image built by `fixtures/setup.sh`: `$FORKD_CACHE/images/<file>`.
pub fn fixture_image(file: &str) -> PathBuf {
    cache_dir().join("images").join(file)
}

/// For a benchmark that needs root and the Debian fixture: the fixture, or `None` after
/// a SKIP line (an error under CI=true, see [`skip`]).
pub fn root_and_debian(bench: &str) -> Result<Option<PathBuf>> {
    if !nix::unistd::Uid::effective().is_root() {
        skip(bench, "needs root (namespaces, mounts, cgroups, CRIU)")?;
        return Ok(None);
    }
    let debian = fixture_image("debian.tar.zst");
    if !debian.exists() {
        skip(
            bench,
            &format!(
                "{} is missing (run fixtures/setup.sh debian)",
                debian.display()
            ),
        )?;
        return Ok(None);
    }
    Ok(Some(debian))
}

/// The QEMU guest of the benches and tests/guest.rs, run inside a Debian sandbox
/// holding the fixture's kernel and initramfs in /guest: TCG (CRIU cannot dump KVM file
/// descriptors), serial console to a file. One argument a line in
/// fixtures/qemu/sandbox-argv.
pub fn qemu_argv() -> Vec<&'static str> {
    include_str!("../../fixtures/qemu/sandbox-argv")
        .lines()
        .collect()
}

pub use super::guest_serial::GuestSerial;

/// A guest's serial log at `path`, if it can be read.
pub fn read_guest_serial(path: &Path) -> Option<GuestSerial> {
    let bytes = std::fs::read(path).ok()?;
    Some(GuestSerial::parse(&String::from_utf8_lossy(&bytes)))
}

/// The last complete `forkd-guest counter=N` line of a guest's serial log at `path`.
pub fn read_guest_counter(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let complete = &text[..text.rfind('\n')?];
    complete.lines().rev().find_map(|l| {
        let rest = &l[l.find("forkd-guest counter=")? + "forkd-guest counter=".len()..];
        rest.split_whitespace().next()?.parse().ok()
    })
}
