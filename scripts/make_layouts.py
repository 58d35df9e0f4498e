"""Miniature corpora in the wsj0-2mix, WHAM! and LibriMix layouts, made from data_samples/.

    python scripts/make_layouts.py OUT [--per-split N] [--layouts wsj0-2mix wham librimix]

writes OUT/<layout>/... with the folder names, file names (speaker ids included) and, for LibriMix, the
metadata CSVs of the real corpora, so ``mtlab.data.layouts.prepare`` can be tried without the corpora.
From each data_samples split (train, dev, test) the first N mixtures are taken: ``mix_clean`` -> ``mix`` /
``mix_clean``, ``mix_noisy`` -> ``mix_both``, noise = ``mix_noisy - mix_clean``, ``mix_single`` = s1 + noise.
"""

from __future__ import annotations

import argparse
import csv
import sys
import wave
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPLITS = {
    "wsj0-2mix": {"train": "tr", "dev": "cv", "test": "tt"},
    "wham": {"train": "tr", "dev": "cv", "test": "tt"},
    "librimix": {"train": "train-100", "dev": "dev", "test": "test"},
}
TOPS = {"wsj0-2mix": "2speakers/wav8k/min", "wham": "wham_mix/wav8k/min", "librimix": "Libri2Mix/wav8k/min"}


def read_pcm(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.int32)


def write_pcm(path: Path, samples: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.clip(samples, -32768, 32767).astype("<i2").tobytes())


def corpus_name(layout: str, split: str, index: int, spk1: int, spk2: int, gain_db: float) -> str:
    """A mixture name as the corpus spells it, carrying the two speaker ids."""
    if layout == "librimix":
        return f"{100 + spk1}-{5000 + index}-{split[:2]}{index:02d}_{100 + spk2}-{6000 + index}-{split[:2]}{index:02d}"
    code = {"train": "c", "dev": "o", "test": "t"}[split]
    return f"4{spk1:02d}{code}{index:04d}_{gain_db / 2:.4f}_4{spk2:02d}{code}{index + 5000:04d}_{-gain_db / 2:.4f}"


def make_tree(layout: str, out: Path, per_split: int = 4, source: Path | None = None) -> Path:
    """Write the miniature ``layout`` tree under ``out``; returns the folder holding its splits."""
    source = source or REPO / "data_samples"
    top = out / TOPS[layout]
    for split, corpus_split in SPLITS[layout].items():
        folder = source / split
        speakers = {}
        for line in (folder / "spk.txt").read_text().splitlines():
            name, a, b = line.split()
            speakers[name] = (int(a), int(b))
        gains = {}
        for line in (folder / "meta.tsv").read_text().splitlines()[1:]:
            fields = line.split("\t")
            gains[fields[0]] = float(fields[5])
        meta: dict[str, list[list[str]]] = {m: [] for m in ("mix_clean", "mix_both", "mix_single")}
        for index, name in enumerate(sorted(speakers)[:per_split]):
            new = corpus_name(layout, split, index, *speakers[name], gains[name])
            clean, noisy = read_pcm(folder / "mix_clean" / f"{name}.wav"), read_pcm(folder / "mix_noisy" / f"{name}.wav")
            s1, s2 = read_pcm(folder / "s1" / f"{name}.wav"), read_pcm(folder / "s2" / f"{name}.wav")
            noise = noisy - clean
            target = top / corpus_split
            files = {"s1": s1, "s2": s2}
            if layout == "wsj0-2mix":
                files["mix"] = clean
            else:
                files.update(mix_clean=clean, mix_both=noisy, mix_single=s1 + noise, noise=noise)
            for stream, samples in files.items():
                write_pcm(target / stream / f"{new}.wav", samples)
            if layout == "librimix":
                paths = {k: str((target / k / f"{new}.wav").resolve()) for k in files}
                length = str(len(clean))
                meta["mix_clean"].append([new, paths["mix_clean"], paths["s1"], paths["s2"], length])
                meta["mix_both"].append([new, paths["mix_both"], paths["s1"], paths["s2"], paths["noise"], length])
                meta["mix_single"].append([new, paths["mix_single"], paths["s1"], paths["noise"], length])
        if layout == "librimix":
            heads = {"mix_clean": ["source_1_path", "source_2_path"],
                     "mix_both": ["source_1_path", "source_2_path", "noise_path"],
                     "mix_single": ["source_1_path", "noise_path"]}
            for mode, rows in meta.items():
                path = top / "metadata" / f"mixture_{corpus_split}_{mode}.csv"
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("w", newline="") as f:
                    writer = csv.writer(f)
                    writer.writerow(["mixture_ID", "mixture_path", *heads[mode], "length"])
                    writer.writerows(rows)
    return top


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-split", type=int, default=8, help="mixtures per split (default 8)")
    parser.add_argument("--layouts", nargs="+", default=list(SPLITS), choices=list(SPLITS))
    args = parser.parse_args(argv)
    for layout in args.layouts:
        top = make_tree(layout, args.out / layout, args.per_split)
        print(f"{layout}: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
