"""Every API operation as a `Call`: the one place that knows paths, bodies and answers.

The function names are the client methods' names; the operation ids of
`docs/openapi.json` are noted on each. Both clients send these calls unchanged.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from . import _credentials
from . import requests as r
from . import types as t
from ._wire import Call, json_call, segment

Command = Union[str, Sequence[str]]
"""A shell line (run as `/bin/sh -c LINE`) or an argv list."""

# Seconds the wire may take beyond an exec's own timeout (start-up, output transfer).
EXEC_MARGIN = 30.0


def _labels(labels: Optional[Mapping[str, str]]) -> dict[str, str]:
    return dict(labels or {})


def _command(command: Command) -> r.ExecRequest:
    if isinstance(command, str):
        return r.ExecRequest(shell=command)
    argv = list(command)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("command must be a shell line or a non-empty list of strings")
    return r.ExecRequest(argv=argv)


def exec_request(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """An `ExecRequest` body (also the `command` of a sandbox created with one); see
    `exec_typed`."""
    return exec_typed(*args, **kwargs).body()


def exec_typed(
    command: Command,
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    timeout: Optional[float] = None,
    tty: bool = False,
    detach: bool = False,
    log: Optional[str] = None,
    merge_stderr: bool = False,
) -> r.ExecRequest:
    """An `ExecRequest`: `timeout` in seconds; flags that are off are left out."""
    req = _command(command)
    if env:
        req.env = [f"{k}={v}" for k, v in env.items()]
    req.cwd = cwd
    req.user = user
    if timeout is not None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        req.timeout_ms = max(1, int(timeout * 1000))
    req.tty = tty or None
    req.detach = detach or None
    req.log = log
    req.merge_stderr = merge_stderr or None
    return req


# Daemon: version, metrics, gc.


def version() -> Call[t.VersionInfo]:
    """`version`."""
    return json_call("GET", "/v1/version", t.VersionInfo.from_json)


def health() -> Call[t.Health]:
    """`health`."""
    return json_call("GET", "/v1/health", t.Health.from_json)


def metrics() -> Call[dict[str, t.OpStats]]:
    """`metrics`."""
    return json_call("GET", "/v1/metrics", lambda d: {k: t.OpStats.from_json(v) for k, v in d.items()})


def prometheus_metrics() -> Call[str]:
    """`prometheusMetrics`: the daemon in Prometheus's text exposition format."""
    return Call("GET", "/metrics", lambda a: a.body.decode("utf-8"))


def gc() -> Call[t.GcResult]:
    """`gc`."""
    return json_call("POST", "/v1/gc", t.GcResult.from_json)


# Images.


def list_images() -> Call[list[t.ImageInfo]]:
    """`listImages`."""
    return json_call("GET", "/v1/images", lambda d: [t.ImageInfo.from_json(x) for x in d])


def import_image(source: str, name: str) -> Call[t.ImageInfo]:
    """`importImage`: `source` is a path on the daemon's host."""
    body = r.ImportImageRequest(source=source, name=name).body()
    return json_call("POST", "/v1/images", t.ImageInfo.from_json, body)


def build_image(
    context: str,
    name: str,
    *,
    dockerfile: Optional[str] = None,
    build_args: Optional[Mapping[str, str]] = None,
    target: Optional[str] = None,
    no_cache: bool = False,
    limits: Optional[Mapping[str, Optional[int]]] = None,
    step_timeout: Optional[int] = None,
    network: bool = False,
) -> Call[t.BuildResult]:
    """`buildImage`: `context` (and `dockerfile`, if absolute) are paths on the daemon's host."""
    body = r.BuildRequest(
        context=context,
        name=name,
        dockerfile=dockerfile,
        build_args=dict(build_args) if build_args else None,
        target=target,
        no_cache=no_cache or None,
        network=network or None,
        limits=r.Limits(**limits) if limits else None,
        step_timeout_secs=None if step_timeout is None else int(step_timeout),
    ).body()
    # A build runs as long as its RUN steps do: no wire timeout.
    call = json_call("POST", "/v1/images/build", t.BuildResult.from_json, body, timeout=None)
    # The caller's credentials for the images its FROM lines pull, when the Dockerfile
    # is readable here (it is where the daemon runs on this host).
    path = Path(dockerfile) if dockerfile and Path(dockerfile).is_absolute() else Path(context) / (dockerfile or "Dockerfile")
    try:
        text = path.read_text()
    except OSError:
        text = ""
    auth = _credentials.header_for(*_credentials.images_named(text))
    if auth is not None:
        call.headers[_credentials.HEADER] = auth
    return call


def list_builds() -> Call[list[t.BuildStatus]]:
    """`listBuilds`: builds in progress."""
    return json_call("GET", "/v1/builds", lambda d: [t.BuildStatus.from_json(x) for x in d])


def pull_image(reference: str, *, platform: Optional[str] = None, name: Optional[str] = None) -> Call[t.ImageInfo]:
    """`pullImage`: from a registry, as the daemon's registries.conf says, with the caller's
    own credentials for it when it has some (`forkd._credentials`), else the daemon's."""
    body = r.PullRequest(reference=reference, platform=platform, name=name).body()
    call = json_call("POST", "/v1/images/pull", t.ImageInfo.from_json, body, timeout=None)
    auth = _credentials.header_for(reference)
    if auth is not None:
        call.headers[_credentials.HEADER] = auth
    return call


def list_pulls() -> Call[list[t.PullStatus]]:
    """`listPulls`: pulls in progress."""
    return json_call("GET", "/v1/pulls", lambda d: [t.PullStatus.from_json(x) for x in d])


def inspect_image(name: str) -> Call[t.ImageInfo]:
    """`inspectImage`."""
    return json_call("GET", f"/v1/images/{segment(name)}", t.ImageInfo.from_json)


def remove_image(name: str) -> Call[str]:
    """`removeImage`."""
    return json_call("DELETE", f"/v1/images/{segment(name)}", lambda d: d["removed"])


# Sandboxes.


def list_sandboxes(stats: bool = False) -> Call[list[t.SandboxInfo]]:
    """`listSandboxes`; with `stats`, each with its cgroup's counters."""
    query = {"stats": "true"} if stats else {}
    return json_call("GET", "/v1/sandboxes", lambda d: [t.SandboxInfo.from_json(x) for x in d], query=query)


NetworkArg = Union[None, str, "t.Network", Mapping[str, Any]]


def network_body(network: Union[str, "t.Network", Mapping[str, Any]]) -> dict[str, Any]:
    """A network as the API takes it, from `"egress"` / `"allowlist=a,b"`, a
    `types.Network`, or the API's own object."""
    return _network(network).body()


def _network(network: Union[str, "t.Network", Mapping[str, Any]]) -> r.Network:
    if isinstance(network, str):
        network = t.Network.parse(network)
    if isinstance(network, t.Network):
        return r.Network(mode=network.mode, hosts=list(network.hosts))
    if isinstance(network, Mapping):
        return r.Network(**network)
    raise TypeError(f"network: expected a string, a Network or a mapping, got {type(network).__name__}")


def create_sandbox(
    image: str,
    *,
    command: Optional[Command] = None,
    hostname: Optional[str] = None,
    memory_bytes: Optional[int] = None,
    pids: Optional[int] = None,
    cpu_millis: Optional[int] = None,
    labels: Optional[Mapping[str, str]] = None,
    network: NetworkArg = None,
    seccomp: Optional[str] = None,
    disk_bytes: Optional[int] = None,
) -> Call[t.SandboxInfo]:
    """`createSandbox`; `seccomp="unconfined"` makes it without the system-call filter."""
    limits = r.Limits(memory_bytes=memory_bytes, pids=pids, cpu_millis=cpu_millis, disk_bytes=disk_bytes)
    body = r.CreateSandboxRequest(
        image=image,
        labels=_labels(labels),
        seccomp=seccomp,
        network=None if network is None else _network(network),
        limits=limits if limits.any() else None,
        hostname=hostname,
        command=None if command is None else exec_typed(command, detach=False),
    ).body()
    return json_call("POST", "/v1/sandboxes", t.SandboxInfo.from_json, body)


def inspect_sandbox(id: str) -> Call[t.SandboxInfo]:
    """`inspectSandbox`."""
    return json_call("GET", f"/v1/sandboxes/{segment(id)}", t.SandboxInfo.from_json)


def stop_sandbox(id: str, grace_secs: Optional[int] = None) -> Call[t.SandboxInfo]:
    """`stopSandbox`: SIGTERM, `grace_secs` (default 10), then SIGKILL."""
    body = r.StopRequest(grace_secs=None if grace_secs is None else int(grace_secs)).body()
    wait = (grace_secs if grace_secs is not None else 10) + 60.0
    return json_call("POST", f"/v1/sandboxes/{segment(id)}/stop", t.SandboxInfo.from_json, body, timeout=wait)


def remove_sandbox(id: str, force: bool = False) -> Call[str]:
    """`removeSandbox`; a running sandbox needs `force`."""
    query = {"force": "true"} if force else {}
    return json_call("DELETE", f"/v1/sandboxes/{segment(id)}", lambda d: d["removed"], query=query)


def exec(
    id: str,
    command: Command,
    *,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    timeout: Optional[float] = None,
    stdin: Optional[bytes] = None,
    merge_stderr: bool = False,
    output_limit: Optional[int] = None,
) -> Call[t.ExecResult]:
    """`execInSandbox`, run to completion. `timeout` (seconds) kills the command's whole
    process tree; `output_limit` bounds the output kept (bytes, both streams)."""
    req = exec_typed(command, env=env, cwd=cwd, user=user, timeout=timeout, merge_stderr=merge_stderr)
    body = r.ExecBody.of(
        req,
        stdin_b64=None if stdin is None else base64.b64encode(stdin).decode(),
        output_limit=None if output_limit is None else int(output_limit),
    ).body()
    wire = None if timeout is None else timeout + EXEC_MARGIN
    return json_call("POST", f"/v1/sandboxes/{segment(id)}/exec", t.ExecResult.from_json, body, timeout=wire)


def exec_detached(
    id: str,
    command: Command,
    *,
    log: str,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
) -> Call[int]:
    """`execInSandbox` with `detach`: answers the pid once the command runs; its output
    goes to the sandbox log `log` (read it with `logs`)."""
    body = exec_request(command, env=env, cwd=cwd, user=user, detach=True, log=log)
    return json_call("POST", f"/v1/sandboxes/{segment(id)}/exec", lambda d: int(d["pid"]), body)


def logs(id: str, name: str = "main") -> Call[bytes]:
    """`sandboxLogs`: a detached command's output, both streams."""
    return Call("GET", f"/v1/sandboxes/{segment(id)}/logs", lambda a: a.body, query={"name": name})


def execs(id: str) -> Call[list[t.ExecRecord]]:
    """`sandboxExecs`: every exec the sandbox ran through the API, in order."""

    def read(a: Any) -> list[t.ExecRecord]:
        lines = a.body.decode("utf-8", errors="replace").splitlines()
        return [t.ExecRecord.from_json(json.loads(line)) for line in lines if line.strip()]

    return Call("GET", f"/v1/sandboxes/{segment(id)}/execs", read)


def copy_out(id: str, path: str) -> Call[bytes]:
    """`copyFromSandbox`: a tar whose top entry is the path's last component."""
    return Call("GET", f"/v1/sandboxes/{segment(id)}/files", lambda a: a.body, query={"path": path})


def copy_in(id: str, path: str, tar: bytes) -> Call[int]:
    """`copyToSandbox`: unpacks `tar` into `path` when it is a directory, else as `path`."""
    return Call(
        "PUT",
        f"/v1/sandboxes/{segment(id)}/files",
        lambda a: int(a.json()["entries"]),
        query={"path": path},
        body=tar,
        content_type="application/x-tar",
    )


# Checkpoints and forks.


def checkpoint(
    id: str, *, live: bool = False, stop: bool = False, labels: Optional[Mapping[str, str]] = None
) -> Call[t.CheckpointInfo]:
    """`checkpointSandbox`: files only, or with `live` the whole process tree (CRIU)."""
    body = r.CheckpointRequest(live=live, stop=stop, labels=_labels(labels)).body()
    return json_call("POST", f"/v1/sandboxes/{segment(id)}/checkpoint", t.CheckpointInfo.from_json, body)


def list_checkpoints() -> Call[list[t.CheckpointInfo]]:
    """`listCheckpoints`."""
    return json_call("GET", "/v1/checkpoints", lambda d: [t.CheckpointInfo.from_json(x) for x in d])


def inspect_checkpoint(id: str) -> Call[t.CheckpointInfo]:
    """`inspectCheckpoint`."""
    return json_call("GET", f"/v1/checkpoints/{segment(id)}", t.CheckpointInfo.from_json)


def remove_checkpoint(id: str, force: bool = False) -> Call[str]:
    """`removeCheckpoint`; one with live branches needs `force`."""
    query = {"force": "true"} if force else {}
    return json_call("DELETE", f"/v1/checkpoints/{segment(id)}", lambda d: d["removed"], query=query)


def fork(
    id: str,
    count: int = 1,
    *,
    lazy: bool = False,
    fresh: bool = False,
    labels: Optional[Mapping[str, str]] = None,
    network: NetworkArg = None,
    share_memory: Optional[bool] = None,
) -> Call[t.ForkResult]:
    """`forkCheckpoint`: `count` branches, each a running sandbox (with the checkpointed
    sandbox's network unless `network` names another). `share_memory` opens the restored
    branches' memory to KSM (None: the daemon's `FORKD_KSM` decides)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    body = r.ForkRequest(
        count=count,
        lazy=lazy,
        fresh=fresh,
        labels=_labels(labels),
        network=None if network is None else _network(network),
        share_memory=share_memory,
    ).body()
    return json_call("POST", f"/v1/checkpoints/{segment(id)}/fork", t.ForkResult.from_json, body)


def export_checkpoint(id: str, path: str, thin: bool = False) -> Call[t.ExportResult]:
    """`exportCheckpoint` to `path` on the daemon's host (`thin`: store layers named, not written)."""
    body = r.ExportRequest(path=path, thin=thin or None).body()
    return json_call("POST", f"/v1/checkpoints/{segment(id)}/export", t.ExportResult.from_json, body)


def import_checkpoint(path: str) -> Call[t.CheckpointInfo]:
    """`importCheckpoint` from `path` on the daemon's host; verified before it appears."""
    body = r.ArchivePath(path=path).body()
    return json_call("POST", "/v1/checkpoints/import", t.CheckpointInfo.from_json, body)


def grant(id: str, uid: int, *, gid: Optional[int] = None, max_steps: Optional[int] = None) -> Call[t.GrantInfo]:
    """`grantSandbox`: exec, files and inspect of sandbox `id` for user `uid`, on a socket
    of its own (a `Client` on `GrantInfo.socket` speaks to it)."""
    body = r.GrantRequest(uid=uid, gid=gid, max_steps=max_steps).body()
    return json_call("POST", f"/v1/sandboxes/{segment(id)}/grants", t.GrantInfo.from_json, body)


def inspect_grant(grant: str) -> Call[t.GrantInfo]:
    """`inspectGrant`: its steps and refusals."""
    return json_call("GET", f"/v1/grants/{segment(grant)}", t.GrantInfo.from_json)


def revoke_grant(grant: str) -> Call[t.GrantInfo]:
    """`revokeGrant`: its socket goes; answers the grant as it ended."""
    return json_call("DELETE", f"/v1/grants/{segment(grant)}", t.GrantInfo.from_json)


def checkpoint_delta(id: str) -> Call[bytes]:
    """`checkpointDelta`: a tar of the checkpoint's own layer."""
    return Call("GET", f"/v1/checkpoints/{segment(id)}/delta", lambda a: a.body)
