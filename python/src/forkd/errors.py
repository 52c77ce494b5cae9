"""Errors of the forkd client.

Every error answer of the API is an `ApiError` body (`kind`, `message`, `request_id`);
the client raises it as the `ForkdError` subclass of its kind, so a caller can catch
`NotFound` or `Conflict` alone. A daemon that cannot be reached, or that answers
something that is not the API, is a `ConnectionFailed` (kind `connection`).
"""

from __future__ import annotations

from typing import Any, Optional


class ForkdError(Exception):
    """An error answered by the daemon (or, for `ConnectionFailed`, on the way to it)."""

    kind: str = "internal"

    def __init__(self, message: str, *, kind: Optional[str] = None, request_id: str = "", status: int = 0):
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind
        self.request_id = request_id
        self.status = status

    def __str__(self) -> str:
        rid = f" (request {self.request_id})" if self.request_id else ""
        return f"{self.kind}: {self.message}{rid}"


class BadRequest(ForkdError):
    """400: a malformed request, an invalid value, a command that cannot start."""

    kind = "bad_request"


class NotFound(ForkdError):
    """404: no such sandbox, image, checkpoint, path or endpoint."""

    kind = "not_found"


class Unauthorized(ForkdError):
    """401: over TCP, no API key, or one the daemon does not hold (a wrong or removed key)."""

    kind = "unauthorized"


class Forbidden(ForkdError):
    """403: on a grant's socket, a request outside the grant or past its step budget; or
    outside the scope of the API key."""

    kind = "forbidden"


class Conflict(ForkdError):
    """409: the wrong state (a stopped sandbox, an image in use, CRIU unavailable)."""

    kind = "conflict"


class InternalError(ForkdError):
    """500: the daemon failed; the message carries the whole cause chain."""

    kind = "internal"


class Unavailable(ForkdError):
    """503: the node cannot take the request now (its volume is full or unusable)."""

    kind = "unavailable"


class ConnectionFailed(ForkdError):
    """The daemon could not be reached, timed out, or answered outside the API."""

    kind = "connection"


_BY_KIND: dict[str, type[ForkdError]] = {
    c.kind: c for c in (BadRequest, NotFound, Unauthorized, Forbidden, Conflict, InternalError, Unavailable, ConnectionFailed)
}


def from_answer(status: int, body: Any, request_id: str) -> ForkdError:
    """The exception for an error answer: its `ApiError` body, or what can be said of it."""
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        kind = str(body.get("kind", "internal"))
        cls = _BY_KIND.get(kind, ForkdError)
        return cls(body["message"], kind=kind, request_id=str(body.get("request_id") or request_id), status=status)
    return InternalError(f"HTTP {status} without an API error body", request_id=request_id, status=status)
