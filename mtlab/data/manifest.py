"""A linked set's lists held as compact columns: memory of a few dozen bytes per utterance, no Python object each.

The lists (``mix_<set>.scp``, ``s1.scp`` ... ``sS.scp``, ``spk.txt``) are read one after the other, joined by
utterance name onto the mixture list (as :func:`mtlab.data.lists.join_lists` does: names missing from a list are
dropped with a :class:`DataWarning`), and kept as numpy arrays: each list's values as bytes without their common
prefix, and its line numbers. DataLoader workers then share these pages without copying them (a list of Python
objects would be copied page by page as reference counts change). :meth:`Column.entry` gives a
:class:`ListEntry` back for one utterance when it is read.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

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
        """Line ``i``'s value (the common prefix and its own suffix)."""
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
        """The lines where ``keep`` (bool) is true."""
        return Column(self.path, self.prefix, self.suffixes[keep], self.lines[keep])


def _parse(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(names, values, line numbers) of a list as numpy arrays; the per-line Python objects live only here."""
    if not path.is_file():
        raise DataError(f"{path}: list file not found; check the data root and split name")
    names: list[bytes] = []
    values: list[bytes] = []
    lines: list[int] = []
    with path.open("rb") as f:
        for number, text in enumerate(f, start=1):
            parts = text.split(maxsplit=1)
            if not parts:
                continue
            if len(parts) < 2:
                raise DataError(f"{path}:{number}: expected 'name value', got {text.decode('utf-8', 'replace').rstrip()!r}")
            names.append(parts[0])
            values.append(b" ".join(parts[1].split()))
            lines.append(number)
    out = np.array(names, dtype=bytes), np.array(values, dtype=bytes), np.array(lines, dtype=np.int32)
    del names, values, lines
    order = np.argsort(out[0], kind="stable")
    repeat = np.flatnonzero(out[0][order][1:] == out[0][order][:-1])
    if repeat.size:
        first, again = sorted(order[repeat[0]:repeat[0] + 2])
        raise DataError(f"{path}:{out[2][again]}: name {out[0][again].decode()!r} repeats line {out[2][first]}; names "
                        "must be unique")
    return out


def make_column(path: Path, values: np.ndarray, lines: np.ndarray) -> Column:
    """A list column of ``values`` (bytes per utterance) stored as their common prefix and the rest."""
    if len(values) == 0 or values.dtype.itemsize == 0:
        return Column(path, "", values.astype(bytes), lines.astype(np.int32))
    ordered = np.sort(values)
    # of all: the first and last agree on it (bytes in, bytes out: commonprefix's '' is for an empty list only)
    prefix = cast(bytes, os.path.commonprefix([bytes(ordered[0]), bytes(ordered[-1])]))
    width = values.dtype.itemsize
    cut = values.view(np.uint8).reshape(len(values), width)[:, len(prefix):].copy()
    suffixes = cut.view(f"S{max(width - len(prefix), 1)}").reshape(-1) if width > len(prefix) else \
        np.zeros(len(values), dtype="S1")
    return Column(path, prefix.decode("utf-8"), suffixes, lines.astype(np.int32))


@dataclass(frozen=True)
class Manifest:
    """Names and joined list columns of one linked set: ``mix``, ``sources`` (S), ``speakers``, ``vector`` and
    ``inputs``: audio lists featurized as the mixture is (other inputs of the same kind)."""

    names: np.ndarray  # dtype S, UTF-8
    mix: Column
    sources: tuple[Column, ...]
    speakers: Column | None
    vector: Column | None
    report: JoinReport
    inputs: tuple[Column, ...] = ()

    def __len__(self) -> int:
        return len(self.names)

    def name(self, i: int) -> str:
        """The name of utterance ``i``."""
        return self.names[i].decode("utf-8")

    def subset(self, keep: np.ndarray) -> Manifest:
        """The utterances where ``keep`` (bool) is true."""
        part = (lambda c: c.subset(keep) if c is not None else None)
        return Manifest(self.names[keep], self.mix.subset(keep), tuple(c.subset(keep) for c in self.sources),
                        part(self.speakers), part(self.vector), self.report,
                        tuple(c.subset(keep) for c in self.inputs))


def read_manifest(mix: Path, sources: list[Path], speakers: Path | None = None,
                  vector: Path | None = None, inputs: tuple[Path, ...] = ()) -> Manifest:
    """The mixture list ``mix`` joined by name with the source lists, the speaker list, the vector list and the
    audio lists of other inputs."""
    names, values, lines = _parse(mix)
    if not len(names):
        raise DataError(f"{mix}: the list has no utterances")
    others = {**{f"s{k}": p for k, p in enumerate(sources, start=1)},
              **({"spk": speakers} if speakers is not None else {}), **({"vector": vector} if vector is not None else {}),
              **{f"input{k}": p for k, p in enumerate(inputs)}}
    order = np.argsort(names, kind="stable")
    ordered = names[order]
    present = np.ones(len(names), dtype=bool)
    columns: dict[str, Column] = {}
    missing: dict[str, tuple[str, ...]] = {}
    extra: dict[str, None] = {}
    for label, path in others.items():
        o_names, o_values, o_lines = _parse(path)
        pos = np.minimum(np.searchsorted(ordered, o_names), len(ordered) - 1)
        hit = ordered[pos] == o_names
        where = np.full(len(names), -1, dtype=np.int64)
        where[order[pos[hit]]] = np.flatnonzero(hit)
        extra.update(dict.fromkeys(n.decode() for n in o_names[~hit]))
        found = where >= 0
        present &= found
        missing[path.name] = tuple(n.decode() for n in names[~found])
        columns[label] = make_column(path, np.where(found, o_values[np.maximum(where, 0)], b""),
                                 np.where(found, o_lines[np.maximum(where, 0)], 0))
    labels = (mix.name, *(p.name for p in others.values()))
    dropped = tuple([*(n.decode() for n in names[~present]), *extra])
    report = JoinReport(labels, int(present.sum()), dropped, {mix.name: tuple(extra), **missing})
    if not present.any():
        sizes = ", ".join(str(p) for p in (mix, *others.values()))
        raise DataError(f"no utterance name is in all of: {sizes}; the lists describe different utterances")
    if dropped:
        warnings.warn(str(report), DataWarning, stacklevel=3)
    full = Manifest(names, make_column(mix, values, lines), tuple(columns[f"s{k}"] for k in range(1, len(sources) + 1)),
                    columns.get("spk"), columns.get("vector"), report,
                    tuple(columns[f"input{k}"] for k in range(len(inputs))))
    return full if present.all() else full.subset(present)


def pack_manifest(m: Manifest) -> dict[str, np.ndarray]:
    """The manifest as named arrays (for ``np.savez``); :func:`unpack_manifest` reads them back."""
    out: dict[str, np.ndarray] = {"names": m.names, "labels": np.array(m.report.labels), "kept": np.array(m.report.kept)}
    columns = {"mix": m.mix, **{f"s{k}": c for k, c in enumerate(m.sources, start=1)},
               **({"spk": m.speakers} if m.speakers is not None else {}), **({"vector": m.vector} if m.vector else {}),
               **{f"input{k}": c for k, c in enumerate(m.inputs)}}
    for label, c in columns.items():
        out.update({f"{label}.path": np.array(str(c.path)), f"{label}.prefix": np.array(c.prefix),
                    f"{label}.suffixes": c.suffixes, f"{label}.lines": c.lines})
    return out


def unpack_manifest(data: Any) -> Manifest:
    """The manifest of :func:`pack_manifest`'s arrays (a mapping); KeyError when they are not one."""
    def column(label: str) -> Column | None:
        if f"{label}.path" not in data:
            return None
        return Column(Path(str(data[f"{label}.path"])), str(data[f"{label}.prefix"]), data[f"{label}.suffixes"],
                      data[f"{label}.lines"])

    sources: list[Column] = []
    while (c := column(f"s{len(sources) + 1}")) is not None:
        sources.append(c)
    inputs: list[Column] = []
    while (c := column(f"input{len(inputs)}")) is not None:
        inputs.append(c)
    labels = tuple(str(x) for x in data["labels"])
    report = JoinReport(labels, int(data["kept"]), (), {label: () for label in labels})
    mix = column("mix")
    if mix is None:
        raise KeyError("mix.path")  # not a manifest file
    return Manifest(data["names"], mix, tuple(sources), column("spk"), column("vector"), report, tuple(inputs))


def cached_manifest(key: bytes, build: Callable[[], Manifest]) -> Manifest:
    """``build()``, kept in the user cache folder (``manifests/<sha256 of key>.npz``) and read back next time:
    a list of many utterances parses in about a second, its arrays load in a few milliseconds. ``key`` must hold
    everything the manifest depends on (the lists' bytes, or a corpus tree's folder times). A manifest that
    dropped utterances in its join is not cached (its warning is shown again each time)."""
    from .usercache import user_cache

    path = user_cache() / "manifests" / f"{hashlib.sha256(key).hexdigest()}.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            return unpack_manifest({k: data[k] for k in data.files})
    except (OSError, KeyError, ValueError):
        pass  # not cached yet, or unreadable: build it
    manifest = build()
    if not manifest.report.dropped:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
            np.savez(tmp, allow_pickle=False, **pack_manifest(manifest))  # read back without pickles
            tmp.replace(path)  # atomic: ranks starting together never read half a file
        except OSError:
            pass  # no writable cache folder: parse the lists each time
    return manifest


def read_manifest_cached(mix: Path, sources: list[Path], speakers: Path | None = None,
                         vector: Path | None = None, inputs: tuple[Path, ...] = ()) -> Manifest:
    """:func:`read_manifest`, through :func:`cached_manifest` keyed by the lists' paths and bytes."""
    key = hashlib.sha256()
    for path in (mix, *sources, speakers, vector, *inputs):
        if path is not None:
            key.update(str(Path(path).resolve()).encode() + b"\0")
            try:
                key.update(Path(path).read_bytes())
            except OSError:
                return read_manifest(mix, sources, speakers, vector, inputs)  # its own error names the missing list
            key.update(b"\0")
        key.update(b"|")  # an absent list (None) and the next one's position stay apart
    m = cached_manifest(key.digest(), lambda: read_manifest(mix, sources, speakers, vector, inputs))
    # the lists as this call names them (the cache may hold another spelling of the same files' paths)
    at = (lambda c, p: replace(c, path=Path(p)) if c is not None and p is not None else c)
    return Manifest(m.names, at(m.mix, mix), tuple(at(c, p) for c, p in zip(m.sources, sources)),
                    at(m.speakers, speakers), at(m.vector, vector), m.report,
                    tuple(at(c, p) for c, p in zip(m.inputs, inputs)))
