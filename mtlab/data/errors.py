"""Errors and warnings of mtlab's data layer."""
from __future__ import annotations

from ..base.errors import DataError, MtlabError  # DataError lives in base: the streams (tasks layer) raise it too

__all__ = ["DataError", "DataWarning", "MtlabError"]


class DataWarning(UserWarning):
    """Data was usable but something was dropped or adjusted (e.g. utterances missing from a list)."""
