"""A minibatch costs what the user's minibatch costs: torch ops counted (never timed) against the loop a user writes.

The case: a ``torch.nn.LSTM`` (one bidirectional layer, hidden 16) and a linear head, batch 4, lengths 5-20, one
task, K = 4. The oracle is the user's own minibatch (forward, the same frame cross-entropy on targets padded with
-100, backward, after ``zero_grad()``); mtlab gets the same examples as ``mtlab.collate`` batches. What mtlab may
add to a minibatch, averaged over a step, is :data:`EXTRA`; the bookkeeping that keeps it exact (the float64 sums of
loss and normalizer, the flat gradient buffer) is paid once per step, at ``finish()``."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import mtlab

K, BATCH, DIN, CLASSES, IGNORE = 4, 4, 40, 10, -100
EXTRA = 3  # torch ops per minibatch (averaged over a step) beyond the user's minibatch (15.75 before)


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(DIN, 16, batch_first=True, bidirectional=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0])


def examples(n: int) -> list[list[dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        lens = torch.randint(5, 21, (BATCH,), generator=g).tolist()
        out.append([{"x": torch.randn(t, DIN, generator=g), "y": torch.randint(0, CLASSES, (t,), generator=g)}
                    for t in lens])
    return out


def user_batch(chunk: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """What a user's collate_fn gives: zero-padded inputs, targets padded with -100."""
    t = max(len(e["y"]) for e in chunk)
    x, y = torch.zeros(len(chunk), t, DIN), torch.full((len(chunk), t), IGNORE)
    for i, e in enumerate(chunk):
        x[i, :len(e["y"])], y[i, :len(e["y"])] = e["x"], e["y"]
    return x, y


def user_minibatch_ops(chunks) -> tuple[float, Counter]:
    torch.manual_seed(0)
    model = Tagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [user_batch(c) for c in chunks]
    counted: Counter[str] = Counter()
    for step in range(3):
        opt.zero_grad()
        for x, y in batches[step * K:(step + 1) * K]:
            with CountOps() as mode:
                logits = model(x)
                F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum").backward()
            if step:
                counted += mode.ops
        for p in model.parameters():
            p.grad.div_(10.0)
        opt.step()
    return sum(counted.values()) / (2 * K), counted


def trainer() -> mtlab.Trainer:
    torch.manual_seed(0)
    task = mtlab.Task("tag", nodes=[mtlab.Node("logits", "tagger", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["logits"], loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"train": mtlab.LinkedSet(None)}, batch_size=BATCH)
    return mtlab.Trainer({"tagger": Tagger()}, [task], lr=1e-3, clip_grad_value=1.0, numbatches_to_aggregate=K,
                         device="cpu", seed=0)


def mtlab_minibatch_ops(chunks) -> tuple[float, Counter]:
    tr = trainer()
    batches = [mtlab.collate(c) for c in chunks]  # the public way a batch is made
    counted: Counter[str] = Counter()
    for step in range(3):  # the first step makes the optimizer state: counted from the second on
        for batch in batches[step * K:(step + 1) * K]:
            with CountOps() as mode:
                tr.process_minibatch("tag", "train", batch=batch)
            if step:
                counted += mode.ops
        tr.finish()
    return sum(counted.values()) / (2 * K), counted


def test_a_minibatch_adds_at_most_three_torch_ops_to_the_users_own():
    chunks = examples(3 * K)
    ours, ours_ops = mtlab_minibatch_ops(chunks)
    theirs, their_ops = user_minibatch_ops(chunks)
    more = Counter({k: v - their_ops.get(k, 0) for k, v in ours_ops.items() if v > their_ops.get(k, 0)})
    assert ours - theirs <= EXTRA, (ours, theirs, dict(more))


class Unused(nn.Module):
    """A tagger with a layer its forward never reaches: that layer gets no gradient from any backward."""

    def __init__(self) -> None:
        super().__init__()
        self.tagger, self.spare = Tagger(), nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tagger(x)


def test_the_first_backwards_gradients_enter_the_buffer_exactly_as_plain_pytorch_sums_them():
    chunks = examples(3)
    torch.manual_seed(0)
    model = Unused()
    ref = Unused()
    ref.load_state_dict(model.state_dict())
    task = mtlab.Task("tag", nodes=[mtlab.Node("logits", "m", ["x"])], inputs=["x"], targets=["y"], outputs=["logits"],
                      loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"a": mtlab.LinkedSet(None), "b": mtlab.LinkedSet(None, weight=0.5)}, batch_size=BATCH)
    tr = mtlab.Trainer({"m": model}, [task], lr=1e-3, numbatches_to_aggregate=3, device="cpu", seed=0)
    sets = ("a", "b", "a")
    for s, c in zip(sets, chunks):
        tr.process_minibatch("tag", s, batch=mtlab.collate(c))
    acc = tr.state("tag")
    grads = {k: v.clone() for k, v in acc.grads.items()}  # read while accumulating: the buffer holds them
    losses, norms = [], []
    for s, c in zip(sets, chunks):  # the oracle: plain PyTorch, each loss × its weight, summed by autograd
        x, y = user_batch(c)
        w = 0.5 if s == "b" else 1.0
        loss = F.cross_entropy(ref(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum")
        (loss * w).backward()
        losses.append(loss.detach().double() * w)
        norms.append(float((y != IGNORE).sum()) * w)
    for name, p in ref.named_parameters():
        expected = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(grads[f"m.{name}"], expected, rtol=1e-6, atol=1e-7)
    assert torch.count_nonzero(grads["m.spare.weight"]) == 0
    seq = torch.zeros((), dtype=torch.float64)
    for v in losses:
        seq = seq + v
    torch.testing.assert_close(acc.loss, seq, rtol=1e-6, atol=0)  # float32 forward: the losses agree to rounding
    assert float(acc.normalizer) == sum(norms)
    assert float(acc.set_normalizer["b"]) == norms[1] and float(acc.set_normalizer["a"]) == norms[0] + norms[2]
    assert torch.equal(acc.totals[0], acc.records[0].loss + acc.records[1].loss + acc.records[2].loss)
    tr.normalize(); tr.apply()
    assert tr.step_count == 1 and tr.params["m.tagger.head.weight"].grad is acc.grads["m.tagger.head.weight"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on GPU machines)")
def test_the_steps_sums_wait_for_nothing_on_cuda_whatever_the_weights_and_sets():
    """A layout of records not seen before (new weights, several linked sets) makes its small index and weight
    tensors on the host and copies them without waiting: no host sync, also the first time."""
    chunks = examples(3)
    task = mtlab.Task("tag", nodes=[mtlab.Node("logits", "tagger", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["logits"], loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
                      linkedsets={"a": mtlab.LinkedSet(None), "b": mtlab.LinkedSet(None, weight=0.25)}, batch_size=BATCH)
    tr = mtlab.Trainer({"tagger": Tagger()}, [task], lr=1e-3, clip_grad_value=1.0, device="cuda", nonfinite="skip")
    batches = [mtlab.base.batching.to_device(mtlab.collate(c), torch.device("cuda")) for c in chunks]
    tr.process_minibatch("tag", "a", batch=batches[0])
    tr.finish()  # the optimizer's state
    torch.cuda.set_sync_debug_mode("error")
    try:
        for s, b in zip(("b", "a", "b"), batches):
            tr.process_minibatch("tag", s, batch=b)
        tr.finish()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert tr.step_count == 2
