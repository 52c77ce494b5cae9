//! A relocatable CRIU bundle: its wrapper script resolved to the binary and shims it
//! runs, so that CRIU is started directly.

use std::path::{Path, PathBuf};

/// How CRIU is started: a program, the arguments before CRIU's own, and environment.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub program: PathBuf,
    pub args: Vec<std::ffi::OsString>,
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl Launch {
    pub fn plain(program: &Path) -> Launch {
        Launch {
            program: program.to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// For a private bundle as `fixtures/setup.sh criu` installs it (`<prefix>/bin/criu`, a
/// shell wrapper that runs `<prefix>/usr/sbin/criu`, built against the host's libraries,
/// with the bundle's shims preloaded), the same launch without the shell: a couple of
/// milliseconds per call.
pub(crate) fn bundle_launch(wrapper: &Path) -> Option<Launch> {
    let prefix = wrapper.parent()?.parent()?;
    let criu = prefix.join("usr/sbin/criu");
    if wrapper.file_name()? != "criu" || !criu.is_file() {
        return None;
    }
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
    let mut env = Vec::new();
    if !preload.is_empty() {
        env.push(("LD_PRELOAD".into(), preload));
    }
    Some(Launch {
        program: criu,
        args: Vec::new(),
        env,
    })
}
