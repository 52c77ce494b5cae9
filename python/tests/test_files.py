"""Unpacking copy-out archives on the host: the checks made where Python's tarfile has no
`data` filter are the same refusals."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from forkd import _files


def archive(*members: tuple[str, str, bytes]) -> list[tarfile.TarInfo]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                info.mode = 0o4777
                tar.addfile(info, io.BytesIO(data))
            elif kind == "sym":
                info.type = tarfile.SYMTYPE
                info.linkname = data.decode()
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
    buf.seek(0)
    with tarfile.open(fileobj=buf, mode="r") as tar:
        return tar.getmembers()


def test_members_inside_pass_with_safe_modes(tmp_path: Path) -> None:
    ok = _files.checked_members(archive(("file", "a/b.txt", b"x"), ("sym", "a/l", b"b.txt")), tmp_path)
    assert [m.name for m in ok] == ["a/b.txt", "a/l"]
    assert ok[0].mode == 0o755, oct(ok[0].mode)
    assert ok[0].uname == ""


@pytest.mark.parametrize(
    "member",
    [
        ("file", "../evil", b"x"),
        ("file", "/etc/evil", b"x"),
        ("sym", "a/l", b"/etc/passwd"),
        ("sym", "a/l", b"../../outside"),
        ("fifo", "a/p", b""),
    ],
)
def test_members_leaving_the_target_are_refused(tmp_path: Path, member: tuple[str, str, bytes]) -> None:
    with pytest.raises(tarfile.TarError):
        _files.checked_members(archive(member), tmp_path)
