"""Data that moved: the experiment's own recipe.toml (or recipe.json) is where its data locations change; resume,
evaluate and replay read them, refuse any other edit naming the key, and refuse data that are not the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.recipes import make_tiny_corpus, write_tiny_recipe

from mtlab.apps.cli import main

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


@pytest.fixture()
def moved(tmp_path: Path) -> tuple[Path, Path, Path]:
    """An experiment trained 3 steps on a corpus that then moved: (expdir, old place, new place)."""
    old, new = tmp_path / "old" / "corpus", tmp_path / "disk2" / "corpus"
    make_tiny_corpus(old)
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", old, num_steps=6, valid_frequency=2)
    exp = tmp_path / "exp"
    assert main(["train", str(recipe), "--expdir", str(exp), "--steps", "3", "--no-progress", "--threads", "1"]) == 0
    new.parent.mkdir()
    shutil.move(old, new)
    return exp, old, new


def test_resume_evaluate_and_replay_follow_the_edited_recipe(moved: tuple[Path, Path, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    exp, old, new = moved
    assert main(["resume", str(exp), "--no-progress", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{exp / 'recipe.toml'}:" in err and "write its new place as root in" in err, err
    toml = exp / "recipe.toml"
    toml.write_text(toml.read_text().replace(f'"{old}"', f'"{new}"'))
    assert main(["evaluate", str(exp), "--threads", "1"]) == 0
    assert main(["resume", str(exp), "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"data.root moved: {old} -> {new}" in out, out
    assert json.loads((exp / "summary.json").read_text())["step"] == 6
    assert main(["replay", str(exp), "--no-progress", "--threads", "1"]) == 0  # bit for bit, on the moved data
    assert "replay identical" in capsys.readouterr().out


def test_only_data_locations_may_change(moved: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    exp, old, new = moved
    toml = exp / "recipe.toml"
    text = toml.read_text().replace(f'"{old}"', f'"{new}"')
    toml.write_text(text.replace("initial_learning_rate = 0.01", "initial_learning_rate = 0.02"))
    before = {p.name: p.stat().st_mtime_ns for p in exp.iterdir()}
    for command in (["resume", str(exp), "--no-progress"], ["evaluate", str(exp)], ["replay", str(exp)]):
        assert main([*command, "--threads", "1"]) == 2
        err = capsys.readouterr().err
        assert f"{toml}: [trainer] initial_learning_rate is 0.02 here, 0.01 when the run started" in err, err
        assert "only data locations may change" in err and "put back" in err, err
    assert {p.name: p.stat().st_mtime_ns for p in exp.iterdir()} == before  # nothing written


def test_a_different_corpus_is_refused_saying_what_differs(moved: tuple[Path, Path, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    exp, old, new = moved
    other = make_tiny_corpus(tmp_path / "other", {"train": 6, "dev": 4})
    toml = exp / "recipe.toml"
    toml.write_text(toml.read_text().replace(f'"{old}"', f'"{other}"'))
    assert main(["resume", str(exp), "--no-progress", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "is not the data this experiment was trained on: 6 examples, the run trained on 8" in err, err
    assert str(toml) in err


def test_a_run_of_a_recipe_dict_moves_its_data_in_recipe_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    import mtlab

    old, new = tmp_path / "corpus", tmp_path / "moved"
    make_tiny_corpus(old)
    recipe = tomllib.loads(write_tiny_recipe(tmp_path / "r.toml", old).read_text())
    exp = tmp_path / "exp"
    mtlab.run(mtlab.from_recipe(recipe), steps=2, progress=False, expdir=exp)
    assert not (exp / "recipe.toml").exists()
    shutil.move(old, new)
    text = (exp / "recipe.json").read_text()
    (exp / "recipe.json").write_text(text.replace(str(old), str(new)))
    assert main(["evaluate", str(exp), "--threads", "1"]) == 0, capsys.readouterr().err
    (exp / "recipe.json").write_text(text.replace(str(old), str(new)).replace('"batch_size": 3', '"batch_size": 4'))
    assert main(["evaluate", str(exp), "--threads", "1"]) == 2
    assert "[trainer] batch_size is 4 here, 3 when the run started" in capsys.readouterr().err


def test_moved_on_the_command_line(moved: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    exp, old, new = moved
    assert main(["evaluate", str(exp), "--moved", f"{old.parent}={new.parent}", "--threads", "1"]) == 0
    assert f"data.root moved: {old} -> {new}" in capsys.readouterr().out
    assert main(["evaluate", str(exp), "--moved", f"/nowhere={new.parent}", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "--moved /nowhere=" in err and "no data location of the experiment is under /nowhere" in err, err
    assert main(["replay", str(exp), "--moved", f"{old}={new}", "--no-progress", "--threads", "1"]) == 0
    assert "replay identical" in capsys.readouterr().out
    assert main(["resume", str(exp), "--moved", f"{old}={new}", "--no-progress", "--threads", "1"]) == 0
    assert main(["evaluate", str(exp), "--threads", "1"]) == 0  # the resumed run's checkpoints carry the new place
