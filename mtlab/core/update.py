"""The update: each parameter's direction from the tasks' processed gradients, then one optimizer step.

The direction of a parameter is ``Σ_t w_t · g_t`` over the tasks that use it and accumulated in this step,
built from the accumulators WITHOUT changing them (their gradients stay readable, bit for bit). Where one
task with weight 1 is the only contributor, the direction is that task's gradient itself (no copy); other
parameters get a buffer of their own, allocated once. A parameter whose contributors all have weight 0
gets no gradient, so the optimizer leaves it and its state alone, as for a parameter no task used.

Two seams choose how tasks become one direction (``mtlab.combine`` and ``mtlab.weighting`` fill them):

- ``combine(group, rows, out) -> [direction per parameter]``: for each :class:`Group` of shared parameters
  that the same two or more tasks contributed to, ``rows`` holds ``(task, weight, [gradient per
  parameter])``; the default :class:`WeightedSum` is the original's ``Σ_t w_t · g_t``. A parameter with
  a single contributing task always gets that task's weighted gradient.
- ``weighting.coefficients(losses, lr, found_inf) -> {task: coefficient}`` (optional): a loss-based task
  weighting; each task's weight is multiplied by its coefficient before the combination.

After each step ``stats`` holds device tensors for the history (no host read): the weighting's
coefficients, the combination's per-task weights, the cosine similarity of the tasks' processed
gradients on each shared model and the norm of the direction.
"""

from __future__ import annotations

import functools

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from ..base import gradops
from .accumulator import Accumulator
from .columns import combine_column, cosine_column, direction_column, weighting_column
from ..base.errors import ConfigError
from ..base.registry import Registry, add_plugin, build
from ..tasks.sampling import derived_seed
from .optimizers import OptimizerFactory, make_adam  # noqa: F401 (make_adam: re-exported for its users)

logger = logging.getLogger("mtlab")


# Fused optimizers accept a device-side ``found_inf`` (as torch.amp.GradScaler uses) from torch 2.4 on.
_FOUND_INF_MIN = (2, 4)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def skips_on_device(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` can skip a step on the device from a ``found_inf`` tensor (no host sync): torch's fused
    optimizers (torch 2.4 on) and mtlab's own that say so (``takes_found_inf``, e.g. ``AdamTF1``)."""
    if getattr(opt, "takes_found_inf", False):
        return True
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


Weight = float | Tensor  # a task's weight in the combination: a number, or a 0-d tensor when a weighting scales it
Row = tuple[str, Weight, list[Tensor]]  # (task, weight, its processed gradient for each parameter of a group)


@dataclass(frozen=True)
class Group:
    """Shared parameters that the same two or more tasks contributed to in this step: one Jacobian
    (tasks × the parameters, flattened) for a combination method. ``name`` is the models it covers."""

    name: str
    tasks: tuple[str, ...]
    params: tuple[str, ...]


def weighted_sum_(dst: Tensor, srcs: Sequence[tuple[Weight, Tensor]]) -> Tensor:
    """``dst = Σ w·src`` in place; with number weights exactly ``gradops.add_scaled_`` (the original's ops)."""
    if all(not isinstance(w, Tensor) for w, _ in srcs):
        return gradops.add_scaled_(dst, srcs)  # type: ignore[arg-type]
    for i, (w, src) in enumerate(srcs):
        if i == 0:
            torch.mul(src, w, out=dst)
        elif isinstance(w, Tensor):
            dst.addcmul_(src, w.to(dst.dtype))
        else:
            dst.add_(src, alpha=w)
    return dst


def flat(views: Sequence[Tensor]) -> Tensor:
    """``views`` as one 1-D tensor: a view of the accumulator's buffer where they lie back to back in it
    (no copy, the usual case for one model's parameters), else a concatenation."""
    first = views[0]
    start = end = first.storage_offset()
    ptr = first.untyped_storage().data_ptr()
    for v in views:
        if (not v.is_contiguous() or v.dtype != first.dtype or v.untyped_storage().data_ptr() != ptr
                or v.storage_offset() != end):
            return torch.cat([u.reshape(-1) for u in views])
        end += v.numel()
    return first.as_strided((end - start,), (1,), start)


@functools.cache  # per parameter and step: the same few names
def model_of(param: str) -> str:
    """The model a parameter name belongs to: ``"enc.lstm.weight"`` -> ``"enc"``."""
    return param.split(".", 1)[0]


class WeightedSum:
    """The default combination (the original's): ``Σ_t w_t · g_t`` per parameter."""

    def __call__(self, group: Group, rows: Sequence[Row], out: Callable[[], list[Tensor]]) -> list[Tensor]:
        bufs = out()
        if all(not isinstance(w, Tensor) for _, w, _ in rows):  # number weights: the original's ops, directly
            return [gradops.add_scaled_(bufs[i], [(float(w), grads[i]) for _, w, grads in rows])
                    for i in range(len(group.params))]
        return [weighted_sum_(bufs[i], [(w, grads[i]) for _, w, grads in rows]) for i in range(len(group.params))]

    def __repr__(self) -> str:
        return "WeightedSum()"


class Weighting(Protocol):
    """A loss-based task weighting (``mtlab.weighting``): per-step coefficients from the tasks' losses."""

    def coefficients(self, tasks: Sequence[str], losses: Tensor, lr: float, found_inf: Tensor | None,
                     seed: int) -> Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


# Combination methods and loss weightings by name; mtlab.combine and mtlab.weighting register theirs on import.
METHODS = Registry("combine", {"sum": WeightedSum})
add_plugin("combine", "mtlab.core.combine")
add_plugin("combine", "mtlab.core.weighting")


class Combination(Protocol):
    """The ``combine`` seam: one shared group's rows (task, weight, gradients) -> one direction per parameter.
    ``out()`` gives buffers shaped as the group's parameters that the result may be written into; e.g. the
    weighted sum, or a ``mtlab.combine`` aggregator (torchjd)."""

    def __call__(self, group: Group, rows: Sequence[Row], out: Callable[[], list[Tensor]]) -> list[Tensor]: ...


# How tasks become one direction: a name ("sum", "upgrad", "dwa+upgrad"), {"type": name, **options}, a
# combination or a weighting object; None is the weighted sum.
MethodSpec = str | Mapping[str, object] | Combination | Weighting | None
Item = tuple[str, dict[str, object]] | Combination | Weighting  # a method by name and options, or an object


def resolve_method(spec: MethodSpec) -> tuple[Combination, Weighting | None]:
    """``(combine, weighting)`` from a method spec: None or ``"sum"`` (the weighted sum), a name
    (``"upgrad"``, ``"uncertainty"``), a weighting and an aggregator joined by ``+`` (``"dwa+upgrad"``),
    ``{"type": name, **options}`` (plus ``"weighting": spec``), or a combine / weighting object."""
    if spec is None:
        return WeightedSum(), None
    items: list[Item] = []
    if isinstance(spec, str):
        items = [(part.strip(), {}) for part in spec.split("+")]
    elif isinstance(spec, Mapping):
        opts = dict(spec)
        if "type" not in opts:
            raise ConfigError(f"combine {dict(spec)!r} needs type = \"<method>\"; methods: {sorted(METHODS)}")
        name = opts.pop("type")
        extra = opts.pop("weighting", None)
        items = [(str(name), opts)]
        if extra is not None:
            items.extend(resolve_items(extra))
    else:
        items = [spec]
    combine: Combination | None = None
    weighting: Weighting | None = None
    for item in items:
        obj: object = build("combine method", METHODS, item[0], item[1]) if isinstance(item, tuple) else item
        if hasattr(obj, "coefficients"):
            if weighting is not None:
                raise ConfigError(f"combine {spec!r} names two loss weightings; choose one (plus one aggregator)")
            weighting = cast(Weighting, obj)
        elif callable(obj):
            if combine is not None:
                raise ConfigError(f"combine {spec!r} names two aggregators; choose one (plus one loss weighting)")
            combine = cast(Combination, obj)
        else:
            raise ConfigError(f"combine: {obj!r} is neither a combination (callable(group, rows, out)) nor a "
                              "weighting (with coefficients()); use a name from " + ", ".join(sorted(METHODS)))
    return (combine if combine is not None else WeightedSum()), weighting


def resolve_items(spec: object) -> list[Item]:
    """A combine setting as a list of items: a name -> ``[(name, {})]``, ``{"type": name, **options}`` ->
    ``[(name, options)]``, anything else (an object) -> ``[spec]``."""
    if isinstance(spec, str):
        return [(spec, {})]
    if isinstance(spec, Mapping) and "type" in spec:
        opts = dict(spec)
        return [(str(opts.pop("type")), opts)]
    return [cast(Combination | Weighting, spec)]


class Update:
    """One optimizer over every used parameter, stepped with the combined direction.

    Examples:
        >>> update = Update(params, users, lambda ps: make_adam(ps, lr=1e-3))  # doctest: +SKIP
        >>> update.step(accumulators, {"a": 1.0, "b": 0.3}, lr=1e-3, found_inf=None)  # doctest: +SKIP
        >>> # between steps: torchjd's UPGrad on each shared group's Jacobian
        >>> update.set_method("upgrad")  # doctest: +SKIP
    """

    def __init__(self, params: Mapping[str, nn.Parameter], users: Mapping[str, Sequence[str]],
                 make_optimizer: OptimizerFactory, combine: MethodSpec = None, seed: int = 0) -> None:
        self.params = dict(params)
        self.users = {k: list(v) for k, v in users.items()}
        self.optimizer = make_optimizer(list(self.params.values()))
        self.seed = int(seed)
        self.calls = 0  # steps taken: seeds the randomness of random methods (the same on every rank, on resume)
        self.record_stats = True
        self.stats: dict[str, Tensor] = {}
        self._buffers: dict[str, Tensor] = {}
        self.set_method(combine)

    def set_method(self, spec: MethodSpec) -> None:
        """Choose the combination (and loss weighting) from the next step on; see :func:`resolve_method`."""
        self.combine, self.weighting = resolve_method(spec)
        self.method = spec if spec is None or isinstance(spec, (str, Mapping)) else repr(spec)

    def step_seed(self) -> int:
        """The seed of this step's random choices (PCGrad's order, GradDrop's masks, random weights)."""
        return derived_seed(self.seed, "combine", str(self.calls))

    def _buffer(self, name: str) -> Tensor:
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = torch.empty_like(self.params[name])
        return buf

    def _buffers_for(self, names: Sequence[str]) -> list[Tensor]:
        bufs = self._buffers
        return [bufs[n] if n in bufs else self._buffer(n) for n in names]

    def buffers(self) -> list[Tensor]:
        """The direction buffers allocated so far (for parameters where tasks' gradients had to be combined)."""
        return list(self._buffers.values())

    def task_weights(self, accs: Mapping[str, Accumulator], weights: Mapping[str, float], lr: float,
                     found_inf: Tensor | None) -> dict[str, Weight]:
        """Each contributing task's weight: the task weight, times the weighting's coefficient if one is set."""
        active: dict[str, Weight] = {t: w for t, w in weights.items()
                                     if w is not None and w > 0.0 and accs[t].minibatches}
        if self.weighting is None or not active:
            return active
        tasks = list(active)
        losses = torch.stack([accs[t].normalized_loss for t in tasks])
        coef = self.weighting.coefficients(tasks, losses, lr, found_inf, self.step_seed())
        self.stats.update({weighting_column(t): coef[i] for i, t in enumerate(tasks)})
        return {t: active[t] * coef[i] for i, t in enumerate(tasks)}

    def directions(self, accs: Mapping[str, Accumulator], weights: Mapping[str, float], lr: float = 0.0,
                   found_inf: Tensor | None = None) -> dict[str, Tensor | None]:
        """Each parameter's direction from the accumulators of the tasks in ``weights`` (read only).

        A weighting's state moves on with each call (use ``step`` to train; tests call this once per step)."""
        self.stats = {}
        eff = self.task_weights(accs, weights, lr, found_inf)
        grads = {t: accs[t].grads for t in eff}  # read once per task: this runs per parameter
        out: dict[str, Tensor | None] = {}
        groups: dict[tuple[str, ...], list[str]] = {}
        for name, users in self.users.items():
            if len(users) == 1:  # a task's own parameter: no list to build
                t = users[0]
                g = grads[t].get(name) if t in grads else None
                if g is None:
                    out[name] = None
                    continue
                w = eff[t]
                out[name] = g if not isinstance(w, Tensor) and w == 1.0 else weighted_sum_(self._buffer(name), [(w, g)])
                continue
            contrib = [t for t in users if t in grads and grads[t].get(name) is not None]
            if not contrib:
                out[name] = None
            elif len(contrib) == 1:
                w, g = eff[contrib[0]], grads[contrib[0]][name]
                out[name] = g if not isinstance(w, Tensor) and w == 1.0 else weighted_sum_(self._buffer(name), [(w, g)])
            else:
                groups.setdefault(tuple(contrib), []).append(name)
        seeded = getattr(self.combine, "random", False)
        for key, names in groups.items():
            group = Group("+".join(dict.fromkeys(model_of(n) for n in names)), key, tuple(names))
            rows: list[Row] = [(t, eff[t], [accs[t].grads[n] for n in names]) for t in key]
            out_buffers = partial(self._buffers_for, names)
            if seeded:
                with torch.random.fork_rng(devices=[d for d in {g.device for g in rows[0][2]} if d.type == "cuda"]):
                    torch.manual_seed(self.step_seed())
                    dirs = self.combine(group, rows, out_buffers)
            else:
                dirs = self.combine(group, rows, out_buffers)
            out.update(zip(names, dirs))
            if self.record_stats:
                self.group_stats(group, rows, dirs)
        if self.record_stats:
            used = [d for d in out.values() if d is not None]
            if used:
                self.stats[direction_column()] = gradops.total_norm(used)
        return out

    def group_stats(self, group: Group, rows: Sequence[Row], dirs: Sequence[Tensor]) -> None:
        """Device tensors for the history: the method's weights, per-model cosine similarities, the norm."""
        chosen = getattr(self.combine, "last_weights", {}).get(group.name)
        if chosen is not None:
            self.stats.update({combine_column(group.name, t): chosen[i] for i, (t, _, _) in enumerate(rows)})
        self.stats[direction_column(group.name)] = gradops.total_norm(list(dirs))
        by_model: dict[str, list[int]] = {}
        for i, n in enumerate(group.params):
            by_model.setdefault(model_of(n), []).append(i)
        for model, idx in by_model.items():
            vecs = [flat([grads[i] for i in idx]) for _, _, grads in rows]
            norms = [torch.linalg.vector_norm(v) for v in vecs]
            for a in range(len(rows)):
                for b in range(a + 1, len(rows)):
                    cos = torch.dot(vecs[a], vecs[b]) / (norms[a] * norms[b])
                    self.stats[cosine_column(model, rows[a][0], rows[b][0])] = cos

    def step(self, accs: Mapping[str, Accumulator], weights: Mapping[str, float], lr: float,
             found_inf: Tensor | None) -> None:
        """Set each parameter's ``.grad`` to its direction, step the optimizer, and give the
        accumulators their ``.grad`` views back (whatever happens)."""
        frozen: list[nn.Parameter] = []
        try:
            directions = self.directions(accs, weights, lr, found_inf)
            params = self.params
            for name, d in directions.items():
                p = params[name]
                if not p.requires_grad:  # frozen now: no gradient, so no optimizer, momentum or decay moves it
                    frozen.append(p)
                    d = None
                if p.grad is not d:  # a task's own gradient of weight 1 is already there: reading is cheaper
                    p.grad = d
            optimizer_step(self.optimizer, found_inf)  # at the lrs its param groups hold (a scheduler's, a knob's)
            self.calls += 1
        finally:
            for acc in accs.values():
                acc.restore_grads()
        for p in frozen:
            p.grad = None  # as in plain PyTorch: a frozen parameter's .grad is None

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "calls": self.calls}
        if self.method is None or isinstance(self.method, (str, Mapping)):  # an object given as method cannot be stored
            state["method"] = self.method if not isinstance(self.method, Mapping) else dict(self.method)
        if self.weighting is not None:
            state["weighting"] = self.weighting.state_dict()
        combine_state: dict[str, Any] = getattr(self.combine, "state_dict", dict)()
        if combine_state:
            state["combine"] = combine_state
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the optimizer, the step count and the method with its weighting's state (a method
        switched since the state was taken is switched back, as the lr is)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.calls = int(state.get("calls", 0))
        if "method" in state and state["method"] != self.method:
            self.set_method(state["method"])
        if "weighting" in state:
            if self.weighting is None:
                raise ConfigError("the state holds a loss weighting's state but this trainer has none; build it with "
                                  "the same combine method")
            self.weighting.load_state_dict(state["weighting"])
        if state.get("combine"):
            if not hasattr(self.combine, "load_state_dict"):
                raise ConfigError(f"the state holds the state of a stateful combination method, but this trainer "
                                  f"combines with {self.method!r}; build it with the same combine method")
            self.combine.load_state_dict(state["combine"])


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
        self.stats: dict[str, Tensor] = {}  # no combination statistics: each task steps its own optimizer
        self.method = None

    def set_method(self, spec: MethodSpec) -> None:
        if spec is not None and spec != "sum":
            raise ConfigError(f"combine {spec!r} needs the single optimizer: acc_steps steps one optimizer per task")

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
                    p.grad = grads.get(name) if p.requires_grad else None  # frozen: untouched
                optimizer_step(opt, found_inf)
                for p in self.task_params[task].values():
                    p.grad = None
        finally:
            for acc in accs.values():
                acc.restore_grads()

    def state_dict(self) -> dict[str, Any]:
        return {"task_optimizers": {k: o.state_dict() for k, o in self.optimizers.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k, o in self.optimizers.items():
            o.load_state_dict(state["task_optimizers"][k])
