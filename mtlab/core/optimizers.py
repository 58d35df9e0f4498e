"""The trainer's optimizers by name: ``"adam"`` (torch's Adam, the default) and ``"adam_tf1"`` (the original's).

Nabu-MSSS trains with TensorFlow 1's ``tf.train.AdamOptimizer``, whose update differs from torch's Adam in
where epsilon sits. TensorFlow folds the bias corrections into the step size and adds epsilon to √v
(``tensorflow/python/training/adam.py``, ``_apply_dense``; the kernel ``ApplyAdamNonCuda`` in
``tensorflow/core/kernels/training_ops.cc``)::

    lr_t = lr · √(1 − β2^t) / (1 − β1^t)
    m   += (g − m) · (1 − β1)
    v   += (g² − v) · (1 − β2)
    θ   -= lr_t · m / (√v + ε)

torch divides by ``√v̂ + ε`` with ``v̂ = v / (1 − β2^t)``; TensorFlow's form is that with ε scaled by
``√(1 − β2^t)``: on the first step (β2 = 0.999) a 31.6× larger epsilon. β1^t and β2^t are float32 state
multiplied by β after each step (TensorFlow's ``beta1_power`` and ``beta2_power``), so :class:`AdamTF1`
agrees with TensorFlow to float32 rounding.

One difference is left: TensorFlow keeps one β-power pair per optimizer, advanced by every
``apply_gradients``; here each parameter keeps its own, advanced when it gets a gradient (as torch's
``step``). They agree whenever every parameter gets a gradient every step, which the original's
graph always gives (its accumulated gradients exist, zero or not, for every variable a task uses).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ..base.errors import ConfigError

OptimizerFactory = Callable[[list[Any]], torch.optim.Optimizer]
DEFAULT_LR = 1e-3  # Trainer(lr=None) with a named optimizer ("adam", "adam_tf1")


class AdamTF1(torch.optim.Optimizer):
    """``tf.train.AdamOptimizer`` (TensorFlow 1): epsilon on √v, the bias correction in the step size.

    Examples:
        >>> model = torch.nn.Linear(3, 1)
        >>> opt = AdamTF1(model.parameters(), lr=1e-3)  # TensorFlow's defaults: betas (0.9, 0.999), eps 1e-8
        >>> model(torch.ones(2, 3)).sum().backward(); opt.step()

    Per parameter state: ``exp_avg`` (m), ``exp_avg_sq`` (v), ``beta1_power``, ``beta2_power`` (β^t of the
    next step, float32 as TensorFlow's) and ``step``. A step can be skipped on the device: set
    ``found_inf`` (a 0-d tensor, nonzero to skip) before ``step()``, as ``mtlab.core.update.optimizer_step``
    does; nothing is read back to the host.
    """

    takes_found_inf = True  # optimizer_step hands it a device-side found_inf (no host sync)

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        if not _real(lr) or not lr > 0:
            raise ConfigError(f"AdamTF1: lr must be a positive number, got {lr!r}")
        check_adam_tf1_options({"betas": betas, "eps": eps}, "AdamTF1")
        super().__init__(params, {"lr": float(lr), "betas": (float(betas[0]), float(betas[1])), "eps": float(eps)})

    def _init_state(self, p: Tensor, betas: tuple[float, float]) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            b1, b2 = (torch.tensor(b, dtype=p.dtype, device=p.device) for b in betas)
            state.update(step=torch.zeros((), dtype=torch.float32, device=p.device),
                         exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                         exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format),
                         beta1_power=b1, beta2_power=b2)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ConfigError("AdamTF1 does not take sparse gradients; use dense embeddings")
                st = self._init_state(p, (beta1, beta2))
                skip = None if found_inf is None else found_inf.to(p.device, torch.bool)
                adam_tf1_update(p, p.grad, st, lr, beta1, beta2, eps, skip)
        return loss


def _one_minus(beta: float, like: Tensor) -> Tensor:
    """``1 − β`` computed in the parameter's dtype, as TensorFlow's kernel does (``T(1) - beta()``)."""
    return 1 - torch.tensor(beta, dtype=like.dtype, device=like.device)


def adam_tf1_update(p: Tensor, g: Tensor, st: dict[str, Any], lr: float, beta1: float, beta2: float, eps: float,
                    skip: Tensor | None = None) -> None:
    """One TensorFlow-1 Adam update of ``p`` in place (``skip``: a 0-d bool tensor, true leaves everything)."""
    m, v, b1p, b2p = st["exp_avg"], st["exp_avg_sq"], st["beta1_power"], st["beta2_power"]
    alpha = lr * torch.sqrt(1 - b2p) / (1 - b1p)  # lr_t, on the device
    if skip is None:
        m.add_((g - m) * _one_minus(beta1, m))
        v.add_((g * g - v) * _one_minus(beta2, v))
        p.sub_(m * alpha / (v.sqrt() + eps))
        b1p.mul_(beta1)
        b2p.mul_(beta2)
        st["step"].add_(1)
        return
    # skipped on the device: every new value is computed, then the old one kept where skip is true
    m_new = m + (g - m) * _one_minus(beta1, m)
    v_new = v + (g * g - v) * _one_minus(beta2, v)
    p.copy_(torch.where(skip, p, p - m_new * alpha / (v_new.sqrt() + eps)))
    m.copy_(torch.where(skip, m, m_new))
    v.copy_(torch.where(skip, v, v_new))
    b1p.copy_(torch.where(skip, b1p, b1p * beta1))
    b2p.copy_(torch.where(skip, b2p, b2p * beta2))
    st["step"].add_((~skip).to(st["step"].dtype))


def make_adam(params: list[Any], lr: float, **options: Any) -> torch.optim.Optimizer:
    """torch's Adam; fused where every parameter allows it (so a non-finite step is skipped on the device)."""
    flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    opts = dict(options)
    if "fused" not in opts and "foreach" not in opts:
        opts["fused"] = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in flat)
    return torch.optim.Adam(params, lr=lr, **opts)


ADAM_TF1_OPTIONS = ("betas", "eps")


def _real(x: Any) -> bool:
    """A real number (bool and text are not)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_adam_tf1_options(options: Mapping[str, Any], where: str = "optimizer 'adam_tf1'") -> None:
    """Refuse, naming the option and the value expected, options :class:`AdamTF1` cannot take."""
    unknown = sorted(set(options) - set(ADAM_TF1_OPTIONS))
    if unknown:
        raise ConfigError(f"{where} takes the options {list(ADAM_TF1_OPTIONS)} (TensorFlow's AdamOptimizer has no "
                          f"others), not {unknown}; remove them or use optimizer='adam'")
    if "betas" in options:
        betas = options["betas"]
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(_real(b) for b in betas)
                or not all(0.0 <= b < 1.0 for b in betas)):
            raise ConfigError(f"{where}: option 'betas' must be a pair of numbers in [0, 1), e.g. (0.9, 0.999), "
                              f"got {betas!r}")
    if "eps" in options:
        eps = options["eps"]
        if not _real(eps) or not eps >= 0:
            raise ConfigError(f"{where}: option 'eps' must be a number >= 0, e.g. 1e-8, got {eps!r}")


def make_adam_tf1(params: list[Any], lr: float, **options: Any) -> torch.optim.Optimizer:
    """:class:`AdamTF1` (the original's Adam); ``options`` may set ``betas`` and ``eps`` only."""
    check_adam_tf1_options(options)
    return AdamTF1(params, lr=lr, **options)


# name -> factory(params, lr, **options); "adam" is the default of a hand-built Trainer and mtlab's own recipes
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {"adam": make_adam, "adam_tf1": make_adam_tf1}


def optimizer_factory(spec: str | OptimizerFactory | None, lr: Callable[[], float],
                      options: Mapping[str, Any]) -> tuple[str, OptimizerFactory]:
    """``(name, factory(params) -> optimizer)`` for ``Trainer(optimizer=...)``: None or ``"adam"`` (torch's
    Adam), ``"adam_tf1"`` (the original's), or a factory of your own (named ``"custom"``). ``lr`` is read
    when an optimizer is built; ``options`` are the trainer's ``adam`` options."""
    if spec is None:
        spec = "adam"
    if callable(spec):
        return "custom", spec
    if not isinstance(spec, str) or spec not in OPTIMIZERS:
        raise ConfigError(f"optimizer {spec!r} is not known; use one of {sorted(OPTIMIZERS)} or a function "
                          "params -> torch.optim.Optimizer")
    if "lr" in options:  # the trainer's knob: changed between steps, journaled, checkpointed
        raise ConfigError(f"optimizer {spec!r}: the options may not set 'lr' (got {options['lr']!r}); give the "
                          "learning rate as Trainer(lr=...) or a recipe's initial_learning_rate")
    if spec == "adam_tf1":
        check_adam_tf1_options(options)  # now, not at the first step
    make = OPTIMIZERS[spec]
    return spec, lambda ps: make(ps, lr=lr(), **options)


def checked_factory(factory: OptimizerFactory, lr: float | None) -> OptimizerFactory:
    """A user's ``params -> optimizer`` factory, checked when it builds: it must return a torch optimizer with a
    positive ``lr``, and ``Trainer(lr=...)``, when given too, must agree with it (never silently replaced)."""

    def build(params: list[Any]) -> torch.optim.Optimizer:
        opt = factory(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise ConfigError(f"optimizer=: the function returned {type(opt).__name__}, not a torch.optim.Optimizer; "
                              "e.g. optimizer=lambda params: torch.optim.SGD(params, lr=0.1)")
        own = opt.defaults.get("lr")
        if lr is not None and own is not None and float(own) != float(lr):
            raise ConfigError(f"Trainer(lr={lr:g}) and the optimizer's own lr ({type(opt).__name__}, lr={float(own):g}) "
                              "disagree; give the lr once: drop Trainer's lr= to train at the optimizer's, or build "
                              f"the optimizer with lr={lr:g}")
        return opt
    return build


def trainer_optimizer(spec: str | OptimizerFactory | None, lr: float | None, options: Mapping[str, Any],
                      acc_steps: bool) -> tuple[str, OptimizerFactory, float]:
    """``Trainer(optimizer=..., lr=...)``: ``(name, factory, lr of a named optimizer)``. A named optimizer is built
    at ``lr`` (1e-3 when None); a user's factory at its own lr, which ``lr``, when given, must agree with."""
    if lr is not None and not (_real(lr) and lr > 0 and lr != float("inf")):
        raise ConfigError(f"lr must be > 0 and finite, got {lr!r}")
    named = DEFAULT_LR if lr is None else float(lr)
    name, factory = optimizer_factory(spec, lambda: named, options)
    if name == "custom" and not acc_steps:
        factory = checked_factory(factory, lr)
    return name, factory, named
