"""Building objects by type name (models and loss computers in recipes).

Domain packages (``mtlab.separation``) register their types into the core tables when imported.
The core never imports them itself: a :class:`Registry` imports the packages listed in
``PLUGINS`` for its kind (with :mod:`importlib`) the first time a name is missing or the full
list of names is asked for. So ``get_loss("deepclustering")`` works without the caller importing
``mtlab.separation`` first. A third-party package adds itself with :func:`add_plugin`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import ConfigError

# Modules imported on a miss, per kind; each registers its types when imported.
PLUGINS: dict[str, list[str]] = {"loss": ["mtlab.separation.losses"], "model": []}


def add_plugin(kind: str, module: str) -> None:
    """Import ``module`` (which registers its types) on the next miss in the ``kind`` registry."""
    PLUGINS.setdefault(kind, [])
    if module not in PLUGINS[kind]:
        PLUGINS[kind].append(module)


class Registry(dict):
    """``name -> type`` table that imports the plugin modules of its kind on a miss or a listing."""

    def __init__(self, kind: str, entries: Mapping[str, type] | None = None) -> None:
        super().__init__(entries or {})
        self.kind = kind
        self._loaded: set[str] = set()

    def load_plugins(self) -> None:
        """Import every plugin module of this kind not imported yet (each once)."""
        for module in list(PLUGINS.get(self.kind, [])):
            if module in self._loaded:
                continue
            self._loaded.add(module)  # before importing: the module's own registration must not recurse
            try:
                importlib.import_module(module)
            except ImportError as exc:
                self._loaded.discard(module)
                raise ConfigError(f"{self.kind} plugin {module!r} could not be imported: {exc}") from exc

    def __contains__(self, name: object) -> bool:
        if dict.__contains__(self, name):
            return True
        self.load_plugins()
        return dict.__contains__(self, name)

    def __missing__(self, name: str) -> type:
        self.load_plugins()
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        self.load_plugins()
        return dict.__iter__(self)

    def keys(self):
        """The registered names, plug-ins loaded first."""
        self.load_plugins()
        return dict.keys(self)

    def items(self):
        """``(name, entry)`` pairs, plug-ins loaded first."""
        self.load_plugins()
        return dict.items(self)

    def __len__(self) -> int:
        self.load_plugins()
        return dict.__len__(self)


def build(kind: str, table: Mapping[str, type], name: str, settings: Mapping[str, Any]) -> Any:
    """``table[name](**settings)``; an unknown name or bad settings is a ConfigError listing the valid names."""
    if name not in table:
        raise ConfigError(f"unknown {kind} type {name!r}; valid: {sorted(table)}")
    try:
        return table[name](**settings)
    except TypeError as exc:
        raise ConfigError(f"{kind} type {name!r}: {exc}") from None
