//! Checkpoints: making them, forking branches, exports and imports; and the answers of
//! removals, copies, gc and a sandbox's exec trajectory.
use super::*;

/// `POST /v1/sandboxes/{id}/checkpoint`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRequest {
    /// Also dump the live process tree with CRIU.
    #[serde(default)]
    pub live: bool,
    /// Stop the sandbox after the checkpoint (default: it keeps running).
    #[serde(default)]
    pub stop: bool,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub id: String,
    /// The checkpoint the source sandbox was forked from, if any.
    pub parent: Option<String>,
    pub sandbox: String,
    pub image: String,
    pub live: bool,
    pub created: u64,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The overlay layers of the checkpointed root, topmost first.
    pub layers: Vec<String>,
    /// SHA-256 over the layers' tree hashes; null while it is still being computed.
    pub tree_hash: Option<String>,
    /// Microseconds per phase (freeze, snapshot, dump, ...).
    pub phases_us: std::collections::BTreeMap<String, u64>,
    /// Size of the CRIU images, bytes.
    pub images_bytes: u64,
    /// Sandboxes forked from this checkpoint that still exist.
    pub branches: Vec<String>,
}

/// `POST /v1/checkpoints/{id}/fork`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// Number of branches (default 1).
    #[serde(default)]
    pub count: Option<usize>,
    /// Restore memory lazily (userfaultfd): branches run before all pages are loaded.
    #[serde(default)]
    pub lazy: bool,
    /// Start each branch with a fresh init over the checkpoint's files instead of
    /// restoring its process tree.
    #[serde(default)]
    pub fresh: bool,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// The branches' network; by default the checkpointed sandbox's (same mode, same
    /// resolved allowlist), each branch with an address of its own.
    #[serde(default)]
    pub network: Option<Network>,
    /// Open the branches' restored memory to KSM, so that identical pages of branches
    /// that share are kept once (copy-on-write). Absent: the daemon's default
    /// (`FORKD_KSM`: `ask` shares only when asked, `on` always, `off` never and refuses
    /// `true`). Only a live checkpoint's restored branches have memory to share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_memory: Option<bool>,
    /// Each branch's disk limit (what the branch itself writes); by default the
    /// checkpointed sandbox's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Each branch is removed this many seconds after it starts; by default branches
    /// last until removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BranchInfo {
    pub id: String,
    pub mode: ForkMode,
    pub init_pid: Option<i32>,
    /// Microseconds per phase (prepare, restore, ready, total).
    pub phases_us: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForkResult {
    pub checkpoint: String,
    pub branches: Vec<BranchInfo>,
}

/// `POST /v1/checkpoints/import`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchivePath {
    /// An absolute path on the daemon's host.
    pub path: String,
}

/// `POST /v1/checkpoints/{id}/export`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    /// An absolute path on the daemon's host.
    pub path: String,
    /// Name the layers of the content-addressed store (an image's layers, forkd's runtime
    /// layer) by tree hash instead of including them: only the checkpoints' own layers
    /// and CRIU images are written. The importing daemon must hold the named layers
    /// (it refuses the archive, 409, naming the first it lacks).
    #[serde(default)]
    pub thin: bool,
}

/// The answer of `exportCheckpoint`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportResult {
    /// The archive written.
    pub path: String,
    pub bytes: u64,
    /// Files in the archive, `manifest.json` included.
    pub files: usize,
    pub tree_hash: String,
    pub duration_us: u64,
}

/// The answer of `removeImage`, `removeSandbox` and `removeCheckpoint`: what was removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Removed {
    pub removed: String,
}

/// The answer of `copyToSandbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyResult {
    /// Archive entries written.
    pub entries: u64,
}

/// The body of `fileOperation`: one file operation inside the sandbox, carried out as
/// `user` (default root), so the sandbox's own permissions apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsRequest {
    #[serde(flatten)]
    pub op: forkd_proto::FsOp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// The answer of `gc`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GcResult {
    /// Ids (tree hashes) of the store layers removed.
    pub removed_layers: Vec<String>,
    pub freed_bytes: u64,
}

/// One line of a sandbox's exec trajectory (`sandboxExecs`, `execs.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecRecord {
    /// When the exec started, microseconds since the Unix epoch.
    pub t_us: u64,
    /// The program and arguments; `None` when `shell` was given.
    #[serde(deserialize_with = "present")]
    pub argv: Option<Vec<String>>,
    #[serde(deserialize_with = "present")]
    pub shell: Option<String>,
    #[serde(deserialize_with = "present")]
    pub cwd: Option<String>,
    #[serde(deserialize_with = "present")]
    pub user: Option<String>,
    pub tty: bool,
    pub detach: bool,
    /// How it ended: an [`ExecExit`], a [`DetachedExec`], an Error frame's `{"message"}`,
    /// or null when a stream ended without either.
    #[serde(deserialize_with = "present")]
    pub result: serde_json::Value,
}

/// Reads a field that may be null but must be there (serde otherwise takes a missing
/// `Option` or `Value` as null).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    T::deserialize(d)
}

/// How a branch was brought up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForkMode {
    /// The processes restored, their memory read before they run.
    Eager,
    /// The processes restored, their memory paged in on demand (userfaultfd).
    Lazy,
    /// A filesystem checkpoint: a new init on the checkpoint's files.
    Fresh,
}

impl ForkMode {
    pub const ALL: [ForkMode; 3] = [ForkMode::Eager, ForkMode::Lazy, ForkMode::Fresh];

    pub fn as_str(self) -> &'static str {
        match self {
            ForkMode::Eager => "eager",
            ForkMode::Lazy => "lazy",
            ForkMode::Fresh => "fresh",
        }
    }
}

impl std::fmt::Display for ForkMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The phases a checkpoint reports in `CheckpointInfo.phases_us`.
pub const CHECKPOINT_PHASES: &[&str] = &[
    "relays", "freeze", "dump", "snapshot", "copy", "sync", "squash", "total",
];

/// The phases a branch reports in `BranchInfo.phases_us`.
pub const FORK_PHASES: &[&str] = &["prepare", "restore", "ready", "total"];

/// Records one phase's duration in `phases`; `name` must be one of `known` (the list
/// the API documents), which debug builds check.
pub fn record_phase(
    phases: &mut std::collections::BTreeMap<String, u64>,
    known: &[&str],
    name: &'static str,
    took: std::time::Duration,
) {
    debug_assert!(known.contains(&name), "phase {name} is not documented");
    phases.insert(name.to_string(), took.as_micros() as u64);
}
