"""Examples to padded batches.

An example is ``dict[str, Tensor]``. A tensor with at least one axis is a sequence with
time on its first axis; a 0-d tensor (a class id) has length 1. A batch is
``data: dict[str, Tensor[B, T, ...]]`` zero-padded to the longest item, plus
``seq_lengths: dict[str, LongTensor[B]]``; 0-d items are stacked to ``[B]``.

An entry may also be a numpy array or a number (taken as a tensor: ``torch.as_tensor``). Any other entry (an id,
a speaker name, a path) is carried along as a list of the batch's values, without a length: a task that does not
read it never sees it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from .errors import BatchError
from .frames import carry, frame_mask

Batch = tuple[dict[str, Tensor], dict[str, Tensor]]


def as_entry(value: Any) -> Any:
    """An example's entry as collate takes it: a tensor as it is, a numpy array or a number as a tensor
    (``torch.as_tensor``, sharing the array's memory), anything else (an id, a path) unchanged."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc":
        return torch.as_tensor(value)
    if isinstance(value, (int, float)):  # bool is an int
        return torch.as_tensor(value)
    return value


def example_length(example: Mapping[str, Any], key: str | None = None) -> int:
    """Time length of ``example[key]`` (default: its first tensor or array); 0-d tensors have length 1."""
    if not example:
        raise BatchError("empty example: an example is a dict name -> tensor with at least one entry")
    if key is not None:
        value = as_entry(example[key])
    else:
        value = next((v for v in map(as_entry, example.values()) if isinstance(v, Tensor)), None)
        if value is None:
            raise BatchError(f"example with entries {sorted(example)} holds no tensor, numpy array or number; "
                             "give the data a task reads as tensors or numpy arrays")
    return 1 if value.dim() == 0 else int(value.shape[0])


def collate(examples: Sequence[Mapping[str, Any]], pin_memory: bool = False) -> Batch:
    """Zero-pad a list of examples into ``(data, seq_lengths)``.

    Examples:
        >>> data, lens = collate([{"x": torch.ones(3, 2)}, {"x": torch.ones(5, 2)}])
        >>> data["x"].shape, lens["x"].tolist()
        (torch.Size([2, 5, 2]), [3, 5])
    """
    if len(examples) == 0:
        raise BatchError("cannot collate an empty list of examples")
    keys = list(examples[0].keys())
    for i, ex in enumerate(examples):
        if list(ex.keys()) != keys and set(ex.keys()) != set(keys):
            raise BatchError(
                f"example {i} has keys {sorted(ex.keys())} but example 0 has {sorted(keys)}; "
                "every example of a batch needs the same keys"
            )
    data: dict[str, Tensor] = {}
    seq_lengths: dict[str, Tensor] = {}
    for key in keys:
        items = [as_entry(ex[key]) for ex in examples]
        first = items[0]
        if not all(isinstance(t, Tensor) for t in items):
            if any(isinstance(t, Tensor) for t in items):
                raise BatchError(f"entry {key!r} is a tensor or array in some examples and not in others "
                                 f"({sorted({type(t).__name__ for t in items})}); give it one type in every example")
            data[key] = cast(Tensor, list(items))  # carried along (ids, paths): no length, never moved to a device
            continue
        if first.dim() == 0:
            if any(t.dim() != 0 for t in items):
                raise BatchError(f"entry {key!r} is 0-d in some examples and not in others")
            data[key] = torch.stack(items)
            seq_lengths[key] = torch.ones(len(items), dtype=torch.long)
            continue
        trailing = first.shape[1:]
        for i, t in enumerate(items):
            if t.dim() == 0 or t.shape[1:] != trailing:
                raise BatchError(
                    f"entry {key!r}: example {i} has shape {tuple(t.shape)}, example 0 has "
                    f"{tuple(first.shape)}; only the first (time) axis may differ"
                )
        lengths = [int(t.shape[0]) for t in items]
        out = first.new_zeros((len(items), max(lengths), *trailing))
        if pin_memory:
            out = out.pin_memory()
        for i, t in enumerate(items):
            out[i, : lengths[i]] = t
        data[key] = out
        seq_lengths[key] = torch.tensor(lengths, dtype=torch.long)
        frame_mask(seq_lengths[key], max(lengths))  # the batch's frame mask, made once here (mtlab.base.frames)
    return data, seq_lengths


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Move a batch to ``device`` without waiting for the copy (non_blocking)."""
    data, seq_lengths = batch
    for t in (*data.values(), *seq_lengths.values()):  # a plain loop: this runs per minibatch
        if t.device != device:
            break
    else:
        return data, seq_lengths
    nb = device.type == "cuda"
    return (
        {k: v.to(device, non_blocking=nb) for k, v in data.items()},
        {k: carry(v, v.to(device, non_blocking=nb), nb) for k, v in seq_lengths.items()},  # with their masks
    )


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; asking for CUDA without it is a ConfigError."""
    from .errors import ConfigError

    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but CUDA is not available here; use device='auto' or 'cpu'")
    return dev
