//! The HTTP+JSON API shared by the daemon and its clients: request and response bodies,
//! the typed error with its status code, and the route table that `docs/openapi.json`
//! is checked against; and the client (`client`), which speaks it over the daemon's
//! Unix socket. Both the daemon and every client (the CLI, the evaluator) depend on this
//! crate; it depends on no part of the daemon.
#![forbid(unsafe_code)]

mod checkpoints;
pub mod client;
pub mod defaults;
mod health;
mod images;
mod limits;
mod network;
mod ops;
pub mod registry_auth;
mod size;
pub mod time;
pub mod transport;

pub use checkpoints::*;
pub use health::*;
pub use images::*;
pub use limits::Limits;
pub use network::{Network, NetworkMode, Seccomp};
pub use ops::{Answer, OpSpec, Operation, RequestBody, GRANTED_OPERATIONS, PROMETHEUS_TEXT};
pub use size::parse_size;

pub use forkd_proto as proto;
pub use forkd_proto::{ExecExit, ExecRequest, FsAnswer, FsEntry, FsKind, FsOp};
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
    /// A TCP request without an API key the daemon holds.
    Unauthorized,
    /// A grant's socket was asked for something outside its grant, or past its budget;
    /// or a key's scope does not cover the operation.
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
    pub fn unauthorized(m: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthorized, m)
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
            ErrorKind::Unauthorized => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::Conflict => 409,
            ErrorKind::Internal => 500,
            ErrorKind::Unavailable => 503,
        }
    }
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
    /// Setuid programs (sudo) take effect: `no_new_privs` is left unset, so a process
    /// may become the sandbox's root (still bounded by its capabilities and filter).
    /// Off by default.
    #[serde(default)]
    pub setuid: bool,
    /// Removed by the daemon this many seconds after it is made (E2B's sandbox timeout);
    /// absent: it lasts until removed. `setSandboxExpiry` changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
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
    /// Whether setuid programs take effect in it.
    #[serde(default)]
    pub setuid: bool,
    /// When the daemon removes it (seconds since the epoch), if it expires.
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// CPU time its processes used, microseconds; given when `memory_bytes` is, for a
    /// running sandbox (cgroup v1 without `cpuacct`: that of the processes it holds now).
    #[serde(default)]
    pub cpu_usage_us: Option<u64>,
}

/// The body of `resumeSandbox`: the live checkpoint of the stopped sandbox to resume
/// from (by default its newest), and the resumed sandbox's lifetime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_secs: Option<u64>,
}

/// The body of `setSandboxExpiry`: the sandbox is removed this many seconds from now
/// (0: at once, within a second); absent or null, never.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpiryRequest {
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
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
