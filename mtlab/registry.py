"""Building objects by type name (models and loss computers in recipes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigError


def build(kind: str, table: Mapping[str, type], name: str, settings: Mapping[str, Any]) -> Any:
    """``table[name](**settings)``; an unknown name or bad settings is a ConfigError listing the valid names."""
    if name not in table:
        raise ConfigError(f"unknown {kind} type {name!r}; valid: {sorted(table)}")
    try:
        return table[name](**settings)
    except TypeError as exc:
        raise ConfigError(f"{kind} type {name!r}: {exc}") from None
