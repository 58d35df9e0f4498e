"""The command line, end to end in subprocesses: train, resume, evaluate, demo; bad input exits 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.recipes import write_tiny_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

from mtlab.apps.cli import main


def mtlab_cmd(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "mtlab", *args, "--threads", "1"], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_train_resume_evaluate(tiny_corpus: Path, tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=6, valid_frequency=2)
    exp = tmp_path / "exp"
    done = mtlab_cmd("train", str(recipe), "--expdir", str(exp), "--steps", "3", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "validation at step 2" in done.stdout and "steps         3 / 6" in done.stdout
    for name in ("recipe.toml", "recipe.json", "best.pt", "final.pt", "history.csv", "validation.csv",
                 "losses.png", "grad_norms.png", "summary.json", "summary.txt"):
        assert (exp / name).is_file(), name
    assert main(["train", str(recipe), "--expdir", str(exp)]) == 2  # would overwrite: refused, in-process
    done = mtlab_cmd("resume", str(exp), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["step"] == 6 and summary["finished"] and summary["stop"] in ("done", "num_tries")
    assert len((exp / "history.csv").read_text().splitlines()) == 1 + 6
    done = mtlab_cmd("evaluate", str(exp), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads((exp / "evaluation_valid.json").read_text())
    assert set(result["loss"]) == {"spk/clean", "frames/clean", "frames/noisy"}


@pytest.mark.slow
def test_demo_runs_a_few_steps(tiny_corpus: Path, tmp_path: Path) -> None:
    done = mtlab_cmd("demo", "--steps", "2", "--expdir", "demo", "--no-progress", cwd=tmp_path,
                     env={"MTLAB_DATA": str(tiny_corpus)})
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["recipe"] == "demo" and summary["step"] == 2 and summary["stop"] == "steps"
    out = done.stdout
    # the quick demo: 8 of the recipe's 25 epochs, said with its expected cost at the start
    assert summary["num_steps"] < 375 and "8 of recipes/demo.toml's 25 epochs, about" in out.splitlines()[1], out
    # it ends by naming its folder, what it wrote and what to try next
    last = out.splitlines()[-5:]
    assert last[0].startswith("wrote in demo: figures losses.png, grad_norms.png") and "journal.jsonl" in last[0], last
    assert last[1] == "next:" and "mtlab replay demo" in last[3] and "recipes/demo.toml" in last[4], last


@pytest.mark.parametrize("text,expect", [
    ("[trainer]\nnumbatches_to_aggregate = 0\n", "numbatches_to_aggregate = 0 is not allowed"),
    ("[trainer\n", "not valid TOML"),
])
def test_bad_recipe_exits_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                           expect: str) -> None:
    (tmp_path / "bad.toml").write_text(text)
    assert main(["train", str(tmp_path / "bad.toml"), "--expdir", str(tmp_path / "exp")]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and expect in err and "Traceback" not in err
    assert main(["resume", str(tmp_path / "nothing")]) == 2
    assert "nothing to resume: no checkpoint in" in capsys.readouterr().err


@pytest.mark.parametrize("cpus,load,local,torch_default,expect", [
    (2, 4.0, 1, 2, 1),     # a shared 2-core machine under load 4: one thread, not torch's 2
    (2, 0.1, 1, 2, 2),     # the same machine idle: both cores
    (16, 3.0, 1, 8, 8),    # never more than torch's own choice (its physical cores)
    (16, 0.0, 4, 16, 4),   # four local ranks share the cores
])
def test_the_default_thread_count_does_not_oversubscribe(monkeypatch: pytest.MonkeyPatch, cpus: int, load: float,
                                                         local: int, torch_default: int, expect: int) -> None:
    import torch

    from mtlab.apps import cli

    monkeypatch.setattr(cli, "_usable_cpus", lambda: cpus)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_default)
    n, why = cli.default_threads()
    assert n == expect and f"{cpus} CPUs" in why and f"load {load:.1f}" in why and "--threads" in why


@pytest.mark.slow
def test_train_says_how_many_threads_run(tiny_corpus: Path, tmp_path: Path) -> None:
    from mtlab.training.loop import _postfix

    recipe = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=1, valid_frequency=0)
    done = mtlab_cmd("train", str(recipe), "--expdir", str(tmp_path / "exp"), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "threads: 1 torch thread (--threads 1)" in done.stdout
    from mtlab.apps.recipe import from_recipe

    exp = from_recipe(recipe)
    exp.trainer.step()
    assert _postfix(exp.trainer)["threads"] == "1"  # the progress bar shows it too (one_thread fixture)


@pytest.mark.parametrize("steps", ["-3", "x"])
def test_steps_below_one_are_refused_before_anything(steps: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.toml").write_text("[trainer]\n")
    with pytest.raises(SystemExit) as stop:
        main(["train", str(tmp_path / "r.toml"), "--expdir", str(tmp_path / "exp"), "--steps", steps])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and ">= 1" in err and "--overwrite" not in err.splitlines()[-1], err
    assert not (tmp_path / "exp").exists()


@pytest.mark.slow
def test_bad_data_names_the_data_as_the_fix_and_never_resume(tiny_corpus: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    corpus = Path(shutil.copytree(tiny_corpus, tmp_path / "corpus"))
    spk = corpus / "train" / "spk.txt"
    spk.write_text(spk.read_text().replace(" 1\n", " spk1\n", 1))  # a speaker id that is not a number
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", corpus)
    exp = tmp_path / "exp"
    assert main(["train", str(recipe), "--expdir", str(exp), "--no-progress", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "after fixing the data" in err and "--overwrite" in err and "fail the same way" in err, err
    assert main(["train", str(recipe), "--expdir", str(exp), "--no-progress", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "stopped before its first step" in err and "--overwrite" in err and "mtlab resume" not in err, err
