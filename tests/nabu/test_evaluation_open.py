"""Opening an experiment to test: what a checkpoint without the importer's record needs to be given."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtlab.base.errors import ConfigError
from mtlab.core.state import digest
from mtlab.nabu.evaluation import evaluate_tests, open_test


def own_experiment(folder: Path) -> Path:
    """An experiment whose recipe mtlab's own (not imported: no ``nabu`` table)."""
    state = {"format": "mtlab-trainer", "recipe": {"name": "own"}}
    torch.save({**state, "checksum": digest(state)}, folder / "final.pt")
    return folder


def test_a_recipe_not_imported_needs_the_recipe_folder_and_the_data_root(tmp_path: Path) -> None:
    expdir = own_experiment(tmp_path)
    with pytest.raises(ConfigError, match=r"--recipe DIR"):
        open_test(expdir)
    with pytest.raises(ConfigError, match=r"names no data root; give the folder .* \(--data-root DIR\)"):
        open_test(expdir, recipe_dir=tmp_path)


def test_tasks_to_run_need_a_trainer(tmp_path: Path) -> None:
    from mtlab.nabu.evaluation import EvalTask

    refused = EvalTask("a", {}, 1, None, refused="its loss has no mtlab implementation")
    assert evaluate_tests(None, {"a": refused}, tmp_path).summary == [{"task": "a", "refused": refused.refused}]
    with pytest.raises(ConfigError, match="'b': evaluate_tests needs the trainer"):
        evaluate_tests(None, {"a": refused, "b": EvalTask("b", {"linkedsets": {}}, 1, None)}, tmp_path)
