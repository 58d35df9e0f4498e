"""Runs of the loop against a loop written by hand: shared by the loop's tests."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.training.loop import Schedule


def plain(nonfinite: str = "raise", clean: list | None = None) -> mtlab.Trainer:
    ex = make_examples(30, 3)
    tr = mtlab.Trainer(make_models(), [task_a((clean or ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=1.0,
                       device="cpu", nonfinite=nonfinite)
    for task in tr.tasks.values():
        for ls in task.linkedsets.values():
            ls.valid = ex[:6]
    return tr


def script(trainer: mtlab.Trainer, values: list[float]) -> list[int]:
    """Make every validation return the next value of ``values`` (for every task and linked set)."""
    seen: list[int] = []

    def evaluate_totals(task: str, linkedset: str, num_batches: int | None = None,
                        examples: Any = None) -> tuple[float, float]:
        if (task, linkedset) == ("a", "clean"):
            seen.append(trainer.step_count)
        return values[len(seen) - 1], 1.0

    trainer.evaluate_totals = evaluate_totals  # type: ignore[method-assign]
    return seen


def assert_same(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), f"{where}: {a!r} != {b!r}"


LENGTHS = [10, 7, 3, 25, 4, 12]
# utterances() cut into 5-frame segments, (utterance, first frame, frames): 10 -> 2, 7 -> 1 (2 frames dropped),
# 3 -> 1 (shorter: whole), 25 -> 5, 4 -> 1, 12 -> 2.
SEGMENTS = [(0, 0, 5), (0, 5, 5), (1, 0, 5), (2, 0, 3), (3, 0, 5), (3, 5, 5), (3, 10, 5), (3, 15, 5), (3, 20, 5),
            (4, 0, 4), (5, 0, 5), (5, 5, 5)]


def utterances(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(n, 4, generator=g, dtype=torch.float64), "y": torch.randint(0, 5, (n,), generator=g),
             "spk": torch.tensor(i % 3)} for i, n in enumerate(LENGTHS)]


STAGES = [{"segment_length": 5, "batch_size": 2, "numbatches_to_aggregate": 2, "initial_learning_rate": 0.01,
           "learning_rate_decay": 0.5},
          {"segment_length": "full", "batch_size": 3, "numbatches_to_aggregate": 1, "initial_learning_rate": 0.005}]


def staged(stages: list[dict[str, Any]] = STAGES, **settings: Any) -> tuple[mtlab.Trainer, Schedule]:
    ex = utterances()
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, device="cpu")
    for ls in tr.tasks["a"].linkedsets.values():
        ls.valid = ex[:4]
    return tr, Schedule.for_trainer(tr, {"stages": copy.deepcopy(stages), "num_epochs": 1.0, **settings})
