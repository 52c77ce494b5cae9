//! Builds whose context comes with the request (`POST /v1/images/build/upload`, a tar):
//! what a client on another host needs, which has no path on the daemon's host to name.
//! The archive is unpacked as untrusted into a directory of the daemon's own
//! (`<data>/build-contexts/<random>`: no entry outside it, none written through a
//! symlink, no hard links or device nodes, owners not kept, setuid and setgid bits
//! dropped), the build runs as any build does over it, and the directory goes with the
//! request, whatever its outcome; a daemon that died meanwhile removes what is left at
//! its next start ([`Daemon::sweep_build_contexts`]).

use crate::api::{ApiError, BuildRequest, BuildResult};
use crate::daemon::{log, Daemon};
use std::path::PathBuf;
use std::sync::Arc;

const DIR: &str = "build-contexts";

impl Daemon {
    /// Builds `req` (its `context` ignored) over the context the tar `body` holds.
    pub fn build_uploaded(
        self: &Arc<Self>,
        mut req: BuildRequest,
        body: &[u8],
        given: Option<forkd_registry::auth::Given>,
    ) -> Result<BuildResult, ApiError> {
        if let Some(f) = &req.dockerfile {
            if std::path::Path::new(f).is_absolute() || f.split('/').any(|c| c == "..") {
                return Err(ApiError::bad_request(format!(
                    "dockerfile {f:?} must be a path inside the uploaded context"
                )));
            }
        }
        let dir = self
            .node
            .data
            .join(DIR)
            .join(forkd_sandbox::id::random_hex(8));
        std::fs::create_dir_all(&dir)
            .map_err(|e| ApiError::internal(format!("create {}: {e}", dir.display())))?;
        let _gone = Remove(dir.clone());
        forkd_sandbox::files::unpack(
            &dir,
            body,
            forkd_sandbox::files::Side::Host {
                top: std::path::Path::new("."),
            },
        )
        .map_err(|e| ApiError::bad_request(format!("the uploaded build context: {e}")))?;
        req.context = dir.display().to_string();
        self.build_image(req, given)
    }

    /// Removes the contexts of uploaded builds a daemon that died left behind.
    pub(crate) fn sweep_build_contexts(&self) {
        let dir = self.node.data.join(DIR);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                log::info(&format!(
                    "removing a build context left behind: {}",
                    e.path().display()
                ));
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Removes a directory when dropped.
struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn(&format!("remove {}: {e}", self.0.display()));
            }
        }
    }
}
