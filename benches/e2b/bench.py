"""Times E2B's SDK against forkd's own Python client, on one daemon, in one run.

Rows (client-side wall time, seconds):
- lifecycle: create a sandbox of the `e2b-base` image -> its first command (`true`) ->
  kill, through E2B's SDK (`Sandbox.create`, `commands.run`, `kill`) and through forkd's
  own Python client (`create`, `exec`, `remove`), both over loopback TCP with one key;
  twice: without a network (loopback only: E2B's `allow_internet_access=False`, forkd's
  default) and with egress (E2B's default, forkd's `network="egress"`);
- fork: `fork(count=N)` of a running sandbox through the SDK (a live checkpoint and a
  fork of N, forks' handles ready), and forkd's own `checkpoint(live=True)` + `fork(N)`.

Writes a JSON document to --out.
"""

import argparse
import json
import os
import sys
import time

from e2b import Sandbox

import forkd


def timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--fork-count", type=int, default=16)
    ap.add_argument("--fork-samples", type=int, default=5)
    a = ap.parse_args()
    native = forkd.Client()
    res = {"sdk_fork": [], "native_fork": []}

    # Warm both paths once (imports, the first base snapshot, pooled connections).
    Sandbox.create(template="base").kill()
    native.remove(native.create("e2b-base").id, force=True)

    for net in ["none", "egress"]:
        res[f"sdk_lifecycle_{net}"] = []
        res[f"native_lifecycle_{net}"] = []
        for _ in range(a.samples):
            def sdk():
                sb = Sandbox.create(template="base", allow_internet_access=(net == "egress"))
                sb.commands.run("true")
                sb.kill()

            def own():
                sb = native.create("e2b-base", network=None if net == "none" else net)
                native.exec(sb.id, ["true"])
                native.remove(sb.id, force=True)

            res[f"sdk_lifecycle_{net}"].append(timed(sdk)[0])
            res[f"native_lifecycle_{net}"].append(timed(own)[0])

    src = Sandbox.create(template="base", timeout=3600, allow_internet_access=False)
    src.commands.run("sleep 3600", background=True)
    own_src = native.create("e2b-base")
    native.exec_detached(own_src.id, ["sleep", "3600"], log="sleeper")
    for _ in range(a.fork_samples):
        dt, forks = timed(lambda: src.fork(count=a.fork_count))
        bad = [f for f in forks if not isinstance(f, Sandbox)]
        if bad:
            raise SystemExit(f"SDK fork failed: {bad[0]}")
        res["sdk_fork"].append(dt)
        for f in forks:
            f.kill()

        def own_fork():
            c = native.checkpoint(own_src.id, live=True)
            r = native.fork(c.id, a.fork_count)
            return c, r

        dt, (c, r) = timed(own_fork)
        res["native_fork"].append(dt)
        for b in r.branches:
            native.remove(b.id, force=True)
        native.remove_checkpoint(c.id, force=True)
    src.kill()
    native.remove(own_src.id, force=True)
    res["samples"] = a.samples
    res["fork_count"] = a.fork_count
    res["fork_samples"] = a.fork_samples
    with open(a.out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    sys.exit(main())
