"""A corpus tree read where it lies: the manifest of a wsj0-2mix, WHAM! or LibriMix split without list files.

``load_split(root="/data/wsj0-2mix", layout="wsj0-2mix", split="train", linkedset="clean", stream=True)`` reads
the tree with :mod:`mtlab.data.layouts`' readers (the same folders, name parsing and LibriMix metadata that
``prepare()`` follows) and holds the result as the compact :class:`~mtlab.data.manifest.Manifest` a list-based
linked set has: the same utterances in the same order, the same absolute paths and the same speaker ids as the
lists ``prepare()`` would write. Nothing is written beside the corpus; the header lengths and feature statistics
are cached in the user cache folder (``$MTLAB_CACHE``, else ``~/.cache/mtlab``), keyed by what they depend on.

A manifest column of a tree has no list file: its ``path`` is the folder of the files (``.../tr/mix``) and its
line numbers count the mixtures from 1, so error messages read ``<folder>:<position>``.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import DataError
from .layouts import (
    ALIASES,
    LAYOUTS,
    Layout,
    Mixture,
    find_split_root,
    get_layout,
    read_corpus,
)
from .lists import JoinReport
from .manifest import Column, Manifest, make_column, pack_manifest, unpack_manifest


@dataclass(frozen=True)
class TreeSplit:
    """One split of a corpus tree: its manifest (every source and the speaker ids), how many speakers the whole
    corpus has (the width of a speaker-id head, as ``speakers.tsv`` of ``prepare()``) and the split folder."""

    manifest: Manifest
    num_speakers: int
    folder: Path


def split_names(layout: Layout) -> dict[str, str]:
    """Every name a split may be asked by: mtlab's (``train``) and the corpus's folder (``tr``) -> mtlab's."""
    return {**{mt: mt for mt in layout.splits.values()}, **layout.splits}


def tree_split(layout: str, root: str | Path, split: str, linkedset: str, num_sources: int = 2) -> TreeSplit:
    """The manifest of ``split`` (mtlab's name or the corpus's folder name) and ``linkedset`` of the ``layout``
    tree at ``root``; a DataError names the valid choices."""
    key = ALIASES.get(layout.lower(), layout.lower())
    if key not in LAYOUTS:
        raise DataError(f"layout={layout!r}: unknown corpus layout; choose from {', '.join(LAYOUTS)}")
    lay = get_layout(key)
    names = split_names(lay)
    if split not in names:
        raise DataError(f"split={split!r}: {lay.name} has the splits {', '.join(dict.fromkeys(names))}")
    if linkedset not in lay.modes.values():
        raise DataError(f"linkedset={linkedset!r}: {lay.name} has the linked sets {', '.join(lay.modes.values())}")
    if num_sources != 2:
        raise DataError(f"num_sources={num_sources}: {lay.name} mixtures have two sources (s1, s2)")
    top = Path(root).resolve()
    splits, speakers = _read_tree(key, str(top), linkedset, _signature(lay, top))
    wanted = names[split]
    if wanted not in splits:
        raise DataError(f"{root}: no {split} split folder in the {lay.name} tree (found {', '.join(splits) or 'none'})")
    manifest, folder = splits[wanted]
    return TreeSplit(manifest, speakers, folder)


def _signature(layout: Layout, root: Path) -> tuple[int, ...]:
    """Modification times of the tree's split and file folders (a file added, removed or renamed changes one)
    and of LibriMix's metadata files."""
    try:
        split_root = find_split_root(layout, root)
    except DataError:
        return ()
    times = []
    for split in layout.splits:
        metadata = sorted((split_root / "metadata").glob(f"mixture_{split}_*.csv"))  # edited in place, too
        for folder in (split_root / split, *(split_root / split / f for f in (*layout.modes, "s1", "s2")),
                       *metadata):
            try:
                times.append(folder.stat().st_mtime_ns)
            except OSError:
                times.append(0)
    return tuple(times)


@lru_cache(maxsize=4)
def _read_tree(layout: str, root: str, linkedset: str,
               signature: tuple[int, ...]) -> tuple[dict[str, tuple[Manifest, Path]], int]:
    """Every split's manifest and the corpus's speaker count, kept for the process while the tree's folders are
    unchanged (``signature``): train and dev each ask. Only compact columns are kept, not the readers' objects.
    They are also kept in the user cache folder (``trees/<key>.npz``), as listing and sorting the folders of a
    30 h corpus takes seconds."""
    from .usercache import user_cache

    key = hashlib.sha256(repr((layout, root, linkedset, signature)).encode()).hexdigest()
    path = user_cache() / "trees" / f"{key}.npz"
    if signature:
        try:
            with np.load(path, allow_pickle=False) as data:
                found = {k: data[k] for k in data.files}
            splits = [str(s) for s in found["splits"]]
            return ({s: (unpack_manifest({k[len(s) + 1:]: v for k, v in found.items() if k.startswith(s + "/")}),
                         Path(str(found[f"{s}/folder"]))) for s in splits}, int(found["speakers"]))
        except (OSError, KeyError, ValueError):
            pass  # not cached yet: read the tree
    out, speakers = _scan_tree(layout, root, linkedset)
    if signature:
        arrays = {"splits": np.array(list(out)), "speakers": np.array(speakers)}
        for s, (manifest, folder) in out.items():
            arrays.update({f"{s}/{k}": v for k, v in pack_manifest(manifest).items()})
            arrays[f"{s}/folder"] = np.array(str(folder))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
            np.savez(tmp, allow_pickle=False, **arrays)  # read back without pickles
            tmp.replace(path)
        except OSError:
            pass  # no writable cache folder: the tree is read each time
    return out, speakers


def _scan_tree(layout: str, root: str, linkedset: str) -> tuple[dict[str, tuple[Manifest, Path]], int]:
    """Every split's manifest and the speaker count, read from the tree by :mod:`mtlab.data.layouts`."""
    import warnings

    with warnings.catch_warnings():  # a tree without its test split is fine to train on
        warnings.simplefilter("ignore")
        corpus = read_corpus(layout, root, modes=[linkedset])
    # speaker ids as prepare() numbers them: the sorted labels of every split
    labels = sorted({spk for mixes in corpus.values() for m in mixes for spk in m.speakers})
    ids = {label: i for i, label in enumerate(labels)}
    out = {split: (_manifest(mixes, linkedset, ids), next(iter(mixes[0].mixtures.values())).parent.parent)
           for split, mixes in corpus.items()}
    return out, len(labels)


def _manifest(mixes: list[Mixture], linkedset: str, ids: dict[str, int]) -> Manifest:
    names = np.array([m.name.encode() for m in mixes], dtype=bytes)
    lines = np.arange(1, len(mixes) + 1, dtype=np.int32)

    def column(paths: list[Path]) -> Column:
        values = np.array([os.fsencode(p) for p in paths], dtype=bytes)
        return make_column(paths[0].parent, values, lines)

    mix = column([m.mixtures[linkedset] for m in mixes])
    sources = tuple(column([m.sources[k] for m in mixes]) for k in range(2))
    spk = make_column(mix.path.parent / "spk", np.array([f"{ids[m.speakers[0]]} {ids[m.speakers[1]]}".encode()
                                                     for m in mixes], dtype=bytes), lines)
    report = JoinReport((mix.path.name, "s1", "s2", "speakers"), len(mixes), (), {})
    return Manifest(names, mix, sources, spk, None, report)
