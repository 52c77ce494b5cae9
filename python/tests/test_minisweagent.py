"""forkd.minisweagent.ForkdEnvironment with the real mini-swe-agent 2.4.6: its
DefaultAgent driven by its own DeterministicModel (the one stand-in: the model), on
real sandboxes started from an image or forked from a checkpoint."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
minisweagent = pytest.importorskip("minisweagent") if os.environ.get("CI") != "true" else __import__("minisweagent")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments import get_environment  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

import forkd  # noqa: E402
from forkd.minisweagent import ForkdEnvironment  # noqa: E402

AGENT = {"system_template": "You act.", "instance_template": "Task: {{task}}", "step_limit": 10, "cost_limit": 0}


def env_of(socket_path: str, **kw: object) -> ForkdEnvironment:
    return ForkdEnvironment(socket=socket_path, interpreter=["sh", "-c"], **kw)


def test_agent_runs_and_submits_from_an_image(socket_path: str, client: forkd.Client) -> None:
    env = get_environment(
        {"environment_class": "forkd.minisweagent.ForkdEnvironment", "image": "busybox", "socket": socket_path,
         "interpreter": ["sh", "-c"], "cwd": "/root", "env": {"GREETING": "hello"}}
    )
    assert isinstance(env, ForkdEnvironment)
    sandbox = env.sandbox_id
    model = DeterministicModel(
        outputs=[
            make_output("write", [{"command": 'echo "$GREETING" > note.txt; cat note.txt; echo warn >&2'}]),
            make_output("submit", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat note.txt"}]),
        ]
    )
    agent = DefaultAgent(model, env, **AGENT)
    info = agent.run("write a note")
    assert info["exit_status"] == "Submitted" and info["submission"] == "hello\n"
    observation = agent.messages[3]["content"]
    assert "hello\nwarn\n" in observation and "<returncode>0</returncode>" in observation
    # Every command went through the daemon: its trajectory holds both.
    assert [r.argv[-1][:4] for r in client.execs(sandbox)] == ['echo', 'echo']
    assert client.read_file(sandbox, "/root/note.txt") == b"hello\n"
    trajectory = agent.serialize()
    assert trajectory["info"]["forkd"]["sandbox"] == sandbox
    assert trajectory["info"]["config"]["environment_type"] == "forkd.minisweagent.ForkdEnvironment"
    env.cleanup()
    with pytest.raises(forkd.NotFound):
        client.inspect(sandbox)


def test_submission_rules_match_the_docker_environment(socket_path: str) -> None:
    env = env_of(socket_path, image="busybox")
    try:
        out = env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1"})
        assert out["returncode"] == 1  # a failing command does not submit
        out = env.execute({"command": "echo first; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
        assert out["returncode"] == 0  # the marker must be the first line
        with pytest.raises(Submitted) as e:
            env.execute({"command": "echo; echo '  COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT'; echo rest"})
        assert e.value.messages[0]["extra"] == {"exit_status": "Submitted", "submission": "rest\n"}
        out = env.execute({"command": "echo out; echo err >&2; echo out2"})
        assert out == {"output": "out\nerr\nout2\n", "returncode": 0, "exception_info": ""}
        out = env.execute({"command": "pwd"}, cwd="/tmp")
        assert out["output"] == "/tmp\n"
    finally:
        env.cleanup()


def test_timeouts_and_commands_that_cannot_start(socket_path: str, client: forkd.Client) -> None:
    env = env_of(socket_path, image="busybox", timeout=1)
    try:
        out = env.execute({"command": "echo before; sleep 60 & sleep 60"})
        assert out["returncode"] == -1 and "timed out after 1 seconds" in out["exception_info"]
        assert out["output"] == "before\n" and out["extra"]["exception_type"] == "TimeoutExpired"
        procs = client.exec(env.sandbox_id, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
        assert b"sleep 60" not in procs
        out = env.execute({"command": "sleep 2; echo late"}, timeout=5)
        assert out["output"] == "late\n"
        bash = ForkdEnvironment(socket=socket_path, sandbox=env.sandbox_id)  # bash -lc: busybox has no bash
        out = bash.execute({"command": "true"})
        assert out["returncode"] == -1 and "bash" in out["exception_info"]
        bash.cleanup()
        assert client.inspect(env.sandbox_id).running  # a given sandbox is never removed
    finally:
        env.cleanup()


def test_every_run_from_a_checkpoint_starts_identical(socket_path: str, client: forkd.Client) -> None:
    with client.sandbox("busybox") as sb:
        client.write_file(sb.id, "/work/state", b"base\n")
        client.exec_detached(sb.id, "while :; do sleep 0.05; done", log="svc")
        ck = client.checkpoint(sb.id, live=True)
    envs = [env_of(socket_path, checkpoint=ck.id, cwd="/work") for _ in range(2)]
    try:
        assert envs[0].sandbox_id != envs[1].sandbox_id
        envs[0].execute({"command": "echo changed > state"})
        assert envs[1].execute({"command": "cat state"})["output"] == "base\n"
        for e in envs:
            # The checkpoint's live process runs in each fork.
            out = e.execute({"command": "for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c; echo; done"})
            assert "while :; do sleep 0.05; done" in out["output"]
    finally:
        for e in envs:
            e.cleanup()
        client.remove_checkpoint(ck.id, force=True)


def test_bad_configuration_is_refused(socket_path: str) -> None:
    with pytest.raises(ValueError, match="exactly one of image, checkpoint and sandbox"):
        ForkdEnvironment(socket=socket_path, image="busybox", checkpoint="abcd")
    with pytest.raises(ValueError, match="exactly one"):
        ForkdEnvironment(socket=socket_path)
    with pytest.raises(forkd.NotFound):
        ForkdEnvironment(socket=socket_path, checkpoint="0123456789abcdef")
