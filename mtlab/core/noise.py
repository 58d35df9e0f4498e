"""Each task's gradient noise scale, measured from the accumulation itself (McCandlish et al. 2018, app. A).

A step of ``k`` minibatches already holds ``k`` small-batch gradients and their mean, the big-batch gradient.
With minibatch ``i`` contributing ``c_i = w_i ∇L_i`` (its weighted summed-loss gradient) and ``m_i = w_i n_i``
(its weighted normalizer; ``n_i`` frames, bins or utterances), ``π_i = m_i / Σm``:

    g_i = c_i / m_i                (minibatch i's mean gradient, E|g_i|² = |G|² + tr(Σ)/n_i)
    G_big = Σ c_i / Σ m_i          (the step's normalized gradient, E|G_big|² = |G|² + tr(Σ)·b)
    A = Σ π_i |g_i|²,  a = Σ π_i / n_i,  b = Σ π_i² / n_i
    tr(Σ)^ = (A − |G_big|²) / (a − b)          |G|²^ = (a |G_big|² − b A) / (a − b)

both unbiased (with equal weights ``a = k/N``, ``b = 1/N``: McCandlish's B_small = N/k, B_big = N). The noise
scale ``B_simple = EMA(tr(Σ)^) / EMA(|G|²^)`` (the ratio of moving averages, as the paper advises). One
minibatch per step gives ``a = b``: no estimate (NaN), and :meth:`NoiseScale.message` says two are needed.

Cost: one copy of a task's gradient buffer before each of its minibatches after the first, one subtraction and
a grouped norm after it; no extra backward, no host read (everything stays a device tensor until the history
row is read). Opt in with ``Trainer(noise_scale=True)`` or ``trainer.noise_scale = NoiseScale()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from ..base import gradops
from ..base.errors import ConfigError
from .columns import noise_column

if TYPE_CHECKING:
    import pandas as pd

    from .accumulator import Accumulator


class Measured(Protocol):
    """What :meth:`NoiseScale.suggest` reads of a trainer."""

    @property
    def tasks(self) -> Mapping[str, object]: ...

    @property
    def history(self) -> pd.DataFrame: ...


class _TaskNoise:
    """One task's per-minibatch squared contributions of this step and its running averages."""

    def __init__(self) -> None:
        self.scratch: list[Tensor] = []
        self.pending = False  # scratch holds the buffers as they were before the minibatch in flight
        self.c2: list[Tensor] = []  # per minibatch: [models..., total] squared norms of c_i
        self.m: list[Tensor] = []  # per minibatch: w_i n_i (0-d float64)
        self.w: list[float] = []  # per minibatch: w_i (host floats, known without a read)
        self.ema_trace: Tensor | None = None
        self.ema_g2: Tensor | None = None
        self.steps = 0
        self.last_k = 0


class Suggestion(dict[str, "int | None"]):
    """:meth:`NoiseScale.suggest`'s answer: task -> minibatches per step, None where there is no estimate; ``why``
    says, for each None, what is missing."""

    def __init__(self) -> None:
        super().__init__()
        self.why: dict[str, str] = {}

    def __repr__(self) -> str:
        return super().__repr__() + "".join(f"\n  {t}: {why}" for t, why in self.why.items())


class NoiseScale:
    """Per task (and per model of a task) gradient noise scale ``B_simple`` with an EMA of factor ``beta``.

    B_simple of task a (in normalizer units) and the minibatches per step each task could use:

    >>> trainer = Trainer(models, tasks, numbatches_to_aggregate=4, noise_scale=True)  # doctest: +SKIP
    >>> trainer.step(); trainer.history["gns/a"]  # doctest: +SKIP
    >>> trainer.noise_scale.suggest(trainer)  # doctest: +SKIP
    """

    def __init__(self, beta: float = 0.95) -> None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= float(beta) < 1.0:
            raise ConfigError(f"NoiseScale(beta={beta!r}): beta must be a number in [0, 1), the moving averages' "
                              "decay (e.g. 0.95; 0: no averaging)")
        self.beta = float(beta)
        self.tasks: dict[str, _TaskNoise] = {}

    @classmethod
    def build(cls, spec: bool | NoiseScale | None, scaling: bool = False) -> NoiseScale | None:
        """The trainer's ``noise_scale=`` argument: False/None (off), True, or a NoiseScale."""
        if not spec:
            return None
        if scaling:
            raise ConfigError("noise_scale is not measured under precision='16-mixed' (scaled gradients); use '32' "
                             "or 'bf16-mixed', or noise_scale=False")
        return spec if isinstance(spec, NoiseScale) else cls()

    def _of(self, task: str) -> _TaskNoise:
        st = self.tasks.get(task)
        if st is None:
            st = self.tasks[task] = _TaskNoise()
        return st

    # ------------------------------------------------------------------ during the minibatches
    def before_backward(self, acc: Accumulator) -> None:
        """Keep the buffers as they are before this minibatch's backward (nothing to keep for the first)."""
        st = self._of(acc.task)
        if acc.minibatches == 0:
            st.c2, st.m, st.w = [], [], []
            st.pending = False
            return
        if len(st.scratch) != len(acc.buffers):
            st.scratch = [torch.empty_like(b) for b in acc.buffers]
        for dst, src in zip(st.scratch, acc.buffers):
            dst.copy_(src)
        st.pending = True

    def after_record(self, acc: Accumulator) -> None:
        """The minibatch's contribution c_i = buffers now − buffers before: its squared norm per model."""
        st = self._of(acc.task)
        if st.pending:
            for diff, now in zip(st.scratch, acc.buffers):
                torch.sub(now, diff, out=diff)
            buffers = st.scratch
        else:
            buffers = acc.buffers
        views = [buffers[i][a:b] for segs in acc.segments.values() for i, a, b in segs]
        per_model, total = gradops.grouped_norms(views, [len(s) for s in acc.segments.values()], acc.device)
        st.c2.append(torch.stack([*per_model, total]).to(torch.float64).square())
        rec = acc.records[-1]
        st.m.append(rec.normalizer)
        st.w.append(rec.weight)
        st.pending = False

    def clear(self) -> None:
        """Forget everything measured (a re-initialised run starts without averages)."""
        self.tasks = {}

    def discard(self, task: str | None = None) -> None:
        """Forget this step's minibatches (a reset); the averages stay."""
        for name in [task] if task is not None else list(self.tasks):
            st = self.tasks.get(name)
            if st is not None:
                st.c2, st.m, st.w, st.pending = [], [], [], False

    # ------------------------------------------------------------------ at apply
    def estimate(self, acc: Accumulator, normalized: bool) -> tuple[Tensor, Tensor, Tensor] | None:
        """``(tr(Σ)^, |G|²^, mean n)`` per model and total (``[models..., total]`` float64), NaN with one
        minibatch; None when the task's minibatches were not all seen (noise scale attached mid-step)."""
        st = self.tasks.get(acc.task)
        if st is None or len(st.c2) != acc.minibatches or not st.c2 or acc.grad_norm is None:
            return None
        keep = [i for i, w in enumerate(st.w) if w != 0.0]  # weight 0: no contribution, no size
        if not keep:
            return None
        c2 = torch.stack([st.c2[i] for i in keep])  # [k, models+1]
        m = torch.stack([st.m[i] for i in keep]).to(c2.device)  # [k]
        n = torch.stack([st.m[i] / st.w[i] for i in keep]).to(c2.device)  # host weights: no copy to the device
        total_m = m.sum()
        pi = m / total_m
        a, b = (pi / n).sum(), (pi.square() / n).sum()
        big = torch.stack([*acc.model_norms.values(), acc.grad_norm]).to(torch.float64).square()  # pre-clip
        if not normalized:
            big = big / total_m.square()
        small = (c2 / (m * total_m)[:, None]).sum(0)  # Σ π_i |c_i / m_i|²
        trace = (small - big) / (a - b)  # one minibatch: 0/0 = NaN, as it should be
        g2 = (a * big - b * small) / (a - b)
        st.last_k = len(keep)
        return trace, g2, n.mean()

    def after_apply(self, acc: Accumulator, normalized: bool, skipped: Tensor) -> dict[str, Tensor]:
        """Update the task's averages (not on a skipped step) and return its history columns."""
        est = self.estimate(acc, normalized)
        st = self._of(acc.task)
        st.c2, st.m, st.w = [], [], []
        if est is None:
            return {}
        trace, g2, mean_n = est
        ok = ~skipped & torch.isfinite(trace).all() & torch.isfinite(g2).all()
        beta = self.beta
        # Both averages start at 0 and share one decay, so their ratio needs no bias correction.
        ema_trace = torch.zeros_like(trace) if st.ema_trace is None else st.ema_trace
        ema_g2 = torch.zeros_like(g2) if st.ema_g2 is None else st.ema_g2
        st.ema_trace = torch.where(ok, beta * ema_trace + (1 - beta) * trace, ema_trace)
        st.ema_g2 = torch.where(ok, beta * ema_g2 + (1 - beta) * g2, ema_g2)
        st.steps += 1
        # Both estimates are unbiased, not positive: while either average is <= 0 (noise swamps |G|² at this batch
        # size, or too few steps), B_simple is undefined (NaN), not a negative batch size; message() says why.
        defined = (st.ema_trace > 0) & (st.ema_g2 > 0)
        b_simple = torch.where(defined, st.ema_trace / st.ema_g2, torch.full_like(st.ema_g2, math.nan))
        name = acc.task
        cols = {noise_column(name): b_simple[-1], noise_column(name, part="gns_trace"): trace[-1],
                noise_column(name, part="gns_g2"): g2[-1], noise_column(name, part="gns_minibatches"): b_simple[-1] / mean_n}
        cols.update({noise_column(name, model): b_simple[i] for i, model in enumerate(acc.segments)})
        return cols

    # ------------------------------------------------------------------ reading
    def _missing(self, task: str) -> str | None:
        """Why ``task`` has no noise scale now (host reads of its averages), None when it has one."""
        st = self.tasks.get(task)
        if st is None or st.steps == 0:
            return f"task {task!r}: no step measured yet"
        if st.last_k < 2:
            return (f"task {task!r}: the noise scale needs two minibatches per step (it has {st.last_k}); set "
                    "numbatches_to_aggregate >= 2 or give the task a second linked set")
        if st.ema_trace is not None and st.ema_g2 is not None:
            trace, g2 = float(st.ema_trace[-1]), float(st.ema_g2[-1])
            if not (trace > 0 and g2 > 0):
                which, value = ("|G|² (the true gradient's size)", g2) if not g2 > 0 else ("tr(Σ) (the noise)", trace)
                return (f"task {task!r}: no noise scale yet: after {st.steps} step(s) the moving average of {which} "
                        f"is {value:.3g}, not positive (the per-step estimates are unbiased but noisy, and the noise "
                        "swamps the gradient at this batch size); train more steps, raise NoiseScale(beta=...) "
                        "towards 1 to average longer, or use more minibatches per step")
        return None

    def message(self, task: str) -> str:
        """What the noise scale of ``task`` can say now (host side)."""
        missing = self._missing(task)
        return missing if missing is not None else f"task {task!r}: measured over {self.tasks[task].steps} step(s)"

    def suggest(self, trainer: Measured) -> Suggestion:
        """Task -> minibatches per step that reach its noise scale (ceil(B_simple / mean minibatch size)),
        from the latest history row that has one (reads the history); None where there is no estimate now, with
        the reason in ``.why`` (and in the repr)."""
        frame = trainer.history
        out = Suggestion()
        for task in trainer.tasks:
            col = noise_column(task, part="gns_minibatches")
            values = frame[col].dropna() if col in frame else None
            value = float(values.iloc[-1]) if values is not None and len(values) else math.nan
            missing = self._missing(task)
            if missing is None and not (math.isfinite(value) and value > 0):
                missing = f"task {task!r}: no noise scale in the history (column {col!r})"
            out[task] = max(1, math.ceil(value)) if missing is None else None
            if missing is not None:
                out.why[task] = missing
        return out

    def state_dict(self) -> dict[str, Any]:
        """The moving averages per task (kept in the trainer's state and checkpoints)."""
        return {"beta": self.beta, "tasks": {n: {"ema_trace": st.ema_trace, "ema_g2": st.ema_g2, "steps": st.steps,
                                                 "last_k": st.last_k}
                                             for n, st in self.tasks.items() if st.ema_trace is not None}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Restore ``state_dict()``'s averages onto ``device``."""
        self.beta = float(state.get("beta", self.beta))
        self.tasks = {}
        for name, saved in state.get("tasks", {}).items():
            st = self._of(name)
            st.ema_trace, st.ema_g2 = saved["ema_trace"].to(device).clone(), saved["ema_g2"].to(device).clone()
            st.steps, st.last_k = int(saved["steps"]), int(saved["last_k"])

    def __repr__(self) -> str:
        return f"NoiseScale(beta={self.beta}, tasks={sorted(self.tasks)})"
