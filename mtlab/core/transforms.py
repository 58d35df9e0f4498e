"""Gradient transforms: small pieces that change a task's accumulated gradient, composed as a chain.

As optax's ``chain``, each transform is one step of processing (normalize, clip by value, clip by global
norm). A task's phase is its position in the chain: after ``Normalize`` it is ``normalized``, after a clip
``clipped``. Each transform names the trainer call that runs it (``normalize()`` or ``clip()``), so the
order of calls, the phase errors, ``step()``, ``explain()`` and the dashboard's buttons follow from the chain.

Examples:
    >>> chain = Chain([Normalize(), ClipByValue(1.0)])
    >>> chain.calls()
    ['normalize', 'clip']

A transform may keep state across steps (``ClipByHistory`` keeps each task's gradient-norm history): it
gives it as ``state_dict()`` and takes it back with ``load_state_dict()``, and the chain's state is part of
the trainer's checkpoint. A new kind of transform is one class here: the trainer runs it at its ``call``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..base import gradops
from .accumulator import Accumulator, Phase
from ..base.errors import ConfigError, PhaseError
from ..tasks.task import check_positive


class Transform:
    """One piece of gradient processing; ``call`` is the trainer method that runs it."""

    call: str = ""
    phase: Phase = Phase.ACCUMULATING

    def __call__(self, acc: Accumulator) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What the transform carries from one step to the next (nothing, for a stateless one)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ConfigError(f"{self!r} keeps no state, but a checkpoint gives it {sorted(state)}")


class Normalize(Transform):
    """Divide the accumulated gradient by the accumulated normalizer (Σ weight × normalizer), once."""

    call = "normalize"
    phase = Phase.NORMALIZED

    def __call__(self, acc: Accumulator) -> None:
        gradops.div_(acc.buffers, acc.normalizer)

    def __repr__(self) -> str:
        return "Normalize()"


class ClipByValue(Transform):
    """Clip element-wise to ``[-value, value]``, as ``torch.nn.utils.clip_grad_value_``; records the norms
    before and after and the fraction of elements clipped."""

    call = "clip"
    phase = Phase.CLIPPED

    def __init__(self, value: float) -> None:
        self.value = check_positive(value, "clip_grad_value", " (or None to turn clipping off)")

    def __call__(self, acc: Accumulator) -> None:
        if acc.grad_norm is None:
            acc.record_norms(clipped=False)
        numel = sum(b.numel() for b in acc.buffers)
        acc.set_clip_fraction(gradops.count_above(acc.buffers, self.value).to(torch.float64) / max(numel, 1))
        gradops.clamp_(acc.buffers, self.value)
        acc.record_norms(clipped=True)

    def __repr__(self) -> str:
        return f"ClipByValue({self.value:g})"


def norm_before(acc: Accumulator) -> Tensor:
    """The task's global gradient norm before this clip (recorded as ``grad_norm`` by the first clip)."""
    if acc.grad_norm is None:
        acc.record_norms(clipped=False)
        return acc.grad_norm  # type: ignore[return-value]
    return acc.norms()[1]


def scale_to_norm(acc: Accumulator, ratio: Tensor) -> None:
    """Scale the task's gradient by ``min(1, ratio)`` (a device tensor: no host sync) and record the norms."""
    coef = torch.clamp(ratio, max=1.0)
    gradops.mul_(acc.buffers, coef)
    acc.set_clip_fraction((coef < 1.0).to(torch.float64), first=True)
    acc.record_norms(clipped=True)


class ClipByGlobalNorm(Transform):
    """Scale the task's whole gradient so its L2 norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` (same ``1e-6`` guard, no host sync)."""

    call = "clip"
    phase = Phase.CLIPPED

    def __init__(self, max_norm: float) -> None:
        self.max_norm = check_positive(max_norm, "clip_grad_norm", " (or None to turn it off)")

    def __call__(self, acc: Accumulator) -> None:
        total = norm_before(acc)
        scale_to_norm(acc, self.max_norm / (total + 1e-6))

    def __repr__(self) -> str:
        return f"ClipByGlobalNorm({self.max_norm:g})"


class ClipByHistory(Transform):
    """AutoClip (Seetharaman, Wichern, Pardo and Le Roux, 2020, for source separation): clip each task's
    global norm to the ``percentile``-th percentile of the norms that task's gradient had at every step so
    far, this one included; as ``torch.nn.utils.clip_grad_norm_(params, quantile(history, p / 100))``.

    The history is state (saved in checkpoints) and stays on the device: no host sync. A non-finite norm
    enters the history as NaN and is ignored by the percentile.
    """

    call = "clip"
    phase = Phase.CLIPPED

    def __init__(self, percentile: float) -> None:
        if not (isinstance(percentile, (int, float)) and 0 < float(percentile) <= 100):
            raise ConfigError(f"clip_grad_percentile = {percentile!r}: give a percentile in (0, 100], e.g. 10 "
                              "(AutoClip's choice), or None to turn it off")
        self.percentile = float(percentile)
        self.history: dict[str, Tensor] = {}  # task -> norms before clipping, one per step (float64)

    def __call__(self, acc: Accumulator) -> None:
        total = norm_before(acc)
        norm = total.detach().to(torch.float64).reshape(1)
        norm = torch.where(torch.isfinite(norm), norm, torch.full_like(norm, float("nan")))
        past = self.history.get(acc.task)
        self.history[acc.task] = norm if past is None else torch.cat([past.to(norm.device), norm])
        bound = torch.nanquantile(self.history[acc.task], self.percentile / 100.0)
        scale_to_norm(acc, bound / (total.to(torch.float64) + 1e-6))

    def state_dict(self) -> dict[str, Any]:
        return {"history": {task: h.detach().cpu().clone() for task, h in self.history.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = {task: torch.as_tensor(h, dtype=torch.float64).clone()
                        for task, h in state.get("history", {}).items()}

    def __repr__(self) -> str:
        return f"ClipByHistory({self.percentile:g})"


class Chain:
    """Transforms applied in order; a task's ``position`` counts those already applied."""

    def __init__(self, transforms: Iterable[Transform] = ()) -> None:
        self.transforms: list[Transform] = list(transforms)

    @classmethod
    def from_settings(cls, normalize: bool, clip_value: float | None, clip_norm: float | None,
                      clip_percentile: float | None = None) -> "Chain":
        """The chain the trainer's settings describe: ``Normalize`` when ``normalize``, then the clips given."""
        parts: list[Transform] = [Normalize()] if normalize else []
        if clip_value is not None:
            parts.append(ClipByValue(clip_value))
        if clip_norm is not None:
            parts.append(ClipByGlobalNorm(clip_norm))
        if clip_percentile is not None:
            parts.append(ClipByHistory(clip_percentile))
        return cls(parts)

    def state_dict(self) -> list[dict[str, Any]]:
        """Each transform's state, in chain order (plain containers)."""
        return [{"type": type(t).__name__, "state": t.state_dict()} for t in self.transforms]

    def load_state_dict(self, state: Sequence[Mapping[str, Any]]) -> None:
        """Give each transform its saved state; a transform that a checkpoint does not have keeps its own (a
        chain built with other settings takes the state of the same kind of transform)."""
        saved = {entry["type"]: entry["state"] for entry in state}
        for t in self.transforms:
            if type(t).__name__ in saved:
                t.load_state_dict(saved[type(t).__name__])

    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.transforms)

    def __repr__(self) -> str:
        return f"Chain({self.transforms})"

    def calls(self) -> list[str]:
        """The trainer calls of one step after the minibatches, in order (``apply`` not included)."""
        return list(dict.fromkeys(t.call for t in self.transforms))

    def next_call(self, acc: Accumulator) -> str:
        """The call ``acc`` needs next: ``process_minibatch``, a transform's call, or ``apply``."""
        if acc.phase in (Phase.EMPTY, Phase.APPLIED):
            return "process_minibatch"
        pos = min(acc.position, len(self.transforms))
        return self.transforms[pos].call if pos < len(self.transforms) else "apply"

    def pending(self, acc: Accumulator, call: str) -> Sequence[Transform]:
        """The transforms ``call`` would apply to ``acc`` now (a run of transforms with that call)."""
        pos = acc.position
        out = []
        while pos < len(self.transforms) and self.transforms[pos].call == call:
            out.append(self.transforms[pos])
            pos += 1
        return out

    def run(self, call: str, acc: Accumulator) -> None:
        """Apply the transforms of ``call`` at ``acc``'s position and move it on."""
        for t in self.pending(acc, call):
            t(acc)
            acc.advance(t.phase)

    def phase_error(self, task: str, acc: Accumulator, call: str) -> PhaseError:
        """The error for ``call`` made on ``acc`` out of order, naming the call that should come instead."""
        nxt = self.next_call(acc)
        if nxt == "process_minibatch":
            return PhaseError(f"{call}(): task {task!r} has nothing accumulated; call process_minibatch({task!r}, ...) first")
        calls = [*self.calls(), "apply"]
        if call not in calls:
            return PhaseError(f"{call}(): this trainer's chain {self} has no {call} step (e.g. clip_grad_value is "
                              f"None); task {task!r} is {acc.phase}; next call: {nxt}()")
        if calls.index(call) < calls.index(nxt):
            return PhaseError(f"{call}(): task {task!r} is already {acc.phase}; next call: {nxt}()")
        needed = next(t.phase for t in self.transforms if t.call == nxt)
        return PhaseError(f"{call}(): task {task!r} has not been {needed}; call {nxt}() first (next call: {nxt}())")
