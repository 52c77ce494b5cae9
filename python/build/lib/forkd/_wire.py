"""The API's wire form, shared by the synchronous and the asyncio client.

Each API call is first described as a `Call` (method, path, query, body, how long it may
take, and how to read its answer) by the functions in `forkd._ops`; a client only sends
the bytes of `Call.encode()` on a fresh connection to the socket, reads to the end (the
daemon answers `Connection: close`), and hands the bytes to `Call.finish()`. So both
clients speak exactly the same protocol, and neither holds any of its logic.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, TypeVar
from urllib.parse import quote

from .errors import ConnectionFailed, from_answer

T = TypeVar("T")

DEFAULT_SOCKET = "/run/forkd/forkd.sock"
# Seconds a call may take on the wire, unless it says otherwise (exec with a timeout).
DEFAULT_TIMEOUT = 600.0
# The largest answer read (the API bounds its bodies at 4 GiB; a client needs less).
MAX_ANSWER = 1 << 32


def socket_path(path: Optional[str] = None) -> str:
    """The socket to use: the argument, else `FORKD_SOCKET`, else the default."""
    return path or os.environ.get("FORKD_SOCKET") or DEFAULT_SOCKET


def segment(value: str) -> str:
    """A path parameter, percent-encoded (a `/` in an image name becomes `%2F`)."""
    return quote(value, safe="")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def request_id(self) -> str:
        return self.headers.get("x-request-id", "")

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise ConnectionFailed(
                f"answer with status {self.status} is not JSON: {e}", request_id=self.request_id
            ) from None


@dataclass
class Call(Generic[T]):
    """One request and the reading of its answer."""

    method: str
    path: str
    read: Callable[[Answer], T]
    query: dict[str, str] = field(default_factory=dict)
    body: Optional[bytes] = None
    content_type: str = "application/json"
    timeout: Optional[float] = DEFAULT_TIMEOUT

    def target(self) -> str:
        if not self.query:
            return self.path
        q = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in self.query.items())
        return f"{self.path}?{q}"

    def encode(self) -> bytes:
        body = self.body if self.body is not None else b""
        head = [
            f"{self.method} {self.target()} HTTP/1.1",
            "Host: forkd",
            "Connection: close",
            f"Content-Length: {len(body)}",
        ]
        if self.body is not None:
            head.append(f"Content-Type: {self.content_type}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    def finish(self, raw: bytes) -> T:
        answer = parse_answer(raw)
        if answer.status >= 400:
            body: Any
            try:
                body = json.loads(answer.body)
            except ValueError:
                body = None
            raise from_answer(answer.status, body, answer.request_id)
        return self.read(answer)


def json_call(method: str, path: str, read: Callable[[Any], T], body: Any = None, **kw: Any) -> Call[T]:
    """A call with a JSON body (when given) and a JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    return Call(method, path, lambda a: read(a.json()), body=data, **kw)


def parse_answer(raw: bytes) -> Answer:
    """Parses a whole HTTP/1.1 answer (status line, headers, body)."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        if not raw:
            raise ConnectionFailed("the daemon closed the connection without answering")
        raise ConnectionFailed(f"incomplete HTTP answer ({len(raw)} bytes)")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ConnectionFailed(f"not an HTTP answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = rest
    if "content-length" in headers:
        n = int(headers["content-length"])
        if len(rest) < n:
            raise ConnectionFailed(
                f"answer cut short: {len(rest)} of {n} bytes", request_id=headers.get("x-request-id", "")
            )
        body = rest[:n]
    return Answer(int(parts[1]), headers, body)
