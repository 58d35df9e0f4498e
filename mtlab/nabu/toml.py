"""``write_toml(recipe, path)``: a recipe dict as a TOML file that ``tomllib`` reads back equal."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE.match(key) else json.dumps(key)


def _value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, where) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(str(k))} = {_value(v, where)}" for k, v in value.items()) + " }"
    raise ConfigError(f"write_toml: {where} = {value!r} ({type(value).__name__}) has no TOML form")


def _table(lines: list[str], name: str, table: Mapping[str, Any]) -> None:
    plain = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    nested = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    if name and (plain or not nested):
        lines.append(f"\n[{name}]")
    for key, value in plain.items():
        if value is None:
            raise ConfigError(f"write_toml: {name or 'top level'} {key} is None; TOML has no null")
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            body = ",\n".join(f"    {_value(v, f'{name}.{key}')}" for v in value)
            lines.append(f"{_key(str(key))} = [\n{body},\n]")
        else:
            lines.append(f"{_key(str(key))} = {_value(value, f'{name}.{key}')}")
    for key, value in nested.items():
        _table(lines, f"{name}.{_key(str(key))}" if name else _key(str(key)), value)


def toml_text(recipe: Mapping[str, Any]) -> str:
    """The TOML text of ``recipe``: scalars first, then one ``[table]`` per nested mapping."""
    lines: list[str] = []
    _table(lines, "", recipe)
    return "\n".join(lines).lstrip("\n") + "\n"


def write_toml(recipe: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``recipe`` to ``path`` as TOML; returns the path."""
    path = Path(path)
    path.write_text(toml_text(recipe))
    return path
