"""Helpers for the data-layer tests: tiny WAV files and corpora."""
from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def write_wav(path: Path, samples: np.ndarray, rate: int = 8000, width: int = 2, channels: int = 1) -> Path:
    """Write int samples as PCM WAV (``samples`` [N] or [N, channels])."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = {1: "u1", 2: "<i2"}[width]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples).astype(dtype).tobytes())
    return path


def make_corpus(root: Path, names: list[str], lengths: list[int] | None = None, seed: int = 0) -> Path:
    """A split ``root/train`` with mix_clean/s1/s2 lists and spk.txt; returns the split folder."""
    rng = np.random.default_rng(seed)
    folder = root / "train"
    lengths = lengths or [1000 + 137 * i for i in range(len(names))]
    lists: dict[str, list[str]] = {"mix_clean": [], "s1": [], "s2": []}
    for name, n in zip(names, lengths):
        s1 = (rng.standard_normal(n) * 3000).astype(np.int64)
        s2 = (rng.standard_normal(n) * 1000).astype(np.int64)
        for stream, x in (("s1", s1), ("s2", s2), ("mix_clean", s1 + s2)):
            write_wav(folder / stream / f"{name}.wav", x)
            lists[stream].append(f"{name} {stream}/{name}.wav")
    for stream, lines in lists.items():
        (folder / f"{stream}.scp").write_text("\n".join(lines) + "\n")
    (folder / "spk.txt").write_text("".join(f"{name} {i % 3} {(i + 1) % 3}\n" for i, name in enumerate(names)))
    return folder
