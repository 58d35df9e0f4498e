"""Reading the original's INI files as it did: Python 2 ``ConfigParser`` semantics (option names
lower-cased, ``#``/``;`` comment lines, a repeated option keeps its last value), every value a string."""

from __future__ import annotations

import configparser
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, overload

from ..base.errors import ConfigError


class SpecReader(Protocol):
    """What the readers of one file (an architecture's spec function, a database section, a loss table) need of
    an import (``mtlab.nabu.importer.Importer`` is one): the recipe folder, typed values, and a record of what
    mtlab refuses or takes from a default."""

    folder: Path
    defaults: list[str]

    def refuse(self, file: str, key: str, why: str) -> None: ...
    def unknown(self, file: str, where: str, key: str, valid: tuple[str, ...] | list[str]) -> ConfigError: ...
    def value(self, file: str, key: str, kind: str, text: str) -> Any: ...


@overload
def read_ini(path: Path, required: Literal[True] = True) -> configparser.ConfigParser:
    """A required file: parsed, or a ConfigError."""


@overload
def read_ini(path: Path, required: bool) -> configparser.ConfigParser | None:
    """A file that may be missing: None then."""



def read_ini(path: Path, required: bool = True) -> configparser.ConfigParser | None:
    """The parsed file, or None when it is missing and not ``required``."""
    parser = configparser.ConfigParser(interpolation=None, strict=False, inline_comment_prefixes=None)
    if not path.is_file():
        if required:
            raise ConfigError(f"{path}: not found; an original recipe folder has trainer.cfg, model.cfg, "
                              "database.conf (or database.cfg) and validation_evaluator.cfg")
        return None
    try:
        parser.read(path)
    except configparser.Error as exc:
        raise ConfigError(f"{path}: not a valid INI file: {exc}") from None
    return parser


def section(parser: configparser.ConfigParser, name: str, path: Path) -> dict[str, str]:
    """One section as a dict of stripped strings; a missing section is a ConfigError naming the file."""
    if not parser.has_section(name):
        raise ConfigError(f"{path}: no [{name}] section; sections: {parser.sections() or 'none'}")
    return {k: v.strip() for k, v in parser.items(name)}


def words(text: str) -> list[str]:
    """Space-separated values (the original splits on ' '; empty parts dropped)."""
    return [w for w in text.split() if w]


def section_kind(file: Path, where: str, conf: Mapping[str, str], kind_key: str, kinds: Sequence[str], does: str,
                 keys: Sequence[str], setting: str, required: Sequence[str] = ()) -> str:
    """A section's ``kind_key`` (one of ``kinds``: "mtlab <does> <kinds>" otherwise), once each of its keys is a
    ``setting`` mtlab honours (one of ``keys``) and the ``required`` ones are there; else a ConfigError naming it."""
    kind = conf.get(kind_key, "")
    if kind not in kinds:
        raise ConfigError(f"{file}: {where} {kind_key} = {kind!r}: mtlab {does} {', '.join(kinds)}")
    for key in conf:
        if key not in keys:
            raise ConfigError(f"{file}: {where} {key}: not a {setting} setting mtlab honours (it honours "
                              f"{', '.join(keys)})")
    for key in required:
        if key not in conf:
            raise ConfigError(f"{file}: {where} needs {key} (the original reads it)")
    return kind
