"""How a job and a client reach each other: the connection file and the signed messages.

A job publishes ``attach.json`` in its experiment folder, readable only by its owner (mode 0600), as a Jupyter
kernel publishes its connection file: the address (``127.0.0.1`` and a free port by default), the process, and a
random key. Every message, both ways, is JSON signed with HMAC-SHA256 under that key (the signing of Jupyter's
messaging protocol); a message whose signature does not match, or that was seen before, is refused. The transport
is ZeroMQ (``pyzmq``: ``pip install "mtlab[attach]"``).

When the job ends it rewrites the file without the key, saying how it ended (``"ended": {"reason", "step"}``),
so that a client learns it even when the job can no longer answer.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..base.errors import MtlabError

CONNECTION_FILE = "attach.json"
SCHEME = "hmac-sha256"


class AttachError(MtlabError, RuntimeError):
    """A job cannot be reached or refused a command (the message says why and what to do)."""


class JobEnded(AttachError):
    """The job this client is attached to has ended (``reason``: done, stopped, interrupted, error) or died."""

    def __init__(self, message: str, reason: str = "ended", step: int | None = None) -> None:
        super().__init__(message)
        self.reason, self.step = reason, step


def need_zmq() -> Any:
    """The ``zmq`` module, or an ImportError naming the extra that installs it."""
    try:
        import zmq
    except ImportError as exc:
        raise ImportError('attaching to a job needs pyzmq; install it with: pip install "mtlab[attach]"') from exc
    return zmq


def new_key() -> str:
    """A random secret of 256 bits, as hex."""
    return secrets.token_hex(32)


def sign(key: str, body: bytes) -> bytes:
    """The HMAC-SHA256 signature of ``body`` under ``key``, as hex bytes."""
    return hmac.new(key.encode("ascii"), body, hashlib.sha256).hexdigest().encode("ascii")


def encode(key: str, message: dict[str, Any]) -> list[bytes]:
    """The frames of a signed message: ``[signature, body]``."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return [sign(key, body), body]


class Verifier:
    """Checks the signature of each message and refuses one seen before (a replayed message), as Jupyter's
    session keeps a history of digests."""

    def __init__(self, key: str, remember: int = 4096) -> None:
        self.key = key
        self._seen: deque[bytes] = deque(maxlen=remember)
        self._seen_set: set[bytes] = set()

    def decode(self, signature: bytes, body: bytes) -> dict[str, Any] | None:
        """The message, or None when its signature is wrong or was seen before."""
        if not hmac.compare_digest(sign(self.key, body), signature):
            return None
        if signature in self._seen_set:
            return None
        if len(self._seen) == self._seen.maxlen:
            self._seen_set.discard(self._seen[0])
        self._seen.append(signature)
        self._seen_set.add(signature)
        try:
            message = json.loads(body)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None


def write_private(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path``, readable and writable by its owner only (0600) from its first byte,
    replacing any earlier file at once (never a moment with a half-written or readable secret)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an earlier file of that name kept its mode
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def connection(ip: str, port: int, key: str, expdir: Path, world_size: int) -> dict[str, Any]:
    """What ``attach.json`` holds while the job runs."""
    return {"transport": "tcp", "ip": ip, "port": int(port), "key": key, "signature_scheme": SCHEME,
            "pid": os.getpid(), "host": socket.gethostname(), "expdir": str(expdir.resolve()),
            "world_size": int(world_size), "started": round(time.time(), 3)}


def read_connection(where: str | Path | dict[str, Any]) -> tuple[dict[str, Any] | None, Path | None]:
    """(the connection file's contents or None if there is none yet, its path) for an experiment folder, the
    file itself, or the contents as a dict."""
    if isinstance(where, dict):
        return dict(where), None
    path = Path(where)
    if path.is_dir() or not path.suffix:
        path = path / CONNECTION_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, path
    except PermissionError as exc:
        raise AttachError(f"{path}: cannot be read ({exc.strerror}); it is readable only by the user who started "
                          "the job: attach as that user") from None
    try:
        data = json.loads(text)
    except ValueError:
        return None, path  # being replaced: read again
    return (data if isinstance(data, dict) else None), path


def process_gone(info: dict[str, Any]) -> bool:
    """True when the file names a process of this machine that no longer runs (a job killed without a word)."""
    if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
