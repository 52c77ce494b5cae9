//! The HTTP+JSON API shared by the daemon and its clients: request and response bodies,
//! the typed error with its status code, and the route table that `docs/openapi.json`
//! is checked against; and the client (`client`), which speaks it over the daemon's
//! Unix socket. Both the daemon and every client (the CLI, the evaluator) depend on this
//! crate; it depends on no part of the daemon.
#![forbid(unsafe_code)]

pub mod client;
pub mod defaults;
mod limits;
mod network;
mod ops;
mod size;

pub use limits::Limits;
pub use network::{Network, NetworkMode, Seccomp};
pub use ops::{Answer, OpSpec, Operation, RequestBody, GRANTED_OPERATIONS};
pub use size::parse_size;

pub use forkd_proto as proto;
pub use forkd_proto::{ExecExit, ExecRequest};
use serde::{Deserialize, Serialize};

/// Version of the API; bumped on incompatible changes.
pub const API_VERSION: &str = "v1";

/// The header a client sends on `POST /v1/sandboxes/{id}/exec` to switch the connection
/// to the frame protocol ([`proto`]) after a `101 Switching Protocols`.
pub const EXEC_UPGRADE: &str = "forkd-exec";

/// Error kinds, each with one HTTP status (mapped in [`ApiError::status`] only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    BadRequest,
    NotFound,
    /// A grant's socket was asked for something outside its grant, or past its budget.
    Forbidden,
    Conflict,
    Internal,
    /// The node cannot take the request now: its volume is full or unusable (what
    /// `GET /v1/health` reports); the message says which.
    Unavailable,
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request id, to find the daemon's log lines for this request.
    #[serde(default)]
    pub request_id: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            request_id: String::new(),
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, m)
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, m)
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, m)
    }
    /// Builds an internal error from an error chain, keeping every cause.
    pub fn from_chain(context: &str, e: &(dyn std::error::Error + 'static)) -> Self {
        let mut msg = format!("{context}: {e}");
        let mut src = e.source();
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        Self::internal(msg)
    }

    pub fn status(&self) -> u16 {
        match self.kind {
            ErrorKind::BadRequest => 400,
            ErrorKind::NotFound => 404,
            ErrorKind::Forbidden => 403,
            ErrorKind::Conflict => 409,
            ErrorKind::Internal => 500,
            ErrorKind::Unavailable => 503,
        }
    }
}

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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportImageRequest {
    /// A path on the daemon's host: rootfs directory, tarball, OCI layout or docker-save archive.
    pub source: String,
    pub name: String,
}

/// `POST /v1/images/pull`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `[registry/]repository[:tag][@sha256:...]`; a short name is resolved through
    /// registries.conf (aliases, unqualified-search registries) or Docker Hub.
    pub reference: String,
    /// `os/arch[/variant]`; default `linux/amd64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// The image's name in forkd; default the fully qualified reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One layer of a pull in progress.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PullLayer {
    /// The compressed blob's digest.
    pub digest: String,
    pub size: u64,
    /// Bytes received so far.
    pub done: u64,
    /// `waiting`, `present` (in the store before), `fetching`, `shared` (fetched by
    /// another pull at the same time), `done`, `failed`.
    pub state: String,
}

/// `GET /v1/pulls`: a pull in progress.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PullStatus {
    /// As asked.
    pub reference: String,
    /// Fully qualified, once known.
    pub resolved: Option<String>,
    pub started: u64,
    /// `resolving`, `layers`, `done`.
    pub phase: String,
    pub layers: Vec<PullLayer>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageInfo {
    pub name: String,
    pub layers: Vec<String>,
    pub created: u64,
    pub source: String,
    /// A pulled image's digest on its registry (of the index or manifest its reference
    /// named).
    #[serde(default)]
    pub digest: Option<String>,
    /// Sandboxes using the image.
    pub used_by: Vec<String>,
    /// The run configuration (ENV, WORKDIR, USER, ENTRYPOINT, CMD, ...). Sandboxes of
    /// the image take env, working directory and user as defaults for every exec.
    pub config: ImageConfig,
}

/// An image's run configuration as the API shows it: every field present.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub cmd: Vec<String>,
    pub entrypoint: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub exposed_ports: Vec<String>,
    pub shell: Vec<String>,
    pub stop_signal: Option<String>,
    pub volumes: Vec<String>,
}

/// `POST /v1/images/build`: build an image from a Dockerfile.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildRequest {
    /// The build context: an absolute directory on the daemon's host.
    pub context: String,
    /// The Dockerfile, relative to the context (default `Dockerfile`) or absolute.
    #[serde(default)]
    pub dockerfile: Option<String>,
    /// The image to make (replaced if it exists and no sandbox uses it).
    pub name: String,
    /// `--build-arg` values.
    #[serde(default)]
    pub build_args: std::collections::BTreeMap<String, String>,
    /// The stage to build (default: the last).
    #[serde(default)]
    pub target: Option<String>,
    /// Run every step, looking nothing up in the step cache.
    #[serde(default)]
    pub no_cache: bool,
    /// RUN steps with egress (the outside world through NAT, never the host or other
    /// sandboxes); `RUN --network=none` still runs without. Default: none.
    #[serde(default)]
    pub network: bool,
    /// Limits for the sandboxes steps run in.
    #[serde(default)]
    pub limits: Limits,
    /// Kill a RUN step's whole process tree after this many seconds, failing the build
    /// (default: no limit).
    #[serde(default)]
    pub step_timeout_secs: Option<u64>,
}

/// One step of a build.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildStep {
    /// Stage index (0-based).
    pub stage: usize,
    /// Dockerfile line (1-based).
    pub line: usize,
    pub instruction: String,
    /// `hit` (the step's layer came from the cache), `miss` (the step ran), or `config`
    /// (the step changes only the image's configuration, no files).
    pub cache: String,
    /// The layer the step made, if it made one (a step that changes no file makes none).
    pub layer: Option<String>,
    pub duration_us: u64,
}

/// `201` of `POST /v1/images/build`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildResult {
    pub image: ImageInfo,
    pub steps: Vec<BuildStep>,
    pub duration_us: u64,
}

/// A build in progress (`GET /v1/builds`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildStatus {
    pub name: String,
    pub started: u64,
    /// Steps done so far.
    pub steps: Vec<BuildStep>,
    /// The step running now, as written.
    pub current: Option<String>,
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    pub image: String,
    /// Started detached right away, output in the sandbox log `main`.
    #[serde(default)]
    pub command: Option<ExecRequest>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// What the sandbox may reach beyond itself (default: nothing; loopback only).
    #[serde(default)]
    pub network: Network,
    /// The system-call filter: `default`, or `unconfined` for a sandbox without one.
    #[serde(default)]
    pub seccomp: Seccomp,
}

/// A sandbox's network as it is (absent for mode `none`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkInfo {
    pub mode: Network,
    /// The sandbox's address on `eth0`, and its gateway (the host's end of the veth).
    pub address: String,
    pub gateway: String,
    /// The host-side veth.
    pub link: String,
    /// Allowlist: the networks its rules allow (names resolved at create time).
    pub allowed: Vec<String>,
    /// Egress: the name servers in its `/etc/resolv.conf`.
    pub nameservers: Vec<String>,
    /// The daemon's nftables table (`inet <table>`) holding its rules, in chain
    /// `sb_<link>`.
    pub table: String,
}

/// Where a sandbox is in its life. `running` and `stopped` are the settled states (the
/// only ones a record on disk holds); the others last while an operation that takes
/// time runs, and a request that conflicts with one is refused with 409 naming it. Which
/// request each state allows: `daemon::lifecycle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxStatus {
    Running,
    /// Its processes are being ended (a stop's grace period, then the clean-up).
    Stopping,
    /// A checkpoint of it is being taken.
    Checkpointing,
    /// It is being removed.
    Removing,
    Stopped,
}

impl SandboxStatus {
    /// Whether nothing is being done to the sandbox.
    pub fn is_settled(self) -> bool {
        matches!(self, SandboxStatus::Running | SandboxStatus::Stopped)
    }
}

impl std::fmt::Display for SandboxStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SandboxStatus::Running => "running",
            SandboxStatus::Stopping => "stopping",
            SandboxStatus::Checkpointing => "checkpointing",
            SandboxStatus::Removing => "removing",
            SandboxStatus::Stopped => "stopped",
        })
    }
}

/// What a sandbox's `memory_bytes` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryCounted {
    /// The charge of the sandbox's own memory cgroup: its processes' pages, the page
    /// cache they read and the kernel memory they caused. A sandbox with a memory limit
    /// has a memory cgroup of its own, and every sandbox does under `FORKD_MEMCG=each`.
    Cgroup,
    /// The proportional set size of its processes (a page mapped by several processes
    /// counted as a share for each): its memory cgroup is shared with the other
    /// sandboxes that have no memory limit (`FORKD_MEMCG=limited`, the default on cgroup
    /// v1). Kernel memory and unmapped page cache are not in it.
    Processes,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub image: String,
    pub status: SandboxStatus,
    pub created: u64,
    pub hostname: String,
    /// Host pid of the sandbox's init while running.
    pub init_pid: Option<i32>,
    pub limits: Limits,
    pub labels: std::collections::BTreeMap<String, String>,
    pub rootfs: String,
    pub upper: String,
    pub cgroup: String,
    /// Current memory use, as `memory_counted` says: given by `inspect` and by a list
    /// asked with `stats=true` (a list of thousands of sandboxes otherwise reads no
    /// cgroup file), for a running sandbox or one whose cgroup is still there.
    pub memory_bytes: Option<u64>,
    /// What `memory_bytes` counts; given with it.
    #[serde(default)]
    pub memory_counted: Option<MemoryCounted>,
    /// Processes killed for lack of memory in the sandbox's own memory cgroup; given
    /// when `memory_bytes` counts that cgroup (a kill in a shared one may have been
    /// another sandbox's).
    pub oom_kills: Option<u64>,
    /// Set-up latency, microseconds (create to ready for the first exec).
    pub create_us: u64,
    /// Its network beyond loopback, while it runs with one.
    #[serde(default)]
    pub network: Option<NetworkInfo>,
    /// Its system-call filter: `default` or `unconfined`.
    #[serde(default)]
    pub seccomp: Seccomp,
    /// What its writable layer is charged, where the volume has quotas; given when
    /// `memory_bytes` is (inspect, a list with `stats=true`).
    #[serde(default)]
    pub disk_used_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    /// Seconds between SIGTERM and SIGKILL (default 10).
    #[serde(default)]
    pub grace_secs: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/exec` without an upgrade: runs to completion.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    #[serde(flatten)]
    pub request: ExecRequest,
    /// Standard input, base64.
    #[serde(default)]
    pub stdin_b64: Option<String>,
    /// Most bytes of output to keep, both streams together (default
    /// [`DEFAULT_OUTPUT_LIMIT`], at most [`MAX_OUTPUT_LIMIT`]). Output past it is still
    /// read, so the command runs on, and dropped; the answer says `truncated`.
    #[serde(default)]
    pub output_limit: Option<u64>,
}

/// Output kept of a run-to-completion exec unless the request says otherwise.
pub const DEFAULT_OUTPUT_LIMIT: u64 = 16 << 20;
/// The largest `output_limit` a request may ask for.
pub const MAX_OUTPUT_LIMIT: u64 = 256 << 20;

impl ExecBody {
    /// The output limit, checked.
    pub fn output_limit(&self) -> Result<usize, ApiError> {
        match self.output_limit {
            None => Ok(DEFAULT_OUTPUT_LIMIT as usize),
            Some(n) if n <= MAX_OUTPUT_LIMIT => Ok(n as usize),
            Some(n) => Err(ApiError::bad_request(format!(
                "output_limit {n} is over the maximum of {MAX_OUTPUT_LIMIT} bytes"
            ))),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecResult {
    pub pid: i32,
    #[serde(flatten)]
    pub exit: ExecExit,
    /// Standard output and error, base64 (binary-safe).
    pub stdout_b64: String,
    pub stderr_b64: String,
    /// Both streams merged, base64: in the exact order written with `merge_stderr`
    /// (then `stderr_b64` is empty), otherwise in the order the sandbox read them.
    #[serde(default)]
    pub output_b64: String,
    /// Bytes of output the command wrote, kept or not.
    #[serde(default)]
    pub output_bytes: u64,
    /// Output past `output_limit` was dropped.
    #[serde(default)]
    pub truncated: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpStats {
    pub count: u64,
    pub errors: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

pub mod b64;

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

/// The `result` of an [`ExecRecord`] for a detached command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetachedExec {
    pub pid: i32,
    /// Its log file inside the sandbox.
    pub log: Option<String>,
}

/// `POST /v1/sandboxes/{id}/grants`: a capability on one sandbox for one unprivileged
/// user, served on a socket of its own. Whoever can connect to that socket (the user
/// `uid`, and root) may exec in the sandbox, copy files in and out, and read its state,
/// logs and trajectory; nothing else, and no other sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    /// The user that owns the grant's socket (never 0).
    pub uid: u32,
    /// Its group; default the same number as `uid`.
    #[serde(default)]
    pub gid: Option<u32>,
    /// Execs the grant allows in all; the one past it is refused (403). Default: no limit.
    #[serde(default)]
    pub max_steps: Option<u64>,
}

/// A request a grant's socket refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// Microseconds since the Unix epoch.
    pub t_us: u64,
    pub method: String,
    pub path: String,
    /// Why, as the 403 answer said.
    pub reason: String,
    /// Whether it was an exec past the step budget.
    pub budget: bool,
}

/// A grant: its socket, its budget, and what it allowed and refused so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrantInfo {
    pub id: String,
    pub sandbox: String,
    /// The socket that serves the grant (owned by `uid`, mode 0600).
    pub socket: String,
    pub uid: u32,
    pub gid: u32,
    pub max_steps: Option<u64>,
    /// Execs started through the grant.
    pub steps: u64,
    /// Requests refused, in all.
    pub refused: u64,
    /// The first refusals (at most [`GRANT_REFUSALS_KEPT`]).
    pub refusals: Vec<Refusal>,
    /// Whether the grant still serves (false once revoked, or its sandbox removed).
    pub active: bool,
}

/// How many refusals a grant keeps in detail (`refused` counts them all).
pub const GRANT_REFUSALS_KEPT: usize = 64;

pub mod url;
