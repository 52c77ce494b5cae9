//! The file-identity check: a sandbox's root as the daemon builds it (a base subvolume
//! whose `tree/` is the overlay's one lower layer, the writable layer a snapshot of the
//! base: see `daemon/bases.rs`), written through, and every entry's (st_dev, st_ino)
//! compared. It runs on the data volume when the daemon has it mounted, else on a small
//! btrfs made for the check (a sparse file under /tmp, loop-mounted and removed after).
//! For comparison it also stacks the same tree under an empty subvolume, as sandboxes
//! were once made, and says how many identities that would share.

use super::{error_chain, Check, TempDir};
use anyhow::{bail, Context};
use std::collections::HashMap;
use std::ffi::CString;
use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const NAME: &str = "identity";
/// Files in the lower tree and written through the overlay.
const FILES: usize = 64;

pub(super) fn check_identity() -> Check {
    match probe() {
        Ok(detail) => Check::ok(NAME, true, detail),
        Err(e) => Check::not_ok(NAME, true, format!("{e:#}")),
    }
}

/// A btrfs to probe on: the daemon's volume, or a scratch one unmounted on drop.
struct Scratch {
    dir: PathBuf,
    mounted: Option<TempDir>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for sub in ["upper-old", "sandbox", "base"] {
            let _ = delete(&self.dir, sub);
        }
        let _ = fs::remove_dir_all(&self.dir);
        if let Some(t) = &self.mounted {
            let _ = Command::new("umount").arg(t.0.join("mnt")).status();
        }
    }
}

fn scratch() -> anyhow::Result<Scratch> {
    let vol = crate::api::defaults::root().join("vol");
    if forkd_volume::mountinfo::mount_at(&vol)
        .ok()
        .flatten()
        .is_some()
    {
        let dir = vol
            .join("tmp")
            .join(format!("doctor-identity-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        return Ok(Scratch { dir, mounted: None });
    }
    let tmp = TempDir::new("forkd-doctor-btrfs")?;
    let img = tmp.0.join("btrfs.img");
    let mnt = tmp.0.join("mnt");
    fs::create_dir(&mnt)?;
    fs::File::create(&img)?.set_len(256 << 20)?;
    for (what, cmd) in [
        (
            "mkfs.btrfs",
            Command::new("mkfs.btrfs").arg("-q").arg(&img).output(),
        ),
        (
            "mount",
            Command::new("mount")
                .arg("-o")
                .arg("loop")
                .arg(&img)
                .arg(&mnt)
                .output(),
        ),
    ] {
        let out = cmd.with_context(|| format!("run {what}"))?;
        if !out.status.success() {
            bail!(
                "{what} of a scratch btrfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(Scratch {
        dir: mnt,
        mounted: Some(tmp),
    })
}

fn cname(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

fn delete(parent: &Path, name: &str) -> std::io::Result<()> {
    let p = fs::File::open(parent)?;
    forkd_sys::btrfs::delete_subvolume(p.as_fd(), &cname(name))
}

/// Every entry under `root` by (st_dev, st_ino), with how many names each has.
fn identities(root: &Path, out: &mut HashMap<(u64, u64), (Vec<PathBuf>, u64, bool)>) {
    let Ok(rd) = fs::read_dir(root) else { return };
    for e in rd.flatten() {
        let Ok(m) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        let entry = out.entry((m.dev(), m.ino())).or_default();
        entry.0.push(e.path());
        entry.1 = m.nlink();
        entry.2 = m.is_dir();
        if m.is_dir() {
            identities(&e.path(), out);
        }
    }
}

/// The (st_dev, st_ino) pairs shared by different files under `root`, and how many
/// entries there are.
fn shared(root: &Path) -> (Vec<String>, usize) {
    let mut ids = HashMap::new();
    identities(root, &mut ids);
    let total = ids.values().map(|v| v.0.len()).sum();
    let bad = ids
        .iter()
        .filter(|(_, (names, links, dir))| names.len() > 1 && (*dir || names.len() as u64 > *links))
        .map(|((dev, ino), (names, _, _))| {
            format!(
                "({dev}, {ino}): {} and {}",
                names[0].display(),
                names[1].display()
            )
        })
        .collect();
    (bad, total)
}

fn probe() -> anyhow::Result<String> {
    let s = scratch()?;
    let dir = fs::File::open(&s.dir).with_context(|| format!("open {}", s.dir.display()))?;
    let at = |what: &str| format!("{what} in {}", s.dir.display());
    forkd_sys::btrfs::create_subvolume(dir.as_fd(), &cname("base"))
        .with_context(|| at("create subvolume base"))?;
    let tree = s.dir.join("base/tree");
    fs::create_dir_all(tree.join("lib"))?;
    for i in 0..FILES {
        fs::write(tree.join(format!("lib/lib{i}.so")), format!("{i}\n"))?;
    }
    let base = fs::File::open(s.dir.join("base"))?;
    forkd_sys::btrfs::snapshot(base.as_fd(), dir.as_fd(), &cname("sandbox"), false)
        .with_context(|| at("snapshot base"))?;
    forkd_sys::btrfs::create_subvolume(dir.as_fd(), &cname("upper-old"))
        .with_context(|| at("create subvolume upper-old"))?;
    let (mut shared_old, mut entries) = (0, 0);
    for (layer, count) in [("sandbox", false), ("upper-old", true)] {
        let (upper, work) = (
            s.dir.join(layer).join("upper"),
            s.dir.join(layer).join("work"),
        );
        fs::create_dir_all(&upper)?;
        fs::create_dir_all(&work)?;
        let mnt = forkd_sys::mount::overlay(&[&tree], Some((&upper, &work)))
            .map_err(|e| anyhow::anyhow!("mount the overlay: {}", error_chain(&e)))?;
        let merged = forkd_sys::mount::fd_path(mnt.as_fd());
        fs::create_dir_all(merged.join("home/w"))?;
        for i in 0..FILES {
            fs::write(merged.join(format!("home/w/f{i}")), b"written\n")?;
        }
        // A copy-up keeps the number the file had.
        let before = fs::metadata(merged.join("lib/lib1.so"))?.ino();
        fs::write(merged.join("lib/lib1.so"), b"changed\n")?;
        let after = fs::metadata(merged.join("lib/lib1.so"))?.ino();
        let (bad, total) = shared(&merged);
        if count {
            shared_old = bad.len();
            continue;
        }
        if before != after {
            bail!("a file changed its inode number when it was copied up ({before} -> {after})");
        }
        entries = total;
        if let Some(first) = bad.first() {
            bail!(
                "{} of {total} entries share (st_dev, st_ino) with a different file, e.g. {first}: overlayfs on this kernel does not keep the base's numbering",
                bad.len()
            );
        }
    }
    Ok(format!(
        "{entries} entries of a base and a snapshot over it, each its own (st_dev, st_ino) (an empty subvolume over the same tree would share {shared_old}), on {}",
        if s.mounted.is_some() { "a scratch btrfs" } else { "the data volume" }
    ))
}
