"""``power_ratio_masks``: each speaker's mask to a power, divided by their sum over the speakers (p = 2: the
Wiener-like power ratio of magnitude masks), against plain PyTorch; a separator with ``mask_power`` set uses it
for its estimates (``separate``, ``evaluate``) while ``masks()`` stays what the head gives."""

from __future__ import annotations

import pytest
import torch

from mtlab.base.errors import ConfigError
from mtlab.separation.masks import power_ratio_masks


def test_power_ratio_masks_equal_the_formula_and_sum_to_one():
    g = torch.Generator().manual_seed(0)
    m = torch.rand(7, 5, 2, generator=g)
    m[0, 0] = 0.0  # a bin no speaker claims: stays 0, no NaN
    for p in (1.0, 2.0, 3.5):
        want = m ** p / (m ** p).sum(-1, keepdim=True)
        want[0, 0] = 0.0
        got = power_ratio_masks(m, p)
        torch.testing.assert_close(got, want)
        assert torch.allclose(got[1:].sum(-1), torch.ones(6, 5))
    assert torch.equal(power_ratio_masks(m, None), m)  # None: the masks as they are
    with pytest.raises(ConfigError, match="mask_power must be > 0"):
        power_ratio_masks(m, 0.0)


@pytest.mark.slow  # builds a separator on the sample corpus
def test_a_separator_with_mask_power_separates_with_the_power_ratio_masks(one_thread):
    from mtlab.separation import build_separator
    from mtlab.separation.metrics import score
    from mtlab.separation.spectral import apply_masks

    plain = build_separator("pit", hidden=8, layers=1, remix=0)
    sharp = build_separator("pit", hidden=8, layers=1, remix=0, mask_power=2.0)
    sharp.trainer.models["blstm"].load_state_dict(plain.trainer.models["blstm"].state_dict())
    sharp.trainer.models["head"].load_state_dict(plain.trainer.models["head"].state_dict())
    data = sharp.dataset("dev")
    raw = sharp.masks([data[0]])[0]
    torch.testing.assert_close(raw, plain.masks([data[0]])[0])  # masks() is the head's, whatever mask_power says
    mix, refs = sharp.waveforms("dev", data.names[0])
    want = score(apply_masks(mix, raw ** 2 / (raw ** 2).sum(-1, keepdim=True).clamp_min(1e-12)), refs, mix).row()
    assert sharp.separate(0, "dev")["scores"]["si_sdri"] == pytest.approx(want["si_sdri"], abs=1e-4)
    assert sharp.evaluate("dev", limit=1)["si_sdri"][0] == pytest.approx(want["si_sdri"], abs=1e-4)
    assert plain.evaluate("dev", limit=1)["si_sdri"][0] != pytest.approx(want["si_sdri"], abs=1e-4)
    with pytest.raises(ConfigError, match="mask_power"):
        build_separator("pit", hidden=8, layers=1, remix=0, mask_power=-1.0)
