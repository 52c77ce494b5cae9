"""The evaluator's driver for mini-swe-agent: one agent run in one trial's sandbox.

`forkd eval` runs `python -m forkd.minisweagent.evalrun BRIEF.json` with the Python that
has mini-swe-agent installed (`FORKD_PYTHON`). The brief says where (socket, sandbox,
workdir), what (the condition's full text: the request, with a notice or handoff note
when the condition has one), with which harness configuration (mini-swe-agent config
specs, merged in order as its own `-c` does, and an optional model name), under which
budgets (steps, wall clock), and where to write (the trajectory, the result).

mini-swe-agent runs as it is: its `DefaultAgent` (or the config's `agent_class`), the
model from its own `get_model` (any LiteLLM model string; base URL and key from the
environment, as LiteLLM reads them), and `ForkdEnvironment` on the trial's sandbox in
place of the config's environment class (the config's `env`, `timeout`, `interpreter`
and `forward_env` are kept; `cwd` is the task's workdir).

The result (JSON) is what the evaluator reads:
- `status`: `submitted` (the agent submitted), `budget` (its step or time limit ended
  it), `stopped` (it ended otherwise without submitting: repeated format errors), or
  `infra` (the harness or the model endpoint failed: connection refused, HTTP 5xx,
  timeouts, any exception out of the harness; the evaluator retries the trial from the
  identical state and never counts it against the agent);
- `exit_status`, `steps` (model calls), `submission`, `cost`, `error`.
With `--check`, only the configuration and the model are loaded (no request is made),
so that `forkd eval run` refuses a broken configuration before any trial starts.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

EXIT_SUBMITTED, EXIT_NOT_SUBMITTED, EXIT_INFRA, EXIT_BAD_CONFIG = 0, 1, 75, 78

DEFAULT_CONFIG = "mini.yaml"


def _quiet_harness() -> None:
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    # LiteLLM otherwise fetches its model cost map from the network at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # Cost tables rarely know self-served models; forkd's budgets are steps and time.
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    # One retry inside the harness; past it the trial is retried from its start state.
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")


def build(brief: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """The model and the merged config (agent, model, environment) of the brief."""
    from minisweagent.config import get_config_from_spec
    from minisweagent.models import get_model
    from minisweagent.utils.serialize import recursive_merge

    specs = brief.get("configs") or [DEFAULT_CONFIG]
    config = recursive_merge(*[get_config_from_spec(s) for s in specs])
    model_config = dict(config.get("model", {}))
    if brief.get("model"):
        model_config["model_name"] = brief["model"]
    model = get_model(config=model_config)
    return model, config.get("model", {}), config


def _result(path: str, **fields: Any) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(fields, indent=2))
    tmp.replace(path)


def run(brief: dict[str, Any]) -> int:
    from minisweagent.agents import get_agent

    from . import ForkdEnvironment

    model, _, config = build(brief)
    env_config = dict(config.get("environment", {}))
    env_config.pop("environment_class", None)
    keep = {k: env_config[k] for k in ("env", "timeout", "interpreter", "forward_env") if k in env_config}
    env = ForkdEnvironment(socket=brief["socket"], sandbox=brief["sandbox"], cwd=brief["workdir"], **keep)
    agent_config = dict(config.get("agent", {}))
    agent_config.pop("mode", None)  # interactive-only settings of mini.yaml
    agent_config.pop("confirm_exit", None)
    agent_config["step_limit"] = int(brief["step_limit"])
    if brief.get("wall_time_limit_seconds"):
        agent_config["wall_time_limit_seconds"] = int(brief["wall_time_limit_seconds"])
    agent_config["output_path"] = Path(brief["trajectory"])
    agent_class = agent_config.get("agent_class", "default")
    agent_config["agent_class"] = agent_class
    agent = get_agent(model, env, agent_config, default_type="default")
    try:
        info = agent.run(brief["task"])
    except Exception as e:  # noqa: BLE001 - every harness or endpoint failure is infrastructure
        _result(
            brief["result"],
            status="infra",
            exit_status=type(e).__name__,
            steps=agent.n_calls,
            submission="",
            cost=agent.cost,
            error=f"{type(e).__name__}: {e}",
            traceback=traceback.format_exc(),
        )
        return EXIT_INFRA
    exit_status = info.get("exit_status", "")
    if exit_status == "Submitted":
        status = "submitted"
    elif exit_status in ("LimitsExceeded", "TimeExceeded"):
        status = "budget"
    else:
        status = "stopped"
    _result(
        brief["result"],
        status=status,
        exit_status=exit_status,
        steps=agent.n_calls,
        submission=info.get("submission", ""),
        cost=agent.cost,
        error="",
    )
    return EXIT_SUBMITTED if status == "submitted" else EXIT_NOT_SUBMITTED


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if len(args) != 1:
        print("usage: python -m forkd.minisweagent.evalrun [--check] BRIEF.json", file=sys.stderr)
        return 2
    _quiet_harness()
    brief = json.loads(Path(args[0]).read_text())
    if check:
        try:
            model, _, config = build(brief)
        except Exception as e:  # noqa: BLE001 - reported to the evaluator by name
            print(f"mini-swe-agent configuration {brief.get('configs')}: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        print(json.dumps({"model": getattr(model.config, "model_name", ""), "model_class": type(model).__name__}))
        return 0
    return run(brief)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
