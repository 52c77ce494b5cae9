//! The sandbox mechanism, free of any daemon or HTTP concern.
//!
//! - [`setup`]: the set-up helper that builds namespaces and the root around the init;
//! - [`init`]: PID 1 inside every sandbox; [`relay`]: one process per exec under it;
//! - [`proto`]: the frame protocol spoken on the init's control socket;
//! - [`host`]: host-side operations (overlay mounts, starting the init, exec);
//! - [`id`]: validated sandbox ids.

#![forbid(unsafe_code)]

pub mod files;
pub mod host;
pub mod id;
pub mod init;
pub mod proto;
pub mod relay;
pub mod setup;

pub use id::{CheckpointId, SandboxId};
