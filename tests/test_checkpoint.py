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
