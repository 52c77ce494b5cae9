"""The client's types and the API's schema (docs/openapi.json) in step: every typed
result has exactly its schema's properties, and every schema a result of the client
uses has a type."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from forkd import _ops, requests, types

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def schemas() -> dict:
    return json.loads(SCHEMA.read_text())["components"]["schemas"]


def test_every_type_has_exactly_its_schemas_properties() -> None:
    s = schemas()
    for name, cls in types.SCHEMAS.items():
        assert name in s, f"{name} is not in {SCHEMA}"
        fields = {f.name for f in dataclasses.fields(cls)}
        props = set(s[name].get("properties", {}))
        assert fields == props, f"{name}: client {sorted(fields ^ props)} differ from the schema"


def test_every_result_schema_has_a_type() -> None:
    spec = json.loads(SCHEMA.read_text())
    used = set()
    for ops in spec["paths"].values():
        for method, op in ops.items():
            if method == "parameters":
                continue
            for resp in op.get("responses", {}).values():
                for media in resp.get("content", {}).values():
                    schema = media.get("schema", {})
                    for holder in (schema, schema.get("items"), schema.get("additionalProperties")):
                        if isinstance(holder, dict) and "$ref" in holder:
                            used.add(holder["$ref"].rsplit("/", 1)[1])
    # Error bodies are exceptions; the Removed*/Copy answers are plain values.
    plain = {"ApiError", "RemovedImage", "RemovedSandbox", "RemovedCheckpoint", "CopyResult", "Metrics"}
    missing = used - plain - set(types.SCHEMAS)
    assert not missing, f"result schemas without a client type: {sorted(missing)}"


def test_exec_request_fields_are_the_schemas() -> None:
    body = _ops.exec_request(
        ["x"], env={"A": "1"}, cwd="/", user="u", timeout=1, tty=True, detach=True, log="l", merge_stderr=True
    )
    props = set(schemas()["ExecRequest"]["properties"])
    assert set(body) <= props, sorted(set(body) - props)
    call = _ops.exec("id", "true", stdin=b"x", output_limit=5, merge_stderr=True)
    sent = json.loads(call.body or b"{}")
    assert set(sent) <= set(schemas()["ExecBody"]["properties"])


def test_fork_request_fields_are_the_schemas() -> None:
    call = _ops.fork("c", 2, lazy=True, labels={"a": "b"}, network="egress", share_memory=True)
    sent = json.loads(call.body or b"{}")
    assert set(sent) <= set(schemas()["ForkRequest"]["properties"]), sorted(sent)
    assert sent["share_memory"] is True
    # Left out, the daemon's default decides.
    assert "share_memory" not in json.loads(_ops.fork("c").body or b"{}")


def test_every_request_has_exactly_its_schemas_properties() -> None:
    s = schemas()
    for name, cls in requests.REQUESTS.items():
        assert name in s, f"{name} is not in {SCHEMA}"
        fields = dataclasses.fields(cls)
        props = set(s[name].get("properties", {}))
        assert {f.name for f in fields} == props, f"{name}: client {sorted({f.name for f in fields} ^ props)} differ from the schema"
        required = {
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert required == set(s[name].get("required", [])), f"{name}: required {sorted(required)}"


def test_every_request_body_the_client_sends_is_typed() -> None:
    # Each call that sends JSON builds it from a request type: its keys are that schema's.
    sent = {
        "CreateSandboxRequest": _ops.create_sandbox("i", command="true", memory_bytes=1, network="egress"),
        "CheckpointRequest": _ops.checkpoint("s", live=True),
        "ForkRequest": _ops.fork("c", 2, network="allowlist=a"),
        "PullRequest": _ops.pull_image("r", platform="linux/amd64"),
        "ImportImageRequest": _ops.import_image("/x", "n"),
        "BuildRequest": _ops.build_image("/c", "n", limits={"pids": 5}, no_cache=True),
        "ExportRequest": _ops.export_checkpoint("c", "/p", thin=True),
        "ArchivePath": _ops.import_checkpoint("/p"),
        "GrantRequest": _ops.grant("s", 1000, max_steps=3),
        "StopRequest": _ops.stop_sandbox("s", 5),
    }
    s = schemas()
    for name, call in sent.items():
        body = json.loads(call.body or b"{}")
        assert set(body) <= set(s[name]["properties"]), f"{name}: {sorted(body)}"
        assert set(s[name].get("required", [])) <= set(body), f"{name}: {sorted(body)}"
