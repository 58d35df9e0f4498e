"""The shipped separator's file against a fresh evaluation, and the training script's resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtlab.core.state import load_safe
from mtlab.separation.pretrained import WEIGHTS, load_pretrained, pretrained_info

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_pretrained_separator.py"


@pytest.fixture(scope="module")
def shipped():
    torch.set_num_threads(1)
    return load_pretrained(), pretrained_info()


def test_shipped_file_is_small_and_says_how_it_was_made() -> None:
    info = pretrained_info()
    assert WEIGHTS.stat().st_size <= 5_000_000
    assert info["steps"] > 0 and info["train_cpu_seconds"] > 0
    assert len(info["test_names"]) == len(info["test_each_si_sdri"]) > 0


@pytest.mark.slow  # loads the corpus' features: about 3 s of CPU
def test_stored_figures_match_a_fresh_evaluation(shipped) -> None:
    sep, info = shipped
    few = 4
    df = sep.evaluate("test", limit=few, metrics=("si_sdr",))
    assert list(df["name"]) == info["test_names"][:few]
    torch.testing.assert_close(torch.tensor(list(df["si_sdri"])), torch.tensor(info["test_each_si_sdri"][:few]),
                               atol=2e-3, rtol=0)
    whole = sep.evaluate("test", metrics=("si_sdr",))
    assert abs(float(whole["si_sdri"].mean()) - info["test_si_sdri"]) <= 0.006  # stored rounded to 0.01 dB
    assert info["test_si_sdri"] == pytest.approx(sum(info["test_each_si_sdri"]) / len(info["test_each_si_sdri"]),
                                                 abs=0.006)
    assert info["test_ibm_si_sdri"] > info["test_si_sdri"]  # the ideal mask bounds what a mask reaches


def _train(run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["--hidden", "8", "--layers", "1", "--steps", "8", "--save-every", "2", "--eval-every", "0",
            "--run", str(run), "--out", str(run / "never.pt")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MTLAB_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args, *extra], capture_output=True, text=True, env=env,
                          timeout=600)


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.slow  # four runs of the script
def test_a_resumed_run_continues_exactly_and_refuses_other_settings(tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    for res in (_train(straight, "--stop-at", "4"), _train(split, "--stop-at", "2"),
                _train(split, "--stop-at", "4")):
        assert res.returncode == 0, res.stdout + res.stderr
    assert "resumed" in res.stdout and "at step 2" in res.stdout
    a, b = load_safe(straight / "checkpoint.pt"), load_safe(split / "checkpoint.pt")
    assert a["step"] == b["step"] == 4 and a["recipe"] == b["recipe"]
    for part in ("models", "update", "streams", "rng", "tasks"):
        _same(a[part], b[part], part)
    assert b["cpu_seconds"] > 0 and not (split / "never.pt").exists()  # the budget (8 steps) is not spent
    refused = _train(split, "--stop-at", "6", "--lr", "0.01")
    assert refused.returncode != 0 and "other settings" in refused.stderr and "'lr': (0.001, 0.01)" in refused.stderr
    assert load_safe(split / "checkpoint.pt")["step"] == 4
