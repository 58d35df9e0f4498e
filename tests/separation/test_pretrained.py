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


@pytest.mark.slow  # the script scores the mean on dev and test
def test_average_writes_the_mean_of_the_files_weights_and_counts_their_work_once(tmp_path: Path) -> None:
    base = torch.load(WEIGHTS, map_location="cpu", weights_only=True)
    prior = base["info"]
    files = []
    for i, (sign, steps) in enumerate([(1.0, 10), (-0.5, 30)]):
        blob = {**base, "models": {n: {k: (v.float() + sign * 1e-2).half() if v.is_floating_point() else v
                                       for k, v in m.items()} for n, m in base["models"].items()},
                "info": {**prior, "steps": prior["steps"] + steps, "train_cpu_seconds": prior["train_cpu_seconds"] + 100,
                         "recipe": f"stage {i}"}}
        files.append(tmp_path / f"stage{i}.pt")
        torch.save(blob, files[-1])
    out = tmp_path / "mean.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MTLAB_THREADS": "1"}
    res = subprocess.run([sys.executable, str(SCRIPT), "--average", *map(str, files), "--init-from", str(WEIGHTS),
                          "--out", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    mean = torch.load(out, map_location="cpu", weights_only=True)
    a, b = (torch.load(f, map_location="cpu", weights_only=True) for f in files)
    for name, params in mean["models"].items():
        for k, v in params.items():
            if v.is_floating_point():  # the mean of the two, rounded to float16 once
                want = ((a["models"][name][k].float() + b["models"][name][k].float()) / 2).half()
                assert torch.equal(v, want), f"{name}.{k}"
    info = pretrained_info(out)
    assert info["steps"] == prior["steps"] + 40  # the common start once, each file's own steps beyond it
    assert info["train_cpu_seconds"] == pytest.approx(prior["train_cpu_seconds"] + 200, abs=0.2)
    assert "stage0.pt: stage 0" in info["recipe"] and "stage1.pt: stage 1" in info["recipe"]
    assert info["dev_si_sdri"] == pytest.approx(float(load_pretrained(path=out).evaluate("dev")["si_sdri"].mean()),
                                                abs=0.01)
