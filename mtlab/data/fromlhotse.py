"""lhotse CutSets of mixtures as mtlab list files, so a corpus described by lhotse manifests trains in mtlab.

Each cut is one mixture: a ``MonoCut`` covering the whole of a one-file mono recording (the mixture), with the
sources as custom ``Recording`` fields ``source_1`` ... ``source_S`` (lhotse's convention for extra signals of a
cut: ``cut.source_1 = Recording.from_file(...)``, read back by ``cut.load_source_1()``) and, optionally, one
supervision per source whose ``speaker`` labels that source. ::

    from lhotse import CutSet
    from mtlab.data import from_lhotse, load_split
    from_lhotse({"train": CutSet.from_jsonl_lazy("cuts_tr.jsonl.gz"), "dev": "cuts_cv.jsonl.gz"}, "lists/mine")
    train = load_split(root="lists/mine", split="train", linkedset="clean", stream=True)

It writes what :func:`mtlab.data.layouts.prepare` writes (``<split>/mix_<linkedset>.scp``, ``s1.scp`` ...,
``spk.txt``, ``speakers.tsv``, ``layout.json``); the audio stays where the manifests point. Cuts are read once,
in order, so lazy manifests are converted in constant memory (the speaker labels excepted). Cuts mtlab cannot
read as files (mixed on the fly, a part of a recording, several channels, another sample rate, in-memory or
URL audio) raise a :class:`DataError` naming the cut and the fix. ``python -m mtlab.data.fromlhotse OUT
train=cuts_tr.jsonl.gz dev=cuts_cv.jsonl.gz`` does the same from the command line. Needs ``pip install
mtlab[lhotse]``.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .audio import SAMPLE_RATE
from .errors import DataError
from .layouts import Prepared

SPLITS = ("train", "dev", "test")


def _cuts(value: Any, split: str) -> Iterable[Any]:
    """A CutSet (or any iterable of cuts) as given, or a manifest path read lazily."""
    if isinstance(value, (str, os.PathLike)):
        try:
            from lhotse import CutSet
        except ImportError as err:
            raise ImportError("reading lhotse manifests needs lhotse: pip install 'mtlab[lhotse]'") from err
        if not Path(value).is_file():
            raise DataError(f"from_lhotse split {split!r}: manifest {value} not found")
        return CutSet.from_jsonl_lazy(value)
    return value


def _file(recording: Any, cut_id: str, what: str) -> str:
    """The absolute path of a recording that mtlab reads whole from one file; else a DataError naming the fix."""
    where = f"cut {cut_id!r}, {what}"
    sources = getattr(recording, "sources", None)
    if sources is None:
        raise DataError(f"{where}: a {type(recording).__name__}, not a lhotse Recording; give a Recording of a WAV "
                        "file")
    if len(sources) != 1 or sources[0].type != "file":
        kinds = ", ".join(s.type for s in sources)
        raise DataError(f"{where}: audio from {len(sources)} source(s) of type {kinds}; mtlab reads one WAV file per "
                        "signal: save it to a file first (e.g. cut.save_audio(path)) and point the Recording there")
    if recording.transforms:
        raise DataError(f"{where}: the recording has transforms ({len(recording.transforms)}, e.g. speed or volume "
                        "perturbation) that mtlab would not apply; save the transformed audio to a file first")
    if recording.num_channels != 1:
        raise DataError(f"{where}: {recording.num_channels} channels; mtlab reads mono files, mix it down first")
    if recording.sampling_rate != SAMPLE_RATE:
        raise DataError(f"{where}: {recording.sampling_rate} Hz; mtlab reads {SAMPLE_RATE} Hz audio, resample it "
                        f"(e.g. cuts.resample({SAMPLE_RATE}) and save the audio)")
    return os.path.abspath(sources[0].source)


def _mixture(cut: Any, num_sources: int) -> tuple[str, str, list[str], list[str]]:
    """(name, mixture file, source files, speaker labels) of one cut."""
    from lhotse import MonoCut

    if not isinstance(cut, MonoCut):
        raise DataError(f"cut {cut.id!r}: a {type(cut).__name__}, not a MonoCut (a MixedCut is mixed on the fly, as "
                        "lhotse's LibriMix recipe does); mtlab reads each mixture from one mono file: save its audio "
                        "(cut.save_audio) and describe it as a MonoCut of that file with source_1 ... source_S fields")
    if len(cut.id.split()) != 1:
        raise DataError(f"cut {cut.id!r}: an id with white space cannot be a list name; rename the cut")
    rec = cut.recording
    if rec is None:
        raise DataError(f"cut {cut.id!r}: no recording; mtlab needs the mixture audio")
    # a sample of slack: durations are floats in seconds, and a whole-file cut may round to one sample less
    if round(cut.start * rec.sampling_rate) != 0 or abs(cut.num_samples - rec.num_samples) > 1:
        raise DataError(f"cut {cut.id!r}: covers {cut.start}-{cut.end} s of recording {rec.id!r} "
                        f"({rec.duration} s); mtlab reads whole files: save the cut's audio to its own file")
    mix = _file(rec, cut.id, "mixture")
    custom = cut.custom or {}
    sources = []
    for k in range(1, num_sources + 1):
        if f"source_{k}" not in custom:
            raise DataError(f"cut {cut.id!r}: no custom field source_{k} (its fields: {sorted(custom) or 'none'}); "
                            f"give each mixture its sources as cut.source_1 ... cut.source_{num_sources} = Recording")
        src = custom[f"source_{k}"]
        sources.append(_file(src, cut.id, f"source_{k}"))
        if src.num_samples != rec.num_samples:
            raise DataError(f"cut {cut.id!r}: source_{k} has {src.num_samples} samples, the mixture "
                            f"{rec.num_samples}; sources must match their mixture sample for sample")
    speakers = [s.speaker for s in cut.supervisions]
    if speakers and (len(speakers) != num_sources or any(s is None for s in speakers)):
        raise DataError(f"cut {cut.id!r}: {len(speakers)} supervision(s) with speakers {speakers}; give one "
                        f"supervision per source (in source order) with its speaker, or none")
    return cut.id, mix, sources, speakers


def from_lhotse(splits: Mapping[str, Any], out: str | Path, linkedset: str = "clean",
                num_sources: int = 2) -> Prepared:
    """Write mtlab's lists for lhotse manifests: ``splits`` maps mtlab splits (``train``, ``dev``, ``test``) to a
    CutSet or a manifest path (``.jsonl.gz``); ``linkedset`` names the mixture list (``mix_<linkedset>.scp``).
    Speaker ids are numbered over all splits (``speakers.tsv``); ``spk.txt`` is written when the cuts name them."""
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown or not splits:
        raise DataError(f"from_lhotse splits {unknown or 'none'}; give CutSets for some of {list(SPLITS)}")
    if not linkedset.isidentifier():
        raise DataError(f"from_lhotse linkedset={linkedset!r}: a name like 'clean' or 'both' (it names mix_<name>.scp)")
    out = Path(out)
    counts: dict[str, int] = {}
    labels: dict[str, list[tuple[str, list[str]]]] = {}
    for split, value in splits.items():
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        files = [folder / f"mix_{linkedset}.scp", *(folder / f"s{k}.scp" for k in range(1, num_sources + 1))]
        handles = [f.open("w", encoding="utf-8") for f in files]
        labels[split] = []
        try:
            for cut in _cuts(value, split):
                name, mix, sources, speakers = _mixture(cut, num_sources)
                for handle, path in zip(handles, [mix, *sources]):
                    handle.write(f"{name} {path}\n")
                labels[split].append((name, speakers))
        finally:
            for handle in handles:
                handle.close()
        counts[split] = len(labels[split])
        if not counts[split]:
            raise DataError(f"from_lhotse split {split!r}: no cuts")
    named = sorted({s for rows in labels.values() for _, spk in rows for s in spk})
    ids = {label: i for i, label in enumerate(named)}
    for split, rows in labels.items():
        with_speakers = [(name, spk) for name, spk in rows if spk]
        if with_speakers and len(with_speakers) != len(rows):
            raise DataError(f"from_lhotse split {split!r}: {len(rows) - len(with_speakers)} of {len(rows)} cuts have no "
                            "speaker supervisions; give them to every cut or to none")
        if with_speakers:
            (out / split / "spk.txt").write_text(
                "".join(f"{name} {' '.join(str(ids[s]) for s in spk)}\n" for name, spk in with_speakers),
                encoding="utf-8")
    if named:
        (out / "speakers.tsv").write_text("id\tspeaker\n" + "".join(f"{i}\t{s}\n" for s, i in ids.items()),
                                          encoding="utf-8")
    info = {"layout": "lhotse", "counts": counts, "linkedsets": [linkedset], "speakers": len(named),
            "manifests": {s: str(v) if isinstance(v, (str, os.PathLike)) else type(v).__name__
                          for s, v in splits.items()}}
    (out / "layout.json").write_text(json.dumps(info, indent=1) + "\n")
    return Prepared(out, "lhotse", counts, (linkedset,), tuple(named))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtlab.data.fromlhotse OUT SPLIT=MANIFEST ... [--linkedset clean] [--num-sources 2]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mtlab.data.fromlhotse",
                                     description="write mtlab list files for lhotse CutSet manifests of mixtures")
    parser.add_argument("out", type=Path, help="where the lists go (a recipe's data root)")
    parser.add_argument("manifests", nargs="+", help="SPLIT=PATH, e.g. train=cuts_tr.jsonl.gz dev=cuts_cv.jsonl.gz")
    parser.add_argument("--linkedset", default="clean")
    parser.add_argument("--num-sources", type=int, default=2)
    args = parser.parse_args(argv)
    bad = [m for m in args.manifests if "=" not in m]
    if bad:
        parser.error(f"{bad[0]!r}: give SPLIT=PATH, SPLIT one of {', '.join(SPLITS)}")
    try:
        print(from_lhotse(dict(m.split("=", 1) for m in args.manifests), args.out, args.linkedset, args.num_sources))
    except DataError as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
