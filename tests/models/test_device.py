"""Packing a padded batch for nn.LSTM/nn.RNN without host-device copies: the same result as torch's own
``pack_padded_sequence(..., enforce_sorted=False)`` (the oracle), outputs and gradients, ties included."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtlab.models import BLSTM
from mtlab.models.device import Packing


def oracle_blstm(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


@pytest.mark.parametrize("lengths", [[5, 7, 5, 2, 7, 1], [3], [4, 4, 4], [1, 2, 3, 4]])
@pytest.mark.parametrize("host", [True, False])
def test_packing_matches_torchs_unsorted_packing(lengths, host):
    torch.manual_seed(0)
    lens = torch.tensor(lengths)
    x = torch.randn(len(lengths), max(lengths), 3, dtype=torch.float64, requires_grad=True)
    model = BLSTM(3, 4).double()
    got = model(x, lens, lens.clone() if host else None)
    want = oracle_blstm(model.lstm, x, lens)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g_got = torch.autograd.grad(got.square().sum(), [x, *model.parameters()])
    g_want = torch.autograd.grad(want.square().sum(), [x, *model.parameters()])
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_packing_keeps_ties_in_batch_order_and_restores_it():
    p = Packing(torch.tensor([2, 5, 2, 5]), None, torch.device("cpu"))
    assert p.order.tolist() == [1, 3, 0, 2] and p.lengths.tolist() == [5, 5, 2, 2]
    assert p.order[p.unorder].tolist() == [0, 1, 2, 3]
    x = torch.arange(4.0)[:, None, None].expand(4, 5, 1).contiguous()
    packed = p.pack(x)
    back = nn.utils.rnn.pad_packed_sequence(packed, batch_first=True, total_length=5)[0]
    assert back[:, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
