//! Where forkd looks for things when nobody says: the one place for the defaults of the
//! daemon's socket, its state root and the fixture cache, and the environment variables
//! that override them. The CLI's flags override both.

use std::path::PathBuf;

/// The daemon's socket unless `--socket` or `FORKD_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/forkd/forkd.sock";
/// The daemon's state root unless `--root` or `FORKD_ROOT` says otherwise.
pub const DEFAULT_ROOT: &str = "/var/lib/forkd";
/// Where `fixtures/setup.sh` keeps what it builds (images, suites, CRIU, Python) unless
/// `FORKD_CACHE` says otherwise.
pub const DEFAULT_CACHE: &str = "/var/cache/forkd";

fn from_env(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// `FORKD_SOCKET`, or [`DEFAULT_SOCKET`].
pub fn socket() -> PathBuf {
    from_env("FORKD_SOCKET", DEFAULT_SOCKET)
}

/// `FORKD_ROOT`, or [`DEFAULT_ROOT`].
pub fn root() -> PathBuf {
    from_env("FORKD_ROOT", DEFAULT_ROOT)
}

/// `FORKD_CACHE`, or [`DEFAULT_CACHE`]: the fixture cache.
pub fn cache() -> PathBuf {
    from_env("FORKD_CACHE", DEFAULT_CACHE)
}
