"""The asyncio client against a live daemon: concurrent calls on one loop, the same
results and errors as the synchronous client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import forkd


def test_concurrent_execs_and_forks(socket_path: str, tmp_path: Path) -> None:
    async def main() -> None:
        c = forkd.AsyncClient(socket_path)
        assert (await c.version()).api == "v1"
        assert (await c.health()).volume.ok
        async with c.sandbox("busybox") as sb:
            outs = await asyncio.gather(*(c.exec(sb.id, f"echo {i}; echo e{i} >&2", merge_stderr=True) for i in range(8)))
            assert [o.text for o in outs] == [f"{i}\ne{i}\n" for i in range(8)]
            r = await c.exec(sb.id, "sleep 100", timeout=0.3)
            assert r.timed_out
            await c.write_file(sb.id, "/data/f", b"async")
            assert await c.read_file(sb.id, "/data/f") == b"async"
            src = tmp_path / "d"
            src.mkdir()
            (src / "a").write_text("A")
            await c.upload_dir(sb.id, src, "/up")
            await c.download_dir(sb.id, "/up", tmp_path / "back")
            assert (tmp_path / "back" / "a").read_text() == "A"
            ck = await c.checkpoint(sb.id)
            res = await c.fork(ck.id, 3)
            texts = await asyncio.gather(*(c.read_file(b, "/data/f") for b in res.ids))
            assert texts == [b"async"] * 3
            await asyncio.gather(*(c.remove(b, force=True) for b in res.ids))
            assert (await c.remove_checkpoint(ck.id)) == ck.id
            records = await c.execs(sb.id)
            assert len(records) >= 9
        with pytest.raises(forkd.NotFound) as e:
            await c.inspect(sb.id)
        assert e.value.request_id

    asyncio.run(main())


def test_async_unreachable_daemon(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(forkd.ConnectionFailed):
            await forkd.AsyncClient(str(tmp_path / "nope.sock")).version()

    asyncio.run(main())
