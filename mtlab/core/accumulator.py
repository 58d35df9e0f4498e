"""A task's accumulation state, owned in one place.

An :class:`Accumulator` holds one task's gradients in ONE contiguous buffer per (device, dtype), with each
parameter's gradient a view into it (as DDP's ``gradient_as_bucket_view``), so normalizing, clipping, norms,
the finiteness check and an all-reduce are a few kernels per task whatever the number of parameters. It also
owns the summed loss and normalizer, the per-minibatch records, the phase and the gradient statistics.
It knows nothing of the trainer: the trainer asks it to take a minibatch's backward, the gradient transforms
change its buffers, and the update reads them.

A minibatch costs what a loop's minibatch costs: the bookkeeping that makes the accumulation exact is paid once
per step. The first minibatch's backward leaves its gradients where autograd puts them (as after a loop's
``zero_grad()``); the second copies them into the flat buffer in one kernel and adds into it from then on (K = 1:
the first call that reads the buffer copies them). Each record keeps the loss and normalizer as the loss computer
returned them; the float64 sums (the step's and each linked set's) are made in a few kernels when first read,
at ``normalize`` or by whoever asks, with the same values and precision as adding each record's float64 pair.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..base import gradops
from ..base.report import values_html


class Phase(StrEnum):
    """Where a task stands in the cycle (the values are the strings earlier versions used)."""

    EMPTY = "empty"
    ACCUMULATING = "accumulating"
    NORMALIZED = "normalized"
    CLIPPED = "clipped"
    PROCESSED = "processed"  # after a user's transform whose call is neither normalize nor clip
    APPLIED = "applied"


@dataclass(eq=False)
class MinibatchRecord:
    """One processed minibatch: linked set, example count, weight, and its weighted loss and normalizer.

    ``raw`` holds the loss computer's ``(loss_sum, normalizer)`` as it returned them (kept without a kernel);
    ``loss`` (weight × the summed loss) and ``normalizer`` (weight × the normalizer), 0-d float64 on the loss's
    device, are made from them when first read, and kept in ``weighted`` (a record loaded from a state has only
    those). ``trace``: the per-model gradient contribution, when a MinibatchTrace is attached."""

    linkedset: str
    num_examples: int
    weight: float
    raw: tuple[Tensor, Tensor] | None = None
    weighted: tuple[Tensor, Tensor] | None = None
    trace: dict[str, Tensor] | None = None

    def weigh(self) -> tuple[Tensor, Tensor]:
        """``(loss, normalizer)`` weighted, in float64: each value converted as it is, then × the weight."""
        if self.weighted is None:
            if self.raw is None:
                raise ValueError("a MinibatchRecord needs raw=(loss_sum, normalizer) or weighted=(loss, normalizer)")
            loss, normalizer = self.raw
            with torch.no_grad():
                pair = torch.stack([loss, normalizer], out=torch.empty(2, dtype=torch.float64, device=loss.device))
                if self.weight != 1.0:
                    pair = pair * self.weight
            loss_w, normalizer_w = pair.unbind()
            self.weighted = (loss_w, normalizer_w)
        return self.weighted

    @property
    def loss(self) -> Tensor:
        """weight × the minibatch's summed loss (0-d float64, on the loss's device)."""
        return self.weigh()[0]

    @property
    def normalizer(self) -> Tensor:
        """weight × its normalizer (0-d float64)."""
        return self.weigh()[1]

    @property
    def norm(self) -> Tensor:
        """Deprecated: the name of ``normalizer`` in release 0.2."""
        warnings.warn("MinibatchRecord.norm is deprecated and will be removed in the next release; use "
                      "record.normalizer", DeprecationWarning, stacklevel=2)
        return self.normalizer


GRAD_STATS = ("grad_norm", "grad_norm_clipped", "clip_fraction")


def host_to(t: Tensor, device: torch.device) -> Tensor:
    """A small tensor made on the host, on ``device`` without waiting for the copy (a plain copy from the host
    waits for the device: a host sync)."""
    return t if device.type == "cpu" else t.to(device, non_blocking=True)
_EMPTY: Mapping[str, Tensor] = MappingProxyType({})


class Accumulator:
    """Everything one task has accumulated since its last reset; readable between any two calls.

    ``grads`` maps ``"<model>.<param>"`` to the task's accumulated (then normalized, then clipped) gradient,
    each a view into ``buffers``. ``loss`` and ``normalizer`` are the weighted sums over ``records``, kept
    as tensors (no device sync while training). ``acc = trainer.state("a")`` gives it; ``acc.phase``,
    ``acc.minibatches``, ``float(acc.loss / acc.normalizer)`` and ``acc.grads["enc.lin.weight"]`` read it."""

    def __init__(self, task: str, params: Mapping[str, nn.Parameter], shared: Collection[str] = (),
                 device: torch.device | str = "cpu") -> None:
        self.task = task
        self.params: dict[str, nn.Parameter] = dict(params)
        self.shared = frozenset(shared)
        self.owned = tuple(n for n in self.params if n not in self.shared)
        self.device = torch.device(device)
        self._buffers: list[Tensor] = []
        self._loose: list[Tensor | None] | None = None  # the first backward's gradients, where autograd put them
        self._open = False  # between begin() and end(): every parameter's .grad is this task's
        self._weights: dict[tuple[float, ...], Tensor] = {}  # record factors -> their [k, 1] float64 column
        self._picks: dict[tuple[int, ...], Tensor] = {}  # a linked set's record positions -> their index
        self._views: dict[str, Tensor] = {}
        self._readonly = MappingProxyType(self._views)
        self.segments: dict[str, list[tuple[int, int, int]]] = {}  # model -> [(buffer index, start, end)]
        self._segment_views: list[Tensor] = []  # every model's segments, in ``segments`` order (made once)
        self._clear()

    def _clear(self) -> None:
        self.phase = Phase.EMPTY
        self.position = 0  # gradient transforms applied so far
        self.minibatches = 0
        self.records: list[MinibatchRecord] = []
        self._totals: Tensor | None = None  # Σ w·loss, Σ w·normalizer (None: made from the records when read)
        self._set_totals: dict[str, Tensor] = {}
        self._summed: tuple[list[MinibatchRecord], int] | None = None  # the records the sums were made of, and how many
        self._pair_views: dict[str | None, tuple[Tensor, tuple[Tensor, ...]]] = {}
        self.grad_norm: Tensor | None = None
        self.grad_norm_clipped: Tensor | None = None
        self.clip_fraction: Tensor | None = None
        self.model_norms: dict[str, Tensor] = {}
        self.model_norms_clipped: dict[str, Tensor] = {}
        self.stats: dict[str, Tensor] = {}  # what the chain's transforms measured this step, beyond the norms

    # ------------------------------------------------------------------ buffers
    def _allocate(self) -> None:
        keys: dict[tuple[torch.device, torch.dtype], list[str]] = {}
        for name, p in self.params.items():
            keys.setdefault((p.device, p.dtype), []).append(name)
        for i, ((dev, dtype), names) in enumerate(keys.items()):
            buf = torch.zeros(sum(self.params[n].numel() for n in names), dtype=dtype, device=dev)
            self._buffers.append(buf)
            start = 0
            for n in names:
                p = self.params[n]
                self._views[n] = buf[start:start + p.numel()].view_as(p)
                model = n.split(".", 1)[0]
                segs = self.segments.setdefault(model, [])
                if segs and segs[-1][0] == i and segs[-1][2] == start:
                    segs[-1] = (i, segs[-1][1], start + p.numel())
                else:
                    segs.append((i, start, start + p.numel()))
                start += p.numel()
        self._segment_views = [self._buffers[i][a:b] for segs in self.segments.values() for i, a, b in segs]
        self._grad_views: list[tuple[nn.Parameter, Tensor]] = [(self.params[n], v) for n, v in self._views.items()]

    @property
    def buffers(self) -> list[Tensor]:
        """The flat gradient buffers, one per (device, dtype) of the task's parameters."""
        if self._loose is not None:
            self._gather()
        return self._buffers

    @property
    def grads(self) -> Mapping[str, Tensor]:
        """Parameter name -> this task's gradient (read-only views into ``buffers``; empty before a minibatch).
        Under ``precision="16-mixed"``: ``scale × Σ gradients`` while ``accumulating``, true ones after."""
        if self._loose is not None:
            self._gather()
        return self._readonly if self.minibatches else _EMPTY

    def begin(self) -> None:
        """Before a backward. After apply/reset: start afresh, every ``.grad`` None, so that autograd puts the
        gradients where a loop's first backward has them; later: every ``.grad`` is this task's view (added into)."""
        if not self._buffers:
            self._allocate()
        self._open = True
        if self.phase in (Phase.EMPTY, Phase.APPLIED):
            self._clear()
            self._loose = []  # marks the first backward; end() keeps its gradients
            for p, _ in self._grad_views:
                if p.grad is not None:
                    p.grad = None
            return
        if self._loose is not None:
            self._gather()
        for p, view in self._grad_views:
            if p.grad is not view:  # reading is cheaper than the setter's checks; usually already in place
                p.grad = view

    def end(self) -> None:
        """After a backward: the first one's gradients kept; shared parameters' ``.grad`` back to None (each
        task keeps its own)."""
        self._open = False
        if self._loose is not None:
            self._loose = [p.grad for p, _ in self._grad_views]
        for name in self.shared:
            self.params[name].grad = None

    def _gather(self) -> None:
        """The first backward's gradients into the flat buffer, one copy (zeros where a parameter got none);
        ``.grad`` are the views again."""
        loose, self._loose = self._loose, None
        dst: list[Tensor] = []
        src: list[Tensor] = []
        missing: list[Tensor] = []
        for (_, view), g in zip(self._grad_views, loose or [None] * len(self._grad_views)):  # a plain loop: per step
            if g is None:
                missing.append(view)
            else:
                dst.append(view)
                src.append(g)
        with torch.no_grad():
            if src:
                torch._foreach_copy_(dst, src)
            if missing:
                torch._foreach_zero_(missing)
        if self._open:
            for p, view in self._grad_views:
                p.grad = view
        else:
            self.restore_grads()

    def record(self, linkedset: str, num_examples: int, weight: float, loss: Tensor, normalizer: Tensor) -> None:
        """Keep a minibatch's loss and normalizer as they are (no kernel, no host read); the weighted float64
        sums are made from the records when first read."""
        self.records.append(MinibatchRecord(linkedset, num_examples, weight, raw=(loss, normalizer)))
        self._totals = None
        self.minibatches += 1
        self.phase = Phase.ACCUMULATING

    def _sum_records(self) -> None:
        """The step's and each linked set's ``[Σ w·loss, Σ w·normalizer]`` (float64) from the records: each
        record's pair converted to float64 and × its weight, as it reads alone, then summed (deterministic sums)."""
        source, dev = self.records, self.device
        n = len(source)  # another thread (a dashboard) may read while the training thread records the next one
        recs = source[:n]
        if not recs:
            self._totals, self._set_totals = torch.zeros(2, dtype=torch.float64, device=dev), {}
            self._summed = (source, 0)
            return
        flat: list[Tensor] = []
        weights: list[float] = []
        sets: dict[str, list[int]] = {}
        for i, r in enumerate(recs):  # a plain loop: per step
            if r.raw is not None:  # as the loss computer returned them: × the weight in float64 below
                flat += r.raw
                weights.append(r.weight)
            else:  # loaded from a state: weighted already
                flat += (r.loss, r.normalizer)
                weights.append(1.0)
            sets.setdefault(r.linkedset, []).append(i)
        with torch.no_grad():
            k = len(recs)
            pairs = torch.stack(flat, out=torch.empty(2 * k, dtype=torch.float64, device=dev)).view(k, 2)
            factors = tuple(weights)
            if factors.count(1.0) != k:
                w = self._weights.get(factors)
                if w is None:
                    if len(self._weights) > 16:
                        self._weights.clear()
                    w = self._weights[factors] = host_to(torch.tensor(factors, dtype=torch.float64)[:, None], dev)
                pairs = pairs * w
            totals = pairs.sum(0)
            if len(sets) == 1:
                set_totals = {s: totals.clone() for s in sets}
            else:
                set_totals = {}
                for s, positions in sets.items():
                    at = tuple(positions)
                    pick = self._picks.get(at)
                    if pick is None:
                        if len(self._picks) > 64:
                            self._picks.clear()
                        pick = self._picks[at] = host_to(torch.tensor(at, dtype=torch.long), dev)
                    set_totals[s] = pairs.index_select(0, pick).sum(0)
        self._totals, self._set_totals = totals, set_totals
        self._summed = (source, n)

    def _sums_stale(self) -> bool:
        """The sums are missing, or were made of other records than those held now."""
        summed = self._summed
        return self._totals is None or summed is None or summed[0] is not self.records or summed[1] != len(summed[0])

    @property
    def totals(self) -> Tensor:
        """``[Σ w·loss, Σ w·normalizer]`` over the accumulated minibatches (float64; made when first read)."""
        if self._sums_stale():
            self._sum_records()
        return self._totals  # type: ignore[return-value]

    @property
    def set_totals(self) -> Mapping[str, Tensor]:
        """Linked set -> its ``[Σ w·loss, Σ w·normalizer]`` in this accumulation (float64)."""
        if self._sums_stale():
            self._sum_records()
        return MappingProxyType(self._set_totals)

    def _views_of(self, key: str | None, pair: Tensor) -> tuple[Tensor, ...]:
        """The two 0-d views of a ``[2]`` sum (made once per sum tensor; a reassigned tensor gets new ones)."""
        cached = self._pair_views.get(key)
        if cached is None or cached[0] is not pair:
            cached = self._pair_views[key] = (pair, pair.unbind())
        return cached[1]

    def reset(self) -> None:
        """Discard what was accumulated; owned parameters' ``.grad`` become None."""
        self._clear()
        self._loose = None
        for name in self.params:
            self.params[name].grad = None

    def adopt(self, minibatches: int) -> None:
        """Join an all-reduce for a task this process did not accumulate: zeros, ``minibatches`` counted."""
        if self.phase not in (Phase.EMPTY, Phase.APPLIED) or minibatches < 1:
            raise ValueError(f"task {self.task!r}: adopt() needs an empty (or applied) accumulator and "
                             f"minibatches >= 1; it is {self.phase} and minibatches={minibatches}")
        if not self._buffers:
            self._allocate()
        self._clear()
        self._loose = None
        for buf in self._buffers:
            buf.zero_()
        self.minibatches = int(minibatches)
        self.phase = Phase.ACCUMULATING
        self.restore_grads()

    def advance(self, phase: Phase, stats: Mapping[str, Tensor] | None = None) -> None:
        """A transform processed the gradients: one position further, now ``phase``, with what it measured (device
        tensors): ``clip_fraction`` (a step's first counts), others kept in ``stats`` (history: ``<task>/<name>``)."""
        self.position, self.phase = self.position + 1, phase
        for key, value in (stats or {}).items():
            if key != "clip_fraction":
                self.stats[key] = value
            elif self.clip_fraction is None:
                self.clip_fraction = value

    def mark_applied(self) -> None:
        """The optimizer stepped with this accumulation: it stays readable until the next minibatch."""
        self.phase = Phase.APPLIED

    def take_reduced(self, totals: Tensor, set_totals: Mapping[str, Tensor], replaced: Collection[str],
                     minibatches: int | None = None) -> None:
        """After an all-reduce of the buffers: summed totals, summed per-set totals for the sets in ``replaced``
        (absent: no process drew from it) and the minibatch count (None: keep this process's)."""
        kept = {s: v for s, v in self.set_totals.items() if s not in replaced}
        self.totals.copy_(totals)
        self._set_totals = {**kept, **set_totals}
        if minibatches is not None:
            self.minibatches = int(minibatches)

    def restore_grads(self) -> None:
        """Owned parameters' ``.grad`` show this task's gradient again (after an optimizer step used others)."""
        if self._loose is not None:
            return self._gather()  # which ends here
        have = bool(self.minibatches)
        for name in self.owned:  # usually still in place (the update stepped with these views): reading is cheaper
            if self.params[name].grad is not (g := self._views[name] if have else None):
                self.params[name].grad = g
        for name in self.shared:
            self.params[name].grad = None

    # ------------------------------------------------------------------ totals and statistics
    @property
    def loss(self) -> Tensor:
        """Σ weight × summed loss over the accumulated minibatches (0-d float64)."""
        return self._views_of(None, self.totals)[0]

    @property
    def normalizer(self) -> Tensor:
        """Σ weight × normalizer over the accumulated minibatches (0-d float64)."""
        return self._views_of(None, self.totals)[1]

    @property
    def normalized_loss(self) -> Tensor:
        """``loss / normalizer``: the mean over everything accumulated."""
        return torch.div(*self._views_of(None, self.totals))

    @property
    def set_loss(self) -> dict[str, Tensor]:
        """Linked set -> its weighted summed loss in this accumulation."""
        return {k: v[0] for k, v in self.set_totals.items()}

    @property
    def set_normalizer(self) -> dict[str, Tensor]:
        """Linked set -> its weighted normalizer in this accumulation."""
        return {k: v[1] for k, v in self.set_totals.items()}

    def linkedset_loss(self, name: str) -> Tensor:
        """Σloss/Σnormalizer of one linked set's minibatches in this accumulation."""
        return torch.div(*self._views_of(name, self.set_totals[name]))

    def norms(self) -> tuple[dict[str, Tensor], Tensor]:
        """Gradient L2 norm per model (from segments of the flat buffers) and over the whole task."""
        per_model, total = gradops.grouped_norms(self._segment_views, [len(s) for s in self.segments.values()],
                                                 self.device)
        return dict(zip(self.segments, per_model)), total

    def record_norms(self, clipped: bool) -> None:
        """Store the gradient norms before (``clipped=False``) or after clipping."""
        per_model, total = self.norms()
        if clipped:
            self.model_norms_clipped, self.grad_norm_clipped = per_model, total
        else:
            self.model_norms, self.grad_norm = per_model, total

    def model_grad_norms(self, clipped: bool = False) -> dict[str, Tensor]:
        """Gradient norm per model (before clipping, or after with ``clipped=True``)."""
        return dict(self.model_norms_clipped if clipped else self.model_norms)

    def finish_stats(self) -> None:
        """Fill statistics no transform recorded (no clipping configured): the norms are the unclipped ones."""
        if self.grad_norm is None:
            self.record_norms(clipped=False)
        if self.grad_norm_clipped is None:
            self.grad_norm_clipped, self.model_norms_clipped = self.grad_norm, dict(self.model_norms)
        if self.clip_fraction is None:
            self.clip_fraction = torch.zeros((), dtype=torch.float64, device=self.device)

    def finite(self) -> Tensor:
        """0-d bool: the loss and the (pre-clip) gradient norm are finite (clamping would hide an inf)."""
        return torch.isfinite(self.totals[0]) & torch.isfinite(self.grad_norm if self.grad_norm is not None
                                                                     else self.norms()[1])

    def nonfinite_reason(self) -> str:
        """Which minibatch gave a non-finite loss, or which model a non-finite gradient (reads the device)."""
        culprit = next((f"minibatch {i} of linked set {r.linkedset!r}" for i, r in enumerate(self.records)
                        if not torch.isfinite(r.loss)), None)
        if culprit:
            return f"task {self.task!r}: non-finite loss from {culprit}"
        norms = self.model_grad_norms() or self.norms()[0]
        models = [m for m, n in norms.items() if not torch.isfinite(n)]
        return f"task {self.task!r}: non-finite gradient in model(s) {models}"

    # ------------------------------------------------------------------ state you can keep
    def state_dict(self) -> dict[str, Any]:
        """Plain containers of tensors and strings (loadable with ``weights_only=True``)."""
        def opt(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.detach().clone()

        return {
            "phase": str(self.phase), "position": self.position, "minibatches": self.minibatches,
            "records": [{"linkedset": r.linkedset, "num_examples": r.num_examples, "weight": r.weight,
                         "loss": r.loss.clone(), "normalizer": r.normalizer.clone()} for r in self.records],
            "totals": self.totals.clone(),
            "set_totals": {k: v.clone() for k, v in self.set_totals.items()},
            "grads": {k: v.detach().clone() for k, v in self.grads.items()},
            "grad_norm": opt(self.grad_norm), "grad_norm_clipped": opt(self.grad_norm_clipped),
            "clip_fraction": opt(self.clip_fraction),
            "model_norms": {k: v.clone() for k, v in self.model_norms.items()},
            "model_norms_clipped": {k: v.clone() for k, v in self.model_norms_clipped.items()},
            "stats": {k: v.detach().clone() for k, v in self.stats.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``; gradients are copied into this accumulator's own buffers."""
        unknown = set(state["grads"]) - set(self.params)
        if unknown:
            raise KeyError(f"task {self.task!r}: the state has gradients for unknown parameters {sorted(unknown)}")
        self.reset()
        dev = self.device

        def to(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.to(dev).clone()

        self.minibatches = int(state["minibatches"])
        self.phase = Phase(state["phase"])
        self.position = int(state.get("position", 0))
        self.records = [MinibatchRecord(r["linkedset"], int(r["num_examples"]), float(r["weight"]),
                                        weighted=(r["loss"].to(dev), r.get("normalizer", r.get("norm")).to(dev)))
                        for r in state["records"]]  # norm: 0.2
        self._totals = state["totals"].to(dev, torch.float64).clone()
        self._set_totals = {k: v.to(dev, torch.float64).clone() for k, v in state["set_totals"].items()}
        self._summed = (self.records, len(self.records))
        self.grad_norm, self.grad_norm_clipped = to(state["grad_norm"]), to(state["grad_norm_clipped"])
        self.clip_fraction = to(state["clip_fraction"])
        self.model_norms = {k: v.to(dev) for k, v in state["model_norms"].items()}
        self.model_norms_clipped = {k: v.to(dev) for k, v in state["model_norms_clipped"].items()}
        self.stats = {k: v.to(dev) for k, v in state.get("stats", {}).items()}
        if self.minibatches:
            if not self._buffers:
                self._allocate()
            for buf in self._buffers:
                buf.zero_()
            for name, g in state["grads"].items():
                self._views[name].copy_(g)
        self.restore_grads()

    # ------------------------------------------------------------------ reading
    def summary(self) -> dict[str, Any]:
        """Host-side values (reads the device): phase, counts, loss, normalizer, gradient norms."""
        loss, normalizer = (float(x) for x in self.totals.tolist())
        out: dict[str, Any] = {"task": self.task, "phase": str(self.phase), "minibatches": self.minibatches,
                               "loss": loss, "normalizer": normalizer,
                               "normalized_loss": loss / normalizer if normalizer else float("nan")}
        return {**out, **{k: None if getattr(self, k) is None else float(getattr(self, k)) for k in GRAD_STATS}}

    def __repr__(self) -> str:
        return (f"Accumulator({self.task!r}, phase={str(self.phase)!r}, minibatches={self.minibatches}, "
                f"grads={len(self._views) if self.minibatches else 0} tensors in {len(self._buffers)} flat buffer(s))")

    def _repr_html_(self) -> str:
        return values_html(self.summary(), "mtlab task state")


class Reducer(Protocol):
    """Combines the accumulators of several processes at ``normalize`` (``mtlab.distributed.AllReduce``).

    The trainer calls ``reduce`` at its first call after the minibatches (``normalize``, or ``clip`` /
    ``apply`` when the chain has no Normalize). A reducer may also define
    ``agree(call, task, accs, next_calls, reduces, within)``: the trainer calls it first thing in ``normalize``,
    ``clip`` and ``apply`` (``step()`` once, with ``within="step"``), so the processes can check they make the
    same call; ``reduces`` says the call is the one that reduces."""

    def reduce(self, call: str, accs: Mapping[str, Accumulator]) -> None: ...
