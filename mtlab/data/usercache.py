"""The user cache folder, where parsed lists, manifests, header lengths and statistics are kept between runs.

Statistics and header lengths go beside a corpus's lists when that folder is writable, except for mtlab's own
sample corpus, which stays as shipped (a checkout's ``git status`` stays clean, an installed package unchanged).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MTLAB_CACHE"


def user_cache() -> Path:
    """The user cache folder: ``$MTLAB_CACHE``, else ``~/.cache/mtlab``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mtlab")


SAMPLE_CORPORA = tuple(p.resolve() for p in (Path(__file__).resolve().parents[2] / "data_samples",
                                             Path(__file__).resolve().parents[1] / "data_samples"))


def beside_allowed(list_file: Path) -> bool:
    """A cache may be written beside ``list_file`` (False inside mtlab's sample corpus)."""
    where = list_file.resolve()
    return not any(where.is_relative_to(root) for root in SAMPLE_CORPORA)
