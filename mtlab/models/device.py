"""What recurrent models need to run on a device without waiting for it, in any precision."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor

HALF = (torch.float16, torch.bfloat16)


def rnn_precision(x: Tensor) -> tuple[contextlib.AbstractContextManager[Any], Tensor]:
    """Autocast off and ``x`` in float32 around nn.LSTM / nn.RNN on the CPU (oneDNN's half-precision recurrent
    kernels need AVX512-BF16 or AMX, and fail elsewhere); on a GPU they run under autocast."""
    if x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        return torch.autocast("cpu", enabled=False), (x.float() if x.dtype in HALF else x)
    return contextlib.nullcontext(), x


def packing_lengths(seq_lengths: Tensor, host_lengths: Tensor | None) -> Tensor:
    """Lengths on the CPU for ``pack_padded_sequence``: the batch's host copy when the graph passes one, else
    ``seq_lengths`` copied back (on a GPU a host sync: the GPU waits for it)."""
    return host_lengths if host_lengths is not None else seq_lengths.cpu()
