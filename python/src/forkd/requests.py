"""Typed requests of the forkd API: one dataclass per request schema of
`docs/openapi.json` (the schema test holds their fields to the schemas'). `_ops`
builds each call's body from one of these; `body()` leaves out what is unset, so the
daemon's defaults apply."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional


class _Request:
    def body(self) -> dict[str, Any]:
        """The JSON body: unset fields (None) left out, nested requests as theirs."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is None:
                continue
            out[f.name] = v.body() if isinstance(v, _Request) else v
        return out


@dataclass
class ExecRequest(_Request):
    argv: Optional[list[str]] = None
    shell: Optional[str] = None
    env: Optional[list[str]] = None
    cwd: Optional[str] = None
    user: Optional[str] = None
    timeout_ms: Optional[int] = None
    tty: Optional[bool] = None
    stdin: Optional[bool] = None
    detach: Optional[bool] = None
    log: Optional[str] = None
    merge_stderr: Optional[bool] = None
    # a command that outlives its client; attach to one by its pid
    keep: Optional[bool] = None
    attach: Optional[int] = None
    # one of forkd's own tools instead of argv or shell: {"watch": {"path": ..., "recursive": ...}}
    tool: Optional[dict[str, Any]] = None


@dataclass
class ExecBody(_Request):
    """`execInSandbox` run to completion: an `ExecRequest` with its input and the output
    kept."""

    argv: Optional[list[str]] = None
    shell: Optional[str] = None
    env: Optional[list[str]] = None
    cwd: Optional[str] = None
    user: Optional[str] = None
    timeout_ms: Optional[int] = None
    tty: Optional[bool] = None
    stdin: Optional[bool] = None
    detach: Optional[bool] = None
    log: Optional[str] = None
    stdin_b64: Optional[str] = None
    merge_stderr: Optional[bool] = None
    output_limit: Optional[int] = None
    keep: Optional[bool] = None
    attach: Optional[int] = None
    tool: Optional[dict[str, Any]] = None

    @classmethod
    def of(cls, req: ExecRequest, **more: Any) -> "ExecBody":
        return cls(**{f.name: getattr(req, f.name) for f in dataclasses.fields(req)}, **more)


@dataclass
class Limits(_Request):
    memory_bytes: Optional[int] = None
    pids: Optional[int] = None
    cpu_millis: Optional[int] = None
    disk_bytes: Optional[int] = None

    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in dataclasses.fields(self))


@dataclass
class Network(_Request):
    mode: str
    hosts: Optional[list[str]] = None


@dataclass
class CreateSandboxRequest(_Request):
    image: str
    command: Optional[ExecRequest] = None
    hostname: Optional[str] = None
    limits: Optional[Limits] = None
    labels: dict[str, str] = field(default_factory=dict)
    network: Optional[Network] = None
    seccomp: Optional[str] = None
    # setuid programs (sudo) take effect: no no_new_privs
    setuid: Optional[bool] = None
    # removed by the daemon this many seconds after it is made
    expires_in_secs: Optional[int] = None


@dataclass
class StopRequest(_Request):
    grace_secs: Optional[int] = None


@dataclass
class ImportImageRequest(_Request):
    source: str
    name: str


@dataclass
class PullRequest(_Request):
    reference: str
    platform: Optional[str] = None
    name: Optional[str] = None


@dataclass
class BuildRequest(_Request):
    context: str
    name: str
    dockerfile: Optional[str] = None
    build_args: Optional[dict[str, str]] = None
    target: Optional[str] = None
    no_cache: Optional[bool] = None
    network: Optional[bool] = None
    limits: Optional[Limits] = None
    step_timeout_secs: Optional[int] = None


@dataclass
class CheckpointRequest(_Request):
    live: bool = False
    stop: bool = False
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ForkRequest(_Request):
    count: int = 1
    lazy: bool = False
    fresh: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    network: Optional[Network] = None
    share_memory: Optional[bool] = None
    disk_bytes: Optional[int] = None
    expires_in_secs: Optional[int] = None


@dataclass
class ExpiryRequest(_Request):
    expires_in_secs: Optional[int] = None


@dataclass
class ResumeRequest(_Request):
    checkpoint: Optional[str] = None
    expires_in_secs: Optional[int] = None


@dataclass
class ExportRequest(_Request):
    path: str
    thin: Optional[bool] = None


@dataclass
class ArchivePath(_Request):
    path: str


@dataclass
class GrantRequest(_Request):
    uid: int
    gid: Optional[int] = None
    max_steps: Optional[int] = None


REQUESTS: dict[str, type[_Request]] = {
    c.__name__: c
    for c in (
        ExecRequest,
        ExecBody,
        Limits,
        Network,
        CreateSandboxRequest,
        StopRequest,
        ImportImageRequest,
        PullRequest,
        BuildRequest,
        CheckpointRequest,
        ForkRequest,
        ExportRequest,
        ArchivePath,
        GrantRequest,
        ExpiryRequest,
        ResumeRequest,
    )
}
