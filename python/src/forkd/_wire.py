"""The API's wire form, shared by the synchronous and the asyncio client.

Each API call is first described as a `Call` (method, path, query, body, how long it may
take, and how to read its answer) by the functions in `forkd._ops`; a client only sends
the bytes of `Call.encode()` on a fresh connection to its `Endpoint`, reads to the end
(the request says `Connection: close`), and hands the bytes to `Call.finish()`, which
reads them with the standard library's HTTP parser. So both clients speak exactly the
same protocol, and neither holds any of its logic.

An `Endpoint` is the daemon's Unix socket, or a TCP listener with TLS (`FORKD_HOST=
tcp://HOST:PORT`, `FORKD_API_KEY`, `FORKD_CA_CERT`, for mutual TLS `FORKD_CLIENT_CERT`
and `FORKD_CLIENT_KEY`; `FORKD_TLS=off` for plain TCP to a loopback address).
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import json
import os
import ssl
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


@dataclass
class Endpoint:
    """Where a client's connections go: a Unix socket, or TCP (with TLS unless `ssl` is None)."""

    socket: Optional[str] = None
    host: Optional[str] = None
    port: int = 0
    key: Optional[str] = None
    ssl: Optional[ssl.SSLContext] = None

    def __str__(self) -> str:
        if self.socket is not None:
            return self.socket
        return f"tcp://{self.host}:{self.port}" + ("" if self.ssl else " (plain)")


def _env(name: str) -> Optional[str]:
    v = os.environ.get(name, "").strip()
    return v or None


def endpoint(socket: Optional[str] = None, host: Optional[str] = None, api_key: Optional[str] = None) -> Endpoint:
    """The endpoint to use: `host` (`tcp://HOST:PORT` or `unix:///PATH`), else `socket`,
    else `FORKD_HOST`, else `FORKD_SOCKET`, else the default socket. A TCP endpoint takes
    `api_key`, else `FORKD_API_KEY`, and its TLS settings from the environment."""
    text = host or (None if socket else _env("FORKD_HOST"))
    if text is None:
        return Endpoint(socket=socket_path(socket))
    text = text.strip()
    if text.startswith("unix://"):
        return Endpoint(socket=text[len("unix://"):])
    if not text.startswith("tcp://"):
        raise ValueError(f"host {text!r}: expected tcp://HOST:PORT or unix:///PATH")
    hostport = text[len("tcp://"):].rstrip("/")
    h, sep, p = hostport.rpartition(":")
    if not sep or not p.isdigit() or not h:
        raise ValueError(f"host {text!r}: expected tcp://HOST:PORT")
    h = h.strip("[]")
    key = api_key or _env("FORKD_API_KEY")
    if (_env("FORKD_TLS") or "").lower() in ("off", "0", "false"):
        try:
            loopback = h == "localhost" or ipaddress.ip_address(h).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"host {text!r}: FORKD_TLS=off is allowed for a loopback address only")
        return Endpoint(host=h, port=int(p), key=key)
    ctx = ssl.create_default_context(cafile=_env("FORKD_CA_CERT"))
    ctx.set_alpn_protocols(["http/1.1"])
    cert, ckey = _env("FORKD_CLIENT_CERT"), _env("FORKD_CLIENT_KEY")
    if bool(cert) != bool(ckey):
        raise ValueError("FORKD_CLIENT_CERT and FORKD_CLIENT_KEY go together")
    if cert:
        ctx.load_cert_chain(cert, ckey)
    return Endpoint(host=h, port=int(p), key=key, ssl=ctx)


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
    # More headers (the caller's registry credentials for a pull).
    headers: dict[str, str] = field(default_factory=dict)

    def target(self) -> str:
        if not self.query:
            return self.path
        q = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in self.query.items())
        return f"{self.path}?{q}"

    def encode(self, key: Optional[str] = None) -> bytes:
        body = self.body if self.body is not None else b""
        head = [
            f"{self.method} {self.target()} HTTP/1.1",
            "Host: forkd",
            "Connection: close",
            f"Content-Length: {len(body)}",
        ]
        if key:
            head.append(f"Authorization: Bearer {key}")
        for k, v in self.headers.items():
            if "\r" in k + v or "\n" in k + v:
                raise ValueError(f"header {k} holds a line break")
            head.append(f"{k}: {v}")
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


class _Received:
    """What `http.client.HTTPResponse` reads from: the bytes of a whole answer."""

    def __init__(self, raw: bytes) -> None:
        self._file = io.BytesIO(raw)

    def makefile(self, *_: Any, **__: Any) -> io.BytesIO:
        return self._file


def parse_answer(raw: bytes) -> Answer:
    """Parses a whole HTTP/1.1 answer (status line, headers, body; chunked or not) with
    the standard library's parser."""
    if not raw:
        raise ConnectionFailed("the daemon closed the connection without answering")
    resp = http.client.HTTPResponse(_Received(raw))  # type: ignore[arg-type]
    try:
        resp.begin()
    except (http.client.HTTPException, ValueError) as e:
        raise ConnectionFailed(f"not an HTTP answer ({len(raw)} bytes): {e!r}") from None
    headers = {k.lower(): v for k, v in resp.getheaders()}
    try:
        body = resp.read()
    except http.client.IncompleteRead as e:
        raise ConnectionFailed(
            f"answer cut short: {len(e.partial)} bytes, {e.expected} more expected",
            request_id=headers.get("x-request-id", ""),
        ) from None
    return Answer(resp.status, headers, body)
