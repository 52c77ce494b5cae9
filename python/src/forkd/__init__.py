"""forkd's Python client and harness adapters.

- `forkd.Client` / `forkd.AsyncClient`: the daemon's API on its Unix socket, typed
  results (`forkd.types`), errors as exceptions carrying the API's kind, message and
  request id (`forkd.errors`).
- `forkd.minisweagent.ForkdEnvironment`: a mini-swe-agent environment on a forkd
  sandbox, started from an image or forked from a checkpoint.
"""

from .aio import AsyncClient
from .client import Client
from .errors import BadRequest, Conflict, ConnectionFailed, Forbidden, ForkdError, InternalError, NotFound, Unauthorized, Unavailable
from .types import (
    BranchInfo,
    CheckpointInfo,
    ExecRecord,
    ExecResult,
    ExportResult,
    ForkResult,
    GcResult,
    ImageInfo,
    Limits,
    OpStats,
    SandboxInfo,
    VersionInfo,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BadRequest",
    "BranchInfo",
    "CheckpointInfo",
    "Client",
    "Conflict",
    "Forbidden",
    "ConnectionFailed",
    "ExecRecord",
    "ExecResult",
    "ExportResult",
    "ForkResult",
    "ForkdError",
    "GcResult",
    "ImageInfo",
    "InternalError",
    "Unauthorized",
    "Unavailable",
    "Limits",
    "NotFound",
    "OpStats",
    "SandboxInfo",
    "VersionInfo",
]
