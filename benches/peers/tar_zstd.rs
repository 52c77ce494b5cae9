//! The tar + zstd peer: archiving a directory the way one would without forkd. Two
//! benchmarks use it, each timed its own way, so the command lines stay as they were
//! measured:
//!
//! - benches/checkpoint/fs.rs: [`pack_command`], `tar | zstd -T0 -3` of a sandbox's
//!   writable layer against a filesystem checkpoint (timed by `time_command`, µs);
//! - benches/slurm.rs: [`unpack`] an archive's contents, then [`export`] (`tar | zstd
//!   -T0 -3` + `sha256sum`) and [`import`] (`sha256sum` + `zstd -d | tar -x`) against
//!   forkd's export and verified import of a state (wall time of `sh -c`, ms).

use anyhow::Result;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// `tar -C DIR -cf - . | zstd -T0 -3 -q -c > ARCHIVE` under `bash -o pipefail`, to be
/// run (and timed) by the caller.
pub fn pack_command(dir: &Path, archive: &Path) -> Command {
    let mut cmd = Command::new("bash");
    cmd.args([
        "-o",
        "pipefail",
        "-c",
        r#"tar -C "$0" -cf - . | zstd -T0 -3 -q -c > "$1""#,
    ])
    .arg(dir)
    .arg(archive);
    cmd
}

/// Unpacks a zstd-compressed tar (such as a forkd archive) into `dir`; milliseconds.
pub fn unpack(archive: &Path, dir: &Path) -> Result<u64> {
    sh(&format!(
        "zstd -dcq '{}' | tar -x -C '{}'",
        archive.display(),
        dir.display()
    ))
}

/// The peer's export: `tar | zstd -T0 -3` of `dir` into `tarball`, then its SHA-256 (to
/// ship it); milliseconds.
pub fn export(dir: &Path, tarball: &Path) -> Result<u64> {
    sh(&format!(
        "tar -C '{}' -cf - . | zstd -T0 -3 -q -o '{}' && sha256sum '{}' >/dev/null",
        dir.display(),
        tarball.display(),
        tarball.display()
    ))
}

/// The peer's import: the SHA-256 of `tarball`, then `zstd -d | tar -x` into `dir`
/// (nothing inside is verified); milliseconds.
pub fn import(tarball: &Path, dir: &Path) -> Result<u64> {
    sh(&format!(
        "sha256sum '{}' >/dev/null && zstd -dcq '{}' | tar -x -C '{}'",
        tarball.display(),
        tarball.display(),
        dir.display()
    ))
}

/// Runs a shell line; its wall time in milliseconds.
fn sh(line: &str) -> Result<u64> {
    let t = Instant::now();
    let st = Command::new("sh").args(["-c", line]).status()?;
    anyhow::ensure!(st.success(), "`{line}` failed");
    Ok(t.elapsed().as_millis() as u64)
}
