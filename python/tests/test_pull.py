"""`pull_image` and `list_pulls` against a real registry (Debian's docker-registry) on a
loopback port: an image pushed over the distribution API is pulled, runs, and is
pulled again at the cost of one manifest HEAD."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

import forkd

REGISTRY = "/usr/bin/docker-registry"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(method: str, url: str, body: bytes = b"", content_type: str = "application/octet-stream"):
    req = urllib.request.Request(url, data=body if method != "GET" else None, method=method)
    req.add_header("Content-Type", content_type)
    return urllib.request.urlopen(req, timeout=30)


@pytest.fixture
def registry(tmp_path: Path):
    if not os.path.exists(REGISTRY):
        message = f"{REGISTRY} missing (run fixtures/setup.sh packages)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    port = _free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = open(tmp_path / "registry.log", "w")
    proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            _request("GET", base + "/v2/")
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the registry did not answer")
    yield base, tmp_path / "registry.log"
    proc.kill()
    proc.wait()
    log.close()


def _push_blob(base: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    loc = _request("POST", f"{base}/v2/{repo}/blobs/uploads/").headers["Location"]
    loc = loc if loc.startswith("http") else base + loc
    sep = "&" if "?" in loc else "?"
    _request("PUT", f"{loc}{sep}digest={digest}", data)
    return digest


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def test_pull_image_runs_and_an_unchanged_image_costs_one_head(client: forkd.Client, registry) -> None:
    base, log = registry
    host = base.removeprefix("http://")
    busybox = Path(os.environ.get("FORKD_CACHE", "/var/cache/forkd")) / "images" / "busybox.tar"
    layers = [busybox.read_bytes(), _layer({"etc/from-python": b"pulled\n"})]
    descs = []
    for tar in layers:
        blob = gzip.compress(tar, compresslevel=1)
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": _push_blob(base, "py/app", blob), "size": len(blob)})
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": {"Env": ["GREETING=hi"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(t).hexdigest() for t in layers]},
    }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _push_blob(base, "py/app", config), "size": len(config)},
        "layers": descs,
    }).encode()
    _request("PUT", f"{base}/v2/py/app/manifests/1", manifest, "application/vnd.oci.image.manifest.v1+json")

    ref = f"{host}/py/app:1"
    img = client.pull_image(ref)
    assert img.name == ref and len(img.layers) == 2
    assert img.digest == "sha256:" + hashlib.sha256(manifest).hexdigest()
    assert img.source == f"registry:{ref}"
    assert client.list_pulls() == []
    sb = client.create(ref)
    try:
        r = client.exec(sb.id, ["sh", "-c", "cat /etc/from-python; echo $GREETING"])
        assert r.stdout == b"pulled\nhi\n"
    finally:
        client.remove(sb.id, force=True)

    before = log.read_text().count('"forkd/')
    again = client.pull_image(ref)
    assert again.layers == img.layers
    seen = [line for line in log.read_text().splitlines() if '"forkd/' in line][before:]
    assert len(seen) == 1 and '"HEAD /v2/py/app/manifests/1' in seen[0], seen

    named = client.pull_image(ref, name="py-test/pulled:1", platform="linux/amd64")
    assert named.name == "py-test/pulled:1" and named.layers == img.layers
    with pytest.raises(forkd.NotFound) as e:
        client.pull_image(f"{host}/py/app:nope")
    assert "manifest unknown" in str(e.value)
    with pytest.raises(forkd.BadRequest):
        client.pull_image("Not//A/Reference")
    for name in (ref, "py-test/pulled:1"):
        client.remove_image(name)
