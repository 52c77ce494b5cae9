//! Images: imports, pulls and builds, and what an image is.
use super::*;

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
