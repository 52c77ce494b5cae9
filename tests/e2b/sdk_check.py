"""Drives a forkd daemon through E2B's own Python SDK, as a tool built on it would.

Run by tests/e2b.rs with the SDK of one pinned venv, E2B_API_URL and E2B_SANDBOX_URL set
to the daemon's TCP listener, E2B_API_KEY to a key of scope own and FORKD_OTHER_KEY to
another key. Every check asserts; the last line printed is `ok <sdk version>`.
"""

import asyncio
import os
import time

import e2b
from e2b import (
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    SandboxState,
)

def sdk_version():
    from importlib.metadata import version

    return version("e2b")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("pass:", what, flush=True)


def commands(sb):
    c = sb.commands
    r = c.run("id -un; pwd; echo $SBVAR; echo err >&2")
    check(r.stdout == "user\n/home/user\nfromsandbox\n", f"default user, home and sandbox envs: {r.stdout!r}")
    check(r.stderr == "err\n" and r.exit_code == 0, f"stderr and exit code: {r.stderr!r} {r.exit_code}")
    r = c.run("echo $A; pwd; id -u", envs={"A": "x y"}, cwd="/tmp", user="root")
    check(r.stdout == "x y\n/tmp\n0\n", f"envs, cwd and user root: {r.stdout!r}")
    r = c.run("sudo -n id -u")
    check(r.stdout == "0\n", f"user has sudo: {r.stdout!r}")
    try:
        c.run("echo partial; exit 3")
        check(False, "a failing command raises")
    except CommandExitException as e:
        check(e.exit_code == 3 and e.stdout == "partial\n", f"exit 3 raises with its output: {e.exit_code}")
    h = c.run("sleep 0.3; echo bg", background=True)
    check(h.pid > 0, f"a background command has a pid: {h.pid}")
    check(h.wait().stdout == "bg\n", "a background command is waited for")
    h = c.run("read x; echo got:$x", background=True, stdin=True)
    c.send_stdin(h.pid, "hello\n")
    check(h.wait().stdout == "got:hello\n", "stdin reaches a command")
    if hasattr(c, "close_stdin"):
        h = c.run("wc -c", background=True, stdin=True)
        c.send_stdin(h.pid, "abcd")
        c.close_stdin(h.pid)
        check(h.wait().stdout.strip() == "4", "closing stdin ends its input")
    h = c.run("sleep 300", background=True)
    check(h.pid in [p.pid for p in c.list()], "list shows a running command")
    check(h.kill() is True, "kill answers True for a running command")
    try:
        h.wait()
        check(False, "a killed command raises on wait")
    except CommandExitException as e:
        check(e.exit_code == -1, f"a killed command's exit code is -1: {e.exit_code}")
    check(c.kill(h.pid) is False, "kill answers False for a command that is gone")
    t = time.monotonic()
    try:
        c.run("sleep 30", timeout=1)
        check(False, "a command past its timeout raises")
    except Exception as e:  # 2.25 raises httpx's read timeout, later versions TimeoutException
        check(time.monotonic() - t < 10, f"a timeout ends the command early ({type(e).__name__})")
    left = c.run("ps -eo args | grep -c '^sleep 30' || true").stdout.strip()
    check(left == "0", f"the timed-out command was killed ({left} left)")
    h = c.run("for i in 1 2 3 4 5; do echo tick$i; sleep 0.3; done", background=True)
    time.sleep(0.5)
    h2 = c.connect(h.pid)
    out = h2.wait().stdout
    check("tick5" in out, f"connect follows a running command: {out!r}")


def files(sb):
    f = sb.files
    f.write("notes/a.txt", "some text")
    check(f.read("notes/a.txt") == "some text", "a relative path is in the user's home")
    info = f.get_info("/home/user/notes/a.txt")
    check(info.owner == "user", f"a file written is the user's: {info.owner}")
    data = bytes(range(256)) * 64
    f.write("/tmp/bin.dat", data)
    check(f.read("/tmp/bin.dat", format="bytes") == data, "binary content round-trips")
    big = os.urandom(24 << 20)
    f.write("/tmp/big.dat", big)
    check(f.read("/tmp/big.dat", format="bytes") == big, "a 24 MiB file round-trips")
    check(f.exists("/tmp/big.dat") and not f.exists("/tmp/none"), "exists")
    check(f.make_dir("/tmp/d/e") is True and f.make_dir("/tmp/d/e") is False, "make_dir, twice")
    f.rename("/tmp/bin.dat", "/tmp/d/moved.dat")
    names = sorted(e.name for e in f.list("/tmp/d", depth=2))
    check(names == ["e", "moved.dat"], f"list with depth: {names}")
    f.remove("/tmp/d")
    check(not f.exists("/tmp/d"), "remove a tree")
    try:
        f.read("/tmp/none")
        check(False, "reading a missing file raises")
    except NotFoundException:
        check(True, "reading a missing file is NotFound")
    import inspect
    import io

    if "gzip" in inspect.signature(f.write).parameters:
        f.write("/tmp/gz.txt", "compressed on the way", gzip=True)
        check(f.read("/tmp/gz.txt") == "compressed on the way", "a gzip'd upload")
        f.write("/tmp/stream.bin", io.BytesIO(b"from a file object"))
        check(f.read("/tmp/stream.bin") == "from a file object", "an octet-stream upload")
    # A signed URL needs no token; the router a URL without the sandbox in its host
    # would go through names the sandbox, as E2B's proxy does from the host name.
    import httpx

    url = sb.download_url("/tmp/gz.txt" if f.exists("/tmp/gz.txt") else "/home/user/notes/a.txt")
    headers = {"E2b-Sandbox-Id": sb.sandbox_id}
    r = httpx.get(url, headers=headers)
    check(r.status_code == 200 and len(r.content) > 0, f"a signed download URL works: {r.status_code}")
    r = httpx.get(url.replace("signature=v1_", "signature=v1_x"), headers=headers)
    check(r.status_code == 401, f"a wrong signature is refused: {r.status_code}")
    f.make_dir("/tmp/watched/sub")
    w = f.watch_dir("/tmp/watched", recursive=True)
    f.write("/tmp/watched/new.txt", "x")
    f.write("/tmp/watched/sub/deep.txt", "y")
    f.remove("/tmp/watched/new.txt")
    time.sleep(0.5)
    seen = {(e.name, e.type.value) for e in w.get_new_events()}
    for want in [("new.txt", "create"), ("new.txt", "write"), ("new.txt", "remove"), ("sub/deep.txt", "create")]:
        check(want in seen, f"watch_dir sees {want}: {sorted(seen)}")
    w.stop()
    written = f.write_files([{"path": "/tmp/w1", "data": "1"}, {"path": "/tmp/w2", "data": b"2"}])
    check(sorted(w.path for w in written) == ["/tmp/w1", "/tmp/w2"], "write_files")
    # As E2B's envd does: files are written as root, for the user, wherever they go.
    f.write("/opt/made/by/envd.txt", "x")
    info = f.get_info("/opt/made/by/envd.txt")
    check(info.owner == "user", f"a file written anywhere is the user's: {info.owner}")
    check(f.get_info("/opt/made").owner == "user", "and so are the directories made for it")
    check(f.get_info("/opt").owner == "root", "a directory that was there keeps its owner")


def pty(sb):
    out = []
    p = sb.pty.create(PtySize(rows=24, cols=80))
    sb.pty.send_stdin(p.pid, b"stty size; echo pty-$((6*7))\n")
    time.sleep(0.5)
    sb.pty.resize(p.pid, PtySize(rows=30, cols=100))
    sb.pty.send_stdin(p.pid, b"stty size; exit\n")
    p.wait(on_pty=lambda d: out.append(d))
    text = b"".join(out).decode(errors="replace")
    check("24 80" in text and "pty-42" in text and "30 100" in text, f"a PTY runs, sized and resized: {text[-200:]!r}")


def isolation(sb):
    other = os.environ["FORKD_OTHER_KEY"]
    try:
        Sandbox.connect(sb.sandbox_id, api_key=other)
        check(False, "another key cannot connect")
    except Exception as e:
        check("not found" in str(e).lower(), f"another key's connect is not found: {type(e).__name__}")
    theirs = [s.sandbox_id for s in Sandbox.list(api_key=other).next_items()]
    check(sb.sandbox_id not in theirs, f"another key does not list it: {theirs}")
    import httpx

    url = os.environ["E2B_SANDBOX_URL"]
    for token in ["wrong", None]:
        headers = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983"}
        if token:
            headers["X-Access-Token"] = token
        r = httpx.get(f"{url}/files", params={"path": "/etc/hostname"}, headers=headers)
        check(r.status_code == 401, f"envd without the sandbox's token is refused: {r.status_code}")
    try:
        Sandbox.create(template="base", api_key="e2b_" + "0" * 40)
        check(False, "a wrong key is refused")
    except AuthenticationException:
        check(True, "a wrong key is AuthenticationException")


def timeouts():
    sb = Sandbox.create(template="base", timeout=600)
    end = sb.get_info().end_at
    sb.set_timeout(1)
    check(sb.get_info().end_at < end, "set_timeout moves the end")
    deadline = time.monotonic() + 15
    while sb.is_running() and time.monotonic() < deadline:
        time.sleep(0.5)
    check(not sb.is_running(), "a sandbox is gone at its timeout")


COUNTER = """
import http.server
n = [0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        n[0] += 1
        self.send_response(200)
        self.end_headers()
        self.wfile.write(str(n[0]).encode())
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""


def count(sb):
    for _ in range(100):
        r = sb.commands.run("curl -s localhost:8000 || true")
        if r.stdout.strip():
            return int(r.stdout)
        time.sleep(0.1)
    raise AssertionError("the counter never answered")


def pause_resume():
    sb = Sandbox.create(template="base", timeout=300)
    sb.files.write("counter.py", COUNTER)
    h = sb.commands.run("python3 counter.py", background=True)
    check(count(sb) == 1 and count(sb) == 2, "a process holds state in memory")
    sb.pause()
    check(not sb.is_running(), "a paused sandbox is not running")
    check(Sandbox.get_info(sb.sandbox_id).state.value == "paused", "its state is paused")
    listed = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()]
    check(sb.sandbox_id in listed, f"it is listed as paused: {listed}")
    again = Sandbox.connect(sb.sandbox_id, timeout=120)
    check(again.sandbox_id == sb.sandbox_id and again.is_running(), "connect resumes it under its id")
    check(count(again) == 3, "the process resumed with its state")
    check(h.pid in [p.pid for p in again.commands.list()], "its command is listed again")
    check(again.commands.kill(h.pid) is True, "and can be killed")
    return again


def snapshots(sb):
    sb.files.write("/tmp/marker", "before")
    snap = sb.create_snapshot()
    sb.files.write("/tmp/marker", "after")
    check(sb.is_running() and sb.files.read("/tmp/marker") == "after", "the source runs on after its snapshot")
    ids = [s.snapshot_id for s in sb.list_snapshots().next_items()]
    check(snap.snapshot_id in ids, f"list_snapshots: {ids}")
    child = Sandbox.create(template=snap.snapshot_id, timeout=120)
    check(child.files.read("/tmp/marker") == "before", "a sandbox made from a snapshot has its files")
    check(child.commands.run("id -un").stdout == "user\n", "and its user")
    child.kill()
    check(Sandbox.delete_snapshot(snap.snapshot_id) is True, "delete_snapshot")
    check(snap.snapshot_id not in [s.snapshot_id for s in sb.list_snapshots().next_items()], "a deleted snapshot is gone")


def forks(sb):
    if not hasattr(sb, "fork"):
        return
    sb.files.write("counter.py", COUNTER)
    sb.commands.run("python3 counter.py", background=True)
    base = count(sb)
    t = time.monotonic()
    forks = sb.fork(count=3, timeout=120)
    print(f"fork(count=3) in {time.monotonic() - t:.3f}s", flush=True)
    check(len(forks) == 3 and all(isinstance(f, Sandbox) for f in forks), f"fork(count=3): {forks}")
    ids = {f.sandbox_id for f in forks}
    check(len(ids) == 3 and sb.sandbox_id not in ids, "three new sandboxes")
    for i, f in enumerate(forks):
        check(count(f) == base + 1, f"fork {i}'s process is alive with the source's state")
        f.files.write("/tmp/mine", f"fork-{i}")
    for i, f in enumerate(forks):
        check(f.files.read("/tmp/mine") == f"fork-{i}", f"fork {i}'s files are its own")
    check(not sb.files.exists("/tmp/mine"), "the source's files are its own")
    check(count(sb) == base + 1, "the source's process runs on, apart")
    for f in forks:
        check(f.kill() is True, "a fork is killed")


async def async_checks(sandbox_id):
    """The asyncio SDK: its commands and its streamed directory watch (WatchDir)."""
    from e2b import AsyncSandbox

    sb = await AsyncSandbox.connect(sandbox_id)
    r = await sb.commands.run("echo async-$((1+1))")
    check(r.stdout == "async-2\n", f"AsyncSandbox runs commands: {r.stdout!r}")
    await sb.files.make_dir("/tmp/awatched")
    events = []
    h = await sb.files.watch_dir("/tmp/awatched", on_event=lambda e: events.append(e))
    await sb.files.write("/tmp/awatched/a.txt", "1")
    for _ in range(50):
        if any(e.name == "a.txt" for e in events):
            break
        await asyncio.sleep(0.1)
    await h.stop()
    check(any(e.name == "a.txt" and e.type.value == "create" for e in events), f"a streamed watch sees a new file: {events}")


def templates():
    """A template from a Dockerfile and its context, built by forkd (what Harbor's E2B
    backend does per task), then a sandbox of it; and its start command."""
    import tempfile

    from e2b import Template

    ctx = tempfile.mkdtemp()
    with open(f"{ctx}/greet.py", "w") as f:
        f.write("print('hello from the template')\n")
    with open(f"{ctx}/Dockerfile", "w") as f:
        f.write(
            "FROM e2b-base\nWORKDIR /app\nCOPY greet.py /app/greet.py\n"
            "RUN python3 /app/greet.py > /app/out.txt\nENV GREETING=hi\n"
        )
    name = "sdk-check-" + sdk_version().replace(".", "-")
    check(not Template.alias_exists(name), "no template of the name yet")
    t = Template(file_context_path=ctx).from_dockerfile(f"{ctx}/Dockerfile")
    # A start command, run once at the build: sandboxes start from the state it reached.
    t = t.set_start_cmd("echo started > /tmp/started; exec sleep infinity", "test -f /tmp/started")
    Template.build(t, alias=name)
    check(Template.alias_exists(name), "the built template exists")
    sb = Sandbox.create(template=name)
    out = sb.commands.run("cat /app/out.txt; echo $GREETING; id -un; cat /tmp/started; pgrep -c sleep").stdout
    check(out == "hello from the template\nhi\nuser\nstarted\n1\n", f"a sandbox of the template, started: {out!r}")
    sb.kill()


def main():
    t = time.monotonic()
    sb = Sandbox.create(template="base", timeout=300, envs={"SBVAR": "fromsandbox"}, metadata={"suite": "sdk"})
    print(f"created {sb.sandbox_id} in {time.monotonic() - t:.3f}s", flush=True)
    info = sb.get_info()
    check(info.sandbox_id == sb.sandbox_id and info.metadata == {"suite": "sdk"}, f"get_info: {info}")
    ids = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"suite": "sdk"})).next_items()]
    check(ids == [sb.sandbox_id], f"list by metadata: {ids}")
    check(sb.is_running(), "is_running")
    busy = sb.commands.run("while :; do :; done", background=True)
    time.sleep(1)
    m = sb.get_metrics()
    busy.kill()
    check(len(m) == 1 and m[0].mem_used > 0 and m[0].cpu_used_pct > 0, f"get_metrics: {m}")
    commands(sb)
    files(sb)
    pty(sb)
    isolation(sb)
    snapshots(sb)
    forks(sb)
    asyncio.run(async_checks(sb.sandbox_id))
    templates()
    check(sb.kill() is True, "kill")
    check(not sb.is_running(), "a killed sandbox is not running")
    check(Sandbox.kill(sb.sandbox_id) is False, "killing it again answers False")
    timeouts()
    resumed = pause_resume()
    check(resumed.kill() is True, "a resumed sandbox is killed")
    print("ok", sdk_version(), flush=True)


if __name__ == "__main__":
    main()
