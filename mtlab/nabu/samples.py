"""A data root in an imported recipe's layout, made from mtlab's sample corpus (``data_samples/``).

Examples:
    >>> recipe = import_nabu("config/recipes/papers/ICASSP2018/MERL_DC_2spk", data_root="/tmp/wsj")  # doctest: +SKIP
    >>> make_sample_root(recipe)   # /tmp/wsj/2speakers/wav8k/min/{tr,cv}/mix_wav.scp, s1.scp, ...  # doctest: +SKIP

Each linked set's training folder gets the samples' ``train`` split, its validation folder the ``dev``
split, with the mixture list named as the recipe expects (``mix_<linkedset>.scp``; the samples' clean
mixtures, or the noisy ones for a linked set whose name contains "noisy"). The audio is linked, not
copied. mtlab's loader computes feature statistics from a split named ``train`` under the same root,
so one is linked to the training folder where the recipe calls it otherwise.

A linked set of more than two speakers per mixture (``data.num_sources``, the processors' ``nrs``) gets
mixtures made from the samples' two-speaker ones (:func:`add_speakers`): each takes the main-speaker source of
the next mixtures of the same split (in list order, wrapping around) whose main speaker it does not have yet,
cut or zero-padded to its length and rescaled to the RMS of its s2, as s3, s4, ...; the WAVs (mixture and every
source, all scaled down together where the sum would clip) and the lists ``s1.scp`` ... ``sN.scp`` and
``spk.txt`` (``name id1 ... idN``) are written in the folder.

A linked set with per-utterance vectors (``data.ivec``, the original's ``matrix2vector_processor``) also gets
its vector list where the recipe reads it, in the original's format: ``name mixture.wav .../ivec<nrcol>/<name>.txt``,
each file one comma-separated row of ``nrcol`` numbers per speaker. A speaker's vector is fixed (a seeded
standard normal draw per speaker id and size), so the same speaker has the same i-vector in every utterance.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import wave

import numpy as np
import torch

from ..base.errors import ConfigError

VECTOR_SEED = 7919  # speaker vectors: torch.Generator seeded with VECTOR_SEED * nrcol + speaker id
SAMPLE_SOURCES = 2  # speakers per mixture of the sample corpus
PEAK = 32000  # largest |sample| of a made mixture (int16), so the rounding of its parts cannot clip


def _copy(src: Path, dst: Path, names: set[str] | None) -> None:
    lines = src.read_text().splitlines(keepends=True)
    dst.write_text("".join(line for line in lines if names is None or line.split(maxsplit=1)[:1][0] in names))


def fill_split(folder: Path, source: Path, linkedset: str, limit: int | None, num_sources: int = SAMPLE_SOURCES) -> None:
    """Fill ``folder`` with the sample corpus's lists of ``linkedset`` from ``source`` (linked, or made for more
    speakers), at most ``limit`` utterances."""
    folder.mkdir(parents=True, exist_ok=True)
    mix = "noisy" if "noisy" in linkedset else "clean"
    if num_sources != SAMPLE_SOURCES:
        add_speakers(folder, source, linkedset, mix, limit, num_sources)
        return
    for sub in (f"mix_{mix}", "s1", "s2"):
        link = folder / sub
        if link.exists() and not link.is_symlink():
            raise ConfigError(f"{link}: holds mixtures of more speakers made here; give each number of speakers "
                              "its own folder")
        if not link.exists():
            link.symlink_to((source / sub).resolve(), target_is_directory=True)
    mixtures = [line.split()[0] for line in (source / f"mix_{mix}.scp").read_text().splitlines() if line.strip()]
    names = set(mixtures[:limit]) if limit is not None else None
    _copy(source / f"mix_{mix}.scp", folder / f"mix_{linkedset}.scp", names)
    for name in ("s1.scp", "s2.scp", "spk.txt"):
        _copy(source / name, folder / name, names)


def _samples(path: Path) -> np.ndarray:
    from ..data import read_wav

    return (read_wav(path).double() * 32768.0).numpy()  # the int16 values, exactly


def _write_wav(path: Path, samples: np.ndarray) -> None:
    from ..data.audio import SAMPLE_RATE

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.astype("<i2").tobytes())


def add_speakers(folder: Path, source: Path, linkedset: str, mix: str, limit: int | None, num_sources: int) -> None:
    """Write ``num_sources``-speaker mixtures of ``source``'s (a sample split) two-speaker ones in ``folder``:
    ``mix_<linkedset>.scp`` (clean or noisy, as ``mix``), ``s1.scp`` ... ``s<num_sources>.scp`` and ``spk.txt``.
    The mixture is the sum of the written sources (plus the samples' noise for ``mix="noisy"``); see the module doc."""
    from ..data import read_list

    if num_sources < SAMPLE_SOURCES:
        raise ConfigError(f"{folder}: num_sources = {num_sources}: the sample corpus has mixtures of "
                          f"{SAMPLE_SOURCES} speakers, which can be added to but not taken apart")
    mixtures = read_list(source / f"mix_{mix}.scp")
    clean, speakers = read_list(source / "mix_clean.scp"), read_list(source / "spk.txt")
    lists = [read_list(source / f"s{k}.scp") for k in (1, 2)]
    order = list(mixtures)
    names = order[:limit] if limit is not None else order
    subs = [f"mix_{mix}", *(f"s{k}" for k in range(1, num_sources + 1))]
    for sub in subs:
        if (folder / sub).is_symlink():  # the samples' own folder: never written to
            raise ConfigError(f"{folder / sub}: links the samples' two-speaker audio; give mixtures of "
                              f"{num_sources} speakers their own folder")
        (folder / sub).mkdir(exist_ok=True)
    lines: dict[str, list[str]] = {sub: [] for sub in (*subs, "spk")}
    for i, name in enumerate(names):
        ids = list(speakers[name].ints(SAMPLE_SOURCES))
        parts = [_samples(lst[name].resolve()) for lst in lists]
        length = parts[0].shape[0]
        noise = _samples(mixtures[name].resolve()) - _samples(clean[name].resolve())  # zero for the clean set
        j = i
        while len(ids) < num_sources:
            j = (j + 1) % len(order)
            if j == i:
                raise ConfigError(f"{source}: {len(set(ids))} speakers in the split, too few for mixtures of "
                                  f"{num_sources}")
            other = order[j]
            speaker = speakers[other].ints(1)[0]
            if speaker in ids:
                continue
            extra = np.zeros(length)
            utt = _samples(lists[0][other].resolve())[:length]
            extra[:utt.shape[0]] = utt
            gain = np.sqrt(np.mean(parts[1] ** 2) / max(np.mean(extra ** 2), 1e-12))
            ids.append(speaker)
            parts.append(extra * gain)
        peak = np.abs(sum(parts) + noise).max()
        scale = min(1.0, PEAK / peak) if peak > 0 else 1.0
        ints = [np.round(p * scale) for p in parts]
        mixture = sum(ints) + np.round(noise * scale)
        for sub, samples in zip(subs, (mixture, *ints)):
            _write_wav(folder / sub / f"{name}.wav", samples)
            lines[sub].append(f"{name} {sub}/{name}.wav\n")
        lines["spk"].append(f"{name} {' '.join(str(s) for s in ids)}\n")
    (folder / f"mix_{linkedset}.scp").write_text("".join(lines[subs[0]]))
    for k in range(1, num_sources + 1):
        (folder / f"s{k}.scp").write_text("".join(lines[f"s{k}"]))
    (folder / "spk.txt").write_text("".join(lines["spk"]))


def write_input_lists(folder: Path, lists: Mapping[str, str], num_sources: int = SAMPLE_SOURCES) -> list[Path]:
    """Stand-ins for the audio lists of a linked set's other inputs (``data.feature_inputs``, e.g. an earlier
    experiment's separated signals): the k-th list (from 0) names, for each mixture of ``folder``, its source
    ``s<k mod num_sources + 1>``, so it matches the mixture sample for sample. A list that exists is kept."""
    from ..data import read_list

    written = []
    for k, path in enumerate(Path(p) for p in lists.values()):
        if path.is_file():
            continue
        sources = read_list(folder / f"s{k % num_sources + 1}.scp")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{name} {entry.resolve().absolute()}\n" for name, entry in sources.items()))
        written.append(path)
    return written


def speaker_genders(samples: Path) -> dict[int, str]:
    """``M`` or ``F`` per sample speaker id, from the voice names in ``speakers.tsv`` (``en-us+m3``, ``en+f2``)."""
    out = {}
    for line in (samples / "speakers.tsv").read_text().splitlines()[1:]:
        if line.strip():
            sid, voice = line.split("\t")[:2]
            out[int(sid)] = "F" if "+f" in voice else "M"
    return out


def write_spkinfo(path: Path, speakers_list: Path, samples: Path) -> Path:
    """The original's speaker-info list (``name <field> id1 gender1 id2 gender2 ...``, which its scorer reads from
    the third word on: ``scorer.py:73-77, 231-236``) for the utterances of a ``spk.txt`` (``name id1 id2``), with
    the sample speakers' genders; returns ``path``."""
    from ..data import read_list

    genders = speaker_genders(samples)
    lines = []
    for name, entry in read_list(speakers_list).items():
        ids = [int(x) for x in entry.fields]
        lines.append(f"{name} {len(ids)} " + " ".join(f"{i} {genders[i]}" for i in ids) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return path


def speaker_vector(speaker: int, nrcol: int) -> list[float]:
    """The fixed ``nrcol``-dimensional vector of a sample speaker (a seeded standard normal draw)."""
    gen = torch.Generator().manual_seed(VECTOR_SEED * nrcol + speaker)
    return torch.randn(nrcol, generator=gen, dtype=torch.float64).tolist()


def write_vectors(folder: Path, linkedset: str, vectors: Mapping[str, Any]) -> Path:
    """Write the vector list ``vectors["list"]`` (and its matrix files) for the utterances of ``folder``'s
    ``mix_<linkedset>.scp``, from the speakers in its ``spk.txt``; returns the list's path."""
    from ..data import read_list

    nrcol, nrs = int(vectors["nrcol"]), int(vectors["nrs"])
    target = Path(vectors["list"])
    target.parent.mkdir(parents=True, exist_ok=True)
    mixtures = read_list(folder / f"mix_{linkedset}.scp")
    speakers = read_list(folder / "spk.txt")
    sub = f"ivec{nrcol}"
    (target.parent / sub).mkdir(exist_ok=True)
    lines = []
    for name, mix in mixtures.items():
        if name not in speakers:
            raise ConfigError(f"{folder / 'spk.txt'}: no speakers for {name!r}, so no i-vectors can be made for it")
        ids = speakers[name].ints(nrs)
        rows = [" ".join(f"{x:.6f}" for x in speaker_vector(spk, nrcol)) for spk in ids]
        (target.parent / sub / f"{name}.txt").write_text(",".join(rows) + "\n")
        # absolute paths, as the original's processor opens them from its working directory
        lines.append(f"{name} {mix.resolve().absolute()} {(target.parent / sub / f'{name}.txt').absolute()}\n")
    target.write_text("".join(lines))
    return target


def make_sample_root(recipe: Mapping[str, Any], samples: str | Path | None = None,
                     limit: int | None = None) -> list[Path]:
    """Write the folders the recipe's linked sets read, from ``samples`` (default: mtlab's sample
    corpus), with at most ``limit`` utterances each; returns them. Paths come from the recipe
    (``import_nabu(..., data_root=...)``)."""
    from ..data import data_samples_dir

    source = Path(samples) if samples is not None else data_samples_dir()
    made: list[Path] = []
    for tname, task in recipe.get("tasks", {}).items():
        for sname, lset in task.get("linkedsets", {}).items():
            data = lset.get("data")
            if not data or "root" not in data:
                raise ConfigError(f"task {tname!r} linked set {sname!r} has no data root to fill")
            root = Path(data["root"])
            name = data.get("linkedset", sname)
            num_sources = data.get("num_sources", SAMPLE_SOURCES)
            fill_split(root / data["split"], source / "train", name, limit, num_sources)
            made.append(root / data["split"])
            if "ivec" in data:
                made.append(write_vectors(root / data["split"], name, data["ivec"]))
            made += write_input_lists(root / data["split"], data.get("feature_inputs", {}), num_sources)
            if data["split"] != "train" and not (root / "train").exists():
                (root / "train").symlink_to(root / data["split"], target_is_directory=True)
            valid = lset.get("valid")
            if valid:
                vroot = Path(valid.get("root", root))
                fill_split(vroot / valid["split"], source / "dev", valid.get("linkedset", name), limit,
                      valid.get("num_sources", num_sources))
                made.append(vroot / valid["split"])
                if "ivec" in valid:
                    made.append(write_vectors(vroot / valid["split"], valid.get("linkedset", name), valid["ivec"]))
                made += write_input_lists(vroot / valid["split"], valid.get("feature_inputs", {}),
                                          valid.get("num_sources", num_sources))
    return made
