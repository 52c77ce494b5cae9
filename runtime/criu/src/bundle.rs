//! A relocatable CRIU bundle: its wrapper script resolved to the loader, binary and
//! shims it runs, so that CRIU is started directly.

use std::path::{Path, PathBuf};

/// How CRIU is started: a program and the arguments before CRIU's own.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub program: PathBuf,
    pub args: Vec<std::ffi::OsString>,
}

impl Launch {
    pub fn plain(program: &Path) -> Launch {
        Launch {
            program: program.to_path_buf(),
            args: Vec::new(),
        }
    }
}

/// For a private bundle as `fixtures/setup.sh criu` installs it (`<prefix>/bin/criu`, a
/// shell wrapper that runs `<prefix>/usr/sbin/criu` through the loader and libraries in
/// `<prefix>/lib/forkd/criu`, the bundle's shims preloaded), the same launch without the
/// shell: a couple of milliseconds per call.
pub(crate) fn bundle_launch(wrapper: &Path) -> Option<Launch> {
    let prefix = wrapper.parent()?.parent()?;
    let libs = prefix.join("lib/forkd/criu");
    let loader_name = match std::env::consts::ARCH {
        "x86_64" => "ld-linux-x86-64.so.2",
        "aarch64" => "ld-linux-aarch64.so.1",
        _ => return None,
    };
    let loader = libs.join(loader_name);
    let criu = prefix.join("usr/sbin/criu");
    if wrapper.file_name()? != "criu" || !loader.is_file() || !criu.is_file() {
        return None;
    }
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
    args.extend(["--library-path".into(), libs.into_os_string(), criu.into()]);
    Some(Launch {
        program: loader,
        args,
    })
}
