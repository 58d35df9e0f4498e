"""The user cache folder, where parsed lists, manifests, header lengths and statistics are kept between runs."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MTLAB_CACHE"


def user_cache() -> Path:
    """The user cache folder: ``$MTLAB_CACHE``, else ``~/.cache/mtlab``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mtlab")
