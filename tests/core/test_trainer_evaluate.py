"""``Trainer.evaluate`` (a float) and ``Trainer.evaluate_totals`` ((Σloss, Σnormalizer)) against plain PyTorch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import pytest

import mtlab
from helpers import make_examples, make_models, task_a
from mtlab.training.schedule import Schedule
from mtlab.training.validation import validate


def oracle_totals(models: dict[str, nn.Module], examples: list[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """Σ framewise cross-entropy and Σ frames of task a, one example at a time (no padding, no mtlab)."""
    loss_sum = normalizer = 0.0
    with torch.no_grad():
        for ex in examples:
            logits = models["head_a"](models["enc"](ex["x"]))
            loss_sum += float(F.cross_entropy(logits, ex["y"], reduction="sum"))
            normalizer += ex["y"].shape[0]
    return loss_sum, normalizer


@pytest.fixture
def setup() -> tuple[mtlab.Trainer, dict[str, nn.Module], list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    clean, noisy = make_examples(7, 1, lengths=(2, 12)), make_examples(5, 2, lengths=(3, 9))
    models = make_models()
    task = task_a((clean, noisy), batch_size=3)  # 7 examples: batches of 3, 3 and 1
    return mtlab.Trainer(models, [task], device="cpu"), models, clean, noisy


def test_evaluate_totals_are_the_sums_over_every_example(setup) -> None:  # noqa: ANN001
    trainer, models, clean, _ = setup
    loss_sum, normalizer = trainer.evaluate_totals("a", "clean")
    ref_loss, ref_norm = oracle_totals(models, clean)
    assert normalizer == ref_norm
    assert loss_sum == pytest.approx(ref_loss, rel=1e-12)


def test_evaluate_is_the_ratio_of_the_totals_and_a_float(setup) -> None:  # noqa: ANN001
    trainer, models, clean, _ = setup
    value = trainer.evaluate("a", "clean")
    ref_loss, ref_norm = oracle_totals(models, clean)
    assert type(value) is float
    assert value == pytest.approx(ref_loss / ref_norm, rel=1e-12)
    assert value != pytest.approx(sum(oracle_totals(models, [e])[0] / oracle_totals(models, [e])[1]
                                      for e in clean) / len(clean), rel=1e-9)  # not a mean of per-example means


def test_num_batches_and_examples_choose_what_is_read(setup) -> None:  # noqa: ANN001
    trainer, models, clean, noisy = setup
    shortest = sorted(clean, key=lambda e: e["x"].shape[0])  # evaluation batches by length, ties in order
    assert trainer.evaluate_totals("a", "clean", num_batches=2) == pytest.approx(oracle_totals(models, shortest[:6]))
    assert trainer.evaluate_totals("a", "clean", examples=noisy) == pytest.approx(oracle_totals(models, noisy))
    first = oracle_totals(models, sorted(noisy, key=lambda e: e["x"].shape[0])[:3])
    assert trainer.evaluate("a", "noisy", num_batches=1) == pytest.approx(first[0] / first[1])


def test_totals_keyword_still_works_and_names_the_new_method(setup) -> None:  # noqa: ANN001
    trainer, *_ = setup
    with pytest.warns(DeprecationWarning, match="evaluate_totals"):
        old = trainer.evaluate("a", "clean", totals=True)
    assert old == trainer.evaluate_totals("a", "clean")


def test_validation_pools_linked_sets_by_their_totals(setup) -> None:  # noqa: ANN001
    trainer, models, clean, noisy = setup
    for ls in trainer.tasks["a"].linkedsets.values():
        ls.valid = ls.examples  # held-out data for both linked sets (weights 1.0 and 0.5)
    record = validate(trainer, Schedule(num_steps=1))
    assert record is not None
    (lc, nc), (ln, nn_) = oracle_totals(models, clean), oracle_totals(models, noisy)
    assert record["a/clean"] == pytest.approx(lc / nc, rel=1e-12)
    assert record["a/noisy"] == pytest.approx(ln / nn_, rel=1e-12)
    assert record["a"] == pytest.approx((lc + 0.5 * ln) / (nc + 0.5 * nn_), rel=1e-12)
