"""What recurrent models need to run on a device without waiting for it, in any precision."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, invert_permutation

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


class Packing:
    """How one padded batch ``[B, T, ...]`` is packed for ``nn.LSTM``/``nn.RNN`` (what ``pack_padded_sequence(...,
    enforce_sorted=False)`` does), worked out once per forward and reused by every layer, without copying
    anything between host and device: the lengths are sorted on the host (for the packing) and, when the
    batch's lengths are on the device too, sorted there the same way (a stable sort of equal values gives the
    same order), so the batch's reordering never waits for a host-to-device copy."""

    def __init__(self, seq_lengths: Tensor, host_lengths: Tensor | None, device: torch.device) -> None:
        host = packing_lengths(seq_lengths, host_lengths).to(torch.int64)
        self.lengths, order = torch.sort(host, descending=True, stable=True)
        if device.type != "cpu" and seq_lengths.device == device:
            order = torch.sort(seq_lengths.to(torch.int64), descending=True, stable=True)[1]
        self.order = order.to(device)
        self.unorder = invert_permutation(self.order)

    def pack(self, x: Tensor) -> PackedSequence:
        """``x`` ([B, T, ...], batch first) packed; ``nn.utils.rnn.pad_packed_sequence`` restores its order."""
        packed = nn.utils.rnn.pack_padded_sequence(x.index_select(0, self.order), self.lengths, batch_first=True,
                                                   enforce_sorted=True)
        return PackedSequence(packed.data, packed.batch_sizes, self.order, self.unorder)
