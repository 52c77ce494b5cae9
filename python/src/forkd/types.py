"""Typed results of the forkd API: one dataclass per schema of `docs/openapi.json`.

Each class's fields are exactly its schema's properties (a test holds them in step).
`from_json` builds an instance from the daemon's JSON answer; nested objects become
their own classes, and properties this version does not know are ignored, so a newer
daemon's additions do not break an older client.
"""

from __future__ import annotations

import base64
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

T = TypeVar("T", bound="_Model")


def _convert(tp: Any, value: Any) -> Any:
    """Converts a JSON value to the annotated type `tp` (dataclasses, lists, dicts)."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if inner else value
    if origin is list:
        return [_convert(args[0], v) for v in value]
    if origin is dict:
        return {k: _convert(args[1], v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, _Model):
        return tp.from_json(value)
    return value


class _Model:
    """Shared loading for the API's dataclasses."""

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in data:
                kwargs[f.name] = _convert(hints[f.name], data[f.name])
        return cls(**kwargs)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass
class VersionInfo(_Model):
    """`GET /v1/version`."""

    version: str = ""
    api: str = ""
    root: str = ""
    cgroup_version: int = 0


@dataclass
class OpStats(_Model):
    """Latency of one operation over its last requests, microseconds."""

    count: int = 0
    errors: int = 0
    p50_us: int = 0
    p90_us: int = 0
    p99_us: int = 0
    max_us: int = 0


@dataclass
class ImageConfig(_Model):
    """An image's run configuration (ENV, WORKDIR, USER, ENTRYPOINT, CMD, ...)."""

    env: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    working_dir: Optional[str] = None
    user: Optional[str] = None
    labels: dict[str, str] = field(default_factory=dict)
    exposed_ports: list[str] = field(default_factory=list)
    shell: list[str] = field(default_factory=list)
    stop_signal: Optional[str] = None
    volumes: list[str] = field(default_factory=list)


@dataclass
class ImageInfo(_Model):
    """An image: its layers (bottom first), the sandboxes using it, its config."""

    name: str = ""
    layers: list[str] = field(default_factory=list)
    created: int = 0
    source: str = ""
    used_by: list[str] = field(default_factory=list)
    config: ImageConfig = field(default_factory=ImageConfig)
    digest: Optional[str] = None


@dataclass
class BuildStep(_Model):
    """One step of an image build: `cache` is `hit`, `miss` or `config`."""

    stage: int = 0
    line: int = 0
    instruction: str = ""
    cache: str = ""
    layer: Optional[str] = None
    duration_us: int = 0


@dataclass
class BuildResult(_Model):
    """`buildImage`: the image and every step's record."""

    image: ImageInfo = field(default_factory=ImageInfo)
    steps: list[BuildStep] = field(default_factory=list)
    duration_us: int = 0


@dataclass
class BuildStatus(_Model):
    """A build in progress (`listBuilds`)."""

    name: str = ""
    started: int = 0
    steps: list[BuildStep] = field(default_factory=list)
    current: Optional[str] = None


@dataclass
class PullLayer(_Model):
    """One layer of a pull: `state` is waiting, present, fetching, shared, done or failed."""

    digest: str = ""
    size: int = 0
    done: int = 0
    state: str = ""


@dataclass
class PullStatus(_Model):
    """A pull in progress (`listPulls`)."""

    reference: str = ""
    resolved: Optional[str] = None
    started: int = 0
    phase: str = ""
    layers: list[PullLayer] = field(default_factory=list)


@dataclass
class Limits(_Model):
    """Resource limits of a sandbox; `None` takes the daemon's default (2048 tasks;
    memory, CPU and disk unlimited unless the operator sets defaults)."""

    memory_bytes: Optional[int] = None
    pids: Optional[int] = None
    cpu_millis: Optional[int] = None
    # what its writable layer may hold (btrfs simple quotas); writes past it get EDQUOT
    disk_bytes: Optional[int] = None


@dataclass
class Network(_Model):
    """What a sandbox may reach: mode `none` (loopback only), `egress`, or `allowlist`
    (egress to `hosts` only: IPv4 addresses, IPv4 networks, DNS names)."""

    mode: str = "none"
    hosts: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> "Network":
        """The command-line form: `none`, `egress` or `allowlist=HOST,...`."""
        text = text.strip()
        if text in ("none", "egress"):
            return cls(mode=text)
        kind, sep, rest = text.partition("=")
        if kind == "allowlist" and sep:
            return cls(mode="allowlist", hosts=[h.strip() for h in rest.split(",")])
        raise ValueError(f"unknown network mode {text!r}: use none, egress or allowlist=HOST,...")


@dataclass
class NetworkInfo(_Model):
    """A running sandbox's network beyond loopback: `eth0` at `address`, `gateway` the
    host's end of the veth `link`; its rules are chain `sb_<link>` of nftables table
    `inet <table>`."""

    mode: Network = field(default_factory=Network)
    address: str = ""
    gateway: str = ""
    link: str = ""
    allowed: list[str] = field(default_factory=list)
    nameservers: list[str] = field(default_factory=list)
    table: str = ""


@dataclass
class SandboxInfo(_Model):
    """A sandbox, as `inspect` shows it."""

    id: str = ""
    image: str = ""
    # running, stopped; stopping, checkpointing or removing while such an operation runs
    status: str = ""
    created: int = 0
    hostname: str = ""
    init_pid: Optional[int] = None
    limits: Limits = field(default_factory=Limits)
    labels: dict[str, str] = field(default_factory=dict)
    rootfs: str = ""
    upper: str = ""
    cgroup: str = ""
    memory_bytes: Optional[int] = None
    # what memory_bytes counts: "cgroup" (its own memory cgroup's charge) or
    # "processes" (its processes' proportional set size: the memory cgroup is shared)
    memory_counted: Optional[str] = None
    oom_kills: Optional[int] = None
    create_us: int = 0
    network: Optional[NetworkInfo] = None
    # the system-call filter: "default" or "unconfined"
    seccomp: str = "default"
    # what its writable layer is charged (inspect, or a list with stats), with quotas
    disk_used_bytes: Optional[int] = None
    # setuid programs (sudo) take effect in it
    setuid: bool = False
    # when the daemon removes it (seconds since the epoch), if it expires
    expires_at: Optional[int] = None
    # CPU time its processes used, microseconds (inspect, or a list with stats)
    cpu_usage_us: Optional[int] = None

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass
class ExecResult(_Model):
    """A command that ran to completion. The `*_b64` fields are the wire form; use
    `stdout`, `stderr` and `output` (both merged) for bytes, `text` for a string."""

    pid: int = 0
    exit_code: int = 0
    signal: Optional[int] = None
    timed_out: bool = False
    duration_us: int = 0
    stdout_b64: str = ""
    stderr_b64: str = ""
    output_b64: str = ""
    output_bytes: int = 0
    truncated: bool = False

    @property
    def stdout(self) -> bytes:
        return base64.b64decode(self.stdout_b64)

    @property
    def stderr(self) -> bytes:
        return base64.b64decode(self.stderr_b64)

    @property
    def output(self) -> bytes:
        """Standard output and error merged (exact order with `merge_stderr=True`)."""
        return base64.b64decode(self.output_b64)

    @property
    def text(self) -> str:
        """The merged output as text (invalid UTF-8 replaced)."""
        return self.output.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ExecRecord(_Model):
    """One exec of a sandbox's trajectory (`GET .../execs`)."""

    t_us: int = 0
    argv: Optional[list[str]] = None
    shell: Optional[str] = None
    cwd: Optional[str] = None
    user: Optional[str] = None
    tty: bool = False
    detach: bool = False
    result: Optional[dict[str, Any]] = None


@dataclass
class FsEntry(_Model):
    """One file in a sandbox, as `lstat` sees it there."""

    name: str = ""
    path: str = ""
    # file, dir, symlink or other
    kind: str = ""
    size: int = 0
    mode: int = 0
    owner: str = ""
    group: str = ""
    modified_ns: int = 0
    symlink_target: Optional[str] = None


@dataclass
class FsAnswer(_Model):
    """What a file operation answers."""

    entries: list[FsEntry] = field(default_factory=list)
    created: Optional[bool] = None


@dataclass
class CheckpointInfo(_Model):
    """A checkpoint: its layers and, when live, the size of its CRIU images."""

    id: str = ""
    parent: Optional[str] = None
    sandbox: str = ""
    image: str = ""
    live: bool = False
    created: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)
    tree_hash: Optional[str] = None
    phases_us: dict[str, int] = field(default_factory=dict)
    images_bytes: int = 0
    branches: list[str] = field(default_factory=list)


@dataclass
class BranchInfo(_Model):
    """One branch of a fork: a new running sandbox."""

    id: str = ""
    mode: str = ""
    init_pid: Optional[int] = None
    phases_us: dict[str, int] = field(default_factory=dict)


@dataclass
class ForkResult(_Model):
    """`POST /v1/checkpoints/{id}/fork`."""

    checkpoint: str = ""
    branches: list[BranchInfo] = field(default_factory=list)

    @property
    def ids(self) -> list[str]:
        return [b.id for b in self.branches]


@dataclass
class ExportResult(_Model):
    """A checkpoint written as one verified archive."""

    path: str = ""
    bytes: int = 0
    files: int = 0
    tree_hash: str = ""
    duration_us: int = 0


@dataclass
class GcResult(_Model):
    """`POST /v1/gc`."""

    removed_layers: list[str] = field(default_factory=list)
    freed_bytes: int = 0


# Schema name -> class, for the schema test and for readers of the wire format.
@dataclass
class Refusal(_Model):
    """A request a grant's socket refused (403)."""

    t_us: int = 0
    method: str = ""
    path: str = ""
    reason: str = ""
    budget: bool = False


@dataclass
class GrantInfo(_Model):
    """`POST /v1/sandboxes/{id}/grants`: a capability on one sandbox, on its own socket."""

    id: str = ""
    sandbox: str = ""
    socket: str = ""
    uid: int = 0
    gid: int = 0
    max_steps: Optional[int] = None
    steps: int = 0
    refused: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    active: bool = False


@dataclass
class ComponentHealth(_Model):
    """One part the daemon needs: whether it works, and what it is or what is wrong."""

    ok: bool = False
    detail: str = ""


@dataclass
class NodeCeiling(_Model):
    """One of the host's ceilings on how many sandboxes may run."""

    name: str = ""
    value: int = 0
    used: int = 0
    kept: int = 0
    per_sandbox: int = 0
    allows: int = 0
    how_to_raise: str = ""


@dataclass
class VolumeHealth(_Model):
    """The data volume: its space and state (`pressure` while full and unable to grow)."""

    path: str = ""
    ok: bool = False
    size_bytes: int = 0
    free_bytes: int = 0
    max_bytes: int = 0
    host_free_bytes: int = 0
    host_reserve_bytes: int = 0
    pressure: Optional[str] = None
    problems: list[str] = field(default_factory=list)


@dataclass
class Health(_Model):
    """`GET /v1/health`."""

    ok: bool = False
    degraded: list[str] = field(default_factory=list)
    volume: VolumeHealth = field(default_factory=VolumeHealth)
    criu: ComponentHealth = field(default_factory=ComponentHealth)
    exit_watcher: ComponentHealth = field(default_factory=ComponentHealth)
    network: ComponentHealth = field(default_factory=ComponentHealth)
    disk_limits: ComponentHealth = field(default_factory=ComponentHealth)
    templates: ComponentHealth = field(default_factory=ComponentHealth)
    ceilings: list[NodeCeiling] = field(default_factory=list)


SCHEMAS: dict[str, type[_Model]] = {
    "VersionInfo": VersionInfo,
    "Health": Health,
    "VolumeHealth": VolumeHealth,
    "ComponentHealth": ComponentHealth,
    "NodeCeiling": NodeCeiling,
    "OpStats": OpStats,
    "ImageInfo": ImageInfo,
    "ImageConfig": ImageConfig,
    "BuildStep": BuildStep,
    "BuildResult": BuildResult,
    "BuildStatus": BuildStatus,
    "PullLayer": PullLayer,
    "PullStatus": PullStatus,
    "Limits": Limits,
    "SandboxInfo": SandboxInfo,
    "Network": Network,
    "NetworkInfo": NetworkInfo,
    "ExecResult": ExecResult,
    "ExecRecord": ExecRecord,
    "CheckpointInfo": CheckpointInfo,
    "BranchInfo": BranchInfo,
    "ForkResult": ForkResult,
    "ExportResult": ExportResult,
    "GcResult": GcResult,
    "Refusal": Refusal,
    "GrantInfo": GrantInfo,
    "FsEntry": FsEntry,
    "FsAnswer": FsAnswer,
}
