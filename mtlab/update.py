"""The update: each parameter's direction from the tasks' processed gradients, then one optimizer step.

The direction of a parameter is ``Σ_t w_t · g_t`` over the tasks that use it and accumulated in this step,
built from the accumulators WITHOUT changing them (their gradients stay readable, bit for bit). Where one
task with weight 1 is the only contributor, the direction is that task's gradient itself (no copy); other
parameters get a buffer of their own, allocated once. A parameter whose contributors all have weight 0
gets no gradient, so the optimizer leaves it and its state alone, as for a parameter no task used.

``combine`` is the seam for task-combination methods: any callable with :class:`WeightedSum`'s signature.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from . import gradops
from .accumulator import Accumulator

logger = logging.getLogger("mtlab")

OptimizerFactory = Callable[[list[Any]], torch.optim.Optimizer]

# Fused optimizers accept a device-side ``found_inf`` (as torch.amp.GradScaler uses) from torch 2.4 on.
_FOUND_INF_MIN = (2, 4)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def skips_on_device(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` can skip a step on the device from a ``found_inf`` tensor (no host sync)."""
    return bool(opt.defaults.get("fused")) and _torch_version() >= _FOUND_INF_MIN


def optimizer_step(opt: torch.optim.Optimizer, found_inf: Tensor | None) -> None:
    """``opt.step()``, skipped where ``found_inf`` (0-d bool tensor) is true.

    The one place that knows how: a fused optimizer reads ``found_inf`` on the device (the mechanism
    ``torch.amp.GradScaler`` uses); any other optimizer needs one host read to decide.
    """
    if found_inf is None:
        opt.step()
    elif skips_on_device(opt):
        opt.found_inf = found_inf.to(torch.float32)  # type: ignore[attr-defined]
        try:
            opt.step()
        finally:
            del opt.found_inf  # type: ignore[attr-defined]
    elif not bool(found_inf):  # sync point: this optimizer cannot skip on the device
        opt.step()


def make_adam(params: list[Any], lr: float, **options: Any) -> torch.optim.Optimizer:
    """torch's Adam; fused where every parameter allows it (so a non-finite step is skipped on the device)."""
    flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    opts = dict(options)
    if "fused" not in opts and "foreach" not in opts:
        opts["fused"] = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in flat)
    return torch.optim.Adam(params, lr=lr, **opts)


class WeightedSum:
    """The default combination (the original's): ``Σ_t w_t · g_t`` per parameter."""

    def __call__(self, name: str, contributions: Sequence[tuple[str, float, Tensor]], out: Callable[[], Tensor]) -> Tensor:
        if len(contributions) == 1 and contributions[0][1] == 1.0:
            return contributions[0][2]
        return gradops.add_scaled_(out(), [(w, g) for _, w, g in contributions])

    def __repr__(self) -> str:
        return "WeightedSum()"


class Update:
    """One optimizer over every used parameter, stepped with the combined direction.

    >>> update = Update(params, users, lambda ps: make_adam(ps, lr=1e-3))
    >>> update.step(accumulators, {"a": 1.0, "b": 0.3}, lr=1e-3, found_inf=None)
    """

    def __init__(self, params: Mapping[str, nn.Parameter], users: Mapping[str, Sequence[str]],
                 make_optimizer: OptimizerFactory, combine: Any = None) -> None:
        self.params = dict(params)
        self.users = {k: list(v) for k, v in users.items()}
        self.optimizer = make_optimizer(list(self.params.values()))
        self.combine = combine if combine is not None else WeightedSum()
        self._buffers: dict[str, Tensor] = {}

    def _buffer(self, name: str) -> Tensor:
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = torch.empty_like(self.params[name])
        return buf

    def buffers(self) -> list[Tensor]:
        """The direction buffers allocated so far (for parameters where tasks' gradients had to be combined)."""
        return list(self._buffers.values())

    def directions(self, accs: Mapping[str, Accumulator], weights: Mapping[str, float]) -> dict[str, Tensor | None]:
        """Each parameter's direction from the accumulators of the tasks in ``weights`` (read only)."""
        out: dict[str, Tensor | None] = {}
        for name, users in self.users.items():
            contributions = []
            for t in users:
                w = weights.get(t)
                if w is None or w <= 0.0:
                    continue
                g = accs[t].grads.get(name) if accs[t].minibatches else None
                if g is not None:
                    contributions.append((t, w, g))
            out[name] = self.combine(name, contributions, lambda n=name: self._buffer(n)) if contributions else None
        return out

    def step(self, accs: Mapping[str, Accumulator], weights: Mapping[str, float], lr: float,
             found_inf: Tensor | None) -> None:
        """Set each parameter's ``.grad`` to its direction, step the optimizer, and give the
        accumulators their ``.grad`` views back (whatever happens)."""
        directions = self.directions(accs, weights)
        try:
            for name, d in directions.items():
                self.params[name].grad = d
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            optimizer_step(self.optimizer, found_inf)
        finally:
            for acc in accs.values():
                acc.restore_grads()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


class PerTaskUpdate:
    """The original's ``acc_steps``: one optimizer per task (lr × task weight), applied one task after another;
    with ``normalize_weights`` a parameter's factor is the task weight over the summed weights of its users."""

    def __init__(self, task_params: Mapping[str, Mapping[str, nn.Parameter]], users: Mapping[str, Sequence[str]],
                 make_optimizer: OptimizerFactory, normalize_weights: bool = False) -> None:
        self.task_params = {t: dict(ps) for t, ps in task_params.items()}
        self.users = {k: list(v) for k, v in users.items()}
        self.normalize_weights = normalize_weights
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        for task, params in self.task_params.items():
            groups: dict[tuple[str, ...], list[nn.Parameter]] = {}
            for name, p in params.items():
                groups.setdefault(tuple(self.users[name]), []).append(p)
            self.optimizers[task] = make_optimizer([{"params": ps, "mtlab_users": list(u)} for u, ps in groups.items()])
        self.optimizer = None

    def step(self, accs: Mapping[str, Accumulator], weights: Mapping[str, float], lr: float,
             found_inf: Tensor | None) -> None:
        try:
            for task, w in weights.items():
                opt = self.optimizers[task]
                for group in opt.param_groups:
                    factor = w
                    if self.normalize_weights:
                        total = sum(weights.get(u, 0.0) for u in group["mtlab_users"])
                        factor = w / total if total > 0 else 0.0
                    group["lr"] = lr * factor
                grads = accs[task].grads
                for name, p in self.task_params[task].items():
                    p.grad = grads.get(name)
                optimizer_step(opt, found_inf)
                for name, p in self.task_params[task].items():
                    p.grad = None
        finally:
            for acc in accs.values():
                acc.restore_grads()

    def state_dict(self) -> dict[str, Any]:
        return {"task_optimizers": {k: o.state_dict() for k, o in self.optimizers.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k, o in self.optimizers.items():
            o.load_state_dict(state["task_optimizers"][k])
