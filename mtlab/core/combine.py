"""Task-combination methods on the accumulated per-task gradients: torchjd's aggregators, no extra backward.

mtlab keeps each task's accumulated, normalized, clipped gradient apart. For every group of shared
parameters that the same tasks contributed to (one shared encoder: one group), the update builds the
Jacobian ``J`` (tasks × those parameters, flattened; row t = ``w_t · g_t``) from the accumulators' buffers and
hands it to a `torchjd <https://torchjd.org>`_ aggregator; the aggregator's vector, cut back into
parameters, is the direction. Task-specific parameters keep their own task's weighted gradient. So a step
still costs tasks × minibatches backward passes, whatever the method, and the combination runs once per
step on the exact accumulated (and, data parallel, all-reduced) gradients.

Task weights apply BEFORE the aggregator (they scale J's rows), for one meaning in every method: the
weight scales that task's loss, exactly as in the weighted sum (which is the sum aggregator on the same J)
and as torchjd would see ``w_t · L_t``. Scale-invariant methods (MGDA, IMTL-G, UPGrad's projections) then
largely ignore them; a weight of 0 still leaves the task out.

Examples:
    >>> # or trainer.set_combine("pcgrad") between steps
    >>> trainer = mtlab.Trainer(models, tasks, combine="upgrad")  # doctest: +SKIP
    >>> # the weights UPGrad chose per step
    >>> trainer.history.filter(like="combine/")  # doctest: +SKIP

Needs ``pip install "mtlab[mtl]"`` (torchjd with the solvers its methods use).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .update import METHODS, Group, Row, flat

EXTRA = 'pip install "mtlab[mtl]"'


@dataclass(frozen=True)
class Method:
    """One torchjd aggregator as mtlab offers it."""

    cls: str  # the class in torchjd.aggregation
    defaults: dict[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # modules its solver imports
    random: bool = False  # draws random numbers: seeded per step (the same on every rank, and on resume)
    per_size: bool = False  # takes the number of tasks (n_tasks)
    doc: str = ""
    state: tuple[str, ...] = ()  # the weighting's attributes that carry state from step to step (checkpointed)


AGGREGATORS: dict[str, Method] = {
    "upgrad": Method("UPGrad", needs=("numpy", "qpsolvers", "quadprog"),
                     doc="each row projected onto the dual cone of all rows, then averaged (Jacobian descent)"),
    "mgda": Method("MGDA", doc="min-norm point of the rows' convex hull (Désidéri; Sener & Koltun)"),
    "pcgrad": Method("PCGrad", random=True, doc="rows projected off each other's conflicting part, random order"),
    "cagrad": Method("CAGrad", {"c": 0.5}, needs=("numpy", "cvxpy", "clarabel"),
                     doc="conflict-averse: best worst-case improvement near the mean (c = 0.5)"),
    "imtl_g": Method("IMTLG", doc="equal projections of the direction on every row (IMTL-G)"),
    "aligned_mtl": Method("AlignedMTL", doc="rows aligned by the Jacobian's condition number (Aligned-MTL)"),
    "dualproj": Method("DualProj", needs=("numpy", "qpsolvers", "quadprog"),
                       doc="the mean projected onto the dual cone of the rows"),
    "graddrop": Method("GradDrop", random=True, doc="random sign-consistent masking per coordinate (GradDrop)"),
    "nash_mtl": Method("NashMTL", needs=("numpy", "cvxpy", "ecos"), per_size=True,
                       doc="Nash bargaining solution (stateful: its previous weights and step count are checkpointed)",
                       state=("step", "prvs_alpha", "normalization_factor", "init_gtg")),
    "config": Method("ConFIG", doc="conflict-free direction from the rows' unit vectors (ConFIG)"),
}


def require(name: str, method: Method) -> Any:
    """The ``torchjd.aggregation`` module, after checking every module ``name`` needs: ImportError naming
    the extra otherwise."""
    for module in ("torchjd", *method.needs):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"combine method {name!r} needs the package {module!r}, which is not installed: "
                              f"{EXTRA}") from exc
    return importlib.import_module("torchjd.aggregation")


def jacobian(rows: Sequence[Row]) -> Tensor:
    """``[tasks, parameters]``: row t is ``w_t ·`` task t's flattened gradient (one copy of each row)."""
    first = rows[0][2]
    dtype = reduce(torch.promote_types, (g.dtype for g in first))
    J = torch.empty(len(rows), sum(g.numel() for g in first), dtype=dtype, device=first[0].device)
    for i, (_, w, grads) in enumerate(rows):
        v = flat(grads)
        if isinstance(w, Tensor) or w != 1.0:
            torch.mul(v, w, out=J[i])
        else:
            J[i].copy_(v)
    return J


def unflatten(vector: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """``vector`` cut into tensors shaped (and typed) as ``like``: views where the dtype already matches."""
    pieces = torch.split(vector, [g.numel() for g in like])
    return [p.view(g.shape).to(g.dtype) for p, g in zip(pieces, like)]


def _storable(value: Any) -> Any:
    """A state value as checkpoints hold it: numpy arrays as tensors (checkpoints load without pickles)."""
    if type(value).__module__ == "numpy":
        return torch.from_numpy(np.asarray(value).copy()) if hasattr(value, "shape") and value.shape else float(value)
    return value


class Aggregate:
    """The ``combine`` seam filled by a torchjd aggregator, one instance per shared group (stateful methods
    keep a state per group). ``last_weights[group]`` holds the per-task weights it chose last, where the
    aggregator has such weights (every one here but GradDrop and ConFIG)."""

    def __init__(self, name: str, make: Callable[[int], Any], random: bool = False, weighted: bool = True,
                 state: tuple[str, ...] = ()) -> None:
        self.name = name
        self.make = make
        self.random = random
        self.state = state
        self.weighted = weighted  # rows combined with weights the aggregator computes (a WeightedAggregator)
        self.aggregators: dict[str, Any] = {}
        self.last_weights: dict[str, Tensor] = {}

    def aggregator(self, group: Group) -> Any:
        agg = self.aggregators.get(group.name)
        if agg is None:
            agg = self.aggregators[group.name] = self.make(len(group.tasks))
            if self.weighted:  # capture the weights it computes, without computing them twice
                agg.weighting.register_forward_hook(partial(self.keep_weights, group.name))
        return agg

    def keep_weights(self, group: str, module: Any, inputs: Any, output: Tensor) -> None:
        self.last_weights[group] = output.detach()

    def __call__(self, group: Group, rows: Sequence[Row], out: Callable[[], list[Tensor]]) -> list[Tensor]:
        direction = self.aggregator(group)(jacobian(rows))
        return unflatten(direction, rows[0][2])

    def state_dict(self) -> dict[str, Any]:
        """Each shared group's state of a stateful method (Nash-MTL: its previous weights and step count)."""
        if not self.state:
            return {}
        return {group: {"tasks": int(agg.weighting.n_tasks),
                        "values": {k: _storable(getattr(agg.weighting, k)) for k in self.state}}
                for group, agg in self.aggregators.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore each shared group's state (the method's instance for that group is built first)."""
        for group, saved in state.items():
            agg = self.aggregators.get(group) or self.aggregator(Group(group, tuple(map(str, range(saved["tasks"]))), ()))
            if saved["values"].get("step", 0):
                # Nash-MTL builds its solver's problem on its first call: one call on a stand-in Jacobian builds
                # it, then the saved values replace what that call left
                agg(torch.eye(saved["tasks"], dtype=torch.float64))
                self.last_weights.pop(group, None)
            for k, v in saved["values"].items():
                setattr(agg.weighting, k, v.numpy().copy() if isinstance(v, Tensor) else v)

    def __repr__(self) -> str:
        return f"Aggregate({self.name!r})"


def make(name: str, **options: Any) -> Aggregate:
    """The combination ``name`` (a key of ``AGGREGATORS``) with torchjd options (e.g. ``c=0.4`` for CAGrad)."""
    method = AGGREGATORS[name]
    module = require(name, method)
    cls = getattr(module, method.cls)
    settings = {**method.defaults, **options}

    def build(tasks: int) -> Any:
        return cls(n_tasks=tasks, **settings) if method.per_size else cls(**settings)

    build(2)  # a bad option fails here (TypeError -> ConfigError from the registry), not at the first step
    return Aggregate(name, build, method.random, issubclass(cls, module.WeightedAggregator), method.state)


for _name in AGGREGATORS:
    METHODS[_name] = partial(make, _name)


def methods() -> dict[str, str]:
    """Name -> one line, for every aggregator offered (whether or not its packages are installed)."""
    return {k: m.doc for k, m in AGGREGATORS.items()}
