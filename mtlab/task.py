"""Tasks, their linked sets (weighted alternative data sources) and their accumulation state."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .errors import ConfigError
from .graph import ModelGraph, Node

LossComputer = Callable[[Mapping[str, Tensor], Mapping[str, Tensor], Mapping[str, Tensor]], tuple[Tensor, Tensor]]

PHASES = ("empty", "accumulating", "normalized", "clipped", "applied")


def check_weight(value: Any, what: str) -> float:
    """A finite, non-negative float, or a ConfigError naming ``what``."""
    try:
        w = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number >= 0, got {value!r}") from None
    if not math.isfinite(w) or w < 0:
        raise ConfigError(f"{what} must be a finite number >= 0, got {value!r}")
    return w


class LinkedSet:
    """A weighted data source for a task: ``LinkedSet(examples, weight=0.5)``.

    ``examples`` is a sequence (or Dataset) of example dicts, or None when every minibatch is
    passed explicitly. ``valid`` optionally holds held-out examples for ``Trainer.evaluate``.
    Both the summed loss and the norm of each minibatch are multiplied by ``weight``.
    """

    def __init__(self, examples: Any = None, weight: float = 1.0, valid: Any = None,
                 num_workers: int = 0) -> None:
        self.examples = examples
        self.weight = check_weight(weight, "LinkedSet weight")
        self.valid = valid
        self.num_workers = num_workers
        if examples is not None and not hasattr(examples, "__len__"):
            raise ConfigError(
                f"LinkedSet examples must be a sequence or Dataset of example dicts, got {type(examples).__name__}"
            )

    def __repr__(self) -> str:
        n = "explicit batches" if self.examples is None else f"{len(self.examples)} examples"
        return f"LinkedSet({n}, weight={self.weight:g})"


class Task:
    """A named task: a graph of models, a loss computer and weighted linked sets."""

    def __init__(
        self,
        name: str,
        nodes: Sequence[Node],
        inputs: Sequence[str],
        targets: Sequence[str],
        outputs: Sequence[str],
        loss: LossComputer,
        linkedsets: Mapping[str, LinkedSet],
        batch_size: int = 8,
        weight: float = 1.0,
        numbuckets: int = 1,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a Task needs a non-empty string name, got {name!r}")
        self.name = name
        self.inputs = tuple([inputs] if isinstance(inputs, str) else inputs)
        self.targets = tuple([targets] if isinstance(targets, str) else targets)
        self.outputs = tuple([outputs] if isinstance(outputs, str) else outputs)
        clash = set(self.inputs) & set(self.targets)
        if clash:
            raise ConfigError(f"task {name!r}: {sorted(clash)} listed both as inputs and as targets")
        self.graph = ModelGraph(nodes, self.inputs, self.outputs, where=f"task {name!r}")
        self.nodes = self.graph.nodes
        if not callable(loss):
            raise ConfigError(
                f"task {name!r}: loss must be callable as loss(targets, outputs, seq_lengths) -> (loss_sum, norm), "
                f"got {type(loss).__name__}"
            )
        self.loss = loss
        if not isinstance(linkedsets, Mapping) or not linkedsets:
            raise ConfigError(f"task {name!r}: linkedsets must be a non-empty dict name -> mtlab.LinkedSet")
        for set_name, ls in linkedsets.items():
            if not isinstance(ls, LinkedSet):
                raise ConfigError(
                    f"task {name!r}: linked set {set_name!r} is a {type(ls).__name__}; wrap it as mtlab.LinkedSet(examples, weight=...)"
                )
        self.linkedsets: dict[str, LinkedSet] = dict(linkedsets)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"task {name!r}: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        if not isinstance(numbuckets, int) or isinstance(numbuckets, bool) or numbuckets < 1:
            raise ConfigError(f"task {name!r}: numbuckets must be a positive integer, got {numbuckets!r}")
        self.numbuckets = numbuckets
        self.weight = check_weight(weight, f"task {name!r} weight")

    def __repr__(self) -> str:
        return (f"Task({self.name!r}, models={self.graph.model_names}, "
                f"linkedsets={ {k: v.weight for k, v in self.linkedsets.items()} }, weight={self.weight:g})")


@dataclass
class MinibatchRecord:
    """One processed minibatch: which linked set, how many examples, its weighted loss and norm."""

    linkedset: str
    num_examples: int
    weight: float
    loss: Tensor
    norm: Tensor
    trace: dict[str, Tensor] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"linkedset": self.linkedset, "examples": self.num_examples, "weight": self.weight,
               "loss": float(self.loss), "norm": float(self.norm)}
        if self.trace:
            out.update({f"grad_norm/{k}": float(v) for k, v in self.trace.items()})
        return out


@dataclass
class TaskState:
    """Everything a task has accumulated since its last reset; readable between any two calls.

    ``grads`` maps ``"<model>.<param>"`` to this task's accumulated (then normalized, then clipped)
    gradient. ``batch_loss`` and ``batch_loss_norm`` are the weighted sums over ``records`` (one per
    minibatch), kept as tensors until read (no device sync while training).
    """

    task: str
    phase: str = "empty"
    minibatches: int = 0
    records: list[MinibatchRecord] = field(default_factory=list)
    grad_norm: Tensor | None = None
    grad_norm_clipped: Tensor | None = None
    clip_fraction: Tensor | None = None
    param_norms: dict[str, Tensor] = field(default_factory=dict)
    param_norms_clipped: dict[str, Tensor] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _grad_view: Callable[[], dict[str, Tensor]] | None = field(default=None, repr=False)
    _sums: tuple[int, Tensor, Tensor] | None = field(default=None, repr=False)

    def _totals(self) -> tuple[Tensor, Tensor]:
        n = len(self.records)
        if self._sums is None or self._sums[0] != n:
            if n == 0:
                zero = torch.zeros((), device=self.device)
                self._sums = (0, zero, zero)
            elif n == 1:
                self._sums = (1, self.records[0].loss, self.records[0].norm)
            else:
                loss = torch.stack([r.loss for r in self.records]).sum()
                norm = torch.stack([r.norm for r in self.records]).sum()
                self._sums = (n, loss, norm)
        return self._sums[1], self._sums[2]

    @property
    def batch_loss(self) -> Tensor:
        """Σ weight × summed loss over the accumulated minibatches."""
        return self._totals()[0]

    @property
    def batch_loss_norm(self) -> Tensor:
        """Σ weight × norm over the accumulated minibatches."""
        return self._totals()[1]

    @property
    def set_loss(self) -> dict[str, Tensor]:
        return self._by_set("loss")

    @property
    def set_norm(self) -> dict[str, Tensor]:
        return self._by_set("norm")

    def _by_set(self, what: str) -> dict[str, Tensor]:
        groups: dict[str, list[Tensor]] = {}
        for r in self.records:
            groups.setdefault(r.linkedset, []).append(getattr(r, what))
        if len(groups) == 1:
            name = next(iter(groups))
            return {name: self.batch_loss if what == "loss" else self.batch_loss_norm}
        return {k: v[0] if len(v) == 1 else torch.stack(v).sum() for k, v in groups.items()}

    @property
    def grads(self) -> dict[str, Tensor]:
        return self._grad_view() if self._grad_view is not None else {}

    @property
    def normalized_loss(self) -> Tensor:
        """``batch_loss / batch_loss_norm`` (the mean over everything accumulated)."""
        return self.batch_loss / self.batch_loss_norm

    def linkedset_loss(self, name: str) -> Tensor:
        """Σloss/Σnorm of one linked set's minibatches in this accumulation."""
        return self.set_loss[name] / self.set_norm[name]

    def model_grad_norms(self, clipped: bool = False) -> dict[str, Tensor]:
        """Gradient norm per model (before clipping, or after with ``clipped=True``)."""
        source = self.param_norms_clipped if clipped else self.param_norms
        per_model: dict[str, list[Tensor]] = {}
        for name, n in source.items():
            per_model.setdefault(name.split(".", 1)[0], []).append(n)
        return {m: torch.linalg.vector_norm(torch.stack(v)) for m, v in per_model.items()}

    def summary(self) -> dict[str, Any]:
        """Host-side values (reads the device): phase, counts, loss, norm, gradient norms."""
        out: dict[str, Any] = {"task": self.task, "phase": self.phase, "minibatches": self.minibatches,
                               "batch_loss": float(self.batch_loss), "batch_loss_norm": float(self.batch_loss_norm)}
        out["normalized_loss"] = out["batch_loss"] / out["batch_loss_norm"] if out["batch_loss_norm"] else float("nan")
        for key in ("grad_norm", "grad_norm_clipped", "clip_fraction"):
            value = getattr(self, key)
            out[key] = None if value is None else float(value)
        return out

    def __repr__(self) -> str:
        return (f"TaskState({self.task!r}, phase={self.phase!r}, minibatches={self.minibatches}, "
                f"grads={len(self.grads)} tensors)")

    def _repr_html_(self) -> str:
        s = self.summary()
        rows = "".join(f"<tr><td>{k}</td><td>{'' if v is None else (f'{v:.6g}' if isinstance(v, float) else v)}</td></tr>"
                       for k, v in s.items())
        return f"<table><caption>mtlab task state</caption>{rows}</table>"
