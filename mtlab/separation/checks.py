"""Build-time checks of a separation graph that no single piece can make alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from ..base.errors import ConfigError

MASK_LOSSES = ("pit", "direct")  # the losses that apply a mask activation to their output


def _get(obj: Any, key: str, default: Any = None) -> Any:
    return obj.get(key, default) if isinstance(obj, Mapping) else getattr(obj, key, default)


def check_mask_activation(models: Mapping[str, nn.Module], tasks: Mapping[str, Any], origin: str = "recipe") -> None:
    """Refuse a ``MaskHead`` (which already applies its softmax or sigmoid) whose output feeds a ``pit`` or
    ``direct`` loss that applies an activation again (``activation`` other than ``"none"``): the masks would
    be squashed twice. ``tasks`` maps names to recipe task tables or :class:`mtlab.Task` objects."""
    from ..models import MaskHead
    from .losses import PIT

    for tname, task in tasks.items():
        loss = _get(task, "loss")
        if isinstance(loss, Mapping):
            kind, output, activation = loss.get("type"), loss.get("output", "masks"), loss.get("activation", "softmax")
        elif isinstance(loss, PIT):
            kind, output, activation = "pit", loss.output, loss.activation
        else:
            continue
        if kind not in MASK_LOSSES or activation == "none":
            continue
        for node in _get(task, "nodes", ()) or ():
            name, model = _get(node, "name"), _get(node, "model")
            produced = _get(node, "outputs") or [name]
            if output in produced and isinstance(models.get(model), MaskHead):
                head = models[model]
                raise ConfigError(
                    f"{origin}: [tasks.{tname}] loss {kind!r} applies activation = {activation!r} to {output!r}, "
                    f"which model {model!r} (MaskHead, activation {head.activation!r}) has already squashed: the "
                    f"masks would go through two activations. Set the loss's activation = \"none\" (the head gives "
                    f"masks), or give the loss a linear layer's logits (type = \"Dense\") as the original does")
