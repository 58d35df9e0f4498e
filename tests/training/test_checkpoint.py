"""Periodic checkpoints by the clock: latest.pt at the first step boundary after ``minutes`` since the last one
(on by default in recipes, ``checkpoint_minutes``), so a killed job loses minutes, not the run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import make_examples, make_models, task_a

import mtlab
from mtlab.apps.settings import TRAINER_KEYS
from mtlab.core.events import Event
from mtlab.training import checkpoint
from mtlab.training.checkpoint import LATEST, Periodic


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_latest_pt_follows_the_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(checkpoint.time, "monotonic", clock)
    ex = make_examples(12, 4)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, device="cpu", distributed=False)
    written: list[int] = []

    def tick(event, info) -> None:  # each step takes 4 minutes of the clock
        if event == Event.APPLY:
            clock.now += 240

    tr.add_callback(tick)
    periodic = Periodic(tr, tmp_path, minutes=10).attach()
    save = periodic.save
    periodic.save = lambda: (written.append(tr.step_count), save())[1]  # type: ignore[method-assign]
    mtlab.run(tr, steps=7, progress=False)
    assert written == [3, 6]  # 12 minutes after the start, then 12 after that checkpoint
    assert torch.load(tmp_path / LATEST, weights_only=True)["step"] == 6


def test_the_timed_checkpoint_is_on_by_default_and_refuses_nonsense(tmp_path: Path) -> None:
    assert TRAINER_KEYS["checkpoint_minutes"].default > 0
    tr = mtlab.Trainer(make_models(), [task_a((make_examples(4, 4),) * 2)], lr=1e-2, device="cpu", distributed=False)
    for bad in (-1, float("inf"), "10", True):
        with pytest.raises(mtlab.ConfigError, match="minutes"):
            Periodic(tr, tmp_path, minutes=bad)
    with pytest.raises(mtlab.ConfigError, match="positive"):
        Periodic(tr, tmp_path, every=0, minutes=0)
