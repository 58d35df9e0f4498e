"""A data root in an imported recipe's layout, made from mtlab's sample corpus (``data_samples/``).

>>> recipe = import_nabu("config/recipes/papers/ICASSP2018/MERL_DC_2spk", data_root="/tmp/wsj")
>>> make_sample_root(recipe)   # /tmp/wsj/2speakers/wav8k/min/{tr,cv}/mix_wav.scp, s1.scp, ...

Each linked set's training folder gets the samples' ``train`` split, its validation folder the ``dev``
split, with the mixture list named as the recipe expects (``mix_<linkedset>.scp``; the samples' clean
mixtures, or the noisy ones for a linked set whose name contains "noisy"). The audio is linked, not
copied. mtlab's loader computes feature statistics from a split named ``train`` under the same root,
so one is linked to the training folder where the recipe calls it otherwise.

A linked set with per-utterance vectors (``data.ivec``, the original's ``matrix2vector_processor``) also gets
its vector list where the recipe reads it, in the original's format: ``name mixture.wav .../ivec<nrcol>/<name>.txt``,
each file one comma-separated row of ``nrcol`` numbers per speaker. A speaker's vector is fixed (a seeded
standard normal draw per speaker id and size), so the same speaker has the same i-vector in every utterance.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError

VECTOR_SEED = 7919  # speaker vectors: torch.Generator seeded with VECTOR_SEED * nrcol + speaker id


def _copy(src: Path, dst: Path, names: set[str] | None) -> None:
    lines = src.read_text().splitlines(keepends=True)
    dst.write_text("".join(line for line in lines if names is None or line.split(maxsplit=1)[:1][0] in names))


def _fill(folder: Path, source: Path, linkedset: str, limit: int | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    mix = "noisy" if "noisy" in linkedset else "clean"
    for sub in (f"mix_{mix}", "s1", "s2"):
        link = folder / sub
        if not link.exists():
            link.symlink_to((source / sub).resolve(), target_is_directory=True)
    mixtures = [line.split()[0] for line in (source / f"mix_{mix}.scp").read_text().splitlines() if line.strip()]
    names = set(mixtures[:limit]) if limit is not None else None
    _copy(source / f"mix_{mix}.scp", folder / f"mix_{linkedset}.scp", names)
    for name in ("s1.scp", "s2.scp", "spk.txt"):
        _copy(source / name, folder / name, names)


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
            _fill(root / data["split"], source / "train", name, limit)
            made.append(root / data["split"])
            if "ivec" in data:
                made.append(write_vectors(root / data["split"], name, data["ivec"]))
            if data["split"] != "train" and not (root / "train").exists():
                (root / "train").symlink_to(root / data["split"], target_is_directory=True)
            valid = lset.get("valid")
            if valid:
                vroot = Path(valid.get("root", root))
                _fill(vroot / valid["split"], source / "dev", valid.get("linkedset", name), limit)
                made.append(vroot / valid["split"])
                if "ivec" in valid:
                    made.append(write_vectors(vroot / valid["split"], valid.get("linkedset", name), valid["ivec"]))
    return made
