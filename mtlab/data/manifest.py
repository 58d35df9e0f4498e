"""A linked set's lists held as compact columns: memory of a few dozen bytes per utterance, no Python object each.

The lists (``mix_<set>.scp``, ``s1.scp`` ... ``sS.scp``, ``spk.txt``) are read one after the other, joined by
utterance name onto the mixture list (as :func:`mtlab.data.lists.join_lists` does: names missing from a list are
dropped with a :class:`DataWarning`), and kept as numpy arrays: each list's values as bytes without their common
prefix, and its line numbers. DataLoader workers then share these pages without copying them (a list of Python
objects would be copied page by page as reference counts change). :meth:`Column.entry` gives a
:class:`ListEntry` back for one utterance when it is read.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError, DataWarning
from .lists import JoinReport, ListEntry


@dataclass(frozen=True)
class Column:
    """One list file's values (common prefix + per-utterance suffix bytes) and line numbers, in manifest order."""

    path: Path
    prefix: str
    suffixes: np.ndarray  # dtype S: the value after the prefix, UTF-8
    lines: np.ndarray  # int32

    def value(self, i: int) -> str:
        return self.prefix + self.suffixes[i].decode("utf-8")

    def resolved(self, i: int) -> str:
        """The value as a path (relative ones from the list's folder), as a string: no Path object is made, as
        pathlib keeps every file name it parses (interned) for the life of the process."""
        value = self.value(i)
        return value if os.path.isabs(value) else os.path.join(os.path.dirname(self.path), value)

    def where(self, i: int) -> str:
        """``list:line`` for error messages."""
        return f"{self.path}:{int(self.lines[i])}"

    def entry(self, i: int, name: str) -> ListEntry:
        """Line ``i`` as :func:`mtlab.data.lists.read_list` gives it."""
        return ListEntry(name, tuple(self.value(i).split()), self.path, int(self.lines[i]))

    def subset(self, keep: np.ndarray) -> Column:
        return Column(self.path, self.prefix, self.suffixes[keep], self.lines[keep])


def _parse(path: Path) -> tuple[list[str], list[str], list[int]]:
    if not path.is_file():
        raise DataError(f"{path}: list file not found; check the data root and split name")
    names: list[str] = []
    values: list[str] = []
    lines: list[int] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            parts = text.split(maxsplit=1)
            if not parts:
                continue
            if len(parts) < 2:
                raise DataError(f"{path}:{number}: expected 'name value', got {text.rstrip()!r}")
            name = parts[0]
            if name in seen:
                raise DataError(f"{path}:{number}: name {name!r} repeats line {seen[name]}; names must be unique")
            seen[name] = number
            names.append(name)
            values.append(" ".join(parts[1].split()))
            lines.append(number)
    return names, values, lines


def _column(path: Path, values: list[str], lines: list[int]) -> Column:
    prefix = os.path.commonprefix(values) if values else ""
    suffixes = np.array([v[len(prefix):].encode("utf-8") for v in values], dtype=bytes)
    return Column(path, prefix, suffixes, np.asarray(lines, dtype=np.int32))


@dataclass(frozen=True)
class Manifest:
    """Names and joined list columns of one linked set: ``mix``, ``sources`` (S), ``speakers``, ``vector``."""

    names: np.ndarray  # dtype S, UTF-8
    mix: Column
    sources: tuple[Column, ...]
    speakers: Column | None
    vector: Column | None
    report: JoinReport

    def __len__(self) -> int:
        return len(self.names)

    def name(self, i: int) -> str:
        return self.names[i].decode("utf-8")

    def subset(self, keep: np.ndarray) -> Manifest:
        """The utterances where ``keep`` (bool) is true."""
        part = (lambda c: c.subset(keep) if c is not None else None)
        return Manifest(self.names[keep], self.mix.subset(keep), tuple(c.subset(keep) for c in self.sources),
                        part(self.speakers), part(self.vector), self.report)


def read_manifest(mix: Path, sources: list[Path], speakers: Path | None = None,
                  vector: Path | None = None) -> Manifest:
    """The mixture list ``mix`` joined by name with the source lists, the speaker list and the vector list."""
    names, values, lines = _parse(mix)
    if not names:
        raise DataError(f"{mix}: the list has no utterances")
    others = {**{f"s{k}": p for k, p in enumerate(sources, start=1)},
              **({"spk": speakers} if speakers is not None else {}), **({"vector": vector} if vector is not None else {})}
    index = {n: i for i, n in enumerate(names)}
    present = np.ones(len(names), dtype=bool)
    columns: dict[str, Column] = {}
    missing: dict[str, tuple[str, ...]] = {}
    extra: dict[str, None] = {}
    for label, path in others.items():
        o_names, o_values, o_lines = _parse(path)
        where = np.full(len(names), -1, dtype=np.int64)
        for j, n in enumerate(o_names):
            i = index.get(n)
            if i is None:
                extra[n] = None
            else:
                where[i] = j
        present &= where >= 0
        missing[str(path.name)] = tuple(names[i] for i in np.flatnonzero(where < 0))
        rows = where.tolist()
        columns[label] = _column(path, [o_values[j] if j >= 0 else "" for j in rows],
                                 [o_lines[j] if j >= 0 else 0 for j in rows])
        del o_names, o_values, o_lines, rows
    labels = (mix.name, *(p.name for p in others.values()))
    dropped = tuple([*(names[i] for i in np.flatnonzero(~present)), *extra])
    report = JoinReport(labels, int(present.sum()), dropped, {mix.name: tuple(extra), **missing})
    if not present.any():
        sizes = ", ".join(str(p) for p in (mix, *others.values()))
        raise DataError(f"no utterance name is in all of: {sizes}; the lists describe different utterances")
    if dropped:
        warnings.warn(str(report), DataWarning, stacklevel=3)
    full = Manifest(np.array([n.encode("utf-8") for n in names], dtype=bytes), _column(mix, values, lines),
                    tuple(columns[f"s{k}"] for k in range(1, len(sources) + 1)), columns.get("spk"),
                    columns.get("vector"), report)
    return full if present.all() else full.subset(present)
