"""The caller's registry credentials as the clients send them (no daemon needed)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from forkd import _credentials, _ops


def decode(value: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))


def test_only_the_named_registries_credentials_are_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = tmp_path / "auth.json"
    token = base64.b64encode(b"docker:s3cret").decode()
    other = base64.b64encode(b"x:y").decode()
    auth.write_text(json.dumps({"auths": {"reg.example:5000": {"auth": token}, "other.example": {"auth": other}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    sent = decode(_credentials.header_for("reg.example:5000/team/app:1"))
    assert sent == {"reg.example:5000": {"username": "docker", "password": "s3cret", "from": str(auth)}}
    assert _credentials.header_for("busybox") is None, "a short name's registry is the daemon's to say"
    assert _credentials.header_for("nowhere.example/x:1") is None
    # A pull carries the header; a build carries the credentials of its FROM images.
    assert "X-Registry-Config" in _ops.pull_image("reg.example:5000/team/app:1").headers
    (tmp_path / "Dockerfile").write_text("FROM reg.example:5000/base:1 AS b\nCOPY --from=b /a /a\nFROM scratch\n")
    call = _ops.build_image(str(tmp_path), "img")
    assert list(decode(call.headers["X-Registry-Config"])) == ["reg.example:5000"]
    assert "s3cret" not in repr(call)


def test_a_broken_credentials_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text("{not json")
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    with pytest.raises(ValueError, match=str(auth)):
        _credentials.header_for("reg.example:5000/x:1")


def test_images_named_in_a_dockerfile() -> None:
    text = "FROM --platform=linux/amd64 reg.example/base:1 AS build\nRUN make\nCOPY --from=ghcr.io/a/uv:0.5 /uv /uv\nFROM ${BASE}\n"
    assert _credentials.images_named(text) == ["reg.example/base:1", "ghcr.io/a/uv:0.5"]
