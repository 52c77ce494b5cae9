"""The synchronous client against a live daemon: every call, and bad input answered with
the API's error as an exception while nothing changes."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

import forkd


def test_version_metrics_and_images(client: forkd.Client) -> None:
    v = client.version()
    assert v.api == "v1" and v.version and v.cgroup_version in (1, 2)
    images = {i.name: i for i in client.list_images()}
    assert "busybox" in images and images["busybox"].layers
    assert client.inspect_image("busybox").layers == images["busybox"].layers
    m = client.metrics()
    assert m["version"].count >= 1 and isinstance(m["version"], forkd.OpStats)
    h = client.health()
    assert h.ok and not h.degraded and h.volume.ok and h.volume.pressure is None, h
    assert 0 < h.volume.free_bytes <= h.volume.size_bytes <= h.volume.max_bytes
    assert h.criu.ok and h.exit_watcher.ok and isinstance(h.volume, forkd.types.VolumeHealth)


def test_a_sandbox_without_the_system_call_filter(client: forkd.Client) -> None:
    sb = client.create("busybox", seccomp="unconfined")
    try:
        assert sb.seccomp == "unconfined"
        assert client.exec(sb.id, "grep Seccomp: /proc/self/status").text.split() == ["Seccomp:", "0"]
    finally:
        client.remove(sb.id, force=True)
    sb = client.create("busybox")
    try:
        assert sb.seccomp == "default"
        assert client.exec(sb.id, "unshare -U true").exit_code != 0
    finally:
        client.remove(sb.id, force=True)


def test_image_import_and_remove(client: forkd.Client, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "hello").write_text("hi\n")
    img = client.import_image(str(root), "py-test/tiny:1")
    assert img.name == "py-test/tiny:1" and img.layers
    assert client.inspect_image("py-test/tiny:1").source.endswith(str(root))
    assert client.remove_image("py-test/tiny:1") == "py-test/tiny:1"
    with pytest.raises(forkd.NotFound):
        client.inspect_image("py-test/tiny:1")


def test_sandbox_lifecycle(client: forkd.Client) -> None:
    sb = client.create(
        "busybox", hostname="py", memory_bytes=256 << 20, pids=128, labels={"k": "v"}, command="echo started; sleep 1000"
    )
    assert sb.running and sb.hostname == "py" and sb.limits.memory_bytes == 256 << 20 and sb.labels == {"k": "v"}
    listed = {s.id: s for s in client.list_sandboxes()}
    assert sb.id in listed and listed[sb.id].memory_bytes is None and listed[sb.id].oom_kills is None
    counted = {s.id: s for s in client.list_sandboxes(stats=True)}
    assert counted[sb.id].oom_kills == 0 and (counted[sb.id].memory_bytes or 0) > 0
    assert client.inspect(sb.id[:8]).id == sb.id
    r = client.exec(sb.id, "hostname")
    assert r.stdout == b"py\n"
    for _ in range(100):
        if client.logs(sb.id) == b"started\n":
            break
    assert client.logs(sb.id) == b"started\n"
    stopped = client.stop(sb.id, grace_secs=1)
    assert stopped.status == "stopped"
    with pytest.raises(forkd.Conflict) as e:
        client.exec(sb.id, "true")
    assert e.value.kind == "conflict" and e.value.request_id and e.value.status == 409
    assert client.remove(sb.id) == sb.id
    assert sb.id not in {s.id for s in client.list_sandboxes()}


def test_exec_output_merged_apart_timeout_and_cap(client: forkd.Client, sandbox: forkd.SandboxInfo) -> None:
    line = "for i in 1 2 3; do echo o$i; echo e$i >&2; done; exit 4"
    r = client.exec(sandbox.id, line, merge_stderr=True)
    assert r.exit_code == 4 and not r.ok
    assert r.text == "o1\ne1\no2\ne2\no3\ne3\n" and r.stderr == b""
    r = client.exec(sandbox.id, line)
    assert r.stdout == b"o1\no2\no3\n" and r.stderr == b"e1\ne2\ne3\n" and len(r.output) == 18
    r = client.exec(sandbox.id, ["sh", "-c", 'echo "$A $(pwd) $(id -u)"'], env={"A": "x"}, cwd="/tmp", user="nobody")
    assert r.stdout.decode().split() == ["x", "/tmp", "65534"]
    r = client.exec(sandbox.id, ["cat"], stdin=bytes(range(256)) * 1000)
    assert r.stdout == bytes(range(256)) * 1000
    # The timeout kills the whole tree: the background sleeper is gone too.
    r = client.exec(sandbox.id, "sleep 300 & sleep 300", timeout=0.5)
    assert r.timed_out and not r.ok
    procs = client.exec(sandbox.id, "for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c; echo; done").stdout
    assert b"sleep 300" not in procs
    # A command printing far more than the cap: the answer is bounded, the command finished.
    r = client.exec(sandbox.id, "head -c 30000000 /dev/zero; exit 3", output_limit=1000, merge_stderr=True)
    assert r.exit_code == 3 and r.truncated and r.output_bytes == 30_000_000 and len(r.output) == 1000


def test_exec_detached_and_trajectory(client: forkd.Client, sandbox: forkd.SandboxInfo) -> None:
    pid = client.exec_detached(sandbox.id, "echo bg; echo done > /tmp/flag", log="job")
    assert pid > 1
    for _ in range(200):
        if client.exec(sandbox.id, "cat /tmp/flag 2>/dev/null").stdout == b"done\n":
            break
    assert client.logs(sandbox.id, "job") == b"bg\n"
    records = client.execs(sandbox.id)
    assert records[0].detach and records[0].shell.startswith("echo bg")
    assert all(isinstance(r, forkd.ExecRecord) for r in records)


def test_files_in_and_out(client: forkd.Client, sandbox: forkd.SandboxInfo, tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    client.write_file(sandbox.id, "/srv/a/b/data.bin", data, mode=0o600)
    assert client.read_file(sandbox.id, "/srv/a/b/data.bin") == data
    assert client.exec(sandbox.id, "stat -c %a /srv/a/b/data.bin").stdout == b"600\n"
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "top.txt").write_text("top")
    (src / "sub" / "x.txt").write_text("x")
    (src / "link").symlink_to("top.txt")
    client.upload_dir(sandbox.id, src, "/srv/tree")
    r = client.exec(sandbox.id, "cat /srv/tree/top.txt /srv/tree/sub/x.txt; readlink /srv/tree/link")
    assert r.stdout == b"topxtop.txt\n"
    client.upload_file(sandbox.id, src / "top.txt", "/srv/one/copy.txt")
    assert client.read_file(sandbox.id, "/srv/one/copy.txt") == b"top"
    out = tmp_path / "out"
    client.download_dir(sandbox.id, "/srv/tree", out)
    assert (out / "top.txt").read_text() == "top" and (out / "sub" / "x.txt").read_text() == "x"
    client.download_file(sandbox.id, "/srv/a/b/data.bin", tmp_path / "d" / "data.bin")
    assert (tmp_path / "d" / "data.bin").read_bytes() == data
    tar = client.copy_out(sandbox.id, "/srv/tree")
    assert tarfile.open(fileobj=io.BytesIO(tar)).getnames()[0] == "tree"


def test_checkpoints_forks_export_import_gc(client: forkd.Client, sandbox: forkd.SandboxInfo, tmp_path: Path) -> None:
    client.write_file(sandbox.id, "/state.txt", b"one")
    ck = client.checkpoint(sandbox.id, labels={"step": "1"})
    assert not ck.live and ck.sandbox == sandbox.id and ck.labels == {"step": "1"}
    assert ck.id in {c.id for c in client.list_checkpoints()}
    res = client.fork(ck.id, 2)
    assert len(res.ids) == 2 and all(b.mode == "fresh" for b in res.branches)
    for b in res.ids:
        assert client.read_file(b, "/state.txt") == b"one"
    client.write_file(res.ids[0], "/state.txt", b"two")
    assert client.read_file(res.ids[1], "/state.txt") == b"one"
    assert set(client.inspect_checkpoint(ck.id).branches) == set(res.ids)
    assert "state.txt" in tarfile.open(fileobj=io.BytesIO(client.checkpoint_delta(ck.id))).getnames()
    with pytest.raises(forkd.Conflict):
        client.remove_checkpoint(ck.id)
    for b in res.ids:
        client.remove(b, force=True)
    archive = tmp_path / "ck.forkd"
    exp = client.export_checkpoint(ck.id, str(archive))
    assert exp.path == str(archive) and exp.bytes == archive.stat().st_size and exp.tree_hash
    assert client.remove_checkpoint(ck.id) == ck.id
    imported = client.import_checkpoint(str(archive))
    assert imported.tree_hash == exp.tree_hash
    with client.branch(imported.id) as b:
        assert client.read_file(b, "/state.txt") == b"one"
    client.remove_checkpoint(imported.id)
    assert isinstance(client.gc(), forkd.GcResult)


def test_live_checkpoint_fork(client: forkd.Client, sandbox: forkd.SandboxInfo) -> None:
    client.exec_detached(sandbox.id, "i=1000; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done", log="loop")

    def counter(id: str) -> int:
        text = client.exec(id, "cat /tmp/n 2>/dev/null").stdout.strip()
        return int(text) if text else 0

    while counter(sandbox.id) < 1002:
        pass
    at = counter(sandbox.id)
    ck = client.checkpoint(sandbox.id, live=True)
    assert ck.live and ck.images_bytes > 0
    res = client.fork(ck.id, 2)
    assert all(b.mode == "eager" for b in res.branches)
    for b in res.ids:
        # The loop was restored, not restarted: it goes on past the checkpointed value.
        while counter(b) < at + 3:
            pass
        client.remove(b, force=True)
    client.remove_checkpoint(ck.id)


def test_bad_input_raises_and_changes_nothing(client: forkd.Client, sandbox: forkd.SandboxInfo) -> None:
    before = (
        sorted(s.id for s in client.list_sandboxes()),
        sorted(c.id for c in client.list_checkpoints()),
        sorted(i.name for i in client.list_images()),
    )
    with pytest.raises(forkd.NotFound) as e:
        client.inspect("0123456789abcdef")
    assert "0123456789abcdef" in e.value.message and e.value.request_id.startswith("r")
    with pytest.raises(forkd.NotFound):
        client.fork("fedcba9876543210")
    with pytest.raises(forkd.NotFound):
        client.create("no-such-image")
    with pytest.raises(forkd.BadRequest) as e:
        client.create("busybox", memory_bytes=-1)
    with pytest.raises(forkd.NotFound) as e:
        client.inspect("../etc")
    assert "../etc" in e.value.message
    with pytest.raises(forkd.NotFound):
        client.read_file(sandbox.id, "/no/such/file")
    # A path outside the sandbox resolves inside it: the host's file is not reached.
    client.write_file(sandbox.id, "/../../escape-probe", b"x")
    assert not Path("/escape-probe").exists()
    assert client.read_file(sandbox.id, "/escape-probe") == b"x"
    with pytest.raises(ValueError):
        client.write_file(sandbox.id, "relative/path", b"x")
    with pytest.raises(forkd.BadRequest) as e:
        client.exec(sandbox.id, ["/no/such/program"])
    assert e.value.kind == "bad_request"
    with pytest.raises(forkd.BadRequest) as e:
        client.exec(sandbox.id, "true", output_limit=1 << 40)
    assert "output_limit" in e.value.message
    with pytest.raises(forkd.NotFound) as e:
        client.import_image("/no/such/dir", "x")
    assert "/no/such/dir" in e.value.message
    after = (
        sorted(s.id for s in client.list_sandboxes()),
        sorted(c.id for c in client.list_checkpoints()),
        sorted(i.name for i in client.list_images()),
    )
    assert after == before


def test_malformed_request_is_an_api_error(socket_path: str) -> None:
    """A request the client would never send, straight on the socket: the API's error."""
    import socket

    from forkd import _wire

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(socket_path)
        body = b'{"image": 5}'
        s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: forkd\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    call = _wire.Call("POST", "/v1/sandboxes", lambda a: a)
    with pytest.raises(forkd.BadRequest) as e:
        call.finish(raw)
    assert e.value.request_id


def test_unreachable_daemon_is_a_connection_error(tmp_path: Path) -> None:
    c = forkd.Client(str(tmp_path / "none.sock"))
    with pytest.raises(forkd.ConnectionFailed) as e:
        c.version()
    assert "none.sock" in str(e.value) and e.value.kind == "connection"
