"""Loss-based task weightings: per-step coefficients from the exact per-task losses mtlab accumulates.

Each weighting reads, once per step, every contributing task's ``Σloss / Σnormalizer`` over everything
accumulated (all-reduced first under data parallelism, so every rank computes the same coefficients),
and returns one coefficient per task. The update multiplies each task's weight by it before the
combination (the weighted sum, or an aggregator: ``"uncertainty+upgrad"``). The coefficients go into the
history as ``weighting/<task>``. A step skipped for a non-finite value leaves the weighting's state as it was.

- ``uncertainty``: Kendall et al. 2018, ``Σ_t ½·e^{-s_t}·L_t + ½·s_t``; coefficient ``½·e^{-s_t}``, the
  log-variances ``s_t`` learned by an Adam of their own (lr: the trainer's unless given), saved in checkpoints.
- ``dwa``: Dynamic Weight Average (Liu et al. 2019), ``K·softmax(r/T)`` with ``r_t`` the ratio of task t's
  mean losses over the last two periods of ``period`` steps (uniform until two periods are done).
- ``famo``: FAMO (Liu et al. 2023) through ``torchjd.scalarization.FAMO``: the coefficients are the
  derivative of FAMO's scalarized loss by each task's loss (so the direction is FAMO's); its logits move by
  FAMO's rule from the change of the losses between consecutive steps, with an Adam mtlab owns so that the
  checkpoint holds it. The "after" losses are the next step's (other minibatches: no extra forward pass).
- ``random_loss``: Random Loss Weighting (Lin et al. 2022): ``softmax(N(0, I))``, drawn from a seed of the
  step (the same on every rank and after a resume).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..base.errors import ConfigError
from ..tasks.task import check_positive
from .update import METHODS, make_adam, optimizer_step

FAMO_EPS = 1e-8  # as FAMO's reference implementation: keeps log(L - b) finite


def keep(found_inf: Tensor | None, old: Tensor, new: Tensor) -> Tensor:
    """``new``, or ``old`` where the step is being skipped (decided on the device: no host read)."""
    return new if found_inf is None else torch.where(found_inf, old, new)


class UncertaintyWeighting:
    """Learned log-variances per task (Kendall, Gal and Cipolla 2018), one Adam of their own."""

    def __init__(self, lr: float | None = None, init: float = 0.0) -> None:
        self.lr = None if lr is None else check_positive(lr, "uncertainty lr")
        self.init = float(init)
        self.log_vars: dict[str, nn.Parameter] = {}
        self.optimizer: torch.optim.Optimizer | None = None

    def parameter(self, task: str, like: Tensor) -> nn.Parameter:
        """The learned log-variance of ``task`` (created on first use)."""
        p = self.log_vars.get(task)
        if p is None:
            p = self.log_vars[task] = nn.Parameter(torch.full((), self.init, dtype=like.dtype, device=like.device))
            if self.optimizer is None:
                self.optimizer = make_adam([p], lr=self.lr or 1e-3)
            else:
                self.optimizer.add_param_group({"params": [p]})
        return p

    def coefficients(self, tasks: Sequence[str], losses: Tensor, lr: float, found_inf: Tensor | None,
                     seed: int) -> Tensor:
        """This step's factor per task, from the step's per-task losses."""
        params: list[Tensor] = [self.parameter(t, losses) for t in tasks]
        s = torch.stack(params)
        with torch.enable_grad():
            objective = (0.5 * torch.exp(-s) * losses.detach() + 0.5 * s).sum()
            grads = torch.autograd.grad(objective, params)
        coef = 0.5 * torch.exp(-s.detach())
        assert self.optimizer is not None
        for p, g in zip(params, grads):
            p.grad = g
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr if self.lr is not None else lr
        optimizer_step(self.optimizer, found_inf)
        for p in params:
            p.grad = None
        return coef

    def state_dict(self) -> dict[str, Any]:
        """What the weighting carries between steps, for a checkpoint."""
        return {"tasks": list(self.log_vars), "log_vars": [p.detach().clone() for p in self.log_vars.values()],
                "optimizer": None if self.optimizer is None else self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what ``state_dict`` gave."""
        self.log_vars, self.optimizer = {}, None
        for task, value in zip(state["tasks"], state["log_vars"]):
            self.parameter(task, value).data.copy_(value)
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def __repr__(self) -> str:
        return f"UncertaintyWeighting(lr={self.lr})"


class DynamicWeightAverage:
    """DWA (Liu, Johns and Davison 2019) over periods of ``period`` steps (an epoch in the paper)."""

    def __init__(self, temperature: float = 2.0, period: int = 1) -> None:
        self.temperature = check_positive(temperature, "dwa temperature")
        if not isinstance(period, int) or period < 1:
            raise ConfigError(f"dwa period must be an integer >= 1 (steps per averaging period), got {period!r}")
        self.period = period
        self.steps = 0
        self.sums: dict[str, Tensor] = {}
        self.counts: dict[str, Tensor] = {}
        self.averages: list[dict[str, Tensor]] = []  # the last two periods' mean losses

    def coefficients(self, tasks: Sequence[str], losses: Tensor, lr: float, found_inf: Tensor | None,
                     seed: int) -> Tensor:
        """This step's factor per task, from the step's per-task losses."""
        known = len(self.averages) == 2 and all(t in a for a in self.averages for t in tasks)
        if known:
            rates = torch.stack([self.averages[1][t] / self.averages[0][t] for t in tasks])
            coef = len(tasks) * torch.softmax(rates / self.temperature, dim=0)
        else:
            coef = torch.ones_like(losses)
        ok = torch.ones((), dtype=losses.dtype, device=losses.device) if found_inf is None else (~found_inf).to(losses.dtype)
        for i, t in enumerate(tasks):
            zero = torch.zeros((), dtype=losses.dtype, device=losses.device)
            self.sums[t] = self.sums.get(t, zero) + keep(found_inf, zero, losses[i])
            self.counts[t] = self.counts.get(t, zero) + ok
        self.steps += 1
        if self.steps % self.period == 0:
            self.averages = [*self.averages, {t: self.sums[t] / self.counts[t] for t in self.sums}][-2:]
            self.sums, self.counts = {}, {}
        return coef

    def state_dict(self) -> dict[str, Any]:
        """What the weighting carries between steps, for a checkpoint."""
        return {"steps": self.steps, "sums": dict(self.sums), "counts": dict(self.counts),
                "averages": [dict(a) for a in self.averages]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what ``state_dict`` gave."""
        self.steps = int(state["steps"])
        self.sums, self.counts = dict(state["sums"]), dict(state["counts"])
        self.averages = [dict(a) for a in state["averages"]]

    def __repr__(self) -> str:
        return f"DynamicWeightAverage(temperature={self.temperature}, period={self.period})"


class RandomLossWeighting:
    """RLW (Lin et al. 2022): ``softmax`` of standard normal draws, new each step."""

    def coefficients(self, tasks: Sequence[str], losses: Tensor, lr: float, found_inf: Tensor | None,
                     seed: int) -> Tensor:
        """This step's factor per task, from the step's per-task losses."""
        gen = torch.Generator(device=losses.device).manual_seed(seed)
        draws = torch.randn(len(tasks), generator=gen, dtype=losses.dtype, device=losses.device)
        return torch.softmax(draws, dim=0)

    def state_dict(self) -> dict[str, Any]:
        """What the weighting carries between steps, for a checkpoint."""
        return {}  # the draws come from the update's step count, which the update saves

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what ``state_dict`` gave."""
        pass

    def __repr__(self) -> str:
        return "RandomLossWeighting()"


class FAMOWeighting:
    """FAMO's coefficients from ``torchjd.scalarization.FAMO`` (needs ``pip install "mtlab[mtl]"``)."""

    def __init__(self, lr: float = 0.025, weight_decay: float = 1e-3, min_losses: Sequence[float] | None = None) -> None:
        try:
            self.scalarization = importlib.import_module("torchjd.scalarization")
        except ImportError as exc:
            raise ImportError('combine method "famo" needs the package torchjd, which is not installed: '
                              'pip install "mtlab[mtl]"') from exc
        self.lr, self.weight_decay = check_positive(lr, "famo lr"), float(weight_decay)
        self.min_losses = None if min_losses is None else [float(b) for b in min_losses]
        self.tasks: list[str] | None = None
        self.famo: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.previous: Tensor | None = None

    def build(self, tasks: Sequence[str], like: Tensor) -> None:
        """Create torchjd's FAMO for these tasks (on first use)."""
        bounds = None if self.min_losses is None else torch.tensor(self.min_losses, dtype=like.dtype)
        self.tasks = list(tasks)
        self.famo = self.scalarization.FAMO(len(tasks), min_losses=bounds, lr=self.lr,
                                            weight_decay=self.weight_decay).to(device=like.device, dtype=like.dtype)
        self.optimizer = make_adam(list(self.famo.parameters()), lr=self.lr, weight_decay=self.weight_decay)

    def coefficients(self, tasks: Sequence[str], losses: Tensor, lr: float, found_inf: Tensor | None,
                     seed: int) -> Tensor:
        """This step's factor per task, from the step's per-task losses."""
        if self.tasks is None:
            self.build(tasks, losses)
        elif list(tasks) != self.tasks:
            raise ConfigError(f"famo keeps one logit per task and began with tasks {self.tasks}; this step has "
                              f"{list(tasks)}: keep every task's weight above 0, or choose the method again")
        losses = losses.detach()
        shift = self.famo.min_losses + FAMO_EPS
        if self.previous is not None:  # FAMO's logit update from the change of the losses over the last step
            (logits,) = self.famo.parameters()
            delta = torch.log(self.previous - shift) - torch.log(losses - shift)
            with torch.enable_grad():
                (logits.grad,) = torch.autograd.grad(torch.softmax(logits, dim=0), logits, grad_outputs=delta)
            assert self.optimizer is not None  # made with the logits, before the first step
            optimizer_step(self.optimizer, found_inf)
            logits.grad = None
        with torch.enable_grad():
            values = losses.clone().requires_grad_(True)
            (coef,) = torch.autograd.grad(self.famo(values), values)
        self.previous = losses.clone() if self.previous is None else keep(found_inf, self.previous, losses)
        return coef

    def state_dict(self) -> dict[str, Any]:
        """What the weighting carries between steps, for a checkpoint."""
        if self.famo is None:
            return {"tasks": None}
        assert self.optimizer is not None
        return {"tasks": list(self.tasks or []), "famo": self.famo.state_dict(),
                "optimizer": self.optimizer.state_dict(), "previous": self.previous}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what ``state_dict`` gave."""
        if state["tasks"] is None:
            self.tasks, self.famo, self.optimizer, self.previous = None, None, None, None
            return
        like = state["famo"]["min_losses"]
        self.build(state["tasks"], like)
        self.famo.load_state_dict(state["famo"])
        assert self.optimizer is not None
        self.optimizer.load_state_dict(state["optimizer"])
        self.previous = state["previous"]

    def __repr__(self) -> str:
        return f"FAMOWeighting(lr={self.lr}, weight_decay={self.weight_decay})"


WEIGHTINGS: dict[str, type] = {"uncertainty": UncertaintyWeighting, "dwa": DynamicWeightAverage,
                               "famo": FAMOWeighting, "random_loss": RandomLossWeighting}
for _name, _cls in WEIGHTINGS.items():
    METHODS[_name] = _cls
