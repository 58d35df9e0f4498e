"""The step path (process_minibatch -> apply) never reads a device value back to the host."""

from __future__ import annotations


import pytest
import torch
from helpers.trainers import no_host_reads

import mtlab
from helpers import make_examples, make_models, task_a, task_b


@pytest.mark.parametrize("read", [float, int, bool, lambda t: t.item(), lambda t: t.cpu()])
def test_the_guard_catches_a_host_read(read):
    with no_host_reads(), pytest.raises(AssertionError, match="host read"):
        read(torch.ones(()))


@pytest.mark.parametrize("acc_steps", [False, True])
def test_step_path_is_sync_free_under_the_skip_policy(acc_steps):
    ex = make_examples(24, 3)
    tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex, weight=0.5)], clip_grad_value=0.5,
                       numbatches_to_aggregate=2, device="cpu", nonfinite="skip", acc_steps=acc_steps)
    tr.step()  # first step creates optimizer state
    with no_host_reads():
        for _ in range(3):
            tr.step()
        tr.process_minibatch("a", "clean")
        tr.process_minibatch("b", "clean")
        tr.normalize(); tr.clip(); tr.apply()
    h = tr.history  # statistics materialize when read, afterwards
    assert len(h) == 5 and not h["skipped"].any()
    assert all(torch.isfinite(p).all() for p in tr.params.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on GPU machines)")
@pytest.mark.parametrize("recipes", [False, True])
@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_step_path_is_sync_free_on_cuda(recipes, precision):
    if recipes:  # BLSTM, the separation heads and losses, the Nabu encoders (defined below)
        ex = sequence_examples(18, 1)
        tr = mtlab.Trainer(models_of_the_recipes(), tasks_of_the_recipes(ex), clip_grad_value=0.5,
                           numbatches_to_aggregate=2, device="cuda", nonfinite="skip", precision=precision)
        task, linkedset = "spk", "train"
    else:
        ex = make_examples(24, 3)
        tr = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex)], clip_grad_value=0.5,
                           numbatches_to_aggregate=2, device="cuda", nonfinite="skip", precision=precision)
        task, linkedset = "a", "clean"
    tr.step()
    batches = {t: next(tr.stream(t, s)) for t, sets in tr.active_tasks().items() for s in sets[:1]}
    # data comes from the host: the batches are drawn outside the check; the step itself never waits
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t, b in batches.items():
            tr.process_minibatch(t, next(iter(tr.tasks[t].linkedsets)), batch=b)
        tr.normalize(); tr.clip(); tr.apply()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(tr.history) == 2 and task in tr.tasks and linkedset in tr.tasks[task].linkedsets


# ---------------------------------------------------------------- the models too
import weakref  # noqa: E402

import torch.utils._pytree as pytree  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from mtlab.models import BLSTM, BRNN, Concat, DeepClusteringHead, LeakyBLSTM, MaskHead, MeanPool, ResetBLSTM  # noqa: E402
from mtlab.separation.losses import PIT, DeepClustering  # noqa: E402

# Ops that read a device value on the host (``.item()``, ``bool(t)``, ``int(t)`` all reach
# _local_scalar_dense) or whose output shape depends on the data (a sync on a GPU).
HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_consecutive", "item"}


class CountHostReads(TorchDispatchMode):
    """Counts every op of HOST_READS on a device tensor inside the block (a CPU stand-in for CUDA's sync
    debug mode). Host tensors are those that live on the CPU on a GPU machine too: a PackedSequence's
    ``batch_sizes`` (nn.LSTM reads ``batch_sizes[0]``) and whatever is computed from host tensors alone."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self._host: dict[int, weakref.ref] = {}

    def _is_host(self, t) -> bool:
        ref = self._host.get(id(t))
        return ref is not None and ref() is t

    def _mark(self, t) -> None:
        if isinstance(t, torch.Tensor):
            self._host[id(t)] = weakref.ref(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        tensors = [a for a in pytree.tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
        on_host = bool(tensors) and all(self._is_host(t) for t in tensors)
        if name in HOST_READS and not on_host:
            self.seen.append(name)
        out = func(*args, **(kwargs or {}))
        if name == "_pack_padded_sequence":
            self._mark(out[1])  # batch_sizes: made on the CPU whatever the data's device
        elif on_host:
            for t in pytree.tree_leaves(out):
                self._mark(t)
        return out


F_BINS, SPK = 5, 3


def sequence_examples(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = int(torch.randint(3, 9, (1,), generator=g))
        src = torch.rand(t, F_BINS, 2, generator=g)
        dominant = src.argmax(-1)
        out.append({"x": torch.randn(t, F_BINS, generator=g), "y": torch.randint(0, 3, (t,), generator=g),
                    "spk": torch.randint(0, SPK, (), generator=g), "src_mag": src, "mix_mag": src.sum(-1),
                    "binary_targets": torch.nn.functional.one_hot(dominant, 2).reshape(t, 2 * F_BINS).float(),
                    "usedbins": torch.ones(t, F_BINS, dtype=torch.bool)})
    return out


def models_of_the_recipes() -> dict[str, torch.nn.Module]:
    """The demo recipe's models (BLSTM encoder, mean pool, linear heads), the separation recipes' heads and
    the Nabu recurrent encoders, small (on the CPU their nn.LSTM/nn.RNN run in float32 under autocast)."""
    torch.manual_seed(0)
    return {"enc": BLSTM(F_BINS, 6, input_noise=0.1), "pool": MeanPool(), "spk_head": torch.nn.Linear(12, SPK),
            "frame_head": torch.nn.Linear(12, 3), "dc": DeepClusteringHead(12, num_bins=F_BINS, emb_dim=4),
            "mask": MaskHead(12, num_bins=F_BINS, num_sources=2),
            "reset": ResetBLSTM(F_BINS, 4, t_reset=3), "leaky": LeakyBLSTM(F_BINS, 4, leak=0.9),
            "brnn": BRNN(F_BINS, 4), "cat": Concat(), "nabu_head": torch.nn.Linear(24, 3)}


def tasks_of_the_recipes(examples) -> list[mtlab.Task]:
    n, ls = mtlab.Node, {"train": mtlab.LinkedSet(examples)}
    ce = mtlab.losses.CrossEntropy
    return [
        mtlab.Task("spk", [n("h", "enc", ["x"]), n("p", "pool", ["h"]), n("o", "spk_head", ["p"])],
                   ["x"], ["spk"], ["o"], ce(output="o", target="spk"), dict(ls), batch_size=3),
        mtlab.Task("frames", [n("h", "enc", ["x"]), n("o", "frame_head", ["h"])],
                   ["x"], ["y"], ["o"], ce(output="o", target="y"), dict(ls), batch_size=3),
        mtlab.Task("dc", [n("h", "enc", ["x"]), n("emb", "dc", ["h"])], ["x"], ["binary_targets", "usedbins"],
                   ["emb"], DeepClustering(), dict(ls), batch_size=3),
        mtlab.Task("pit", [n("h", "enc", ["x"]), n("masks", "mask", ["h"])], ["x"], ["src_mag", "mix_mag"],
                   ["masks"], PIT(activation="none"), dict(ls), batch_size=3),
        mtlab.Task("nabu", [n("r", "reset", ["x"]), n("l", "leaky", ["x"]), n("b", "brnn", ["x"]),
                            n("c", "cat", ["r", "l", "b"]), n("o", "nabu_head", ["c"])], ["x"], ["y"], ["o"], ce(output="o", target="y"),
                   dict(ls), batch_size=3),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed"])
def test_a_step_with_the_recipes_models_reads_nothing_back(precision):
    ex = sequence_examples(18, 1)
    # fp16 at scale 1: deep clustering's summed loss overflows larger scales (the scaler would back off)
    tr = mtlab.Trainer(models_of_the_recipes(), tasks_of_the_recipes(ex), clip_grad_value=1.0,
                       numbatches_to_aggregate=2, device="cpu", nonfinite="skip",
                       precision={"type": precision, "init_scale": 1.0} if precision == "16-mixed" else precision)
    tr.step()  # optimizer state, first allocations
    with CountHostReads() as reads:
        tr.step()
        tr.step()
    assert reads.seen == []
    with CountHostReads() as reads:  # the guard sees a read
        float(tr.state("spk").loss)
    assert reads.seen == ["_local_scalar_dense"]
    h = tr.history
    assert len(h) == 3 and not h["skipped"].any()


@pytest.mark.parametrize("model", [BLSTM(4, 3), BLSTM(4, 3, num_layers=2, layer_dropout=0.1), BRNN(4, 3)])
def test_packing_models_use_the_batchs_host_lengths_and_never_read_the_devices(model):
    x, host = torch.randn(3, 7, 4), torch.tensor([7, 2, 5])
    expected = model.eval()(x, host)
    # Lengths on the meta device hold no values: reading them back would fail, as a sync fails on a GPU.
    on_device = torch.empty(3, dtype=torch.long, device="meta")
    assert torch.equal(model(x, on_device, host_lengths=host), expected)
    with pytest.raises((NotImplementedError, RuntimeError)):
        model(x, on_device)


def test_the_graph_passes_the_batchs_host_lengths_to_models_that_take_them():
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(F_BINS, 3)

        def forward(self, x, seq_lengths, host_lengths=None):
            seen.append(host_lengths)
            return self.lin(x)

    ex = sequence_examples(3, 2)
    task = mtlab.Task("t", [mtlab.Node("h", "spy", ["x"]), mtlab.Node("o", "head", ["h"])], ["x"], ["y"], ["o"],
                      mtlab.losses.CrossEntropy(output="o", target="y"), {"train": mtlab.LinkedSet(ex)}, batch_size=3)
    tr = mtlab.Trainer({"spy": Spy(), "head": torch.nn.Linear(3, 3)}, [task], device="cpu")
    batch = mtlab.collate(ex)
    tr.process_minibatch("t", "train", batch=batch)
    assert len(seen) == 1 and seen[0] is batch[1]["x"]
