"""Kaldi-style list files (``name value ...`` per line) and joining several lists by utterance name.

A relative path in a list is resolved against the directory of the list file; absolute paths are kept.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DataError, DataWarning


@dataclass(frozen=True)
class ListEntry:
    """One parsed line: the utterance ``name``, the remaining ``fields``, and where it came from."""

    name: str
    fields: tuple[str, ...]
    path: Path
    line: int

    @property
    def value(self) -> str:
        """The fields joined by single spaces (the whole value for ``name path`` lists)."""
        return " ".join(self.fields)

    @property
    def where(self) -> str:
        """``file:line`` for error messages."""
        return f"{self.path}:{self.line}"

    def resolve(self) -> Path:
        """The value as a path, relative paths taken from the list file's directory."""
        value = Path(self.value)
        return value if value.is_absolute() else self.path.parent / value

    def ints(self, count: int) -> tuple[int, ...]:
        """The first ``count`` fields as integers, or a DataError naming this line."""
        if len(self.fields) < count:
            raise DataError(f"{self.where}: expected {count} integer fields after the name, got {len(self.fields)}")
        try:
            return tuple(int(f) for f in self.fields[:count])
        except ValueError as err:
            raise DataError(f"{self.where}: expected integers after the name, got {self.value!r}") from err


def read_list(path: str | Path) -> dict[str, ListEntry]:
    """Parse a list file into ``{name: ListEntry}`` in file order; blank lines are skipped.

    Raises DataError for a missing file, a line that is not UTF-8, a line without a value, or a repeated name.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: list file not found; check the data root and split name")
    entries: dict[str, ListEntry] = {}
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                            "save the list as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        parts = text.split()
        if not parts:
            continue
        if len(parts) < 2:
            raise DataError(f"{path}:{number}: expected 'name value', got {text.rstrip()!r}")
        name = parts[0]
        if name in entries:
            first = entries[name].line
            raise DataError(f"{path}:{number}: name {name!r} repeats line {first}; names must be unique")
        entries[name] = ListEntry(name, tuple(parts[1:]), path, number)
    return entries


@dataclass(frozen=True)
class JoinReport:
    """What :func:`join_lists` kept and dropped; ``missing[label]`` are the names absent from that list."""

    labels: tuple[str, ...]
    kept: int
    dropped: tuple[str, ...]
    missing: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def num_dropped(self) -> int:
        """How many utterances the join left out."""
        return len(self.dropped)

    def __str__(self) -> str:
        text = f"joined {len(self.labels)} lists: kept {self.kept} utterances, dropped {self.num_dropped}"
        details = [f"{len(names)} missing from {label}" for label, names in self.missing.items() if names]
        return text + (f" ({'; '.join(details)})" if details else "")


def join_lists(lists: Mapping[str, Mapping[str, ListEntry]]) -> tuple[list[str], JoinReport]:
    """Names present in every list (in the first list's order) and a report of the dropped ones.

    ``lists`` maps a label (e.g. the list file name) to a parsed list. Dropped utterances trigger a
    :class:`DataWarning`; an empty result raises DataError naming the lists.
    """
    if not lists:
        raise DataError("join_lists needs at least one list")
    labels = tuple(lists)
    common = set.intersection(*(set(entries) for entries in lists.values()))
    everything: dict[str, None] = {}
    for entries in lists.values():
        everything.update(dict.fromkeys(entries))
    names = [name for name in lists[labels[0]] if name in common]
    dropped = tuple(name for name in everything if name not in common)
    missing = {label: tuple(n for n in everything if n not in lists[label]) for label in labels}
    report = JoinReport(labels, len(names), dropped, missing)
    if not names:
        sizes = ", ".join(f"{label} ({len(lists[label])} names)" for label in labels)
        raise DataError(f"no utterance name is in all of: {sizes}; the lists describe different utterances")
    if dropped:
        warnings.warn(str(report), DataWarning, stacklevel=2)
    return names, report
