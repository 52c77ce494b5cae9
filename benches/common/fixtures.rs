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

/// What a guest's serial log says (complete lines only): how many times it booted, and
/// each `forkd-guest counter=N secret=S` line as (N, S), in order.
#[derive(Debug, Default)]
pub struct GuestSerial {
    pub boots: usize,
    pub counters: Vec<(u64, String)>,
}

impl GuestSerial {
    pub fn read(path: &Path) -> Option<GuestSerial> {
        let bytes = std::fs::read(path).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let complete = &text[..text.rfind('\n')?];
        let mut s = GuestSerial::default();
        for line in complete.lines() {
            let Some(i) = line.find("forkd-guest ") else {
                continue;
            };
            let rest = line[i + "forkd-guest ".len()..].trim_end_matches('\r');
            if rest.starts_with("boot secret=") {
                s.boots += 1;
            } else if let Some(rest) = rest.strip_prefix("counter=") {
                let mut it = rest.split(' ');
                let n = it.next().and_then(|n| n.parse().ok());
                let secret = it.next().and_then(|x| x.strip_prefix("secret="));
                if let (Some(n), Some(secret)) = (n, secret) {
                    s.counters.push((n, secret.to_string()));
                }
            }
        }
        Some(s)
    }

    pub fn last(&self) -> u64 {
        self.counters.last().map_or(0, |c| c.0)
    }

    /// Why this is not one guest run carrying `secret` (one boot, counters 1, 2, 3, ...
    /// with no restart or gap, every line with that secret); `None` when it is.
    pub fn not_one_run_of(&self, secret: &str) -> Option<String> {
        if self.boots != 1 {
            return Some(format!("{} boot lines", self.boots));
        }
        if let Some((i, (n, _))) = (1u64..).zip(&self.counters).find(|(i, c)| c.0 != *i) {
            return Some(format!("counter line {i} says {n} (a restart or a gap)"));
        }
        self.counters
            .iter()
            .find(|c| c.1 != secret)
            .map(|c| format!("counter {} has secret {} instead of {secret}", c.0, c.1))
    }
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
