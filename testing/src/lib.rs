//! The one rule for a test or benchmark that cannot run on this machine (no root, a
//! missing tool or fixture): it prints `SKIP <name>: <why>` and passes, except under CI
//! (`CI=true` or `CI=1`), where nothing may be skipped and it fails instead. Every test
//! helper and benchmark of the workspace goes through these functions.

/// True when running in CI, where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skips `name` because of `why`: prints the SKIP line, or panics under CI.
pub fn skip(name: &str, why: &str) {
    if in_ci() {
        panic!("{name}: {why} (CI: nothing may be skipped)");
    }
    println!("SKIP {name}: {why}");
}

/// `ok`, or a skip of `name` because of `why` (see [`skip`]).
pub fn require(name: &str, ok: bool, why: &str) -> bool {
    if !ok {
        skip(name, why);
    }
    ok
}

/// True when this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// Root, or a skip of `name` (see [`skip`]).
pub fn require_root(name: &str) -> bool {
    require(name, is_root(), "needs root")
}
