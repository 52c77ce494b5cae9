"""The caller's registry credentials, sent with a pull as `X-Registry-Config` (Docker's
header: base64url of a JSON object from registry host to credentials), as podman-remote
and docker send theirs. Looked up as the daemon and `forkd login` do, in this process's
files: `REGISTRY_AUTH_FILE`, else the containers auth files
(`$XDG_RUNTIME_DIR/containers/auth.json`, `/run/containers/UID/auth.json`,
`$XDG_CONFIG_HOME/containers/auth.json` or `~/.config/...`); then Docker's
`$DOCKER_CONFIG/config.json` (`~/.docker/config.json`). In a file, a `credHelpers` entry
runs `docker-credential-NAME get`; else the most specific `auths` key gives `auth` or an
`identitytoken`; else `credsStore` names the helper. Only the credentials for the
registry of the reference are sent; for a short name none are (its registry is the
daemon's registries.conf's to say).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Optional

HEADER = "X-Registry-Config"
DOCKER_HUB = "docker.io"
_HUB_NAMES = [DOCKER_HUB, "index.docker.io", "registry-1.docker.io"]


def _files() -> list[Path]:
    env = os.environ
    files: list[Path] = []
    if env.get("REGISTRY_AUTH_FILE"):
        files.append(Path(env["REGISTRY_AUTH_FILE"]))
    else:
        if env.get("XDG_RUNTIME_DIR"):
            files.append(Path(env["XDG_RUNTIME_DIR"]) / "containers/auth.json")
        files.append(Path(f"/run/containers/{os.getuid()}/auth.json"))
        if env.get("XDG_CONFIG_HOME"):
            files.append(Path(env["XDG_CONFIG_HOME"]) / "containers/auth.json")
        elif env.get("HOME"):
            files.append(Path(env["HOME"]) / ".config/containers/auth.json")
    if env.get("DOCKER_CONFIG"):
        files.append(Path(env["DOCKER_CONFIG"]) / "config.json")
    elif env.get("HOME"):
        files.append(Path(env["HOME"]) / ".docker/config.json")
    return list(dict.fromkeys(files))


def _registry_of(reference: str) -> Optional[tuple[str, str]]:
    """(registry, repository) of a qualified reference; None for a short name."""
    name = reference.split("@", 1)[0]
    first, sep, rest = name.partition("/")
    if not sep or not ("." in first or ":" in first or first == "localhost"):
        return None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest = rest[: len(rest) - len(last)] + last.split(":", 1)[0]
    registry = DOCKER_HUB if first == "index.docker.io" else first
    if registry == DOCKER_HUB and "/" not in rest:
        rest = "library/" + rest
    return registry, rest


def _key(k: str) -> str:
    for scheme in ("https://", "http://"):
        if k.startswith(scheme):
            return k[len(scheme):].split("/", 1)[0]
    return k.rstrip("/")


def _helper(name: str, registry: str) -> Optional[dict[str, Any]]:
    server = "https://index.docker.io/v1/" if registry == DOCKER_HUB else registry
    try:
        out = subprocess.run([f"docker-credential-{name}", "get"], input=server.encode(), capture_output=True, timeout=60)
    except OSError as e:
        raise ValueError(f"docker-credential-{name}: cannot run it: {e}") from None
    if out.returncode != 0:
        if b"credentials not found" in out.stdout + out.stderr:
            return None
        raise ValueError(f"docker-credential-{name} failed: {out.stderr.decode(errors='replace').strip()}")
    answer = json.loads(out.stdout)
    return {"username": answer.get("Username", ""), "password": answer.get("Secret", ""), "from": f"docker-credential-{name}"}


def _lookup(doc: dict[str, Any], path: Path, registry: str, repository: str) -> Optional[dict[str, Any]]:
    names = _HUB_NAMES if registry == DOCKER_HUB else [registry]
    for k, helper in (doc.get("credHelpers") or {}).items():
        if _key(k) in names:
            return _helper(helper, registry)
    auths = {_key(k): v for k, v in (doc.get("auths") or {}).items()}
    for name in names:
        scope = f"{name}/{repository}"
        while True:
            entry = auths.get(scope)
            if entry:
                if entry.get("identitytoken"):
                    user = ""
                    if entry.get("auth"):
                        user = base64.b64decode(entry["auth"]).decode().split(":", 1)[0]
                    return {"username": user or "<token>", "identitytoken": entry["identitytoken"], "from": str(path)}
                if entry.get("auth"):
                    user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
                    if not sep:
                        raise ValueError(f"{path}: the entry for {registry}: \"auth\" is not base64 of user:password")
                    return {"username": user, "password": password, "from": str(path)}
            if "/" not in scope:
                break
            scope = scope.rsplit("/", 1)[0]
    if doc.get("credsStore"):
        return _helper(doc["credsStore"], registry)
    return None


def _found(registry: str, repository: str) -> Optional[dict[str, Any]]:
    """The caller's credential for `repository` on `registry`, from the first file that has one."""
    for path in _files():
        try:
            text = path.read_text()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            continue
        if not text.strip():
            continue
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{path}: not a credentials file: {e}") from None
        found = _lookup(doc, path, registry, repository)
        if found is not None:
            return found
    return None


def header_for(*references: str) -> Optional[str]:
    """The `X-Registry-Config` value for a pull of `references` (or a build whose images
    they are), or None when the caller has no credential for any of their registries."""
    config: dict[str, dict[str, Any]] = {}
    for reference in references:
        where = _registry_of(reference)
        if where is None or where[0] in config:
            continue
        found = _found(*where)
        if found is not None:
            config[where[0]] = found
    if not config:
        return None
    return base64.urlsafe_b64encode(json.dumps(config).encode()).decode().rstrip("=")


def images_named(dockerfile: str) -> list[str]:
    """The images a Dockerfile's `FROM` and `COPY --from`/`ADD --from` lines name (stage
    names too: short names send nothing); a name with a `$` is the build's to expand."""
    out = []
    for line in dockerfile.splitlines():
        words = line.split()
        if not words:
            continue
        op = words[0].upper()
        named = None
        if op == "FROM":
            named = next((w for w in words[1:] if not w.startswith("--")), None)
        elif op in ("COPY", "ADD"):
            named = next((w[len("--from="):] for w in words[1:] if w.startswith("--from=")), None)
        if named and "$" not in named:
            out.append(named)
    return out
