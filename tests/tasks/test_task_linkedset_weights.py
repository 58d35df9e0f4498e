"""Linked-set weights: as given (``"absolute"``, mtlab's default) or relative to the task's first set
(``"relative"``, the original's, what imported recipes set)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_examples, make_models, task_a

import mtlab
from mtlab.base.errors import ConfigError
from mtlab.tasks.task import applied_weight

pytestmark = pytest.mark.usefixtures("one_thread")


def original_linkedset_weighting(set_names: list[str], linkedset_weighting: str | None) -> dict[str, float]:
    """The original as written, ``nabu/neuralnetworks/trainers/task_trainer.py:57-63`` (Python 2's ``map``
    gives a list)::

        if 'linkedset_weighting' in taskconf:
            linkedset_weighting = np.array(map(float, taskconf['linkedset_weighting'].split(' ')))
            # the first set has the reference weight
            linkedset_weighting /= linkedset_weighting[0]
        else:
            linkedset_weighting = np.array([1.0] * len(self.linkedsets))
        self.linkedset_weighting = {set_name: weight for set_name, weight in zip(set_names, linkedset_weighting)}

    and ``task_trainer.py:206-207`` multiplies each minibatch's loss and norm by its set's weight."""
    if linkedset_weighting is not None:
        weights = np.array(list(map(float, linkedset_weighting.split(" "))))
        weights /= weights[0]
    else:
        weights = np.array([1.0] * len(set_names))
    return {name: float(w) for name, w in zip(set_names, weights)}


def trainer(weights: tuple[float, float], mode: str, **kw) -> mtlab.Trainer:
    ex = make_examples(12, 5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex), weights=weights)], lr=1e-2, device="cpu",
                         linkedset_weights=mode, **kw)


def accumulate(tr: mtlab.Trainer) -> mtlab.core.accumulator.Accumulator:
    tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy")
    return tr.state("a")


@pytest.mark.parametrize("written", ["2 1", "0.5 0.25", "4 1"])
def test_relative_weights_are_the_originals_and_accumulate_as_the_original(written: str) -> None:
    w = tuple(float(x) for x in written.split())
    expected = original_linkedset_weighting(["clean", "noisy"], written)
    rel = trainer(w, "relative")  # type: ignore[arg-type]
    assert {s: applied_weight(rel.task("a"), s, "relative") for s in ("clean", "noisy")} == expected
    oracle = trainer((expected["clean"], expected["noisy"]), "absolute")
    a, b = accumulate(rel), accumulate(oracle)
    assert [r.weight for r in a.records] == [expected["clean"], expected["noisy"]]
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=0)
    torch.testing.assert_close(a.normalizer, b.normalizer, rtol=0, atol=0)
    for k, g in a.grads.items():
        torch.testing.assert_close(g, b.grads[k], rtol=0, atol=0)


def test_absolute_is_the_default_and_differs_by_the_first_sets_weight_without_normalization() -> None:
    ex = make_examples(12, 5)
    default = mtlab.Trainer(make_models(), [task_a((ex, ex), weights=(2.0, 1.0))], device="cpu")
    assert default.linkedset_weights == "absolute"
    raw, rel = accumulate(default), accumulate(trainer((2.0, 1.0), "relative"))
    torch.testing.assert_close(raw.loss, 2 * rel.loss)
    torch.testing.assert_close(raw.normalizer, 2 * rel.normalizer)
    # the applied (normalized) gradient is the same; without normalization it differs by the first set's weight
    p, q = trainer((2.0, 1.0), "absolute", normalize_gradients=False), trainer((2.0, 1.0), "relative",
                                                                              normalize_gradients=False)
    ga, gb = accumulate(p).grads["head_a.weight"], accumulate(q).grads["head_a.weight"]
    torch.testing.assert_close(ga, 2 * gb)


def test_a_first_set_of_weight_zero_is_refused_while_another_set_counts() -> None:
    with pytest.raises(ConfigError, match="relative to the first set 'clean'"):
        trainer((0.0, 1.0), "relative")
    tr = trainer((2.0, 1.0), "relative")
    with pytest.raises(ConfigError, match="needs a positive weight"):
        tr.set_weight("a", "clean", 0.0)
    assert tr.task("a").linkedsets["clean"].weight == 2.0  # refused: unchanged
    tr.set_weight("a", "noisy", 0.0); tr.set_weight("a", "clean", 0.0)  # every set 0: the task is left out
    assert tr.active_tasks() == {}
    with pytest.raises(ConfigError, match="absolute"):
        trainer((1.0, 1.0), "first")
    assert trainer((1.0, 1.0), "relative").state_dict()["settings"]["linkedset_weights"] == "relative"
