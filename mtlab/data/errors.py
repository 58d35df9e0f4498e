"""Errors and warnings of mtlab's data layer."""
from __future__ import annotations

from ..base.errors import MtlabError


class DataError(MtlabError, ValueError):
    """Bad input data; the message names the file (and line) and what to do about it."""


class DataWarning(UserWarning):
    """Data was usable but something was dropped or adjusted (e.g. utterances missing from a list)."""
