"""Tar packing for file transfers, shared by both clients (pure functions, in memory).

The API moves files as tar archives (`copy_in`, `copy_out`). These helpers turn a host
file or directory, or bytes, into such an archive, and an archive from the sandbox back
into bytes or a host directory. Unpacking on the host uses tarfile's `data` filter: no
absolute names, no `..`, no links pointing out, no device nodes.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import time
from pathlib import Path


def split(path: str) -> tuple[str, str]:
    """`/a/b/c` -> (`/a/b`, `c`); refuses relative paths and paths ending in `/` or `..`."""
    if not path.startswith("/"):
        raise ValueError(f"path {path!r} inside the sandbox must be absolute")
    norm = posixpath.normpath(path)
    parent, name = posixpath.split(norm)
    if not name or name in (".", ".."):
        raise ValueError(f"path {path!r} does not name a file")
    return parent, name


def pack_bytes(name: str, data: bytes, mode: int = 0o644) -> bytes:
    """A tar holding one regular file `name` with `data`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pack_path(src: Path, name: str) -> bytes:
    """A tar of the host file `src`, as `name` (symlinks kept as links)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, dereference=False) as tar:
        tar.add(str(src), arcname=name, recursive=False)
    return buf.getvalue()


def pack_dir_contents(src: Path) -> bytes:
    """A tar of everything under the host directory `src`, names relative to it."""
    if not src.is_dir():
        raise NotADirectoryError(f"{src} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, dereference=False) as tar:
        for entry in sorted(os.listdir(src)):
            tar.add(str(src / entry), arcname=entry, recursive=True)
    return buf.getvalue()


def single_file(archive: bytes, path: str) -> bytes:
    """The content of the one regular file a `copy_out` of a file gives."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        first = tar.next()
        if first is None:
            raise FileNotFoundError(f"{path}: empty archive")
        if not first.isfile():
            raise IsADirectoryError(f"{path} in the sandbox is not a regular file")
        f = tar.extractfile(first)
        assert f is not None
        return f.read()


def checked_members(members: list[tarfile.TarInfo], dest: Path) -> list[tarfile.TarInfo]:
    """What the `data` extraction filter does, for Pythons that lack it (3.10 before
    3.10.12, 3.11 before 3.11.4): refuses names and links that leave `dest` and special
    files, drops set-id, sticky and group/other write bits, and keeps no owner."""
    root = os.path.realpath(dest)

    def inside(path: str) -> bool:
        return os.path.commonpath([root, os.path.realpath(path)]) == root

    out = []
    for m in members:
        name = m.name
        if os.path.isabs(name) or ".." in name.split("/") or not inside(os.path.join(root, name)):
            raise tarfile.TarError(f"archive member {name!r} would land outside {dest}")
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise tarfile.TarError(f"archive member {name!r} is a special file")
        if m.issym():
            target = os.path.join(root, os.path.dirname(name), m.linkname)
            if os.path.isabs(m.linkname) or not inside(target):
                raise tarfile.TarError(f"symlink {name!r} points outside {dest}: {m.linkname!r}")
        if m.islnk() and (os.path.isabs(m.linkname) or not inside(os.path.join(root, m.linkname))):
            raise tarfile.TarError(f"hard link {name!r} points outside {dest}: {m.linkname!r}")
        m.mode &= 0o755 if (m.isdir() or m.mode & 0o100) else 0o644
        m.uid, m.gid, m.uname, m.gname = os.geteuid(), os.getegid(), "", ""
        out.append(m)
    return out


def unpack_into(archive: bytes, dest: Path, *, strip_top: bool) -> None:
    """Unpacks a `copy_out` archive into the host directory `dest` (made if missing).
    With `strip_top`, the archive's top entry is `dest` itself (its contents land in
    `dest`), as `download_dir` wants."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        members = tar.getmembers()
        if strip_top:
            top = members[0].name.split("/")[0] if members else ""
            kept = []
            for m in members:
                parts = m.name.split("/", 1)
                if parts[0] != top or len(parts) == 1:
                    continue
                m.name = parts[1]
                if m.islnk() and m.linkname.startswith(top + "/"):
                    m.linkname = m.linkname[len(top) + 1 :]
                kept.append(m)
            members = kept
        if hasattr(tarfile, "data_filter"):
            tar.extractall(str(dest), members=members, filter="data")
        else:
            tar.extractall(str(dest), members=checked_members(members, dest))
