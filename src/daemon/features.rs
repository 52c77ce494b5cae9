//! What this kernel can do, asked once when the daemon starts and handed to what depends
//! on it: no part of the daemon asks the kernel again on a request's path.

use forkd_sys::mount::LowerMode;

/// The kernel's features that change what the daemon does.
#[derive(Debug, Clone)]
pub struct Features {
    /// `uname -r`.
    pub kernel: String,
    /// How overlays take their lower layers: the setting's, or what the kernel takes.
    pub lower_mode: LowerMode,
    /// Whether a branch's memory can be opened to KSM (`PR_SET_MEMORY_MERGE`), or why
    /// not.
    pub memory_merge: Result<(), String>,
    /// Whether cgroup2 takes `favordynmods` (Linux 6.0).
    pub cgroup_favordynmods: bool,
    /// Whether process events can be filtered to exits in the kernel (Linux 6.6).
    pub proc_events_filter: bool,
}

impl Features {
    /// Asks the kernel, once; `lower_mode` (`FORKD_OVERLAY_LOWERS`) overrides what it
    /// would take, and is set for the whole process before any overlay is made.
    pub fn probe(lower_mode: Option<LowerMode>) -> Features {
        if let Some(mode) = lower_mode {
            forkd_sys::mount::set_lower_mode(mode);
        }
        let kernel = forkd_sys::mount::kernel_release();
        let version = forkd_sys::mount::kernel_version(&kernel);
        Features {
            lower_mode: forkd_sys::mount::lower_mode(),
            memory_merge: super::sharing::memory_merge_verdict(
                &kernel,
                forkd_sys::probe::memory_merge(),
            ),
            cgroup_favordynmods: forkd_sys::probe::cgroup_favordynmods()
                .unwrap_or_else(|| version.is_none_or(|v| v >= (6, 0))),
            proc_events_filter: version.is_some_and(|v| v >= forkd_sys::proc_events::KERNEL_FILTER),
            kernel,
        }
    }
}
