"""Checkpoint files: atomic writes, and loads that never unpickle arbitrary objects."""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from .errors import MtlabError


class CheckpointError(MtlabError, OSError):
    """A checkpoint that cannot be written or read; the message names the file."""


def save_atomic(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save`` to a temporary file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise CheckpointError(f"could not write checkpoint {path}: {exc.strerror or exc}; "
                                  "the previous checkpoint (if any) is intact. Free disk space or choose another path") from exc
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def load_safe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain containers only."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, KeyError) as exc:
        raise CheckpointError(
            f"{path} is not a readable mtlab checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "it may be truncated, corrupted or contain objects other than tensors and plain containers, "
            "which mtlab refuses to unpickle"
        ) from exc
    if not isinstance(obj, dict) or obj.get("format") != "mtlab-trainer":
        raise CheckpointError(f"{path} is not an mtlab trainer checkpoint (no 'format': 'mtlab-trainer' entry)")
    return obj
