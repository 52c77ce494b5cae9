"""A Harbor agent for the benchmark: runs one command (`true`) and records, in its logs
directory, the wall-clock time at which that first command returned. With
`FORKD_BENCH_T0` (the epoch seconds `harbor run` was started at), the report is the
time from `harbor run` to each trial's first agent command."""

from __future__ import annotations

import json
import time

from harbor.agents.base import BaseAgent
from harbor.agents.capabilities import AgentCapabilities
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class FirstCommandAgent(BaseAgent):
    capabilities = AgentCapabilities(windows=False)

    @staticmethod
    def name() -> str:
        return "first-command"

    def version(self) -> str:
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        started = time.time()
        result = await environment.exec("true")
        done = time.time()
        (self.logs_dir / "first_command.json").write_text(
            json.dumps({"started": started, "returned": done, "return_code": result.return_code})
        )
