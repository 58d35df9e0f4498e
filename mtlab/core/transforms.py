"""Gradient transforms: small pieces that change a task's accumulated gradient, composed as a chain.

As optax's ``chain``, each transform is one step of processing (normalize, clip by value, clip by global
norm, or one of the user's own). A task's phase is its position in the chain: after ``Normalize`` it is
``normalized``, after a clip ``clipped``. Each transform names the trainer call that runs it
(``trainer.call(name)``; ``normalize()`` and ``clip()`` for the built-in ones), so the order of calls, the
phase errors, ``step()``, ``explain()``, the dashboard's buttons and the ranks' agreement follow from the chain.

Examples:
    >>> chain = Chain([Normalize(), ClipByValue(1.0)])
    >>> chain.calls()
    ['normalize', 'clip']

A transform of one's own is a subclass that names its call and defines ``__call__(acc)``; what it returns (a
mapping of 0-d tensors, or None) is recorded by the accumulator and written into the history as
``<task>/<key>``::

    class Scale(mtlab.Transform):
        # its docstring's first line describes it in explain() and on its dashboard button
        call = "scale"

        def __init__(self, factor: float) -> None:
            self.factor = factor

        def __call__(self, acc):
            for buf in acc.buffers:
                buf.mul_(self.factor)

    trainer = mtlab.Trainer(models, tasks, chain=mtlab.Chain([mtlab.Normalize(), Scale(0.5)]))
    trainer.process_minibatch("a", "clean"); trainer.normalize(); trainer.call("scale"); trainer.apply()

A transform may keep state across steps (``ClipByHistory`` keeps each task's gradient-norm history): it
gives it as ``state_dict()`` and takes it back with ``load_state_dict()``, and the chain's state is part of
the trainer's checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Any

import torch
from torch import Tensor

from ..base import gradops
from .accumulator import Accumulator, Phase
from ..base.errors import ConfigError, PhaseError
from ..tasks.task import check_positive


class Call(StrEnum):
    """The trainer's calls of one step (a user's transform adds its own name between minibatches and apply)."""

    PROCESS_MINIBATCH = "process_minibatch"
    NORMALIZE = "normalize"
    CLIP = "clip"
    APPLY = "apply"
    STEP = "step"
    RESET = "reset"


# Names a transform may not take: the trainer's calls around the chain, other methods of the trainer, and the
# dashboard's other buttons (a call's button would hide them).
RESERVED_CALLS = frozenset({Call.PROCESS_MINIBATCH, Call.APPLY, Call.STEP, Call.RESET, "finish", "call", "evaluate",
                            "minibatch", "run", "pause", "stop", "snapshot", "restore"})
PHASE_OF_CALL = {Call.NORMALIZE: Phase.NORMALIZED, Call.CLIP: Phase.CLIPPED}
IDLE = (Phase.EMPTY, Phase.APPLIED)  # nothing accumulated in the cycle: the next call is process_minibatch
_PROCESS, _APPLY = str(Call.PROCESS_MINIBATCH), str(Call.APPLY)

Stats = Mapping[str, Tensor]


class Transform:
    """One piece of gradient processing, run by the trainer call ``call``.

    A subclass sets ``call`` (a name such as ``"clip"`` or ``"scale"``) and defines ``__call__(acc)``, which
    changes ``acc.buffers`` in place and may return the statistics it measured (``{"name": 0-d tensor}``) for
    the accumulator to record. ``phase`` (what a task is after it) follows from the call: ``normalized`` after
    ``normalize``, ``clipped`` after ``clip``, else ``processed``. ``state_dict``/``load_state_dict`` are for
    a transform that keeps state across steps; the first line of the class docstring describes it in
    ``explain()`` and on its dashboard button.
    """

    call: str = ""
    phase: Phase = Phase.PROCESSED

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "phase" not in cls.__dict__:
            cls.phase = PHASE_OF_CALL.get(cls.call, Phase.PROCESSED)  # type: ignore[call-overload]

    def __call__(self, acc: Accumulator) -> Stats | None:
        raise NotImplementedError(f"{type(self).__name__} must define __call__(self, acc)")

    def describe(self) -> str:
        """One line for ``explain()`` and the dashboard: the first line of the class docstring."""
        doc = (type(self).__doc__ or "").strip()
        return doc.splitlines()[0] if doc else f"{self!r} on the gradients"

    def state_dict(self) -> dict[str, Any]:
        """What the transform carries from one step to the next (nothing, for a stateless one)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what ``state_dict()`` gave (a stateless transform refuses any state)."""
        if state:
            raise ConfigError(f"{self!r} keeps no state, but a checkpoint gives it {sorted(state)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Normalize(Transform):
    """grads /= Σ w·normalizer, once: the exact gradient of the mean over everything accumulated."""

    call = Call.NORMALIZE

    def __call__(self, acc: Accumulator) -> None:
        gradops.div_(acc.buffers, acc.totals[1])  # Σ w·normalizer (acc.normalizer)


class ClipByValue(Transform):
    """Clip element-wise to ``[-value, value]``, as ``torch.nn.utils.clip_grad_value_``; records the norms
    before and after and the fraction of elements clipped."""

    call = Call.CLIP

    def __init__(self, value: float) -> None:
        self.value = check_positive(value, "clip_grad_value", " (or None to turn clipping off)")

    def __call__(self, acc: Accumulator) -> Stats:
        if acc.grad_norm is None:
            acc.record_norms(clipped=False)
        numel = sum(b.numel() for b in acc.buffers)
        fraction = gradops.count_above(acc.buffers, self.value).to(torch.float64) / max(numel, 1)
        gradops.clamp_(acc.buffers, self.value)
        acc.record_norms(clipped=True)
        return {"clip_fraction": fraction}

    def describe(self) -> str:
        """What it does, with its bound."""
        return f"clamp every element to ±{self.value:g}"

    def __repr__(self) -> str:
        return f"ClipByValue({self.value:g})"


def norm_before(acc: Accumulator) -> Tensor:
    """The task's global gradient norm before this clip (recorded as ``grad_norm`` by the first clip)."""
    if acc.grad_norm is None:
        acc.record_norms(clipped=False)
        return acc.grad_norm  # type: ignore[return-value]
    return acc.norms()[1]


def scale_to_norm(acc: Accumulator, ratio: Tensor) -> Stats:
    """Scale the task's gradient by ``min(1, ratio)`` (a device tensor: no host sync) and record the norms;
    the clip fraction is 1 when it scaled, else 0."""
    coef = torch.clamp(ratio, max=1.0)
    gradops.mul_(acc.buffers, coef)
    acc.record_norms(clipped=True)
    return {"clip_fraction": (coef < 1.0).to(torch.float64)}


class ClipByGlobalNorm(Transform):
    """Scale the task's whole gradient so its L2 norm is at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` (same ``1e-6`` guard, no host sync)."""

    call = Call.CLIP

    def __init__(self, max_norm: float) -> None:
        self.max_norm = check_positive(max_norm, "clip_grad_norm", " (or None to turn it off)")

    def __call__(self, acc: Accumulator) -> Stats:
        total = norm_before(acc)
        return scale_to_norm(acc, self.max_norm / (total + 1e-6))

    def describe(self) -> str:
        """What it does, with its bound."""
        return f"scale each task's gradient to a global norm of at most {self.max_norm:g}"

    def __repr__(self) -> str:
        return f"ClipByGlobalNorm({self.max_norm:g})"


class ClipByHistory(Transform):
    """AutoClip (Seetharaman, Wichern, Pardo and Le Roux, 2020, for source separation): clip each task's
    global norm to the ``percentile``-th percentile of the norms that task's gradient had at every step so
    far, this one included; as ``torch.nn.utils.clip_grad_norm_(params, quantile(history, p / 100))``.

    The history is state (saved in checkpoints) and stays on the device: no host sync. A non-finite norm
    enters the history as NaN and is ignored by the percentile.
    """

    call = Call.CLIP

    def __init__(self, percentile: float) -> None:
        if not (isinstance(percentile, (int, float)) and 0 < float(percentile) <= 100):
            raise ConfigError(f"clip_grad_percentile = {percentile!r}: give a percentile in (0, 100], e.g. 10 "
                              "(AutoClip's choice), or None to turn it off")
        self.percentile = float(percentile)
        self.history: dict[str, Tensor] = {}  # task -> norms before clipping, one per step (float64)

    def __call__(self, acc: Accumulator) -> Stats:
        total = norm_before(acc)
        norm = total.detach().to(torch.float64).reshape(1)
        norm = torch.where(torch.isfinite(norm), norm, torch.full_like(norm, float("nan")))
        past = self.history.get(acc.task)
        self.history[acc.task] = norm if past is None else torch.cat([past.to(norm.device), norm])
        bound = torch.nanquantile(self.history[acc.task], self.percentile / 100.0)
        return scale_to_norm(acc, bound / (total.to(torch.float64) + 1e-6))

    def describe(self) -> str:
        """What it does, with its percentile."""
        return f"scale each task's gradient to the {self.percentile:g}th percentile of its norm history (AutoClip)"

    def state_dict(self) -> dict[str, Any]:
        """Each task's norm history (on the CPU)."""
        return {"history": {task: h.detach().cpu().clone() for task, h in self.history.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back a ``state_dict()``'s norm histories."""
        self.history = {task: torch.as_tensor(h, dtype=torch.float64).clone()
                        for task, h in state.get("history", {}).items()}

    def __repr__(self) -> str:
        return f"ClipByHistory({self.percentile:g})"


BUILT_IN = (Normalize, ClipByValue, ClipByGlobalNorm, ClipByHistory)  # their order in a chain built from settings


class Chain:
    """Transforms applied in order; a task's ``position`` counts those already applied.

    The transforms of one call lie next to each other (one call runs them all); a call's name is a Python
    identifier other than the trainer's own calls (``process_minibatch``, ``apply``, ``step``, ``reset``).
    A chain is not changed once built (``replaced`` makes a new one): the call at each position is worked out
    once here, not at every call of every step."""

    def __init__(self, transforms: Iterable[Transform] = ()) -> None:
        self.transforms: list[Transform] = list(transforms)
        seen: list[str] = []
        for t in self.transforms:
            if not isinstance(t, Transform):
                raise ConfigError(f"Chain: {t!r} is not a transform; subclass mtlab.Transform, set call = \"<name>\" "
                                  "and define __call__(self, acc)")
            call = t.call
            if not (isinstance(call, str) and call.isidentifier()) or call in RESERVED_CALLS:
                raise ConfigError(f"Chain: {type(t).__name__}.call = {call!r}; give it a name for its trainer call, a "
                                  f"Python identifier other than {sorted(RESERVED_CALLS)} (e.g. call = \"scale\")")
            if seen and seen[-1] != call and call in seen:
                raise ConfigError(f"Chain: the transforms of call {call!r} are not next to each other in "
                                  f"{self.transforms}; put them together (one {call}() runs them all)")
            seen.append(call)
        self._call_at = tuple(str(t.call) for t in self.transforms)  # position -> the call that runs it
        self._calls = tuple(dict.fromkeys(self._call_at))
        # where data-parallel ranks sum (the first call after the minibatches) and whether it holds Normalize
        self.reduces_at: str = self._call_at[0] if self._call_at else _APPLY
        self.normalizes = any(type(t) is Normalize for t in self.transforms)

    @classmethod
    def from_settings(cls, normalize: bool, clip_value: float | None, clip_norm: float | None,
                      clip_percentile: float | None = None) -> Chain:
        """The chain the trainer's settings describe: ``Normalize`` when ``normalize``, then the clips given."""
        parts: list[Transform] = [Normalize()] if normalize else []
        if clip_value is not None:
            parts.append(ClipByValue(clip_value))
        if clip_norm is not None:
            parts.append(ClipByGlobalNorm(clip_norm))
        if clip_percentile is not None:
            parts.append(ClipByHistory(clip_percentile))
        return cls(parts)

    def find(self, kind: type[Transform]) -> Transform | None:
        """The chain's first transform of class ``kind``, or None."""
        return next((t for t in self.transforms if type(t) is kind), None)

    def replaced(self, kind: type[Transform], new: Transform | None) -> Chain:
        """A chain where the transform of built-in class ``kind`` is ``new`` (None: removed), in its place, or
        where a chain built from settings would have it; the others (a user's too) are the same objects."""
        old = self.find(kind)
        parts = [t for t in self.transforms if t is not old]
        if new is not None:
            if old is not None:
                at = self.transforms.index(old)
                if old.state_dict():
                    new.load_state_dict(old.state_dict())  # a norm history survives a change of the percentile
            else:
                before = BUILT_IN[:BUILT_IN.index(kind)]
                at = max((i + 1 for i, t in enumerate(parts) if type(t) in before), default=0)
            parts.insert(at, new)
        return Chain(parts)

    def state_dict(self) -> list[dict[str, Any]]:
        """Each transform's state, in chain order (plain containers)."""
        return [{"type": type(t).__name__, "state": t.state_dict()} for t in self.transforms]

    def load_state_dict(self, state: Sequence[Mapping[str, Any]]) -> None:
        """Give each transform its saved state, by position among the transforms of its class (the second
        ``Counter`` of the chain takes the second saved ``Counter``'s); a transform that a checkpoint does not
        have keeps its own (a chain built with other settings takes the state of the same kind of transform)."""
        saved: dict[str, list[Mapping[str, Any]]] = {}
        for entry in state:
            saved.setdefault(entry["type"], []).append(entry["state"])
        seen: dict[str, int] = {}
        for t in self.transforms:
            kind = type(t).__name__
            i = seen[kind] = seen.get(kind, -1) + 1
            if i < len(saved.get(kind, ())):
                t.load_state_dict(saved[kind][i])

    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)

    def __repr__(self) -> str:
        return f"Chain({self.transforms})"

    def calls(self) -> list[str]:
        """The trainer calls of one step after the minibatches, in order (``apply`` not included)."""
        return list(self._calls)

    def of_call(self, call: str) -> list[Transform]:
        """The transforms one ``call`` runs, in order."""
        return [t for t in self.transforms if t.call == call]

    def reducing_call(self) -> str:
        """The first call after the minibatches, where data-parallel ranks sum their accumulators (``apply``
        when the chain is empty)."""
        return self.reduces_at

    def next_call(self, acc: Accumulator) -> str:
        """The call ``acc`` needs next: ``process_minibatch``, a transform's call, or ``apply``."""
        if acc.phase in IDLE:
            return _PROCESS
        pos, at = acc.position, self._call_at
        return at[pos] if pos < len(at) else _APPLY

    def select(self, call: str, task: str | None, accs: Mapping[str, Accumulator]) -> dict[str, Accumulator]:
        """The accumulators ``call`` covers (``task``'s, or every task due for it; ``apply``: every task that
        accumulated, each of which must be due for it); raises PhaseError naming the call that comes first."""
        if task is not None:
            acc = accs.get(task)
            if acc is None:
                raise ConfigError(f"unknown task {task!r}; tasks: {list(accs)}")
            if self.next_call(acc) != call:
                raise self.phase_error(task, acc, call)
            return {task: acc}
        at, n_at = self._call_at, len(self._call_at)
        chosen: dict[str, Accumulator] = {}
        busy = False
        late = None  # the first task that accumulated but is not due for ``call``
        for n, a in accs.items():  # one pass, next_call inlined: this runs at every call of every step
            if a.phase in IDLE:
                continue
            busy = True
            pos = a.position
            if (at[pos] if pos < n_at else _APPLY) == call:
                chosen[n] = a
            elif late is None:
                late = n
        if not busy:
            raise PhaseError(f"{call}(): no task has accumulated minibatches; call process_minibatch(task, linkedset) "
                             "first" + (" (or step())" if call == Call.APPLY else ""))
        if late is not None and (call == Call.APPLY or not chosen):
            raise self.phase_error(late, accs[late], call)
        return chosen

    def run(self, call: str, acc: Accumulator) -> None:
        """Apply the transforms of ``call`` at ``acc``'s position, move it on after each and give the
        accumulator the statistics each measured."""
        transforms, at = self.transforms, self._call_at
        while acc.position < len(at) and at[acc.position] == call:
            t = transforms[acc.position]
            acc.advance(t.phase, t(acc))

    def phase_error(self, task: str, acc: Accumulator, call: str) -> PhaseError:
        """The error for ``call`` made on ``acc`` out of order, naming the call that should come instead."""
        nxt = self.next_call(acc)
        if nxt == Call.PROCESS_MINIBATCH:
            return PhaseError(f"{call}(): task {task!r} has nothing accumulated; call process_minibatch({task!r}, ...) first")
        calls = [*self.calls(), Call.APPLY]
        if call not in calls:
            return PhaseError(f"{call}(): this trainer's chain {self} has no {call} step (e.g. clip_grad_value is "
                              f"None); task {task!r} is {acc.phase}; next call: {nxt}()")
        if calls.index(call) < calls.index(nxt):
            return PhaseError(f"{call}(): task {task!r} is already {acc.phase}; next call: {nxt}()")
        needed = next(t.phase for t in self.transforms if t.call == nxt)
        return PhaseError(f"{call}(): task {task!r} has not been {needed}; call {nxt}() first (next call: {nxt}())")


def refuse_hand_work(accs: Mapping[str, Accumulator], chain: Chain) -> None:
    """step() starts a fresh cycle: refuse rather than silently discard minibatches processed by hand."""
    busy = {n: a for n, a in accs.items() if a.phase not in IDLE}
    if not busy:
        return
    parts = ", ".join(f"{n!r}: {a.minibatches} minibatch(es), phase {a.phase}" for n, a in busy.items())
    calls = [*chain.calls(), Call.APPLY]
    first = min(calls.index(c) if c in calls else 0 for c in (chain.next_call(a) for a in busy.values()))
    raise PhaseError(f"step(): tasks hold minibatches processed by hand ({parts}), which a fresh step would "
                     f"discard; finish them with finish() (it makes {', '.join(c + '()' for c in calls[first:])}) "
                     "or discard them with reset(), then step()")


KEPT = "mtlab: step() stopped before its update;"  # how kept_note begins (mtlab.run replaces it when it rolls back)


def kept_note(accs: Mapping[str, Accumulator]) -> str:
    """What a step() refused inside its cycle leaves behind, for the error's note."""
    kept = ", ".join(f"{n}: {a.minibatches} minibatch(es), {a.phase}" for n, a in accs.items() if a.minibatches)
    return (f"{KEPT} what it accumulated is kept for inspection ({kept or 'nothing'}; "
            "see trainer.state(task)) and parameters and optimizer are untouched. reset() discards it, after which "
            "step() draws fresh minibatches")
