"""TaskPlan: the one checked forward + loss of a task, against plain PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.base.batching import collate
from mtlab.tasks.forward import TaskPlan, eval_mode, evaluate_totals, parameter_users


def plan_for(task, models=None) -> TaskPlan:
    return TaskPlan(task, models if models is not None else make_models(), torch.device("cpu"))


def oracle_frame_loss(models, data, lens) -> tuple[torch.Tensor, int]:
    """Task a's loss written out: encoder and head per example, summed cross-entropy over valid frames."""
    total, frames = torch.zeros((), dtype=torch.float64), 0
    for i, n in enumerate(lens["x"].tolist()):
        logits = models["head_a"](models["enc"](data["x"][i, :n]))
        total = total + F.cross_entropy(logits, data["y"][i, :n], reduction="sum")
        frames += n
    return total, frames


def test_loss_equals_plain_pytorch_and_is_prepared_once() -> None:
    models = make_models()
    plan = plan_for(task_a(), models)
    assert plan.inputs == ("x",) and plan.targets == ("y",) and plan.outputs == ("logits",)
    batch = collate(make_examples(5, 3))
    result = plan.loss(batch, require_grad=True)
    ref, frames = oracle_frame_loss(models, *batch)
    torch.testing.assert_close(result.loss_sum, ref)
    assert float(result.normalizer) == frames and result.num_examples == 5
    assert result.loss_sum.requires_grad and result.outputs == {}  # the training path keeps no outputs
    assert set(plan.loss(batch).outputs) >= {"h", "logits"}
    assert set(plan.loss(batch, require_grad=True, keep_outputs=True).outputs) >= {"h", "logits"}
    # gradients equal too
    grads = torch.autograd.grad(result.loss_sum, list(models["enc"].parameters()))
    ref_grads = torch.autograd.grad(oracle_frame_loss(models, *batch)[0], list(models["enc"].parameters()))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("keep", [False, True])
def test_the_training_path_frees_the_activations_its_backward_has_done_with(keep) -> None:
    """Without kept outputs, the encoder's output dies during the backward (as in a plain loop)."""
    import weakref

    models = make_models()
    plan = plan_for(task_a(), models)
    seen = []
    models["enc"].register_forward_hook(lambda m, args, out: seen.append(weakref.ref(out)))
    result = plan.loss(collate(make_examples(4, 6)), require_grad=True, keep_outputs=keep)
    result.loss_sum.backward()
    assert (seen[0]() is not None) == keep


def test_prepare_picks_the_task_keys_and_leaves_the_batch_alone() -> None:
    plan = plan_for(task_b())
    data, lens = collate(make_examples(4, 1))
    before = (dict(data), dict(lens))
    picked, picked_lens = plan.prepare((data, lens))
    assert set(picked) == {"x", "spk"} and picked["x"] is data["x"]
    assert (data, lens) == before  # the caller's dicts are unchanged
    inputs_only, _ = plan.prepare((data, lens), targets=False)
    assert set(inputs_only) == {"x"}
    assert picked_lens["x"] is lens["x"]


def test_a_batch_in_other_containers_gives_the_same_loss_and_a_non_tensor_entry_is_refused() -> None:
    """collate's (dict, dict) takes the short way; a list pair or other mappings give the same result; an entry
    the task reads that is not a tensor is refused, naming it."""
    from types import MappingProxyType

    plan = plan_for(task_a())
    data, lens = collate(make_examples(3, 2))
    ref = plan.loss((data, lens)).loss_sum
    for batch in ([data, lens], (MappingProxyType(data), MappingProxyType(lens))):
        assert torch.equal(plan.loss(batch).loss_sum, ref)
    with pytest.raises(mtlab.BatchError, match=r"reads 'y', which the batch holds as a list, not a tensor"):
        plan.loss(({**data, "y": data["y"].tolist()}, lens))


def test_forward_needs_no_targets() -> None:
    models = make_models()
    plan = plan_for(task_a(), models)
    data, lens = collate(make_examples(3, 2))
    out = plan.forward(({"x": data["x"]}, lens)).outputs["logits"]
    torch.testing.assert_close(out, models["head_a"](models["enc"](data["x"])))


def test_bad_batches_and_loss_computers_get_clear_errors() -> None:
    plan = plan_for(task_a())
    data, lens = collate(make_examples(3, 2))
    with pytest.raises(mtlab.BatchError, match=r"lacks \['y'\].*task inputs \['x'\], targets \['y'\]"):
        plan.loss(({"x": data["x"]}, lens))
    with pytest.raises(mtlab.BatchError, match="as mtlab.collate returns"):
        plan.loss([data])
    bad = task_a()
    bad.loss = lambda targets, outputs, lens: (outputs["logits"].sum(-1), 1.0)
    with pytest.raises(mtlab.BatchError, match="loss_sum must be a scalar"):
        plan_for(bad).loss((data, lens))
    bad.loss = lambda targets, outputs, lens: outputs["logits"].sum()
    with pytest.raises(mtlab.BatchError, match=r"must return \(loss_sum, normalizer\)"):
        plan_for(bad).loss((data, lens))
    bad.loss = lambda targets, outputs, lens: (outputs["nope"].sum(), 1.0)
    with pytest.raises(mtlab.BatchError, match=r"task 'a': the loss computer .* failed on .*KeyError"):
        plan_for(bad).loss((data, lens))
    bad.loss = lambda targets, outputs, lens: (targets["y"].double().sum(), 2.0)
    with pytest.raises(mtlab.GraphError, match="does not depend on any trainable parameter"):
        plan_for(bad).loss((data, lens), require_grad=True)
    normalizer = plan_for(bad).loss((data, lens)).normalizer  # a number becomes a 0-d tensor
    assert isinstance(normalizer, torch.Tensor) and float(normalizer) == 2.0


def test_evaluate_totals_sums_every_batch_once_without_gradients() -> None:
    models = make_models()
    examples = make_examples(7, 4)
    plan = plan_for(task_a(), models)
    loss_sum, norm = evaluate_totals(plan, examples, batch_size=3)
    with torch.no_grad():
        ref = [oracle_frame_loss(models, *collate([e])) for e in examples]
    assert abs(loss_sum - float(sum(r[0] for r in ref))) < 1e-9 and norm == sum(r[1] for r in ref)
    assert all(p.grad is None for m in models.values() for p in m.parameters())


def test_parameter_users_keeps_the_first_name_of_tied_weights() -> None:
    models = make_models()
    tied = nn.Linear(8, 5).double()
    tied.weight = models["head_a"].weight  # tied to head_a; "tied" comes after head_a in the models
    models["tied"] = tied
    plans = {"a": plan_for(task_a(), models), "b": plan_for(task_b(), models)}
    params, task_params, users = parameter_users(models, plans)
    assert "head_a.weight" in params and "tied.weight" not in params and "tied.bias" in params
    assert users["enc.lin.weight"] == ["a", "b"] and users["head_a.weight"] == ["a"]
    assert set(task_params["b"]) == {"enc.lin.weight", "enc.lin.bias", "head_b.weight", "head_b.bias"}


def test_eval_mode_restores_each_models_own_mode() -> None:
    models = make_models()
    models["head_a"].eval()
    with eval_mode(models):
        assert not any(m.training for m in models.values())
    assert not models["head_a"].training and models["enc"].training
