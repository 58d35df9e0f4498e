"""The shipped data_samples/ match their manifest and the generator."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from types import ModuleType

import pytest
from helpers.paths import REPO

from mtlab.data import data_samples_dir


def test_files_match_manifest() -> None:
    root = data_samples_dir()
    lines = (root / "MANIFEST.sha256").read_text().splitlines()
    listed = {}
    for line in lines:
        digest, rel = line.split("  ", 1)
        listed[rel] = digest
    # statistics and header lengths cached beside the lists (mix_<set>.stats.json, .samples.npz) are derived
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*")
               if p.is_file() and not p.name.endswith((".stats.json", ".samples.npz"))} - {"MANIFEST.sha256"}
    assert set(listed) == on_disk
    bad = [rel for rel, digest in listed.items() if hashlib.sha256((root / rel).read_bytes()).hexdigest() != digest]
    assert bad == []


def _generator() -> ModuleType:
    if "make_data_samples" in sys.modules:
        return sys.modules["make_data_samples"]
    spec = importlib.util.spec_from_file_location("make_data_samples", REPO / "scripts" / "make_data_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_data_samples"] = module
    spec.loader.exec_module(module)
    return module


def test_plan_matches_shipped_lists() -> None:
    gen = _generator()
    root = data_samples_dir()
    for split, count in gen.SPLITS.items():
        names = [line.split()[0] for line in (root / split / "mix_clean.scp").read_text().splitlines()]
        assert names == [s.name for s in gen.plan() if s.split == split] and len(names) == count


def test_regenerating_one_mixture_gives_identical_bytes() -> None:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng); the manifest test checks the files")
    gen = _generator()
    pytest.importorskip("scipy", reason="the generator resamples with scipy")
    recorded = json.loads((data_samples_dir() / "generation.json").read_text())["espeak_ng"]
    if gen.espeak_version() != recorded:
        pytest.skip(f"installed {gen.espeak_version()!r} differs from {recorded!r} used for the shipped files")
    spec = next(s for s in gen.plan() if s.split == "dev")
    files = gen.render(spec)
    for stream, data in files.items():
        assert data == (data_samples_dir() / "dev" / stream / f"{spec.name}.wav").read_bytes(), stream
