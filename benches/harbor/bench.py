"""Harbor benchmark, the Python half (run by `cargo bench --bench harbor`).

For 8 concurrent trials of one task (`-k 8 -n 8`), with the first-command agent
(benches/harbor/first_command.py), measures per trial:
- `to_first_command`: from the start of `harbor run` to the trial's first agent command
  returning (what a user waits for);
- `environment_setup`: Harbor's own record of the trial's environment start-up.
Runs forkd's backend cold (no image or checkpoint of the definition yet: the Dockerfile
is built, the golden sandbox started and checkpointed in the run) and warm (the
checkpoint is reused), then Harbor's podman backend on a copy of the task whose
Dockerfile starts FROM the podman copy of the same image, when it can run here.

    python bench.py --task DIR --podman-image IMG --out DIR
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def iso(s: str) -> float:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def run(env_args: list[str], task: Path, jobs: Path, extra_env: dict[str, str]) -> dict:
    harbor = Path(sys.executable).parent / "harbor"
    env = os.environ | extra_env | {"PYTHONPATH": f"{HERE}:{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.time()
    out = subprocess.run(
        [str(harbor), "run", *env_args, "--agent", "first_command:FirstCommandAgent", "-p", str(task),
         "-o", str(jobs), "-k", "8", "-n", "8"],
        env=env, capture_output=True, text=True,
    )
    wall = time.time() - t0
    firsts, setups, errors = [], [], []
    for trial in sorted(jobs.glob("*/*/result.json")):
        r = json.loads(trial.read_text())
        fc = trial.parent / "agent" / "first_command.json"
        if fc.is_file():
            firsts.append(json.loads(fc.read_text())["returned"] - t0)
        es = r.get("environment_setup") or {}
        if es.get("started_at") and es.get("finished_at"):
            setups.append(iso(es["finished_at"]) - iso(es["started_at"]))
        if r.get("exception_info"):
            errors.append(str(r["exception_info"].get("exception_message", ""))[:300])
    return {
        "exit": out.returncode, "wall_s": wall, "to_first_command_s": sorted(firsts),
        "environment_setup_s": sorted(setups), "errors": errors,
        "log_tail": (out.stdout + out.stderr)[-1500:] if out.returncode or errors or len(firsts) < 8 else "",
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", required=True, type=Path)
    ap.add_argument("--podman-image", default="")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--scratch", required=True, type=Path)
    a = ap.parse_args()
    report: dict = {}
    forkd_env = ["--env", "forkd.harbor:ForkdEnvironment"]
    print("[harbor bench] forkd, cold", file=sys.stderr)
    report["forkd_cold"] = run(forkd_env, a.task, a.scratch / "forkd-cold", {})
    print("[harbor bench] forkd, warm", file=sys.stderr)
    report["forkd_warm"] = run(forkd_env, a.task, a.scratch / "forkd-warm", {})
    if a.podman_image:
        # The same task on the podman image. Harbor's podman backend refuses
        # network_mode 'no-network', so the copy allows the (absent) internet.
        task = a.scratch / "podman-task" / a.task.name
        shutil.copytree(a.task, task)
        toml = (task / "task.toml").read_text()
        toml = toml.replace('docker_image = "debian"', f'docker_image = "{a.podman_image}"')
        # The same Dockerfile, FROM the podman copy of the Debian fixture (podman has no
        # image called plain "debian", and no network to look for one).
        dockerfile = task / "environment" / "Dockerfile"
        if dockerfile.is_file():
            text = dockerfile.read_text()
            dockerfile.write_text(text.replace("FROM debian", f"FROM {a.podman_image}"))
        toml = toml.replace("allow_internet = false", "allow_internet = true")
        (task / "task.toml").write_text(toml)
        # This machine lacks CAP_SYS_RESOURCE: containers need rlimits within the hard ones.
        conf = a.scratch / "containers.conf"
        base = Path("/usr/share/containers/containers.conf")
        text = base.read_text() if base.is_file() else ""
        conf.write_text(text + '\n[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]\n'
                        if "[containers]" not in text else
                        text.replace("[containers]", '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]', 1))
        print("[harbor bench] podman", file=sys.stderr)
        # podman-compose (in this environment's bin/) is the compose frontend it needs.
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
        report["podman"] = run(["--env", "podman"], task, a.scratch / "podman",
                               {"CONTAINERS_CONF": str(conf), "PATH": path})
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "harbor-python.json").write_text(json.dumps(report, indent=2))
    print(f"[harbor bench] wrote {a.out / 'harbor-python.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
