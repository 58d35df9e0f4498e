"""Readers for the field's two-speaker corpora, and ``prepare()`` writing the list files a recipe reads.

- ``wsj0-2mix``: ``{tr,cv,tt}/{mix,s1,s2}/*.wav``; ``mix`` is the linked set ``clean``.
- ``wham``: ``{tr,cv,tt}/{mix_clean,mix_both,mix_single,s1,s2,noise}``; linked sets ``clean``, ``both``, ``single``.
- ``librimix``: ``{train-100,train-360,dev,test}/{mix_clean,mix_both,mix_single,s1,s2,noise}`` and
  ``metadata/mixture_<split>_<mode>.csv`` (followed when present); the same linked sets; ``train-100``
  (or ``train="train-360"``) is the training split.

Corpus splits become mtlab's ``train``, ``dev`` and ``test`` (tr, cv, tt for wsj0-2mix and WHAM!).

ROOT may be the folder holding the splits or one above it (``Libri2Mix``, ``2speakers``, ``wham_mix``);
the ``wav8k/min`` (else ``wav8k/max``) folder below it is found.

``prepare(layout, root, out)`` writes, for mtlab's splits ``train``/``dev``/``test``::

    out/<split>/mix_<mode>.scp   name /abs/path.wav   one list per mixture mode = one linked set
    out/<split>/s1.scp, s2.scp   the sources: the targets every linked set of the split shares
    out/<split>/noise.scp        the noise (WHAM!, LibriMix)
    out/<split>/spk.txt          name id1 id2 (speaker ids of s1 and s2, from the file names)
    out/speakers.tsv             id and corpus speaker label
    out/layout.json              what was read: layout, root, split mapping, modes, counts

so a recipe trains on it with ``data = { root = "out", split = "train", linkedset = "clean" }`` (or
``"both"``: the noisy mixtures of the same sources, what the demo calls its noisy linked set).
``single`` (WHAM!'s and LibriMix's ``mix_single`` = s1 + noise) holds only the first speaker: its
utterance-level targets (``spk``) hold, but targets built from both sources (``src_mag``,
``binary_targets``, ``frame_target``) describe s2 too, which that mixture does not contain.
"""

from __future__ import annotations

import csv
import json
import os
import warnings
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .audio import SAMPLE_RATE
from .errors import DataError, DataWarning


@dataclass(frozen=True)
class Mixture:
    """One mixture of a corpus: its files per mode, the source files, the noise and the speaker labels."""

    name: str
    mixtures: dict[str, Path]  # linked set ("clean", "both", "single") -> mixture file
    sources: tuple[Path, ...]  # s1, s2
    speakers: tuple[str, ...]  # corpus speaker label of s1, s2
    noise: Path | None = None


@dataclass(frozen=True)
class Layout:
    """A corpus layout: its split folders (corpus name -> mtlab split), mode folders and name parser."""

    name: str
    splits: dict[str, str]  # corpus split folder -> mtlab split
    modes: dict[str, str]  # corpus mixture folder -> linked set
    speakers: Callable[[str], tuple[str, str]]
    metadata: bool = False  # LibriMix: metadata/mixture_<split>_<mode>.csv lists the mixtures
    description: str = ""


def wsj0_speakers(name: str) -> tuple[str, str]:
    """``011a0101_0.061105_20ho010d_-0.061105`` -> ``("011", "20h")``: WSJ0 utterance ids start with the speaker."""
    parts = name.split("_")
    if len(parts) != 4 or len(parts[0]) < 4 or len(parts[2]) < 4:
        raise DataError(f"{name!r}: not a wsj0-2mix/WHAM! mixture name (utt1_gain1_utt2_gain2, e.g. "
                        "011a0101_0.061105_20ho010d_-0.061105); rename the files or use another layout")
    return parts[0][:3], parts[2][:3]


def librimix_speakers(name: str) -> tuple[str, str]:
    """``103-1240-0003_1235-135887-0017`` -> ``("103", "1235")``: LibriSpeech ids start with the speaker."""
    parts = name.split("_")
    if len(parts) != 2 or any(p.count("-") != 2 for p in parts):
        raise DataError(f"{name!r}: not a Libri2Mix mixture name (spk-chapter-utt_spk-chapter-utt, e.g. "
                        "103-1240-0003_1235-135887-0017); a Libri3Mix or renamed corpus is not supported")
    return parts[0].split("-")[0], parts[1].split("-")[0]


WSJ_SPLITS = {"tr": "train", "cv": "dev", "tt": "test"}
LAYOUTS: dict[str, Layout] = {
    "wsj0-2mix": Layout("wsj0-2mix", WSJ_SPLITS, {"mix": "clean"}, wsj0_speakers,
                        description="wsj0-2mix (Hershey et al. 2016): clean two-speaker WSJ0 mixtures"),
    "wham": Layout("wham", WSJ_SPLITS, {"mix_clean": "clean", "mix_both": "both", "mix_single": "single"},
                   wsj0_speakers, description="WHAM! (Wichern et al. 2019): wsj0-2mix with recorded noise"),
    "librimix": Layout("librimix", {"train-100": "train", "dev": "dev", "test": "test"},
                       {"mix_clean": "clean", "mix_both": "both", "mix_single": "single"}, librimix_speakers,
                       metadata=True, description="Libri2Mix (Cosentino et al. 2020): LibriSpeech + WHAM! noise"),
}
ALIASES = {"wsj0mix": "wsj0-2mix", "wsj02mix": "wsj0-2mix", "wham!": "wham", "libri2mix": "librimix"}


def get_layout(name: str, train: str | None = None) -> Layout:
    """The layout called ``name``; ``train`` picks LibriMix's training folder (``train-100`` or ``train-360``)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in LAYOUTS:
        raise DataError(f"unknown corpus layout {name!r}; choose from {', '.join(LAYOUTS)}")
    layout = LAYOUTS[key]
    if train is not None:
        if key != "librimix" or train not in ("train-100", "train-360"):
            raise DataError(f"train={train!r}: only the librimix layout has a choice of training folder "
                            "(train-100 or train-360)")
        splits = {train: "train", **{k: v for k, v in layout.splits.items() if v != "train"}}
        layout = Layout(layout.name, splits, layout.modes, layout.speakers, layout.metadata, layout.description)
    return layout


def find_split_root(layout: Layout, root: str | Path) -> Path:
    """The folder that holds ``layout``'s split folders: ``root`` itself or a ``wav8k/{min,max}`` below it."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: corpus folder not found")
    candidates = [root]
    for sub in ("", "2speakers", "Libri2Mix", "wham_mix"):
        for mode in ("min", "max"):
            candidates.append(root / sub / "wav8k" / mode if sub else root / "wav8k" / mode)
    for folder in candidates:
        if any((folder / split).is_dir() for split in layout.splits):
            return folder
    if any((root / sub / "wav16k").is_dir() or (root / "wav16k").is_dir() for sub in ("2speakers", "Libri2Mix")):
        raise DataError(f"{root}: only 16 kHz data found; mtlab reads {SAMPLE_RATE} Hz, generate the wav8k version")
    raise DataError(f"{root}: no {layout.name} split folder ({', '.join(layout.splits)}) here or in wav8k/min "
                    "below it; point ROOT at the folder that holds them")


def _wav_names(folder: Path) -> dict[str, Path]:
    """``{name: file}`` of the folder's WAVs in name order (names sorted as strings: sorting 10^5 Path objects
    takes seconds)."""
    with os.scandir(folder) as entries:
        names = sorted(e.name for e in entries if e.name.endswith(".wav") and e.is_file())
    return {n[:-4]: folder / n for n in names}


def _metadata(split_root: Path, split: str, folder: str) -> dict[str, tuple[Path, ...]] | None:
    """LibriMix metadata: ``{mixture_ID: (mixture, source_1, source_2[, noise])}`` with paths moved under
    ``split_root`` when the CSV's absolute paths are from another machine; None when there is no CSV."""
    path = split_root / "metadata" / f"mixture_{split}_{folder}.csv"
    if not path.is_file():
        return None
    rows: dict[str, tuple[Path, ...]] = {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        if "mixture_ID" not in fields or "mixture_path" not in fields:
            raise DataError(f"{path}: not a LibriMix metadata file (needs mixture_ID, mixture_path columns)")
        if "source_3_path" in fields:
            raise DataError(f"{path}: three sources (Libri3Mix); mtlab's separation datasets take two sources")
        columns = ["mixture_path"] + [c for c in ("source_1_path", "source_2_path", "noise_path") if c in fields]
        for number, row in enumerate(reader, start=2):
            rows[row["mixture_ID"]] = tuple(_relocate(Path(row[c]), split_root, f"{path}:{number}") for c in columns)
    return rows


def _relocate(path: Path, split_root: Path, where: str) -> Path:
    """A metadata path as it is here: as written, else ``split_root / <split>/<folder>/<file>``."""
    if path.is_absolute() and path.is_file():
        return path
    moved = split_root.joinpath(*path.parts[-3:])
    if not moved.is_file():
        raise DataError(f"{where}: {path} not found, nor {moved}; the metadata does not match the files")
    return moved


def read_split(layout: Layout, split_root: Path, split: str, modes: Sequence[str] | None = None) -> list[Mixture]:
    """The mixtures of one corpus split folder, joined by name over the modes, sources and noise."""
    folder = split_root / split
    present = {f: ls for f, ls in layout.modes.items() if (folder / f).is_dir()}
    if modes is not None:
        unknown = sorted(set(modes) - set(layout.modes.values()))
        if unknown:
            raise DataError(f"linked set(s) {unknown} are not in {layout.name}; it has "
                            f"{', '.join(layout.modes.values())}")
        wanted = {f: ls for f, ls in layout.modes.items() if ls in modes}
        missing = [ls for f, ls in wanted.items() if f not in present]
        if missing:
            raise DataError(f"{folder}: no mixtures for linked set(s) {missing}; found {sorted(present.values())}")
        present = wanted
    if not present:
        raise DataError(f"{folder}: none of the mixture folders {', '.join(layout.modes)}")
    for needed in ("s1", "s2"):
        if not (folder / needed).is_dir():
            raise DataError(f"{folder}: no {needed}/ folder; {layout.name} keeps each source in s1/ and s2/")
    if (folder / "s3").is_dir():
        raise DataError(f"{folder}: an s3/ folder (three speakers); mtlab's separation datasets take two sources")
    mixtures: dict[str, dict[str, Path]] = {}
    for f, ls in present.items():
        meta = _metadata(split_root, split, f) if layout.metadata else None
        files = {n: row[0] for n, row in meta.items()} if meta is not None else _wav_names(folder / f)
        if not files:
            raise DataError(f"{folder / f}: no .wav files")
        mixtures[ls] = files
    sources = [_wav_names(folder / s) for s in ("s1", "s2")]
    noise = _wav_names(folder / "noise") if (folder / "noise").is_dir() else {}
    first = next(iter(mixtures.values()))
    names = [n for n in first if all(n in m for m in mixtures.values())]
    for ls, files in mixtures.items():
        unmatched = sorted(set(files) - set(names)) or sorted(set(first) - set(files))
        if unmatched:
            raise DataError(f"{folder}: linked set {ls!r} and the others name different mixtures (e.g. "
                            f"{unmatched[0]!r}); every mode must hold the same mixtures")
    out = []
    for name in names:
        src = []
        for k, found in enumerate(sources, start=1):
            if name not in found:
                raise DataError(f"{folder / f's{k}'}: no {name}.wav for the mixture {name!r}")
            src.append(found[name])
        out.append(Mixture(name, {ls: mixtures[ls][name] for ls in mixtures}, tuple(src),
                           layout.speakers(name), noise.get(name)))
    return out


def _check_rate(path: Path) -> None:
    try:
        with wave.open(str(path), "rb") as w:
            rate = w.getframerate()
    except (wave.Error, EOFError, OSError) as err:
        raise DataError(f"{path}: not a readable PCM WAV file ({err})") from err
    if rate != SAMPLE_RATE:
        raise DataError(f"{path}: {rate} Hz; mtlab reads {SAMPLE_RATE} Hz audio, use the corpus's wav8k version")


def read_corpus(layout: str | Layout, root: str | Path, modes: Sequence[str] | None = None,
                train: str | None = None) -> dict[str, list[Mixture]]:
    """``{mtlab split: mixtures}`` of every split folder of ``layout`` found under ``root``."""
    lay = layout if isinstance(layout, Layout) else get_layout(layout, train)
    split_root = find_split_root(lay, root)
    missing = [split for split in lay.splits if not (split_root / split).is_dir()]
    if train is not None and train in missing:
        raise DataError(f"{split_root}: no {train}/ folder for train={train!r}; found "
                        f"{', '.join(s for s in lay.splits if s not in missing)}")
    if missing:
        warnings.warn(f"{split_root}: no {', '.join(missing)} folder; listing the other splits only", DataWarning,
                      stacklevel=2)
    corpus = {mt: read_split(lay, split_root, split, modes) for split, mt in lay.splits.items()
              if split not in missing}
    first = next(iter(corpus.values()))[0]
    _check_rate(next(iter(first.mixtures.values())))
    return corpus


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` wrote: the folder, its splits with their sizes, the linked sets and speakers."""

    out: Path
    layout: str
    counts: dict[str, int]
    linkedsets: tuple[str, ...]
    speakers: tuple[str, ...]

    def __str__(self) -> str:
        sizes = ", ".join(f"{s} {n}" for s, n in self.counts.items())
        return (f"{self.layout} -> {self.out}: {sizes} mixtures; linked sets {', '.join(self.linkedsets)}; "
                f"{len(self.speakers)} speakers")


def prepare(layout: str, root: str | Path, out: str | Path, modes: Sequence[str] | None = None,
            train: str | None = None) -> Prepared:
    """Write the list files a recipe reads (see the module doc) for the corpus at ``root``.

    Examples:
        >>> prepare("librimix", "/data/Libri2Mix", "lists/librimix")  # doctest: +SKIP
        >>> # recipe: data = { root = "lists/librimix", split = "train", linkedset = "both" }
    """
    lay = get_layout(layout, train)
    corpus = read_corpus(lay, root, modes, train)
    out = Path(out)
    labels = sorted({spk for mixes in corpus.values() for m in mixes for spk in m.speakers})
    ids = {label: i for i, label in enumerate(labels)}
    out.mkdir(parents=True, exist_ok=True)
    linkedsets = tuple(next(iter(corpus.values()))[0].mixtures)
    for split, mixes in corpus.items():
        folder = out / split
        folder.mkdir(exist_ok=True)
        for ls in linkedsets:
            _write(folder / f"mix_{ls}.scp", [f"{m.name} {m.mixtures[ls].resolve()}" for m in mixes])
        for k in range(2):
            _write(folder / f"s{k + 1}.scp", [f"{m.name} {m.sources[k].resolve()}" for m in mixes])
        if any(m.noise is not None for m in mixes):
            _write(folder / "noise.scp", [f"{m.name} {m.noise.resolve()}" for m in mixes if m.noise is not None])
        _write(folder / "spk.txt", [f"{m.name} {ids[m.speakers[0]]} {ids[m.speakers[1]]}" for m in mixes])
    _write(out / "speakers.tsv", ["id\tspeaker", *(f"{i}\t{label}" for label, i in ids.items())])
    counts = {split: len(mixes) for split, mixes in corpus.items()}
    info: dict[str, Any] = {"layout": lay.name, "root": str(Path(root).resolve()), "counts": counts,
                            "splits": {mt: corpus_split for corpus_split, mt in lay.splits.items() if mt in counts},
                            "linkedsets": list(linkedsets), "speakers": len(labels)}
    (out / "layout.json").write_text(json.dumps(info, indent=1) + "\n")
    return Prepared(out, lay.name, counts, linkedsets, tuple(labels))


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtlab.data.layouts LAYOUT ROOT OUT [--linkedsets ...] [--train train-360]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mtlab.data.layouts",
                                     description="write the list files of a corpus for mtlab recipes")
    parser.add_argument("layout", help=f"one of {', '.join(LAYOUTS)}")
    parser.add_argument("root", type=Path, help="the corpus folder (e.g. .../Libri2Mix or .../wav8k/min)")
    parser.add_argument("out", type=Path, help="where the lists go (a recipe's data root)")
    parser.add_argument("--linkedsets", nargs="+", default=None, help="mixture modes to list (default: all found)")
    parser.add_argument("--train", default=None, help="librimix: train-100 (default) or train-360")
    args = parser.parse_args(argv)
    try:
        print(prepare(args.layout, args.root, args.out, args.linkedsets, args.train))
    except DataError as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
