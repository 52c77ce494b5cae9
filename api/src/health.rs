//! What the daemon says of itself: its health (the node's ceilings, the volume, its
//! parts) and its version.
use super::*;

/// `GET /v1/health`: what the daemon depends on, and what of it is degraded.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    /// Nothing is degraded.
    pub ok: bool,
    /// What is degraded, in words (empty when `ok`).
    pub degraded: Vec<String>,
    pub volume: VolumeHealth,
    pub criu: ComponentHealth,
    /// The thread that learns of every sandbox's exit.
    pub exit_watcher: ComponentHealth,
    /// The egress rules' nftables table.
    pub network: ComponentHealth,
    /// Whether a sandbox may have a disk limit here (btrfs simple quotas), or why not;
    /// not counted as degraded.
    pub disk_limits: ComponentHealth,
    /// Restore templates, through which branches of a live checkpoint share its memory:
    /// how many are held and the memory they hold within their budget, or why branches
    /// read their pages instead; not counted as degraded.
    pub templates: ComponentHealth,
    /// The host's ceilings on how many more sandboxes may run (`kernel.pid_max`,
    /// `kernel.threads-max`, memory, and descriptors where the daemon watches inits with
    /// one each), for a sandbox of two tasks or, with `?checkpoint=ID`, for a branch of
    /// that checkpoint; not counted as degraded.
    pub ceilings: Vec<NodeCeiling>,
}

/// One of the host's ceilings on how many sandboxes may run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeCeiling {
    /// The setting: `kernel.pid_max`, `kernel.threads-max`, `MemAvailable`, `RLIMIT_NOFILE`.
    pub name: String,
    pub value: u64,
    /// What is used of it now.
    pub used: u64,
    /// What is kept free of sandboxes (for the host and the daemon's own helpers).
    pub kept: u64,
    /// What one more sandbox takes of it.
    pub per_sandbox: u64,
    /// How many more sandboxes it allows.
    pub allows: u64,
    /// What raises it.
    pub how_to_raise: String,
}

/// The data volume: its space and its state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeHealth {
    pub path: String,
    /// Writable and without device errors.
    pub ok: bool,
    pub size_bytes: u64,
    pub free_bytes: u64,
    /// The most it may grow to.
    pub max_bytes: u64,
    /// Free on the disk under its image, and what it leaves free there.
    pub host_free_bytes: u64,
    pub host_reserve_bytes: u64,
    /// Set while it is full and cannot grow: writers get ENOSPC, creates and forks are
    /// refused (503) until space is freed.
    pub pressure: Option<String>,
    /// What is wrong with it (read-only, device errors, an image not allocated under it).
    pub problems: Vec<String>,
}

/// One part the daemon needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ComponentHealth {
    pub ok: bool,
    /// What it is (a version, a table), or what is wrong with it.
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionInfo {
    pub version: String,
    pub api: String,
    pub root: String,
    pub cgroup_version: u8,
}
