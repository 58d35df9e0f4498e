"""Tiny WAV files and corpora for the data tests, and the corpus layouts of scripts/make_layouts.py."""

from __future__ import annotations

import importlib.util
import wave
from pathlib import Path
from types import ModuleType

import numpy as np
from helpers.paths import REPO

import mtlab


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



def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_layouts", REPO / "scripts" / "make_layouts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_layouts = _script()


def recipe(root: Path, linkedsets: list[str], speakers: int) -> dict:
    """Two tasks (speaker id, frame dominance) on a shared BLSTM, trained on the prepared lists."""
    sets = {ls: {"weight": 1.0, "data": {"root": str(root), "split": "train", "linkedset": ls},
                 "valid": {"split": "dev"}} for ls in linkedsets}
    return {
        "name": "layout",
        "trainer": {"num_steps": 2, "batch_size": 2, "initial_learning_rate": 1e-3, "clip_grad_value": 1.0,
                    "numbuckets": 1, "seed": 0, "device": "cpu"},
        "models": {"enc": {"type": "BLSTM", "input_dim": 129, "hidden": 8},
                   "pool": {"type": "MeanPool"},
                   "spk_head": {"type": "Linear", "in_features": 16, "out_features": speakers},
                   "frame_head": {"type": "Linear", "in_features": 16, "out_features": 3}},
        "tasks": {
            "spk": {"inputs": ["features"], "targets": ["spk"], "outputs": ["logits"],
                    "nodes": [{"name": "h", "model": "enc", "inputs": ["features"]},
                              {"name": "pooled", "model": "pool", "inputs": ["h"]},
                              {"name": "logits", "model": "spk_head", "inputs": ["pooled"]}],
                    "loss": {"type": "crossentropy", "output": "logits", "target": "spk"}, "linkedsets": sets},
            "frames": {"inputs": ["features"], "targets": ["frame_target"], "outputs": ["logits"],
                       "nodes": [{"name": "h", "model": "enc", "inputs": ["features"]},
                                 {"name": "logits", "model": "frame_head", "inputs": ["h"]}],
                       "loss": {"type": "crossentropy", "output": "logits", "target": "frame_target"},
                       "linkedsets": sets},
        },
    }


def build(spec: dict) -> object:
    """The trainer of a recipe dict, through the shell's recipe API (``mtlab.from_recipe`` once it exists)."""
    if hasattr(mtlab, "from_recipe"):
        return mtlab.from_recipe(spec).trainer
    from mtlab.apps.recipe import build_trainer

    return build_trainer(spec)
