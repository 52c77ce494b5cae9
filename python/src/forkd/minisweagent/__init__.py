"""A mini-swe-agent environment on a forkd sandbox.

Select it the way mini-swe-agent selects any environment:

    mini -c swebench.yaml --environment-class forkd.minisweagent.ForkdEnvironment ...

or in a config file:

    environment:
      environment_class: forkd.minisweagent.ForkdEnvironment
      checkpoint: 3f9c0d2e11aa4b57     # or image: debian, or sandbox: <a running one>
      cwd: /testbed

It implements mini-swe-agent 2.4.6's environment protocol as its docker environment
does: `execute(action, cwd="", *, timeout=None)` runs `action["command"]` through the
configured interpreter with standard error merged into standard output in the order
written, and returns `{"output", "returncode", "exception_info"}`; a timeout kills the
command's whole process tree and comes back as `returncode` -1 with the output so far;
`Submitted` is raised when the first line of the output is
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` and the command exited 0.

Where it starts: a fork of `checkpoint` (so every run of a task starts from the
identical state, live processes included), a new sandbox of `image`, or an existing
`sandbox` (the evaluator's trials). A sandbox it made is removed by `cleanup()`.
"""

from __future__ import annotations

import logging
import os
import platform
import shlex
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from ..client import Client
from ..errors import BadRequest

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class ForkdEnvironmentConfig(BaseModel):
    """Where the environment's sandbox comes from, and how commands run in it. Exactly
    one of `image`, `checkpoint` and `sandbox` must be given."""

    image: str = ""
    """Start a new sandbox of this forkd image."""
    checkpoint: str = ""
    """Start from a fork of this checkpoint (files, and live processes when it has them)."""
    sandbox: str = ""
    """Use this running sandbox as it is; it is left in place at cleanup."""
    socket: str = ""
    """The daemon's socket (default `FORKD_SOCKET`, else /run/forkd/forkd.sock)."""
    cwd: str = "/"
    """Working directory in which to execute commands."""
    env: dict[str, str] = {}
    """Environment variables to set for every command."""
    forward_env: list[str] = []
    """Host environment variables passed on to every command when set (`env` wins)."""
    timeout: int = 30
    """Seconds a command may run; then its whole process tree is killed."""
    interpreter: list[str] = ["bash", "-lc"]
    """The command is appended to this argv (use `["sh", "-c"]` for images without bash)."""
    output_limit: int = 16 << 20
    """Bytes of output kept per command; past it output is dropped (the command runs on)."""
    memory_bytes: int | None = None
    """Memory limit of a sandbox this environment creates."""
    pids: int | None = None
    """Process limit of a sandbox this environment creates."""
    labels: dict[str, str] = {}
    """Labels of a sandbox this environment creates."""


class ForkdEnvironment:
    """mini-swe-agent's Environment protocol on a forkd sandbox. See the module doc."""

    def __init__(
        self,
        *,
        config_class: type = ForkdEnvironmentConfig,
        logger: logging.Logger | None = None,
        **kwargs: Any,
    ) -> None:
        self.sandbox_id: str = ""
        self._owned = False
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config = config_class(**kwargs)
        self.client = Client(self.config.socket or None)
        self._start()

    def _start(self) -> None:
        c = self.config
        given = [k for k in ("image", "checkpoint", "sandbox") if getattr(c, k)]
        if len(given) != 1:
            raise ValueError(
                "ForkdEnvironment needs exactly one of image, checkpoint and sandbox"
                + (f" (got {', '.join(given)})" if given else "")
            )
        labels = {"forkd.harness": "mini-swe-agent", **c.labels}
        if c.sandbox:
            info = self.client.inspect(c.sandbox)
            self.sandbox_id = info.id
        elif c.checkpoint:
            res = self.client.fork(c.checkpoint, 1, labels=labels)
            self.sandbox_id = res.branches[0].id
            self._owned = True
        else:
            info = self.client.create(c.image, memory_bytes=c.memory_bytes, pids=c.pids, labels=labels)
            self.sandbox_id = info.id
            self._owned = True
        self.logger.info(f"forkd sandbox {self.sandbox_id} ({given[0]} {getattr(c, given[0])})")

    def _env(self) -> dict[str, str]:
        env = {k: v for k in self.config.forward_env if (v := os.getenv(k)) is not None}
        env.update(self.config.env)
        return env

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Runs `action["command"]` in the sandbox; see the module doc for the result."""
        command = action.get("command", "")
        cwd = cwd or self.config.cwd
        limit = timeout or self.config.timeout
        argv = [*self.config.interpreter, command]
        try:
            r = self.client.exec(
                self.sandbox_id,
                argv,
                env=self._env(),
                cwd=cwd,
                timeout=limit,
                merge_stderr=True,
                output_limit=self.config.output_limit,
            )
        except BadRequest as e:
            # The command could not start (no such interpreter, no such cwd): the
            # agent's concern, reported as a failed command. Anything else (the daemon
            # unreachable, the sandbox gone) is infrastructure and propagates.
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e.message}",
                "extra": {"exception_type": type(e).__name__, "exception": e.message},
            }
            self._check_finished(output)
            return output
        text = r.text
        if r.truncated:
            text += f"\n[forkd: output cut at {self.config.output_limit} of {r.output_bytes} bytes]\n"
        if r.timed_out:
            message = f"Command '{shlex.join(argv)}' timed out after {limit} seconds"
            output = {
                "output": text,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {message}",
                "extra": {"exception_type": "TimeoutExpired", "exception": message},
            }
        else:
            output = {"output": text, "returncode": r.exit_code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        """Raises Submitted if the output says the task is complete (and it exited 0)."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                },
                "forkd": {"sandbox": self.sandbox_id, "socket": self.client.socket},
            }
        }

    def cleanup(self) -> None:
        """Removes the sandbox this environment made (never one it was given)."""
        if getattr(self, "_owned", False) and self.sandbox_id:
            try:
                self.client.remove(self.sandbox_id, force=True)
            except Exception as e:  # noqa: BLE001 - cleanup must not raise from __del__
                self.logger.warning(f"forkd: remove sandbox {self.sandbox_id}: {e}")
            self._owned = False

    def __del__(self) -> None:
        self.cleanup()
