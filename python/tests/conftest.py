"""Fixtures for the Python tests: a live daemon (its socket in FORKD_SOCKET, with the
busybox image imported as `busybox`), as `tests/python.rs` provides it."""

from __future__ import annotations

import os

import pytest

import forkd


@pytest.fixture(scope="session")
def socket_path() -> str:
    path = os.environ.get("FORKD_SOCKET", "")
    if not path or not os.path.exists(path):
        message = f"no daemon socket (FORKD_SOCKET={path!r}); run through tests/python.rs"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def client(socket_path: str) -> forkd.Client:
    return forkd.Client(socket_path)


@pytest.fixture
def sandbox(client: forkd.Client):
    """A running busybox sandbox, removed after the test."""
    sb = client.create("busybox", labels={"test": "python"})
    yield sb
    try:
        client.remove(sb.id, force=True)
    except forkd.NotFound:
        pass

