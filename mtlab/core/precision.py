"""Mixed precision for the stepwise trainer: autocast settings and one ``torch.amp.GradScaler``.

``Precision("32" | "bf16-mixed" | "16-mixed")`` is what the trainer calls at four points of a step:

- ``autocast()`` around each minibatch's forward and loss (the loss computer itself runs in float32, see
  ``mtlab.tasks.forward``: mtlab's losses are SUMS over a minibatch, which half precision would round away);
- ``scale(loss)`` before each backward (``16-mixed`` only: the scaler's ``scale``);
- ``unscale_(acc.buffers)`` once per task and step, in the first call after the minibatches (``normalize``,
  or ``clip`` / ``apply`` when the chain has no Normalize): ``GradScaler.unscale_`` on the task's buffers;
- ``update(found_inf)`` in ``apply``: ``GradScaler.update()``; a step skipped because a loss or gradient of
  any task was not finite (``found_inf``, on the device) backs the scale off.

Parameters, gradients, accumulators and optimizer state stay float32 (the master copy). Under ``16-mixed``
a task's accumulated gradient is readable as the SCALED sum while the task is ``accumulating`` (its
``acc.buffers`` hold ``scale × Σ grad``) and as the true gradient from the next call on; its ``loss`` and
``normalizer`` are never scaled.

Examples:
    >>> p = Precision("16-mixed", "cpu", init_scale=2.0**10)
    >>> p.mode, p.dtype, p.state_dict()["scaler"]["scale"]
    ('16-mixed', torch.float16, 1024.0)
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, TypedDict, Unpack, cast

import torch
from torch import Tensor

from ..base.errors import ConfigError

PRECISIONS = ("32", "bf16-mixed", "16-mixed")
_ALIASES = {"32": "32", "fp32": "32", "32-true": "32", "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed",
            "16": "16-mixed", "fp16": "16-mixed", "16-mixed": "16-mixed"}
_DTYPES = {"32": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
SCALER_OPTIONS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


class ScalerOptions(TypedDict, total=False):
    """``torch.amp.GradScaler``'s options (``16-mixed`` only)."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int


class PrecisionOptions(ScalerOptions, total=False):
    """``precision={"type": "16-mixed", "init_scale": 2.0**10}``: a precision name and GradScaler options."""

    type: str  # a name of PRECISIONS (or an alias); "32" when left out


PrecisionSpec = str | PrecisionOptions  # Trainer(precision=...), besides a Precision object


class _Carrier:
    """What ``GradScaler.unscale_`` reads of an optimizer: ``param_groups`` whose tensors' ``.grad`` are a
    task's flat buffers (each carried by one element expanded to the buffer's shape)."""

    def __init__(self, buffers: list[Tensor]) -> None:
        holders = []
        for buf in buffers:
            holder = buf.new_empty(()).expand(buf.shape)  # never read: no fill kernel
            holder.grad = buf
            holders.append(holder)
        self.param_groups = [{"params": holders}]


def compile_models(models: Mapping[str, torch.nn.Module]) -> None:
    """``torch.compile`` each model in place with dynamic shapes (``Module.compile``: names, state dicts and
    parameters stay the module's own), so variable lengths do not recompile per length. What dynamo cannot
    trace (nn.LSTM, nn.RNN, packing) runs eagerly between compiled pieces."""
    for model in models.values():
        model.compile(dynamic=True)


def check_precision(value: object) -> str:
    """The canonical name of a precision setting (``"bf16"`` -> ``"bf16-mixed"``); a ConfigError otherwise."""
    key = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if key not in _ALIASES:
        raise ConfigError(f"precision {value!r} is not one of {list(PRECISIONS)} "
                          "(also accepted: 'bf16', '16', 'fp16', 'fp32')")
    return _ALIASES[key]


class Precision:
    """Autocast settings and, for ``16-mixed``, the trainer's one GradScaler (its state in checkpoints).

    ``scaler_options`` go to ``torch.amp.GradScaler`` (``init_scale``, ``growth_factor``, ``backoff_factor``,
    ``growth_interval``)."""

    def __init__(self, mode: str = "32", device: str | torch.device = "cpu", **scaler_options: Unpack[ScalerOptions]) -> None:
        self.mode = check_precision(mode)
        self.device = torch.device(device)
        self.dtype: torch.dtype | None = _DTYPES[self.mode]
        unknown = set(scaler_options) - set(SCALER_OPTIONS)
        if unknown:
            raise ConfigError(f"precision: unknown GradScaler option(s) {sorted(unknown)}; valid: {list(SCALER_OPTIONS)}")
        if scaler_options and self.mode != "16-mixed":
            raise ConfigError(f"precision {self.mode!r} has no loss scaling; GradScaler options "
                              f"{sorted(scaler_options)} need precision = \"16-mixed\"")
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(self.device.type, **scaler_options) if self.mode == "16-mixed" else None)
        self.scaling = self.scaler is not None  # whether losses are scaled (16-mixed)
        self._carriers: list[_Carrier] = []

    @classmethod
    def build(cls, spec: Precision | PrecisionSpec | None, device: torch.device) -> Precision:
        """From a Trainer's ``precision=``: a name, ``{"type": name, **scaler options}``, or a Precision."""
        if isinstance(spec, Precision):
            if spec.device.type != device.type:
                raise ConfigError(f"precision object built for {spec.device}, trainer on {device}; "
                                  "pass the precision by name instead")
            return spec
        if isinstance(spec, Mapping):
            opts = dict(spec)
            mode = opts.pop("type", "32")
            return cls(str(mode), device, **cast(ScalerOptions, opts))  # __init__ refuses unknown options
        return cls("32" if spec is None else spec, device)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward's autocast region (nothing under ``"32"``)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    # ------------------------------------------------------------------ loss scaling (16-mixed)
    def scale(self, loss: Tensor) -> Tensor:
        """``loss × scale`` before a backward (the loss itself under ``"32"`` and ``"bf16-mixed"``)."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def unscale_(self, buffers: list[Tensor]) -> None:
        """Divide a task's accumulated buffers by the scale, in place, with ``GradScaler.unscale_`` itself
        (its kernel also records whether they hold an inf or NaN, for ``update``). No host read."""
        if self.scaler is None:
            return
        # unscale_ takes an optimizer, but reads only its param_groups' ``.grad``: a carrier per call (one per
        # task and step; a task reset and accumulated again gets a new one) points them at the buffers.
        carrier = _Carrier(buffers)
        self._carriers.append(carrier)  # alive until update(): the scaler keys its records by id()
        self.scaler.unscale_(carrier)  # type: ignore[arg-type]

    def update(self, found_inf: Tensor) -> dict[str, Tensor]:
        """After a step: ``GradScaler.update()``, on the device. A skipped step (``found_inf``: any task's loss
        or gradient not finite) backs the scale off, an applied one counts towards growth; returns the
        history's ``grad_scale`` (the scale this step used)."""
        if self.scaler is None:
            return {}
        used = self.scaler.scale(torch.ones((), device=found_inf.device))  # the scale as a tensor, no host read
        # The step's own verdict, as one more "gradient" the scaler checks: inf where the step was skipped. It
        # agrees with the tasks' carriers (the same buffers, checked again) and also covers a step whose
        # buffers were unscaled before a checkpoint was loaded.
        self.unscale_([torch.where(found_inf, float("inf"), 0.0).to(torch.float32).reshape(1)])
        self.scaler.update()
        self._carriers = []
        return {"grad_scale": used}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``{"mode": ..., "scaler": GradScaler.state_dict() or None}`` (reads the scale: one host read)."""
        return {"mode": self.mode, "scaler": None if self.scaler is None else self.scaler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scaler's state (a state without one leaves the scaler as it is)."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(dict(state["scaler"]))

    def __repr__(self) -> str:
        return f"Precision({self.mode!r}, device={str(self.device)!r})"
