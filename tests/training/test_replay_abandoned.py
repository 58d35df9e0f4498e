"""An abandoned step (a second Ctrl-C, SIGTERM or SIGUSR1 inside one step) replays: the loop rolls the step back and
the journal says so ("abandoned"), and replay skips it as the rollback undid it: bit for bit, row for row."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.training.loop import Schedule, run
from mtlab.training.replay import replay

STEPS = 5


def build() -> mtlab.Trainer:
    ex = make_examples(20, 9)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=1.0,
                         numbatches_to_aggregate=2, device="cpu")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_step_abandoned_by_a_second_signal_replays_bit_for_bit(signum: int, sigint_raises) -> None:
    tr = build()
    fired = []

    def twice(grad: torch.Tensor) -> torch.Tensor:  # inside the backward of step 3's first minibatch
        if tr.step_count == 2 and not fired:
            fired.append(True)
            os.kill(os.getpid(), signum)
            os.kill(os.getpid(), signum)
        return grad

    tr.params["head_a.weight"].register_hook(twice)
    schedule = Schedule(num_steps=STEPS)
    run(tr, schedule, progress=False)
    assert fired and schedule.last_stop == "interrupted" and tr.step_count == 2  # the step was abandoned
    assert [e["kind"] for e in tr.journal.entries if e["type"] == "change"].count("abandoned") == 1
    run(tr, schedule, progress=False)  # continued in the same process, as `mtlab resume` continues
    assert tr.step_count == STEPS
    again = replay(tr.journal, build())
    assert again.history.equals(tr.history)
    for name, p in tr.params.items():
        assert torch.equal(p, again.params[name]), name
