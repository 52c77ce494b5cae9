//! The API's operations: one enum variant per route, each with its contract
//! ([`OpSpec`]). The daemon's router answers from it and `tests/api_spec.rs` checks it
//! against `docs/openapi.json`.

/// The content type of `GET /metrics`: Prometheus's text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every operation of the API. The daemon's router matches on it exhaustively, so an
/// operation without a handler does not compile; what each one takes and answers is
/// [`Operation::spec`], which `docs/openapi.json` is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    Version,
    Health,
    Metrics,
    PrometheusMetrics,
    ListImages,
    ImportImage,
    BuildImage,
    ListBuilds,
    PullImage,
    ListPulls,
    InspectImage,
    RemoveImage,
    ListSandboxes,
    CreateSandbox,
    InspectSandbox,
    RemoveSandbox,
    StopSandbox,
    ExecInSandbox,
    SandboxLogs,
    CopyFromSandbox,
    CopyToSandbox,
    FileOperation,
    ReadFile,
    WriteFile,
    SetSandboxExpiry,
    CheckpointSandbox,
    ListCheckpoints,
    InspectCheckpoint,
    RemoveCheckpoint,
    ForkCheckpoint,
    ExportCheckpoint,
    ImportCheckpoint,
    Gc,
    SandboxExecs,
    CheckpointDelta,
    GrantSandbox,
    InspectGrant,
    RevokeGrant,
}

/// What an operation's request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody {
    None,
    /// A JSON body of the named schema (a type of this crate of the same name).
    Json(&'static str),
    /// A tar stream (`application/x-tar`).
    Tar,
    /// A file's bytes (`application/octet-stream`).
    Bytes,
}

/// What an operation answers on success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// JSON of the named schema (`[Name]`: an array of it).
    Json(&'static str),
    /// Bytes of the given content type.
    Bytes(&'static str),
}

/// The contract of one operation: its route, its success status, its request body,
/// its answer and its query parameters (name, required).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpSpec {
    pub method: &'static str,
    /// `{x}` marks a path parameter.
    pub path: &'static str,
    /// The OpenAPI operation id.
    pub id: &'static str,
    pub status: u16,
    pub body: RequestBody,
    pub answer: Answer,
    pub query: &'static [(&'static str, bool)],
}

impl Operation {
    /// Every operation, in the order routes are matched.
    pub const ALL: [Operation; 38] = [
        Operation::Version,
        Operation::Health,
        Operation::Metrics,
        Operation::PrometheusMetrics,
        Operation::ListImages,
        Operation::ImportImage,
        Operation::BuildImage,
        Operation::ListBuilds,
        Operation::PullImage,
        Operation::ListPulls,
        Operation::InspectImage,
        Operation::RemoveImage,
        Operation::ListSandboxes,
        Operation::CreateSandbox,
        Operation::InspectSandbox,
        Operation::RemoveSandbox,
        Operation::StopSandbox,
        Operation::ExecInSandbox,
        Operation::SandboxLogs,
        Operation::CopyFromSandbox,
        Operation::CopyToSandbox,
        Operation::FileOperation,
        Operation::ReadFile,
        Operation::WriteFile,
        Operation::SetSandboxExpiry,
        Operation::CheckpointSandbox,
        Operation::ListCheckpoints,
        Operation::InspectCheckpoint,
        Operation::RemoveCheckpoint,
        Operation::ForkCheckpoint,
        Operation::ExportCheckpoint,
        Operation::ImportCheckpoint,
        Operation::Gc,
        Operation::SandboxExecs,
        Operation::CheckpointDelta,
        Operation::GrantSandbox,
        Operation::InspectGrant,
        Operation::RevokeGrant,
    ];

    pub fn spec(self) -> OpSpec {
        match self {
            Operation::Version => OpSpec {
                method: "GET",
                path: "/v1/version",
                id: "version",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("VersionInfo"),
                query: &[],
            },
            Operation::Health => OpSpec {
                method: "GET",
                path: "/v1/health",
                id: "health",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("Health"),
                query: &[("checkpoint", false)],
            },
            Operation::Metrics => OpSpec {
                method: "GET",
                path: "/v1/metrics",
                id: "metrics",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("Metrics"),
                query: &[],
            },
            Operation::PrometheusMetrics => OpSpec {
                method: "GET",
                path: "/metrics",
                id: "prometheusMetrics",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Bytes(PROMETHEUS_TEXT),
                query: &[],
            },
            Operation::ListImages => OpSpec {
                method: "GET",
                path: "/v1/images",
                id: "listImages",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("[ImageInfo]"),
                query: &[],
            },
            Operation::ImportImage => OpSpec {
                method: "POST",
                path: "/v1/images",
                id: "importImage",
                status: 201,
                body: RequestBody::Json("ImportImageRequest"),
                answer: Answer::Json("ImageInfo"),
                query: &[],
            },
            Operation::BuildImage => OpSpec {
                method: "POST",
                path: "/v1/images/build",
                id: "buildImage",
                status: 201,
                body: RequestBody::Json("BuildRequest"),
                answer: Answer::Json("BuildResult"),
                query: &[],
            },
            Operation::ListBuilds => OpSpec {
                method: "GET",
                path: "/v1/builds",
                id: "listBuilds",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("[BuildStatus]"),
                query: &[],
            },
            Operation::PullImage => OpSpec {
                method: "POST",
                path: "/v1/images/pull",
                id: "pullImage",
                status: 201,
                body: RequestBody::Json("PullRequest"),
                answer: Answer::Json("ImageInfo"),
                query: &[],
            },
            Operation::ListPulls => OpSpec {
                method: "GET",
                path: "/v1/pulls",
                id: "listPulls",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("[PullStatus]"),
                query: &[],
            },
            Operation::InspectImage => OpSpec {
                method: "GET",
                path: "/v1/images/{name}",
                id: "inspectImage",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("ImageInfo"),
                query: &[],
            },
            Operation::RemoveImage => OpSpec {
                method: "DELETE",
                path: "/v1/images/{name}",
                id: "removeImage",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("RemovedImage"),
                query: &[],
            },
            Operation::ListSandboxes => OpSpec {
                method: "GET",
                path: "/v1/sandboxes",
                id: "listSandboxes",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("[SandboxInfo]"),
                query: &[("stats", false)],
            },
            Operation::CreateSandbox => OpSpec {
                method: "POST",
                path: "/v1/sandboxes",
                id: "createSandbox",
                status: 201,
                body: RequestBody::Json("CreateSandboxRequest"),
                answer: Answer::Json("SandboxInfo"),
                query: &[],
            },
            Operation::InspectSandbox => OpSpec {
                method: "GET",
                path: "/v1/sandboxes/{id}",
                id: "inspectSandbox",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("SandboxInfo"),
                query: &[],
            },
            Operation::RemoveSandbox => OpSpec {
                method: "DELETE",
                path: "/v1/sandboxes/{id}",
                id: "removeSandbox",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("RemovedSandbox"),
                query: &[("force", false)],
            },
            Operation::StopSandbox => OpSpec {
                method: "POST",
                path: "/v1/sandboxes/{id}/stop",
                id: "stopSandbox",
                status: 200,
                body: RequestBody::Json("StopRequest"),
                answer: Answer::Json("SandboxInfo"),
                query: &[],
            },
            Operation::ExecInSandbox => OpSpec {
                method: "POST",
                path: "/v1/sandboxes/{id}/exec",
                id: "execInSandbox",
                status: 200,
                body: RequestBody::Json("ExecBody"),
                answer: Answer::Json("ExecResult"),
                query: &[],
            },
            Operation::SandboxLogs => OpSpec {
                method: "GET",
                path: "/v1/sandboxes/{id}/logs",
                id: "sandboxLogs",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Bytes("application/octet-stream"),
                query: &[("name", false)],
            },
            Operation::CopyFromSandbox => OpSpec {
                method: "GET",
                path: "/v1/sandboxes/{id}/files",
                id: "copyFromSandbox",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Bytes("application/x-tar"),
                query: &[("path", true)],
            },
            Operation::CopyToSandbox => OpSpec {
                method: "PUT",
                path: "/v1/sandboxes/{id}/files",
                id: "copyToSandbox",
                status: 200,
                body: RequestBody::Tar,
                answer: Answer::Json("CopyResult"),
                query: &[("path", true)],
            },
            Operation::FileOperation => OpSpec {
                method: "POST",
                path: "/v1/sandboxes/{id}/fs",
                id: "fileOperation",
                status: 200,
                body: RequestBody::Json("FsRequest"),
                answer: Answer::Json("FsAnswer"),
                query: &[],
            },
            Operation::ReadFile => OpSpec {
                method: "GET",
                path: "/v1/sandboxes/{id}/file",
                id: "readFile",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Bytes("application/octet-stream"),
                query: &[("path", true), ("user", false)],
            },
            Operation::WriteFile => OpSpec {
                method: "PUT",
                path: "/v1/sandboxes/{id}/file",
                id: "writeFile",
                status: 200,
                body: RequestBody::Bytes,
                answer: Answer::Json("FsAnswer"),
                query: &[("path", true), ("user", false)],
            },
            Operation::SetSandboxExpiry => OpSpec {
                method: "PUT",
                path: "/v1/sandboxes/{id}/expiry",
                id: "setSandboxExpiry",
                status: 200,
                body: RequestBody::Json("ExpiryRequest"),
                answer: Answer::Json("SandboxInfo"),
                query: &[],
            },
            Operation::CheckpointSandbox => OpSpec {
                method: "POST",
                path: "/v1/sandboxes/{id}/checkpoint",
                id: "checkpointSandbox",
                status: 201,
                body: RequestBody::Json("CheckpointRequest"),
                answer: Answer::Json("CheckpointInfo"),
                query: &[],
            },
            Operation::ListCheckpoints => OpSpec {
                method: "GET",
                path: "/v1/checkpoints",
                id: "listCheckpoints",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("[CheckpointInfo]"),
                query: &[],
            },
            Operation::InspectCheckpoint => OpSpec {
                method: "GET",
                path: "/v1/checkpoints/{id}",
                id: "inspectCheckpoint",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("CheckpointInfo"),
                query: &[],
            },
            Operation::RemoveCheckpoint => OpSpec {
                method: "DELETE",
                path: "/v1/checkpoints/{id}",
                id: "removeCheckpoint",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("RemovedCheckpoint"),
                query: &[("force", false)],
            },
            Operation::ForkCheckpoint => OpSpec {
                method: "POST",
                path: "/v1/checkpoints/{id}/fork",
                id: "forkCheckpoint",
                status: 201,
                body: RequestBody::Json("ForkRequest"),
                answer: Answer::Json("ForkResult"),
                query: &[],
            },
            Operation::ExportCheckpoint => OpSpec {
                method: "POST",
                path: "/v1/checkpoints/{id}/export",
                id: "exportCheckpoint",
                status: 200,
                body: RequestBody::Json("ExportRequest"),
                answer: Answer::Json("ExportResult"),
                query: &[],
            },
            Operation::ImportCheckpoint => OpSpec {
                method: "POST",
                path: "/v1/checkpoints/import",
                id: "importCheckpoint",
                status: 201,
                body: RequestBody::Json("ArchivePath"),
                answer: Answer::Json("CheckpointInfo"),
                query: &[],
            },
            Operation::Gc => OpSpec {
                method: "POST",
                path: "/v1/gc",
                id: "gc",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("GcResult"),
                query: &[],
            },
            Operation::SandboxExecs => OpSpec {
                method: "GET",
                path: "/v1/sandboxes/{id}/execs",
                id: "sandboxExecs",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Bytes("application/x-ndjson"),
                query: &[],
            },
            Operation::CheckpointDelta => OpSpec {
                method: "GET",
                path: "/v1/checkpoints/{id}/delta",
                id: "checkpointDelta",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Bytes("application/x-tar"),
                query: &[],
            },
            Operation::GrantSandbox => OpSpec {
                method: "POST",
                path: "/v1/sandboxes/{id}/grants",
                id: "grantSandbox",
                status: 201,
                body: RequestBody::Json("GrantRequest"),
                answer: Answer::Json("GrantInfo"),
                query: &[],
            },
            Operation::InspectGrant => OpSpec {
                method: "GET",
                path: "/v1/grants/{grant}",
                id: "inspectGrant",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("GrantInfo"),
                query: &[],
            },
            Operation::RevokeGrant => OpSpec {
                method: "DELETE",
                path: "/v1/grants/{grant}",
                id: "revokeGrant",
                status: 200,
                body: RequestBody::None,
                answer: Answer::Json("GrantInfo"),
                query: &[],
            },
        }
    }

    /// The OpenAPI operation id.
    pub fn id(self) -> &'static str {
        self.spec().id
    }

    /// The operation of an OpenAPI id.
    pub fn from_id(id: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.id() == id)
    }
}

/// The operations a grant's socket serves (see [`GrantRequest`]), each only for the
/// grant's own sandbox: its exec (plain and streamed), files, logs, trajectory and
/// state, and the daemon's version.
pub const GRANTED_OPERATIONS: &[Operation] = &[
    Operation::Version,
    Operation::InspectSandbox,
    Operation::ExecInSandbox,
    Operation::SandboxLogs,
    Operation::CopyFromSandbox,
    Operation::CopyToSandbox,
    Operation::FileOperation,
    Operation::ReadFile,
    Operation::WriteFile,
    Operation::SandboxExecs,
];
