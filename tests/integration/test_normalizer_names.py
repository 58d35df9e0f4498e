"""The normalizer is called ``normalizer`` everywhere; the names of release 0.2 still work, with a warning."""

from __future__ import annotations

import warnings

import pytest
import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b


def trainer() -> mtlab.Trainer:
    ex = make_examples(8, 3)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], device="cpu")


def test_records_carry_the_weighted_normalizer_and_the_old_name_warns() -> None:
    tr = trainer()
    batch = next(tr.stream("a", "noisy"))
    frames = int(batch[1]["y"].sum())  # the cross-entropy's normalizer: the valid frames
    tr.process_minibatch("a", "noisy", batch=batch)  # weight 0.5
    rec = tr.state("a").records[0]
    assert float(rec.normalizer) == 0.5 * frames and frames > 0
    with pytest.warns(DeprecationWarning, match="record.normalizer"):
        old = rec.norm
    assert old is rec.normalizer


def test_accumulator_state_writes_normalizer_and_reads_a_0_2_checkpoint() -> None:
    tr = trainer()
    tr.process_minibatch("a", "clean")
    tr.process_minibatch("a", "noisy")
    acc = tr.state("a")
    state = acc.state_dict()
    assert all("normalizer" in r and "norm" not in r for r in state["records"])
    old = {**state, "records": [{("norm" if k == "normalizer" else k): v for k, v in r.items()} for r in state["records"]]}
    expected = [float(r.normalizer) for r in acc.records]
    acc.load_state_dict(old)
    assert [float(r.normalizer) for r in acc.records] == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the trainer's own code reads no deprecated name
        tr.normalize()
        tr.apply()


def test_zero_normalizer_error_keeps_its_0_2_name() -> None:
    assert mtlab.ZeroNormError is mtlab.ZeroNormalizerError
    ex = make_examples(6, 8)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex), weights=(0.0, 0.0))], device="cpu")
    tr.process_minibatch("a", "clean")
    with pytest.raises(mtlab.ZeroNormError, match="normalizer of 0"):
        tr.normalize()
    with pytest.raises(mtlab.ZeroNormalizerError):
        tr.normalize()
    assert torch.equal(tr.state("a").normalizer, torch.zeros((), dtype=torch.float64))
