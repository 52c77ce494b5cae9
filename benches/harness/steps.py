"""Harness benchmark, the Python half (run by `cargo bench --bench harness`).

Measures, in one run, side by side:
1. an exec round trip (`true`) through the forkd Python client, through `podman exec`
   (the Docker-less choice a user has here), and mini-swe-agent's LocalEnvironment on the
   host (the floor: no isolation at all);
2. the same through each harness environment's `execute` (its interpreter included):
   forkd.minisweagent.ForkdEnvironment, mini-swe-agent's DockerEnvironment with
   `executable=podman`, and LocalEnvironment;
3. one mini-swe-agent step (DefaultAgent, the model's answer already known:
   DeterministicModel) on each of those environments.

    python steps.py --socket S --image debian --podman-image IMG --out DIR [--n N]

Writes DIR/harness-python.json: per row its samples and p50/p90/p99/mean, microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.docker import DockerEnvironment  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

import forkd  # noqa: E402
from forkd.minisweagent import ForkdEnvironment  # noqa: E402

PODMAN_FLAGS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--network", "none"]
STEP_COMMAND = "ls -la /usr/bin | wc -l"


def summary(samples: list[float]) -> dict:
    us = sorted(int(s * 1e6) for s in samples)

    def pct(p: float) -> int:
        return us[min(len(us) - 1, int(round(p / 100 * (len(us) - 1))))]

    return {"n": len(us), "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99),
            "mean_us": int(statistics.fmean(us)), "min_us": us[0], "max_us": us[-1], "samples_us": us}


def timed(fn: Callable[[], object], n: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return summary(samples)


def agent_steps(env: object, n: int) -> dict:
    """Times DefaultAgent.step() n times (after 2 warm-up steps), the model's answers known."""
    outputs = [make_output(f"step {i}", [{"command": STEP_COMMAND}], cost=0.0) for i in range(n + 2)]
    agent = DefaultAgent(
        DeterministicModel(outputs=outputs),
        env,  # type: ignore[arg-type]
        system_template="bench",
        instance_template="{{task}}",
        step_limit=0,
        cost_limit=0,
    )
    agent.add_messages({"role": "system", "content": "bench"}, {"role": "user", "content": "bench"})
    samples = []
    for i in range(n + 2):
        t = time.perf_counter()
        agent.step()
        if i >= 2:
            samples.append(time.perf_counter() - t)
    last = agent.messages[-1]["content"]
    assert "returncode>0<" in last.replace("</", "<"), last
    return summary(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("--podman-image", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--n-podman", type=int, default=40)
    a = ap.parse_args()
    report: dict = {"python": sys.version.split()[0], "n": a.n, "n_podman": a.n_podman, "step_command": STEP_COMMAND}
    c = forkd.Client(a.socket)
    sb = c.create(a.image, labels={"bench": "harness"})
    print(f"[harness] forkd sandbox {sb.id}", file=sys.stderr)
    try:
        report["exec_forkd_client"] = timed(lambda: c.exec(sb.id, ["true"]), a.n, 20)
        report["exec_forkd_client_merged"] = timed(lambda: c.exec(sb.id, ["true"], merge_stderr=True), a.n, 20)
        fenv = ForkdEnvironment(socket=a.socket, sandbox=sb.id, cwd="/")
        report["execute_forkd"] = timed(lambda: fenv.execute({"command": "true"}), a.n, 20)
        print("[harness] forkd steps", file=sys.stderr)
        report["step_forkd"] = agent_steps(fenv, a.n // 3)
    finally:
        c.remove(sb.id, force=True)
    local = LocalEnvironment(cwd="/")
    report["execute_local"] = timed(lambda: local.execute({"command": "true"}), a.n, 20)
    report["exec_local_true"] = timed(lambda: subprocess.run(["true"], check=True), a.n, 20)
    report["step_local"] = agent_steps(local, a.n // 3)
    if a.podman_image:
        print("[harness] podman peers", file=sys.stderr)
        denv = DockerEnvironment(
            image=a.podman_image, executable="podman", cwd="/", run_args=["--rm", *PODMAN_FLAGS],
            interpreter=["bash", "-lc"],
        )
        try:
            cid = denv.container_id
            report["exec_podman"] = timed(
                lambda: subprocess.run(["podman", "exec", cid, "true"], check=True), a.n_podman, 3
            )
            report["execute_podman"] = timed(lambda: denv.execute({"command": "true"}), a.n_podman, 3)
            report["step_podman"] = agent_steps(denv, a.n_podman)
        finally:
            subprocess.run(["podman", "rm", "-f", "-t", "0", denv.container_id], capture_output=True)
            denv.container_id = None
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "harness-python.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(f"[harness] wrote {os.path.join(a.out, 'harness-python.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
