//! The sandbox mechanism, free of any daemon or HTTP concern.
//!
//! - [`setup`]: the set-up helper that builds namespaces and the root around the init;
//! - [`init`]: PID 1 inside every sandbox; [`relay`]: one process per exec under it;
//! - [`proto`]: the frame protocol spoken on the init's control socket;
//! - [`host`]: host-side operations (overlay mounts, starting the init, exec);
//! - [`seccomp`]: the system-call filter every sandbox runs under by default;
//! - [`id`]: validated sandbox ids.

#![forbid(unsafe_code)]

pub mod files;
pub mod fsops;
pub mod host;
pub mod id;
pub mod init;
pub mod layout;
pub use forkd_proto as proto;
pub mod relay;
pub mod seccomp;
pub mod setup;
pub mod watch;

pub use id::{CheckpointId, SandboxId};
pub use seccomp::Seccomp;

/// The first kernel whose ptrace reports a process's rseq area
/// (`PTRACE_GET_RSEQ_CONFIGURATION`), which CRIU needs to dump a process that registered
/// one (every thread of a program linked with glibc 2.35 or later does).
pub const RSEQ_DUMP_KERNEL: (u32, u32) = (5, 13);

/// The environment entry that keeps glibc from registering rseq areas, set for a
/// sandbox's init and every command on kernels older than [`RSEQ_DUMP_KERNEL`], so that
/// live checkpoints work there (CRIU: "has rseq but kernel lacks get_rseq_conf").
pub const RSEQ_OFF: (&str, &str) = ("GLIBC_TUNABLES", "glibc.pthread.rseq=0");

/// Whether this kernel needs [`RSEQ_OFF`] (decided once).
pub fn rseq_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| {
        forkd_sys::mount::kernel_version(&forkd_sys::mount::kernel_release())
            .is_some_and(|v| v < RSEQ_DUMP_KERNEL)
    })
}
