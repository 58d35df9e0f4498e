"""Small models and data shared by the tests (plain PyTorch). The package's modules hold what tests of one
theme share (tests/README.md): ``from helpers.nabu import write_recipe``."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import mtlab


class Encoder(nn.Module):
    """Per-frame MLP encoder: padding cannot leak between frames, so oracles stay simple."""

    def __init__(self, din: int = 4, dout: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(din, dout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class LSTMEncoder(nn.Module):
    """Encoder that takes seq_lengths (packed LSTM)."""

    def __init__(self, din: int = 4, dout: int = 8) -> None:
        super().__init__()
        self.rnn = nn.LSTM(din, dout, batch_first=True)

    def forward(self, x: torch.Tensor, seq_lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(x, seq_lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return out


def make_examples(n: int, seed: int, din: int = 4, classes: int = 5, lengths: tuple[int, int] = (2, 12),
                  dtype: torch.dtype = torch.float64, utt_classes: int = 3) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
        out.append({
            "x": torch.randn(t, din, generator=g, dtype=dtype),
            "y": torch.randint(0, classes, (t,), generator=g),
            "spk": torch.randint(0, utt_classes, (), generator=g),
        })
    return out


class MeanPool(nn.Module):
    def forward(self, h: torch.Tensor, seq_lengths: torch.Tensor) -> torch.Tensor:
        mask = (torch.arange(h.shape[1], device=h.device)[None, :] < seq_lengths[:, None]).to(h.dtype)
        return (h * mask[..., None]).sum(1) / seq_lengths[:, None].to(h.dtype)


def make_models(seed: int = 0, dtype: torch.dtype = torch.float64) -> dict[str, nn.Module]:
    torch.manual_seed(seed)
    return {
        "enc": Encoder().to(dtype),
        "head_a": nn.Linear(8, 5).to(dtype),
        "pool": MeanPool(),
        "head_b": nn.Linear(8, 3).to(dtype),
        "unused": nn.Linear(8, 2).to(dtype),
    }


def task_a(examples=None, weights=(1.0, 0.5), batch_size: int = 3, **kw) -> mtlab.Task:
    clean, noisy = examples if examples is not None else (None, None)
    return mtlab.Task(
        "a",
        nodes=[mtlab.Node("h", model="enc", inputs=["x"]), mtlab.Node("logits", model="head_a", inputs=["h"])],
        inputs=["x"], targets=["y"], outputs=["logits"],
        loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
        linkedsets={"clean": mtlab.LinkedSet(clean, weight=weights[0]),
                    "noisy": mtlab.LinkedSet(noisy, weight=weights[1])},
        batch_size=batch_size, **kw)


def task_b(examples=None, batch_size: int = 3, weight: float = 1.0) -> mtlab.Task:
    return mtlab.Task(
        "b",
        nodes=[mtlab.Node("h", model="enc", inputs=["x"]), mtlab.Node("pooled", model="pool", inputs=["h"]),
               mtlab.Node("logits", model="head_b", inputs=["pooled"])],
        inputs=["x"], targets=["spk"], outputs=["logits"],
        loss=mtlab.losses.CrossEntropy(output="logits", target="spk"),
        linkedsets={"clean": mtlab.LinkedSet(examples, weight=1.0)},
        batch_size=batch_size, weight=weight)


def clone_models(models: dict[str, nn.Module]) -> dict[str, nn.Module]:
    return {k: copy.deepcopy(m) for k, m in models.items()}


def script_validations(monkeypatch, values: list[float], first: tuple[str, str] = ("spk", "clean")) -> list[int]:  # noqa: ANN001
    """Every Trainer's validation returns the next value of ``values`` for each linked set; the steps at
    which linked set ``first`` was validated are returned (filled in as the run goes)."""

    calls: list[int] = []

    def scripted(self: mtlab.Trainer, task: str, linkedset: str, num_batches: Any = None,
                 examples: Any = None) -> tuple[float, float]:
        if (task, linkedset) == first:
            calls.append(self.step_count)
        return values[len(calls) - 1], 1.0

    monkeypatch.setattr(mtlab.Trainer, "evaluate_totals", scripted)
    return calls


def assert_grads_reach_weights_and_valid_frames(model: nn.Module) -> None:
    """A sequence model over ``[2, 9, 4]`` with lengths 9 and 5: every weight gets a gradient, and the
    second sequence's padded frames none (they are outside the computation)."""
    x = torch.randn(2, 9, 4, requires_grad=True)
    model(x, torch.tensor([9, 5])).pow(2).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad is not None
    assert x.grad[1, 5:].abs().sum() == 0
    assert x.grad[1, :5].abs().sum() > 0


class DecayingScale(mtlab.Transform):  # a user's transform, written outside mtlab
    """Multiply each task's gradient by factor × decay^(steps this task was scaled before)."""

    call = "scale"

    def __init__(self, factor: float, decay: float = 0.5) -> None:
        self.factor, self.decay = factor, decay
        self.seen: dict[str, int] = {}

    def __call__(self, acc: mtlab.Accumulator) -> dict[str, torch.Tensor]:
        k = self.seen.get(acc.task, 0)
        coef = torch.tensor(self.factor * self.decay ** k, dtype=torch.float64)
        for buf in acc.buffers:
            buf.mul_(coef.to(buf.dtype))
        self.seen[acc.task] = k + 1
        return {"scale": coef}

    def state_dict(self) -> dict[str, Any]:
        return {"seen": dict(self.seen)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seen = dict(state["seen"])

    def __repr__(self) -> str:
        return f"DecayingScale({self.factor:g})"
