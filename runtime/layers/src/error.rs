//! Error types: one enum per concern. Every I/O error carries the step that
//! failed and the path it failed on; messages never repeat their `#[source]`
//! because callers print the whole chain.

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::id::{InvalidHex, LayerId};

/// Errors of the layer store, tree hashing and archive extraction.
#[derive(Debug, Error)]
pub enum LayerError {
    #[error("{step} {}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid layer id {input:?}: expected 64 lowercase hex characters")]
    InvalidId { input: String },
    #[error("layer id prefix {prefix:?} is too short or not lowercase hex: give at least 12 hex characters")]
    BadPrefix { prefix: String },
    #[error("no layer matches {prefix:?}")]
    NoMatch { prefix: String },
    #[error(
        "layer id prefix {prefix:?} is ambiguous: it matches {}",
        join_ids(matches)
    )]
    AmbiguousPrefix {
        prefix: String,
        matches: Vec<LayerId>,
    },
    #[error("layer {0} not found")]
    NotFound(LayerId),
    /// An archive entry that is refused: unsafe path, link or file type, or
    /// a header that does not make sense.
    #[error("archive entry {entry:?}: {reason}")]
    BadEntry { entry: String, reason: String },
    #[error("malformed tar archive at byte {offset} ({context})")]
    Tar {
        offset: u64,
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot import {kind} {}", path.display())]
    UnsupportedFile { kind: &'static str, path: PathBuf },
    #[error("directory tree deeper than {limit} levels at {}", path.display())]
    TooDeep { limit: usize, path: PathBuf },
    #[error("{} changed while it was being hashed", path.display())]
    Changed { path: PathBuf },
    #[error("layer {id} is corrupt: its tree now hashes to {actual}")]
    Corrupt {
        id: LayerId,
        actual: crate::TreeHash,
    },
    #[error("{} is not on the same filesystem as the layer store", path.display())]
    CrossDevice { path: PathBuf },
    #[error("invalid layer metadata {}", path.display())]
    Metadata {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// Cleaning up after a failure failed too; both errors are kept.
    #[error("cleaning up {} failed ({cleanup}) after an earlier error", path.display())]
    Cleanup {
        path: PathBuf,
        cleanup: io::Error,
        #[source]
        original: Box<LayerError>,
    },
}

impl From<InvalidHex> for LayerError {
    fn from(e: InvalidHex) -> LayerError {
        LayerError::InvalidId { input: e.0 }
    }
}

fn join_ids(ids: &[LayerId]) -> String {
    ids.iter().map(|i| i.short()).collect::<Vec<_>>().join(", ")
}

impl LayerError {
    pub(crate) fn io(step: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        LayerError::Io {
            step,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn entry(entry: &[u8], reason: impl Into<String>) -> Self {
        LayerError::BadEntry {
            entry: String::from_utf8_lossy(entry).into_owned(),
            reason: reason.into(),
        }
    }
}

/// Shorthand: `.map_err(io_at("reading", &path))`.
pub(crate) fn io_at<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> LayerError + 'a {
    move |e| LayerError::io(step, path, e)
}

/// Same as [`io_at`] for rustix calls.
pub(crate) fn errno_at<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(rustix::io::Errno) -> LayerError + 'a {
    move |e| LayerError::io(step, path, e.into())
}

/// Errors of the image store.
#[derive(Debug, Error)]
pub enum ImageError {
    #[error("invalid image name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("image {0:?} not found")]
    NotFound(String),
    #[error("{step} {}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid image record {}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("image record {} has version {version}, this build reads version {supported}", path.display())]
    Version {
        path: PathBuf,
        version: u32,
        supported: u32,
    },
}

/// Errors of [`crate::import_image`].
#[derive(Debug, Error)]
pub enum ImportError {
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error("{step} {}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a directory or a tar archive", path.display())]
    UnknownSource { path: PathBuf },
    #[error("{}: {format} archives are not supported; decompress it first", path.display())]
    UnsupportedCompression { path: PathBuf, format: &'static str },
    #[error("cannot parse {what} {}", path.display())]
    Parse {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{} holds {count} images, expected one: {list}", path.display())]
    Ambiguous {
        path: PathBuf,
        count: usize,
        list: String,
    },
    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("blob {digest}: content has digest sha256:{actual}")]
    DigestMismatch { digest: String, actual: String },
    #[error("blob {digest}: size is {actual} bytes, the descriptor says {expected}")]
    SizeMismatch {
        digest: String,
        expected: u64,
        actual: u64,
    },
    /// A layer inside an image failed to extract.
    #[error("layer {layer}")]
    InLayer {
        layer: String,
        #[source]
        source: LayerError,
    },
    #[error("blob {digest}: unsupported digest algorithm (only sha256 is supported)")]
    UnsupportedDigest { digest: String },
    /// Cleaning up after a failure failed too; both errors are kept.
    #[error("cleaning up {} failed ({cleanup}) after an earlier error", path.display())]
    Cleanup {
        path: PathBuf,
        cleanup: io::Error,
        #[source]
        original: Box<ImportError>,
    },
}

impl ImportError {
    pub(crate) fn io(step: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ImportError::Io {
            step,
            path: path.into(),
            source,
        }
    }
    pub(crate) fn parse(
        what: &'static str,
        path: impl Into<PathBuf>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ImportError::Parse {
            what,
            path: path.into(),
            source: Box::new(source),
        }
    }
    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        ImportError::Invalid {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
