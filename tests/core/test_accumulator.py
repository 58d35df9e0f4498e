"""Accumulator: one flat buffer per (device, dtype) per task, .grad views into it, state it owns."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.core.accumulator import Accumulator, Phase


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
    snap = tr.state_dict()
    buffers = [b.data_ptr() for t in tr.tasks for b in tr.state(t).buffers]
    tr.step()
    tr.load_state_dict(snap)
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
    mtlab.base.gradops.div_(refs, acc.normalizer, foreach=False)
    pre = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in refs]))
    above = sum(int((t.abs() > 1.0).sum()) for t in refs)
    mtlab.base.gradops.clamp_(refs, 1.0, foreach=False)
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
    norm = sum(float(r.normalizer) for r in acc.records)
    assert abs(float(acc.loss) - loss) < 1e-12 and abs(float(acc.normalizer) - norm) < 1e-12
    assert set(acc.set_loss) == {"clean", "noisy"}
    assert float(acc.records[1].weight) == 0.5
    assert "flat buffer" in repr(acc) and acc.summary()["minibatches"] == 2
    tr.reset("a")
    assert acc.phase is Phase.EMPTY and acc.grads == {} and tr.params["head_a.weight"].grad is None


def test_views_survive_the_all_reduce(tmp_path) -> None:
    """The data-parallel reducer sums the flat buffers in place: .grad stay views, values are the sums."""
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already up")
    import mtlab.training.distributed

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        tr = mtlab.distributed.attach(trainer())
        assert tr.parallel.reducer is not None
        ref = trainer()
        for t in (tr, ref):
            t.reset()
            for name in t.tasks:
                for s in t.tasks[name].linkedsets:
                    t.process_minibatch(name, s)
        buffers = [b.data_ptr() for t in tr.tasks for b in tr.state(t).buffers]
        tr.normalize(); ref.normalize()  # the all-reduce runs here
        assert [b.data_ptr() for t in tr.tasks for b in tr.state(t).buffers] == buffers
        assert owned_grads_are_views(tr) and all(views_of(tr.state(t)) for t in tr.tasks)
        for t in tr.tasks:
            for k, v in tr.state(t).grads.items():
                assert torch.equal(v, ref.state(t).grads[k]), k  # one rank: the sum is its own gradient
        tr.clip(); tr.apply(); ref.clip(); ref.apply()
        assert owned_grads_are_views(tr)
        assert all(torch.equal(p, ref.params[k]) for k, p in tr.params.items())
    finally:
        dist.destroy_process_group()


def test_buffers_per_dtype_and_model_norms_from_segments() -> None:
    """Parameters of two dtypes get two buffers; a model spread over both has its norm from both segments."""
    class Mixed(nn.Module):
        """A head with a float64 layer then a float32 layer."""

        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 6).double(), nn.Linear(6, 5).float()

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(h).float()).double()

    models = make_models()
    models["head_a"] = Mixed()
    ex = make_examples(8, 5)
    tr = mtlab.Trainer(models, [task_a((ex, ex))], lr=1e-2, clip_grad_value=0.1, device="cpu")
    tr.process_minibatch("a", "clean")
    acc = tr.state("a")
    assert {b.dtype for b in acc.buffers} == {torch.float32, torch.float64} and len(acc.buffers) == 2 and views_of(acc)
    assert tr.params["head_a.b.bias"].grad.data_ptr() == acc.grads["head_a.b.bias"].data_ptr()
    assert len(acc.segments["head_a"]) == 2
    per_model, total = acc.norms()
    for m in ("enc", "head_a"):
        ref = torch.linalg.vector_norm(torch.cat([v.double().flatten() for k, v in acc.grads.items()
                                                  if k.startswith(m + ".")]))
        torch.testing.assert_close(per_model[m].double(), ref)
    flat = torch.cat([v.double().flatten() for v in acc.grads.values()])
    torch.testing.assert_close(total.double(), torch.linalg.vector_norm(flat))
    tr.normalize(); tr.clip()
    assert float(acc.clip_fraction) == float((flat / float(acc.normalizer)).abs().gt(0.1).double().mean())


def test_totals_are_the_weighted_sums_of_the_records() -> None:
    tr = trainer()
    acc = tr.state("a")
    batch = next(tr.stream("a", "noisy"))
    direct = tr.plans["a"].loss(batch)
    tr.process_minibatch("a", "clean")
    tr.process_minibatch("a", "noisy", batch=batch)  # the noisy set has weight 0.5
    tr.process_minibatch("a", "noisy")
    rec = acc.records[1]
    assert rec.weight == 0.5 and float(rec.loss) == pytest.approx(0.5 * float(direct.loss_sum.detach()), rel=1e-12)
    assert float(rec.normalizer) == 0.5 * float(direct.normalizer)
    assert acc.totals.dtype == torch.float64 and all(isinstance(r.loss, torch.Tensor) for r in acc.records)
    for s in ("clean", "noisy"):
        rs = [r for r in acc.records if r.linkedset == s]
        assert float(acc.set_loss[s]) == pytest.approx(sum(float(r.loss) for r in rs), rel=1e-12)
        assert float(acc.set_normalizer[s]) == pytest.approx(sum(float(r.normalizer) for r in rs), rel=1e-12)
    assert float(acc.loss) == pytest.approx(float(acc.set_loss["clean"] + acc.set_loss["noisy"]), rel=1e-12)
    assert float(acc.normalizer) == float(acc.set_normalizer["clean"] + acc.set_normalizer["noisy"])


def test_sums_read_from_another_thread_while_a_minibatch_is_recorded_are_never_kept_stale(monkeypatch):
    """A dashboard's thread reads a task's sums while the training thread records the next minibatch: the sums
    made from the records read then must not stand for the records after it (normalize would divide by them)."""
    import mtlab.core.accumulator as accumulator_module
    from types import SimpleNamespace

    acc = Accumulator("a", {"w": torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))})
    acc.begin(); acc.end()
    acc.record("clean", 2, 1.0, torch.tensor(3.0, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64))
    real = torch

    def stack(*args, **kwargs):  # the training thread records a minibatch while the reader sums
        monkeypatch.setattr(accumulator_module, "torch", real)
        acc.record("clean", 2, 1.0, torch.tensor(5.0, dtype=torch.float64), torch.tensor(6.0, dtype=torch.float64))
        return real.stack(*args, **kwargs)
    names = {k: getattr(real, k) for k in dir(real) if not k.startswith("__")}
    monkeypatch.setattr(accumulator_module, "torch", SimpleNamespace(**{**names, "stack": stack}))
    read = acc.totals  # the reader's sums, of the first record only
    assert read.tolist() == [3.0, 4.0]
    assert acc.totals.tolist() == [8.0, 10.0]  # both records
    assert acc.set_totals["clean"].tolist() == [8.0, 10.0]
