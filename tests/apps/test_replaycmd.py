"""`mtlab replay EXPDIR`: an experiment trained, resumed and validated by the CLI reruns bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.recipes import write_tiny_recipe

from mtlab.apps.cli import main
from mtlab.core.journal import Journal


@pytest.mark.slow  # trains a recipe twice and replays it (in-process, a few seconds)
def test_replay_reruns_a_trained_and_resumed_experiment(tiny_corpus: Path, tmp_path: Path, one_thread,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    recipe = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=6, valid_frequency=2)
    exp = tmp_path / "exp"
    assert main(["train", str(recipe), "--expdir", str(exp), "--steps", "3", "--no-progress", "--threads", "1"]) == 0
    assert main(["resume", str(exp), "--no-progress", "--threads", "1"]) == 0
    journal = Journal.read_file(exp)
    assert [e["kind"] for e in journal.changes()].count("resume") == 1
    capsys.readouterr()
    assert main(["replay", str(exp), "--expdir", str(tmp_path / "again"), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("replay identical") and "step 6" in last, out
    assert (tmp_path / "again" / "history.csv").read_text() == (exp / "history.csv").read_text()
    assert Journal.read_file(tmp_path / "again").entries == journal.entries
