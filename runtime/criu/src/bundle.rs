//! A relocatable CRIU bundle: its wrapper script resolved to the loader and binary it
//! runs, so that CRIU is started directly.

use std::path::{Path, PathBuf};

/// For a private bundle as `fixtures/setup.sh criu` installs it (`<prefix>/bin/criu`, a
/// shell wrapper that runs `<prefix>/usr/sbin/criu` through the prefix's own loader and
/// libraries, its rlimit shim preloaded), the same launch without the shell: a couple of
/// milliseconds per call.
pub(crate) fn bundle_launch(wrapper: &Path) -> Option<(PathBuf, Vec<std::ffi::OsString>)> {
    let prefix = wrapper.parent()?.parent()?;
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    let loader_name = match std::env::consts::ARCH {
        "x86_64" => "ld-linux-x86-64.so.2",
        "aarch64" => "ld-linux-aarch64.so.1",
        _ => return None,
    };
    let libs = prefix.join("usr/lib").join(&triplet);
    let loader = libs.join(loader_name);
    let criu = prefix.join("usr/sbin/criu");
    if wrapper.file_name()? != "criu" || !loader.is_file() || !criu.is_file() {
        return None;
    }
    let mut path = std::ffi::OsString::from(libs.as_os_str());
    path.push(":");
    path.push(prefix.join("lib").join(&triplet));
    let mut args = Vec::new();
    // The bundle's shims (fixtures/criu/rlimit-shim.c, root-shim.c), as its wrapper
    // preloads them.
    let mut preload = std::ffi::OsString::new();
    for name in ["rlimit-shim.so", "root-shim.so"] {
        let shim = prefix.join("lib/forkd").join(name);
        if shim.is_file() {
            if !preload.is_empty() {
                preload.push(":");
            }
            preload.push(shim);
        }
    }
    if !preload.is_empty() {
        args.extend(["--preload".into(), preload]);
    }
    args.extend(["--library-path".into(), path, criu.into()]);
    Some((loader, args))
}
