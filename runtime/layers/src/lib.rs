//! forkd-layers: the content-addressed layer store, the tree hash that names
//! layers, safe archive extraction, and image import.
//!
//! - [`hash`]: the `forkd-tree-v1` tree hash ([`tree_hash`]).
//! - [`LayerStore`]: sealed, immutable layers under `<state>/layers`, each
//!   usable as an overlayfs lowerdir; imports from directories and tar
//!   streams, and adoption of a sandbox's upper directory by rename.
//! - [`extract`]: tar extraction that never writes outside its target.
//! - [`blobs`]: layers streamed in as compressed blobs, and the index of which blobs
//!   and `diff_id`s the store holds.
//! - [`devices`]: the device nodes a sandbox root carries under `dev/`.
//! - [`ImageStore`] and [`import_image`]: named layer stacks from a rootfs
//!   directory, a tarball, an OCI image layout or a `docker save` archive.
//!
//! Everything here is blocking; callers with an async runtime run it on a
//! blocking thread.

#![forbid(unsafe_code)]

pub mod blobs;
pub mod copy;
pub mod devices;
pub mod diff;
pub mod error;
pub mod export;
pub mod extract;
mod fsx;
pub mod hash;
mod id;
mod image;
mod import;
mod progress;
mod store;

pub use blobs::PendingLayer;
pub use error::{ImageError, ImportError, LayerError};
pub use export::export_tar;
pub use extract::TarFlavor;
pub use hash::{tree_hash, TREE_FORMAT};
pub use id::{InvalidHex, LayerId, TreeHash};
pub use image::{validate_image_name, Image, ImageConfig, ImageStore};
pub use import::{import_image, parse_image_config};
pub use progress::{Progress, REPORT_EVERY};
pub use store::{LayerInfo, LayerStore, MIN_PREFIX};
