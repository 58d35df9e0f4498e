"""A run owns its state: its random numbers, its root (what "initial" means), and knob changes that take effect
where the journal says, whatever thread made them. Oracles: freshly built trainers and mtlab.replay."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import mtlab
from helpers import Encoder, make_examples, make_models, task_a, task_b
from helpers.trainers import assert_trees_equal
from mtlab.base.errors import ConfigError
from mtlab.core.state import digest

EX, EX2 = make_examples(24, 3), make_examples(24, 4)


def dropout_models() -> dict[str, nn.Module]:
    models = make_models()
    models["enc"] = nn.Sequential(Encoder().double(), nn.Dropout(0.2))  # draws random numbers at every forward
    return models


def build(**kw) -> mtlab.Trainer:
    kw.setdefault("numbatches_to_aggregate", 2)
    return mtlab.Trainer(dropout_models(), [task_a((EX, EX2)), task_b(EX)], lr=1e-2, device="cpu", **kw)


def assert_same_run(a: mtlab.Trainer, b: mtlab.Trainer) -> None:
    assert b.step_count == a.step_count
    for name, p in a.params.items():
        assert torch.equal(p, b.params[name]), name
    assert_trees_equal(a.update.state_dict(), b.update.state_dict(), "optimizer")
    assert b.history.equals(a.history)


def test_runs_stepped_in_turn_with_dropout_each_replay_bit_for_bit():
    trainer = build()
    trainer.step()
    lower = trainer.fork("lower-lr")
    lower.lr = 2e-3
    noisy = trainer.fork("more-noisy")
    noisy.set_weight("a", "noisy", 1.0)
    for _ in range(3):
        for t in (trainer, lower, noisy):
            t.step()
        torch.rand(7)  # the user's own random numbers between calls change no run
    for run in (trainer, lower, noisy):
        assert_same_run(run, mtlab.replay(run.journal, build()))


def test_the_global_generator_is_left_as_the_user_set_it():
    trainer = build()
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    trainer.step()  # dropout draws from the run's own generator
    assert torch.equal(torch.rand(3), want)


def test_a_branch_reinitialized_equals_a_fresh_trainer_and_replays():
    trainer = build(noise_scale=True)
    trainer.step()
    trainer.step()
    branch = trainer.fork("b")
    branch.step()
    branch.reinitialize()
    fresh = build(noise_scale=True)
    for name, p in fresh.params.items():
        assert torch.equal(p, branch.params[name]), name
    assert_trees_equal(fresh.update.state_dict(), branch.update.state_dict(), "optimizer")
    assert_trees_equal(fresh.noise_scale.state_dict(), branch.noise_scale.state_dict(), "noise scale")
    branch.step()
    fresh.step()
    for name, p in fresh.params.items():  # the same random numbers too: the run's root generator
        assert torch.equal(p, branch.params[name]), name
    assert_same_run(branch, mtlab.replay(branch.journal, build(noise_scale=True)))


def test_a_reinitialized_noise_scale_equals_a_fresh_one():
    trainer = build(noise_scale=True)
    for _ in range(3):
        trainer.step()
    assert trainer.noise_scale.state_dict()["tasks"]
    trainer.reinitialize()
    assert_trees_equal(build(noise_scale=True).noise_scale.state_dict(), trainer.noise_scale.state_dict(), "noise")


def test_a_refused_fork_leaves_the_parent_journal_and_events_unchanged():
    trainer = build()
    trainer.step()
    other = mtlab.Trainer(make_models(), [task_b(EX)], device="cpu")
    seen = []
    trainer.add_callback(lambda event, info: seen.append(str(event)))
    before = trainer.journal.to_dict()
    with pytest.raises(ConfigError):
        trainer.fork("bad", state=other.state_dict())
    assert trainer.journal.to_dict() == before
    assert seen == []


class Gate:
    """Holds the training thread at its next draw (after the minibatch read its knobs) until released."""

    def __init__(self, trainer: mtlab.Trainer) -> None:
        self.armed = False
        self.at_draw, self.go = threading.Event(), threading.Event()
        real = trainer.streams.get_stream

        def held(task, linkedset):  # noqa: ANN001, ANN202
            if self.armed:
                self.armed = False
                self.at_draw.set()
                assert self.go.wait(60)
            return real(task, linkedset)

        trainer.streams.get_stream = held  # type: ignore[method-assign]


def two_tasks() -> mtlab.Trainer:
    return mtlab.Trainer(make_models(), [task_a((EX, EX2), batch_size=3), task_b(EX)], lr=1e-2, device="cpu",
                         numbatches_to_aggregate=2)


@pytest.mark.parametrize("steps_before", [0, 1])
def test_a_batch_size_set_from_another_thread_during_the_draw_replays(steps_before):
    trainer = two_tasks()
    gate = Gate(trainer)
    for _ in range(steps_before):
        trainer.step()
    gate.armed = True
    worker = threading.Thread(target=lambda: [trainer.step() for _ in range(3)])
    worker.start()
    assert gate.at_draw.wait(60)
    setter = threading.Thread(target=lambda: (trainer.set_batch_size("a", 2), trainer.set_weight("a", "noisy", 0.3)))
    setter.start()
    setter.join(20)
    waited = setter.is_alive()
    gate.go.set()
    worker.join(60)
    setter.join(60)
    assert not waited  # a knob set from another thread never waits for the step in progress
    assert trainer.step_count == steps_before + 3
    assert_same_run(trainer, mtlab.replay(trainer.journal, two_tasks()))


BAD_ENTRIES = [
    ("a negative weight", {"type": "change", "kind": "weight", "task": "a", "linkedset": "noisy", "value": -1.0}),
    ("a NaN lr", {"type": "change", "kind": "lr", "value": float("nan")}),
    ("K = 0", {"type": "change", "kind": "minibatches_per_step", "task": None, "value": 0}),
    ("batch size 0", {"type": "change", "kind": "batch_size", "task": "a", "value": 0}),
    ("an unknown task", {"type": "change", "kind": "task_weight", "task": "zz", "value": 1.0}),
    ("an unknown linked set", {"type": "change", "kind": "weight", "task": "a", "linkedset": "zz", "value": 1.0}),
    ("an unknown call", {"type": "call", "kind": "jump"}),
    ("a count written as text", {"type": "call", "kind": "step", "count": "2"}),
    ("an entry without a kind", {"type": "change", "value": 1.0}),
    ("an entry that is not an object", ["step"]),
]


@pytest.mark.parametrize("what,bad", BAD_ENTRIES, ids=[w for w, _ in BAD_ENTRIES])
def test_a_bad_journal_entry_is_refused_before_anything_changes(what, bad):
    trainer = mtlab.Trainer(make_models(), [task_a((EX, EX2)), task_b(EX)], lr=1e-2, device="cpu")
    trainer.step()
    trainer.lr = 5e-3
    trainer.step()
    data = trainer.journal.to_dict()
    last = data["entries"][-1]
    entry = bad if not isinstance(bad, dict) else {k: last.get(k) for k in ("step", "minibatch", "tick", "source",
                                                                            "inside", "time")} | bad
    data["entries"].append(entry)
    fresh = mtlab.Trainer(make_models(), [task_a((EX, EX2)), task_b(EX)], lr=1e-2, device="cpu")
    before = digest(fresh.state_dict())
    index = len(data["entries"]) - 1
    with pytest.raises(ConfigError, match=f"entry {index} "):
        mtlab.replay(data, fresh)
    assert digest(fresh.state_dict()) == before, what
    assert fresh.step_count == 0


def test_a_mid_epoch_batch_size_change_draws_every_remaining_example_once():
    examples = make_examples(10, 7)
    trainer = mtlab.Trainer(make_models(), [task_b(examples, batch_size=3)], lr=1e-2, device="cpu")
    stream = trainer.stream("b", "clean")
    order = [i for b in stream.epoch_batches() for i in b]
    drawn = []
    real = stream.next_indices

    def spy() -> list[int]:
        idx = real()
        drawn.append((stream.epoch, list(idx)))
        return idx

    stream.next_indices = spy  # type: ignore[method-assign]
    trainer.step()
    trainer.step()
    trainer.set_batch_size("b", 2)
    while stream.epoch == 0 or stream.position == 0:
        trainer.step()
    epoch0 = [i for e, b in drawn if e == 0 for i in b]
    assert sorted(epoch0) == list(range(10))  # each example once
    assert epoch0 == order  # in the epoch's order
    assert [len(b) for e, b in drawn if e == 0] == [3, 3, 2, 2]
