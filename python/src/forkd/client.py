"""The synchronous client: `Client(socket=None, *, host=None, api_key=None)`.

Every method sends one API call (see `forkd._ops`) on a fresh connection to the daemon
(its Unix socket, or `host`/`FORKD_HOST`: TCP with TLS and an API key) and returns its
typed result, or raises the `forkd.errors.ForkdError` of the
answer's error kind. A `Client` holds no connection between calls, so one may be shared
by threads.

    from forkd import Client
    c = Client()                                  # FORKD_SOCKET, else /run/forkd/forkd.sock
    sb = c.create("busybox")
    r = c.exec(sb.id, "echo hi; echo oops >&2", merge_stderr=True, timeout=10)
    print(r.exit_code, r.text)
    c.remove(sb.id, force=True)
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, TypeVar, Union

from . import _files, _ops
from . import types as t
from ._ops import Command
from ._wire import MAX_ANSWER, Call, endpoint
from .errors import BadRequest, ConnectionFailed

T = TypeVar("T")


class Client:
    """A client of one forkd daemon."""

    def __init__(self, socket: Optional[str] = None, *, host: Optional[str] = None, api_key: Optional[str] = None) -> None:
        self.endpoint = endpoint(socket, host, api_key)
        self.socket = str(self.endpoint)

    def __repr__(self) -> str:
        return f"Client({str(self.endpoint)!r})"

    def _connect(self, timeout: Optional[float]) -> socket.socket:
        e = self.endpoint
        if e.socket is not None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(timeout)
                s.connect(e.socket)
            except BaseException:
                s.close()
                raise
            return s
        s = socket.create_connection((e.host, e.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if e.ssl is None:
            return s
        try:
            return e.ssl.wrap_socket(s, server_hostname=e.host)
        except BaseException:
            s.close()
            raise

    def _send(self, call: Call[T]) -> T:
        what = f"{call.method} {call.path}"
        try:
            with self._connect(call.timeout) as s:
                s.sendall(call.encode(self.endpoint.key))
                chunks: list[bytes] = []
                size = 0
                while True:
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > MAX_ANSWER:
                        raise ConnectionFailed(f"{what}: answer larger than {MAX_ANSWER} bytes")
                    chunks.append(chunk)
        except socket.timeout:
            raise ConnectionFailed(f"{what}: no answer from {self.socket} within {call.timeout} s") from None
        except OSError as e:
            raise ConnectionFailed(f"{what}: daemon at {self.socket}: {e.strerror or e}") from None
        return call.finish(b"".join(chunks))

    def version(self) -> t.VersionInfo:
        """The daemon's version, API version, state root and cgroup version."""
        return self._send(_ops.version())

    def health(self) -> t.Health:
        """The node's health: the volume (space, pressure, problems), CRIU, the exit watcher, the network table."""
        return self._send(_ops.health())

    def metrics(self) -> dict[str, t.OpStats]:
        """Latency per operation."""
        return self._send(_ops.metrics())

    def prometheus_metrics(self) -> str:
        """The daemon in Prometheus's text format (`GET /metrics`)."""
        return self._send(_ops.prometheus_metrics())

    def gc(self) -> t.GcResult:
        """Removes every store layer nothing uses."""
        return self._send(_ops.gc())

    def list_images(self) -> list[t.ImageInfo]:
        """Every image."""
        return self._send(_ops.list_images())

    def import_image(self, source: str, name: str) -> t.ImageInfo:
        """Imports an image from `source`, a path on the daemon's host (rootfs directory, tarball, OCI layout, docker-save archive)."""
        return self._send(_ops.import_image(source, name))

    def build_image(self, context: str, name: str, *, dockerfile: Optional[str] = None, build_args: Optional[Mapping[str, str]] = None, target: Optional[str] = None, no_cache: bool = False, limits: Optional[Mapping[str, Optional[int]]] = None, step_timeout: Optional[int] = None, network: bool = False) -> t.BuildResult:
        """Builds image `name` from the Dockerfile in `context` (a directory on the daemon's host); see `forkd image build`."""
        return self._send(_ops.build_image(context, name, dockerfile=dockerfile, build_args=build_args, target=target, no_cache=no_cache, limits=limits, step_timeout=step_timeout, network=network))

    def list_builds(self) -> list[t.BuildStatus]:
        """Builds in progress, with the steps each has finished."""
        return self._send(_ops.list_builds())

    def pull_image(self, reference: str, *, platform: Optional[str] = None, name: Optional[str] = None) -> t.ImageInfo:
        """Pulls `reference` from its registry (default platform linux/amd64); see `forkd image pull`."""
        return self._send(_ops.pull_image(reference, platform=platform, name=name))

    def list_pulls(self) -> list[t.PullStatus]:
        """Pulls in progress, with each layer's state."""
        return self._send(_ops.list_pulls())

    def inspect_image(self, name: str) -> t.ImageInfo:
        """One image."""
        return self._send(_ops.inspect_image(name))

    def remove_image(self, name: str) -> str:
        """Removes an image no sandbox uses; returns its name."""
        return self._send(_ops.remove_image(name))

    def list_sandboxes(self, stats: bool = False) -> list[t.SandboxInfo]:
        """Every sandbox, running or stopped; with `stats`, with memory use and OOM kills."""
        return self._send(_ops.list_sandboxes(stats))

    def create(self, image: str, *, command: Optional[Command] = None, hostname: Optional[str] = None, memory_bytes: Optional[int] = None, pids: Optional[int] = None, cpu_millis: Optional[int] = None, labels: Optional[Mapping[str, str]] = None, network: _ops.NetworkArg = None, seccomp: Optional[str] = None, disk_bytes: Optional[int] = None) -> t.SandboxInfo:
        """Creates and starts a sandbox of `image`. `command`, when given, starts detached with its output in the log `main`; limits left out take the daemon's defaults (2048 tasks; `cpu_millis` is thousandths of a CPU); `seccomp="unconfined"` makes it without the system-call filter. `network` is `"none"` (the default: loopback only), `"egress"` or `"allowlist=HOST,..."` (or a `types.Network`)."""
        return self._send(_ops.create_sandbox(image, command=command, hostname=hostname, memory_bytes=memory_bytes, pids=pids, cpu_millis=cpu_millis, labels=labels, network=network, seccomp=seccomp, disk_bytes=disk_bytes))

    def inspect(self, id: str) -> t.SandboxInfo:
        """One sandbox (a full id or a unique prefix of at least 4)."""
        return self._send(_ops.inspect_sandbox(id))

    def stop(self, id: str, grace_secs: Optional[int] = None) -> t.SandboxInfo:
        """Stops a sandbox: SIGTERM to its init, then SIGKILL after `grace_secs` (default 10)."""
        return self._send(_ops.stop_sandbox(id, grace_secs))

    def remove(self, id: str, *, force: bool = False) -> str:
        """Removes a sandbox (a running one only with `force`); returns its id."""
        return self._send(_ops.remove_sandbox(id, force))

    def exec(self, id: str, command: Command, *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, user: Optional[str] = None, timeout: Optional[float] = None, stdin: Optional[bytes] = None, merge_stderr: bool = False, output_limit: Optional[int] = None) -> t.ExecResult:
        """Runs `command` (a shell line, or an argv list) to completion inside the sandbox.

        `timeout` (seconds) kills the command's whole process tree (`timed_out` is then
        set); `merge_stderr` sends standard error into standard output's pipe, so that
        `output` holds both in the exact order written; `output_limit` bounds the bytes
        kept (default 16 MiB: past it, output is dropped and `truncated` set)."""
        return self._send(_ops.exec(id, command, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin, merge_stderr=merge_stderr, output_limit=output_limit))

    def exec_detached(self, id: str, command: Command, *, log: str, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None, user: Optional[str] = None) -> int:
        """Starts `command` in the background; returns its pid. Its output goes to the log `log`."""
        return self._send(_ops.exec_detached(id, command, log=log, env=env, cwd=cwd, user=user))

    def logs(self, id: str, name: str = "main") -> bytes:
        """A detached command's output (both streams)."""
        return self._send(_ops.logs(id, name))

    def execs(self, id: str) -> list[t.ExecRecord]:
        """Every exec the sandbox ran through the API, in order: its trajectory."""
        return self._send(_ops.execs(id))

    def copy_out(self, id: str, path: str) -> bytes:
        """A tar of `path` inside the sandbox; its top entry is the path's last component."""
        return self._send(_ops.copy_out(id, path))

    def copy_in(self, id: str, path: str, tar: bytes) -> int:
        """Unpacks the tar `tar` into `path` (when a directory) or as `path`; returns the entry count."""
        return self._send(_ops.copy_in(id, path, tar))

    def checkpoint(self, id: str, *, live: bool = False, stop: bool = False, labels: Optional[Mapping[str, str]] = None) -> t.CheckpointInfo:
        """Checkpoints a sandbox: its files (an O(1) snapshot), and with `live` its whole process tree."""
        return self._send(_ops.checkpoint(id, live=live, stop=stop, labels=labels))

    def list_checkpoints(self) -> list[t.CheckpointInfo]:
        """Every checkpoint."""
        return self._send(_ops.list_checkpoints())

    def inspect_checkpoint(self, id: str) -> t.CheckpointInfo:
        """One checkpoint."""
        return self._send(_ops.inspect_checkpoint(id))

    def remove_checkpoint(self, id: str, *, force: bool = False) -> str:
        """Removes a checkpoint; returns its id."""
        return self._send(_ops.remove_checkpoint(id, force))

    def fork(self, checkpoint: str, count: int = 1, *, lazy: bool = False, fresh: bool = False, labels: Optional[Mapping[str, str]] = None, network: _ops.NetworkArg = None, share_memory: Optional[bool] = None) -> t.ForkResult:
        """Starts `count` branches of a checkpoint, each a running sandbox (a live checkpoint's processes resume in each; `fresh` starts a new init over its files instead; `share_memory` opens the branches' memory to KSM)."""
        return self._send(_ops.fork(checkpoint, count, lazy=lazy, fresh=fresh, labels=labels, network=network, share_memory=share_memory))

    def export_checkpoint(self, id: str, path: str, thin: bool = False) -> t.ExportResult:
        """Writes a checkpoint as one verified archive at `path` on the daemon's host;
        `thin` names the store's layers (images, runtime) instead of writing them."""
        return self._send(_ops.export_checkpoint(id, path, thin))

    def import_checkpoint(self, path: str) -> t.CheckpointInfo:
        """Imports (and verifies) an archive at `path` on the daemon's host."""
        return self._send(_ops.import_checkpoint(path))

    def grant(self, id: str, uid: int, *, gid: Optional[int] = None, max_steps: Optional[int] = None) -> t.GrantInfo:
        """Exec, files and inspect of sandbox `id` for user `uid`, on a socket of its own, with at most `max_steps` execs."""
        return self._send(_ops.grant(id, uid, gid=gid, max_steps=max_steps))

    def inspect_grant(self, grant: str) -> t.GrantInfo:
        """A grant's steps and refusals."""
        return self._send(_ops.inspect_grant(grant))

    def revoke_grant(self, grant: str) -> t.GrantInfo:
        """Ends a grant; answers it as it ended."""
        return self._send(_ops.revoke_grant(grant))

    def checkpoint_delta(self, id: str) -> bytes:
        """A tar of the checkpoint's own layer: what it changed over its parent."""
        return self._send(_ops.checkpoint_delta(id))

    # Files, as bytes or host paths (built on copy_in / copy_out).

    def write_file(self, id: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Writes `data` as the file `path` inside the sandbox, making its parents."""
        parent, name = _files.split(path)
        self._mkdir(id, parent)
        self.copy_in(id, path, _files.pack_bytes(name, data, mode))

    def read_file(self, id: str, path: str) -> bytes:
        """The content of the regular file `path` inside the sandbox."""
        return _files.single_file(self.copy_out(id, path), path)

    def upload_file(self, id: str, source: Union[str, Path], path: str) -> None:
        """Copies the host file `source` to `path` inside the sandbox (parents made)."""
        parent, name = _files.split(path)
        self._mkdir(id, parent)
        self.copy_in(id, path, _files.pack_path(Path(source), name))

    def upload_dir(self, id: str, source: Union[str, Path], path: str) -> None:
        """Copies the contents of the host directory `source` into `path` (made if missing)."""
        _files.split(path)
        self._mkdir(id, path)
        self.copy_in(id, path, _files.pack_dir_contents(Path(source)))

    def download_file(self, id: str, path: str, target: Union[str, Path]) -> None:
        """Copies the file `path` inside the sandbox to the host file `target`."""
        target = Path(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.read_file(id, path))

    def download_dir(self, id: str, path: str, target: Union[str, Path]) -> None:
        """Copies the contents of the directory `path` inside the sandbox into the host
        directory `target` (made if missing); nothing is written outside it."""
        _files.unpack_into(self.copy_out(id, path), Path(target), strip_top=True)

    def _mkdir(self, id: str, path: str) -> None:
        r = self.exec(id, ["mkdir", "-p", path], timeout=60)
        if not r.ok:
            raise BadRequest(f"mkdir -p {path} in sandbox {id}: {r.stderr.decode(errors='replace').strip()}")

    @contextmanager
    def sandbox(self, image: str, **create: object) -> Iterator[t.SandboxInfo]:
        """A sandbox for the length of a `with` block, removed at its end."""
        sb = self.create(image, **create)  # type: ignore[arg-type]
        try:
            yield sb
        finally:
            self.remove(sb.id, force=True)

    @contextmanager
    def branch(self, checkpoint: str, **fork: object) -> Iterator[str]:
        """One branch of `checkpoint` for the length of a `with` block; yields its id."""
        res = self.fork(checkpoint, 1, **fork)  # type: ignore[arg-type]
        try:
            yield res.branches[0].id
        finally:
            self.remove(res.branches[0].id, force=True)
