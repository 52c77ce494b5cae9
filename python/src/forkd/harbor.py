"""A Harbor environment backend on forkd: `harbor run --env forkd.harbor:ForkdEnvironment`.

Every trial starts as a fork of one checkpoint. For each distinct environment
definition (the image, the task's workdir, env and healthcheck) the backend starts one
"golden" sandbox, health-checks it once, checkpoints it (live, so services the start-up
left running are part of the state), and removes it; every trial of that task, its
attempts, retries and concurrent trials, is a branch of that checkpoint. Trial starts
that arrive together are coalesced into one fork request. The checkpoint is labelled
with the definition's key, so a later `harbor run` of the same definition forks it
again instead of starting over.

Keyword arguments (`--ek key=value`):
- `socket`: the daemon's socket (default `FORKD_SOCKET`, else /run/forkd/forkd.sock);
- `checkpoint`: start every trial from this forkd checkpoint instead (a residual or
  rescue state, live processes included): the inherited-start conditions in Harbor;
- `image`: the forkd image to use (default: the task's `docker_image`, pulled from its
  registry if forkd lacks it, else the image built from `environment/Dockerfile`);
- `live` (default true): checkpoint the golden sandbox with its processes;
- `seccomp`: `unconfined` runs the golden sandbox and its trials without forkd's
  system-call filter (for software that needs what it refuses).

The image: `--ek image=NAME`, else the task's `[environment] docker_image` (forkd's image
of that name, or pulled from its registry as Harbor's own backends pull it), else
`environment/Dockerfile` built by the daemon (`forkd image build`, the environment
directory as context, RUN steps with egress unless the task has no network; its step
cache makes a rebuild of an unchanged Dockerfile take milliseconds; `--force-build` runs
every step again; a missing base image is pulled). As
Harbor's own Docker backend does, the golden sandbox runs the image's ENTRYPOINT with
`sleep infinity` as its command (CMD is replaced), so a start-up script that launches
services and then `exec "$@"` leaves them running; the live checkpoint keeps them, and
every trial starts with them up. `cpus` and `memory_mb` become the sandbox's cgroup
limits, and `storage_mb` its disk limit (each trial branch is charged only what it
writes; where the daemon cannot hold disk limits, a warning says so and none is set). The task's network policy becomes the sandbox's network (docs/NETWORK.md):
`no-network` (`allow_internet = false`) is forkd's `none`, loopback only; `public` is
`egress` (the outside world, never the host or another sandbox); `allowlist` with
`allowed_hosts` is forkd's allowlist (exact hostnames, IPv4 addresses and IPv4 networks;
wildcard hostnames and IPv6 are refused before start, as Harbor's contract asks). The
golden sandbox runs with the policy, and so does every trial branched from it, each with
an address of its own. forkd cannot change a running sandbox's policy, so a task whose
phases differ gets the broadest one for all of them (Harbor's own rule for such
environments).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Optional

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.models.task.config import NetworkMode, NetworkPolicy

from .aio import AsyncClient
from .errors import ForkdError

KEY_LABEL = "forkd.harbor.key"
# How long the first of a burst of trial starts waits for the others to join its fork.
COALESCE_SEC = 0.05


class _Golden:
    """One environment definition's checkpoint, and the fork batch being gathered."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.checkpoint: str | None = None
        self.waiting: list[asyncio.Future[str]] = []
        self.flusher: asyncio.Task[None] | None = None


class ForkdEnvironment(BaseEnvironment):
    """Harbor's BaseEnvironment on forkd sandboxes forked from one checkpoint."""

    _goldens: dict[str, _Golden] = {}

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: Any,
        task_env_config: Any,
        socket: str | None = None,
        checkpoint: str | None = None,
        image: str | None = None,
        live: bool | str = True,
        seccomp: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if seccomp not in (None, "default", "unconfined"):
            raise ValueError(f"seccomp={seccomp!r}: forkd knows default and unconfined")
        self._seccomp = seccomp
        self._socket = socket
        self._start_checkpoint = checkpoint
        self._image_override = image
        self._live = str(live).lower() not in ("0", "false", "no")
        self.client = AsyncClient(socket)
        self.sandbox_id: str | None = None
        super().__init__(
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            **kwargs,
        )

    @staticmethod
    def type() -> Any:
        return "forkd"

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
        )

    @staticmethod
    def _forkd_network(policy: NetworkPolicy) -> dict[str, Any]:
        """A Harbor network policy as forkd's network."""
        if policy.network_mode == NetworkMode.NO_NETWORK:
            return {"mode": "none"}
        if policy.network_mode == NetworkMode.PUBLIC:
            return {"mode": "egress"}
        return {"mode": "allowlist", "hosts": list(policy.allowed_hosts)}

    def _dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    def _image(self) -> str | None:
        """The image named outright (kwarg or docker_image); None means: build it."""
        return self._image_override or self.task_env_config.docker_image

    def _validate_definition(self) -> None:
        if self._start_checkpoint or self._image():
            return
        if not self._dockerfile().is_file():
            raise ValueError(
                f"forkd: task environment {self.environment_dir} has neither a docker_image nor "
                f"a Dockerfile ({self._dockerfile()}): set [environment] docker_image to a forkd "
                "image (or --ek image=NAME), add the Dockerfile, or start from a checkpoint "
                "(--ek checkpoint=ID)"
            )

    async def _resolve_image(self, key: str, force_build: bool) -> str:
        """The image to start the golden sandbox from, building it if need be."""
        named = self._image()
        if self._image_override:
            return self._image_override
        if named:
            try:
                await self.client.inspect_image(named)
                return named
            except ForkdError:
                pass
            try:
                self.logger.info(f"forkd: pulling {named}")
                await self.client.pull_image(named, name=named)
                return named
            except ForkdError as e:
                if not self._dockerfile().is_file():
                    raise ValueError(
                        f"forkd: image {named!r} (the task's docker_image) is not in forkd, "
                        f"pulling it failed ({e}), and {self._dockerfile()} does not exist"
                    ) from None
                self.logger.info(f"forkd: pulling {named} failed ({e}); building {self._dockerfile()}")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", self.environment_name).strip(".-") or "task"
        name = f"harbor/{slug[:80]}:{key[:12]}"
        self.logger.info(f"forkd: building {self._dockerfile()} as {name}")
        # Harbor's build_timeout_sec bounds the build; forkd bounds each RUN step by it.
        budget = getattr(self.task_env_config, "build_timeout_sec", None)
        step_timeout = max(1, math.ceil(budget)) if budget else None
        network = self._forkd_network(self._network_policy)["mode"] != "none"
        res = await self.client.build_image(str(self.environment_dir.resolve()), name, no_cache=force_build, step_timeout=step_timeout, network=network)
        ran = sum(1 for s in res.steps if s.cache == "miss")
        self.logger.info(f"forkd: built {name}: {ran} steps run, {len(res.steps) - ran} from cache or config")
        return name

    # --- start: one golden checkpoint per definition, trials as coalesced forks ----------

    def _key(self) -> str:
        hc = self.task_env_config.healthcheck
        definition = {
            "image": self._image_override or self.task_env_config.docker_image or "Dockerfile",
            "workdir": self.task_env_config.workdir,
            "env": self._startup_env(),
            "healthcheck": hc.model_dump(mode="json") if hc else None,
            "cpus": self._effective_cpus,
            "memory_mb": self._effective_memory_mb,
            "storage_mb": self._effective_storage_mb,
            "seccomp": self._seccomp,
            "live": self._live,
            "network": self._forkd_network(self._network_policy),
            "environment_dir": sorted(
                (str(p.relative_to(self.environment_dir)), hashlib.sha256(p.read_bytes()).hexdigest())
                for p in self.environment_dir.rglob("*")
                if p.is_file()
            )
            if self.environment_dir.is_dir()
            else [],
        }
        return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:32]

    async def _disk_bytes(self) -> Optional[int]:
        """The task's `storage_mb` as the sandbox's disk limit, where the daemon can hold
        one (btrfs simple quotas, Linux 6.7); said once where it cannot."""
        mb = self._effective_storage_mb
        if mb is None:
            return None
        health = await self.client.health()
        if not health.disk_limits.ok:
            self.logger.warning(f"forkd: storage_mb = {mb} is not enforced: {health.disk_limits.detail}")
            return None
        return int(mb) << 20

    def _limits(self) -> dict[str, Any]:
        limits: dict[str, Any] = {}
        if (mb := self._effective_memory_mb) is not None:
            limits["memory_bytes"] = int(mb) << 20
        if (cpus := self._effective_cpus) is not None:
            limits["cpu_millis"] = int(float(cpus) * 1000)
        return limits

    async def _golden_checkpoint(self, key: str, golden: _Golden, force_build: bool) -> str:
        async with golden.lock:
            if golden.checkpoint:
                return golden.checkpoint
            # A checkpoint an earlier run left for this definition, unless told to rebuild.
            for ck in [] if force_build else await self.client.list_checkpoints():
                if ck.labels.get(KEY_LABEL) == key:
                    self.logger.info(f"forkd: reusing checkpoint {ck.id} for {self.environment_name}")
                    golden.checkpoint = ck.id
                    return ck.id
            image = await self._resolve_image(key, force_build)
            info = await self.client.inspect_image(image)
            # Harbor's Docker backend replaces CMD with `sleep infinity` and keeps ENTRYPOINT.
            command = [*info.config.entrypoint, "sh", "-c", "sleep infinity"] if info.config.entrypoint else None
            self.logger.info(f"forkd: starting the golden sandbox of {self.environment_name} ({image})")
            sb = await self.client.create(
                image,
                command=command,
                labels={KEY_LABEL: key, "forkd.harbor": "golden"},
                network=self._forkd_network(self._network_policy),
                disk_bytes=await self._disk_bytes(),
                seccomp=self._seccomp,
                **self._limits(),
            )
            self.sandbox_id = sb.id
            try:
                workdir = self.task_env_config.workdir
                if workdir:
                    await self.client.exec(sb.id, ["mkdir", "-p", workdir], timeout=60)
                await self.ensure_dirs(self._mount_targets(writable_only=True))
                await self._upload_environment_dir_after_start()
                await self.run_healthcheck()
                ck = await self.client.checkpoint(sb.id, live=self._live, labels={KEY_LABEL: key, "forkd.harbor.task": self.environment_name})
            finally:
                self.sandbox_id = None
                await self.client.remove(sb.id, force=True)
            golden.checkpoint = ck.id
            self.logger.info(f"forkd: checkpoint {ck.id} of {self.environment_name}")
            return ck.id

    async def _fork_coalesced(self, golden: _Golden, checkpoint: str) -> str:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        golden.waiting.append(fut)
        if golden.flusher is None:
            golden.flusher = asyncio.create_task(self._flush(golden, checkpoint))
        return await fut

    async def _flush(self, golden: _Golden, checkpoint: str) -> None:
        await asyncio.sleep(COALESCE_SEC)
        batch, golden.waiting, golden.flusher = golden.waiting, [], None
        try:
            res = await self.client.fork(
                checkpoint, len(batch), labels={"forkd.harbor": "trial"}, network=self._forkd_network(self._network_policy)
            )
        except Exception as e:  # noqa: BLE001 - handed to every waiter
            for f in batch:
                f.set_exception(e)
            return
        for i, f in enumerate(batch):
            if i < len(res.branches):
                f.set_result(res.branches[i].id)
            else:
                f.set_exception(RuntimeError(f"forkd: fork of {checkpoint} gave {len(res.branches)} of {len(batch)} branches"))

    async def start(self, force_build: bool) -> None:
        if self._start_checkpoint:
            key = f"checkpoint:{self._start_checkpoint}"
            golden = self._goldens.setdefault(key, _Golden())
            golden.checkpoint = self._start_checkpoint
            checkpoint = self._start_checkpoint
        else:
            key = self._key()
            golden = self._goldens.setdefault(key, _Golden())
            checkpoint = await self._golden_checkpoint(key, golden, force_build)
        self.sandbox_id = await self._fork_coalesced(golden, checkpoint)
        self.logger.debug(f"forkd: trial {self.session_id} on branch {self.sandbox_id} of {checkpoint}")
        # Harbor's output directories are the trial's own: empty them in the branch.
        await self.ensure_dirs(self._mount_targets(writable_only=True))

    async def stop(self, delete: bool) -> None:
        if self.sandbox_id:
            try:
                await self.client.remove(self.sandbox_id, force=True)
            except ForkdError as e:
                self.logger.warning(f"forkd: remove {self.sandbox_id}: {e}")
            self.sandbox_id = None

    # --- commands and files ----------------------------------------------------------

    def _id(self) -> str:
        if not self.sandbox_id:
            raise RuntimeError("forkd: the environment is not started")
        return self.sandbox_id

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        env = self._merge_env(env)
        r = await self.client.exec(
            self._id(),
            ["bash", "-c", command],
            env=env or None,
            cwd=cwd or self.task_env_config.workdir or None,
            user=None if user is None else str(user),
            timeout=timeout_sec or None,
        )
        stderr = r.stderr.decode("utf-8", errors="replace")
        code = r.exit_code
        if r.timed_out:
            stderr += f"\n[forkd: timed out after {timeout_sec} s; the command's process tree was killed]\n"
            code = 124
        return ExecResult(stdout=r.stdout.decode("utf-8", errors="replace"), stderr=stderr, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.client.upload_file(self._id(), source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.client.upload_dir(self._id(), source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self.client.download_file(self._id(), source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self.client.download_dir(self._id(), source_dir, target_dir)
