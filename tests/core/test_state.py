"""Checkpoint I/O: a rank that does not write says so; state checks name what differs; trees are cloned."""

from __future__ import annotations

import logging

import pytest
import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.core import state as checkpoint


def trainer() -> mtlab.Trainer:
    ex = make_examples(10, 2)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], device="cpu")


def test_a_rank_other_than_zero_writes_nothing_and_says_so(tmp_path, caplog) -> None:
    tr = trainer()
    tr.step()
    with caplog.at_level(logging.INFO, logger="mtlab"):
        assert checkpoint.save_trainer(tr.state_dict(), tmp_path / "r1.pt", rank=1) is None
    assert not (tmp_path / "r1.pt").exists() and "rank 1 does not write" in caplog.text
    assert tr.save(tmp_path / "r0.pt") == tmp_path / "r0.pt" and (tmp_path / "r0.pt").exists()
    state = checkpoint.load_safe(tmp_path / "r0.pt")
    assert state["step"] == 1 and state["version"] == checkpoint.VERSION


def test_states_that_do_not_fit_are_refused_with_the_difference() -> None:
    tr = trainer()
    state = tr.state_dict()
    with pytest.raises(mtlab.ConfigError, match="version"):
        tr.load_state_dict({**state, "version": 1})
    other = mtlab.Trainer(make_models(), [task_a((make_examples(4, 1),) * 2)], device="cpu")
    with pytest.raises(mtlab.ConfigError, match=r"tasks by \['b'\]"):
        other.load_state_dict(state)
    per_task = mtlab.Trainer(make_models(), [task_a((make_examples(4, 1),) * 2), task_b(make_examples(4, 1))],
                             device="cpu", acc_steps=True)
    with pytest.raises(mtlab.ConfigError, match="acc_steps"):
        per_task.load_state_dict(state)


def test_clone_tree_shares_no_tensor() -> None:
    t = torch.ones(2)
    tree = {"a": [t, (t, 3)], "b": "x"}
    copy = checkpoint.clone_tree(tree)
    t.add_(1)
    assert torch.equal(copy["a"][0], torch.ones(2)) and copy["a"][1][1] == 3 and copy["b"] == "x"


def foreign_models() -> dict[str, torch.nn.Module]:
    """The helper trainer's models with two heads of another size (a checkpoint of another recipe)."""
    models = make_models(seed=3)
    models["head_a"] = torch.nn.Linear(8, 7).double()  # 7 classes instead of 5
    models["head_b"] = torch.nn.Linear(8, 4).double()
    return models


def test_a_checkpoint_with_other_shapes_is_refused_naming_everything_and_changes_nothing(tmp_path) -> None:
    ex = make_examples(10, 2)
    other = mtlab.Trainer(foreign_models(), [task_a((ex, ex)), task_b(ex)], device="cpu")
    other.save(tmp_path / "other.pt")
    tr = trainer()
    tr.step()
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    opt_before = {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()}
    with pytest.raises(mtlab.ConfigError) as err:
        tr.load_checkpoint(tmp_path / "other.pt")
    text = str(err.value)
    assert str(tmp_path / "other.pt") in text
    for name, theirs, ours in (("head_a.weight", "(7, 8)", "(5, 8)"), ("head_b.bias", "(4,)", "(3,)")):
        assert f"parameter {name}: {theirs} saved, {ours} in this trainer" in text  # model, parameter, both shapes
    assert all(torch.equal(p, before[k]) for k, p in tr.params.items())  # nothing loaded, not even 'enc'
    assert {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()} == opt_before and tr.step_count == 1


def test_init_weights_with_other_shapes_are_refused_before_any_model_changes(tmp_path) -> None:
    from mtlab.apps.recipe import load_initial_weights

    torch.save({k: m.state_dict() for k, m in foreign_models().items()}, tmp_path / "weights.pt")
    tr = trainer()
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    with pytest.raises(mtlab.ConfigError) as err:
        load_initial_weights(tr, tmp_path / "weights.pt", origin="recipe.toml: [trainer] init_file")
    text = str(err.value)
    assert text.startswith("recipe.toml: [trainer] init_file") and str(tmp_path / "weights.pt") in text
    assert "model 'head_a' parameter head_a.weight: (7, 8) saved, (5, 8) in this trainer" in text
    assert all(torch.equal(p, before[k]) for k, p in tr.params.items())


def test_a_checkpoint_holding_objects_is_refused_without_torchs_unsafe_advice(tmp_path):
    import argparse

    from mtlab.core.state import CheckpointError, load_safe

    path = tmp_path / "odd.pt"
    torch.save({"format": "mtlab-trainer", "args": argparse.Namespace(lr=1.0)}, path)
    with pytest.raises(CheckpointError) as info:
        load_safe(path)
    text = str(info.value)
    assert str(path) in text and "weights_only=True" in text
    assert "weights_only=False" not in text and "two options" not in text and "\x1b" not in text
    assert "Trainer.save" in text  # what to use instead
