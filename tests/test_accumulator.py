"""Accumulator: one flat buffer per (device, dtype) per task, .grad views into it, state it owns."""

from __future__ import annotations

import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.accumulator import Accumulator, Phase


def trainer(**kw) -> mtlab.Trainer:
    ex = make_examples(16, 5)
    return mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], lr=1e-2, clip_grad_value=1.0,
                         numbatches_to_aggregate=2, device="cpu", **kw)


def views_of(acc: Accumulator) -> bool:
    """Every gradient of the task is a view into one of its flat buffers."""
    bases = {b.data_ptr(): b for b in acc.buffers}
    for g in acc.grads.values():
        base = g._base if g._base is not None else g
        if base.data_ptr() not in bases or base.numel() != bases[base.data_ptr()].numel():
            return False
    return True


def owned_grads_are_views(tr: mtlab.Trainer) -> bool:
    for t in tr.tasks:
        acc = tr.state(t)
        for name in acc.owned:
            if not acc.minibatches:
                continue
            if tr.params[name].grad is None or tr.params[name].grad.data_ptr() != acc.grads[name].data_ptr():
                return False
    return True


def test_gradients_live_in_one_flat_buffer_per_task_and_grad_is_a_view() -> None:
    tr = trainer()
    tr.step()
    a, b = tr.state("a"), tr.state("b")
    assert len(a.buffers) == 1 and a.buffers[0].numel() == sum(tr.params[n].numel() for n in tr.task_params["a"])
    assert views_of(a) and views_of(b) and owned_grads_are_views(tr)
    # a shared parameter has a segment in each task's buffer, and no .grad outside a backward or an update
    assert "enc.lin.weight" in a.shared and tr.params["enc.lin.weight"].grad is None
    assert a.grads["enc.lin.weight"].data_ptr() != b.grads["enc.lin.weight"].data_ptr()


def test_views_survive_save_load_snapshot_restore_and_further_steps(tmp_path) -> None:
    tr = trainer()
    tr.step()
    snap = tr.snapshot()
    buffers = [b.data_ptr() for t in tr.tasks for b in tr.state(t).buffers]
    tr.step()
    tr.restore(snap)
    assert owned_grads_are_views(tr) and all(views_of(tr.state(t)) for t in tr.tasks)
    assert [b.data_ptr() for t in tr.tasks for b in tr.state(t).buffers] == buffers  # restored in place
    for t in tr.tasks:
        for k, v in snap["tasks"][t]["grads"].items():
            assert torch.equal(tr.state(t).grads[k], v)
    tr.save(tmp_path / "ck.pt")
    other = trainer()
    other.load_checkpoint(tmp_path / "ck.pt")
    assert owned_grads_are_views(other) and all(views_of(other.state(t)) for t in other.tasks)
    tr.step(); other.step()
    assert all(torch.equal(p, other.params[k]) for k, p in tr.params.items())


def test_flat_buffer_path_equals_the_per_tensor_reference() -> None:
    """Normalize and clip on the flat buffer equal the same ops on each gradient tensor separately."""
    tr = trainer()
    tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy")
    acc = tr.state("a")
    ref = {k: v.clone() for k, v in acc.grads.items()}
    tr.normalize("a"); tr.clip("a")
    refs = list(ref.values())
    mtlab.gradops.div_(refs, acc.normalizer, foreach=False)
    pre = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in refs]))
    above = sum(int((t.abs() > 1.0).sum()) for t in refs)
    mtlab.gradops.clamp_(refs, 1.0, foreach=False)
    for (k, v), r in zip(acc.grads.items(), refs):
        assert torch.equal(v, r), k
    torch.testing.assert_close(acc.grad_norm.double(), pre.double())
    assert float(acc.clip_fraction) == above / sum(t.numel() for t in refs)
    per_model = {m: torch.linalg.vector_norm(torch.cat([v.flatten() for k, v in acc.grads.items() if k.startswith(m + ".")]))
                 for m in ("enc", "head_a")}
    for m, n in acc.model_grad_norms(clipped=True).items():
        torch.testing.assert_close(n, per_model[m])


def test_totals_records_and_phase() -> None:
    tr = trainer()
    acc = tr.state("a")
    assert acc.phase is Phase.EMPTY and acc.grads == {} and acc.minibatches == 0
    tr.process_minibatch("a", "clean"); tr.process_minibatch("a", "noisy")
    assert acc.phase == "accumulating" and acc.minibatches == len(acc.records) == 2
    loss = sum(float(r.loss) for r in acc.records)
    norm = sum(float(r.norm) for r in acc.records)
    assert abs(float(acc.loss) - loss) < 1e-12 and abs(float(acc.normalizer) - norm) < 1e-12
    assert acc.batch_loss_norm is not None and float(acc.batch_loss_norm) == float(acc.normalizer)  # old name
    assert set(acc.set_loss) == {"clean", "noisy"}
    assert float(acc.records[1].weight) == 0.5
    assert "flat buffer" in repr(acc) and acc.summary()["minibatches"] == 2
    tr.reset("a")
    assert acc.phase is Phase.EMPTY and acc.grads == {} and tr.params["head_a.weight"].grad is None
