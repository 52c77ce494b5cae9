//! Paths on the daemon's host that requests name (an image's source, a build's
//! context): checked once, the same way, with errors that name what the path was for.

use crate::api::ApiError;
use std::path::{Path, PathBuf};

/// What a named path must be.
#[derive(Clone, Copy)]
pub enum Want {
    /// Anything, there or not (the caller opens it and says what it found).
    Any,
    /// Anything that exists.
    Exists,
    /// A directory.
    Dir,
    /// A path to be made, in a directory that exists.
    InDir,
}

/// `given`, which the request names as `what` (e.g. "image source"): absolute (the
/// daemon's working directory is not the caller's), and there as `want` says.
pub fn host_path(what: &str, given: &Path, want: Want) -> Result<PathBuf, ApiError> {
    let path = given.to_path_buf();
    if !path.is_absolute() {
        return Err(ApiError::bad_request(format!(
            "{what} {:?} must be an absolute path",
            given.display().to_string()
        )));
    }
    match want {
        Want::Exists if !path.exists() => Err(ApiError::not_found(format!(
            "{what} {} does not exist",
            path.display()
        ))),
        Want::Dir if !path.is_dir() => Err(ApiError::not_found(format!(
            "{what} {} is not a directory",
            path.display()
        ))),
        Want::InDir if !path.parent().is_some_and(|p| p.is_dir()) => Err(ApiError::bad_request(
            format!("{what} {}: its directory does not exist", path.display()),
        )),
        _ => Ok(path),
    }
}
