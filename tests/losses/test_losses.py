"""Built-in loss computers against direct PyTorch computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mtlab
from mtlab.base.batching import collate


def test_frame_cross_entropy_masks_padding():
    g = torch.Generator().manual_seed(0)
    lens = [3, 7, 5]
    logits_list = [torch.randn(t, 4, generator=g, dtype=torch.float64) for t in lens]
    ys = [torch.randint(0, 4, (t,), generator=g) for t in lens]
    data, sl = collate([{"logits": l, "y": y} for l, y in zip(logits_list, ys)])
    data["logits"][0, 4:] = 1e6  # garbage in padding must not matter
    loss, norm = mtlab.losses.CrossEntropy(output="logits", target="y")({"y": data["y"]}, {"logits": data["logits"]}, sl)
    ref = sum(F.cross_entropy(l, y, reduction="sum") for l, y in zip(logits_list, ys))
    assert float(norm) == sum(lens)
    torch.testing.assert_close(loss, ref)


def test_utterance_cross_entropy_norm_is_batch_size():
    logits = torch.randn(6, 3)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    loss, norm = mtlab.losses.CrossEntropy(output="o", target="y")({"y": y}, {"o": logits}, {"y": torch.ones(6, dtype=torch.long)})
    torch.testing.assert_close(loss, F.cross_entropy(logits, y, reduction="sum"))
    assert float(norm) == 6


def test_mse_counts_valid_elements_only():
    g = torch.Generator().manual_seed(1)
    lens = [2, 6]
    outs = [torch.randn(t, 3, generator=g) for t in lens]
    tgts = [torch.randn(t, 3, generator=g) for t in lens]
    d1, sl = collate([{"o": o} for o in outs])
    d2, _ = collate([{"t": t} for t in tgts])
    d1["o"][0, 2:] = 99.0
    loss, norm = mtlab.losses.MSE(output="o", target="t")({"t": d2["t"]}, {"o": d1["o"]}, {"o": sl["o"]})
    ref = sum(((o - t) ** 2).sum() for o, t in zip(outs, tgts))
    torch.testing.assert_close(loss, ref)
    assert float(norm) == 3 * sum(lens)


def test_loss_shape_errors_are_clear():
    with pytest.raises(mtlab.BatchError, match="frame-level target"):
        mtlab.losses.CrossEntropy(output="o", target="y")({"y": torch.zeros(2, 3, dtype=torch.long)},
                                                          {"o": torch.zeros(2, 4)}, {})
    with pytest.raises(mtlab.BatchError, match="no output named 'o'"):
        mtlab.losses.MSE(output="o", target="t")({"t": torch.zeros(1)}, {"z": torch.zeros(1)}, {})


def test_core_registry_holds_generic_losses_and_does_not_import_domains():
    from pathlib import Path

    assert {"crossentropy", "mse"} <= set(dict.keys(mtlab.losses.LOSSES))
    assert "mse" not in mtlab.losses.ORIGINAL_LOSS_TYPES and "crossentropy" in mtlab.losses.ORIGINAL_LOSS_TYPES
    core = Path(mtlab.__file__).parent
    for name in ("losses/__init__.py", "base/registry.py"):
        text = (core / name).read_text()
        assert "from .separation" not in text and "import mtlab.separation" not in text


def previous_frame_ce(logits, target, lengths):
    """The earlier formulation (per-frame losses on a transposed copy, masked with where): the oracle
    the ignore_index form must equal."""
    per = F.cross_entropy(logits.transpose(1, 2), target.long(), reduction="none")
    mask = torch.arange(target.shape[1])[None] < lengths[:, None]
    return torch.where(mask, per, per.new_zeros(())).sum(), mask.sum().to(logits.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_frame_cross_entropy_equals_the_previous_form_in_value_and_gradient(dtype):
    g = torch.Generator().manual_seed(2)
    lens = torch.tensor([9, 4, 1, 7])
    logits = torch.randn(4, 9, 6, generator=g, dtype=dtype, requires_grad=True)
    y = torch.randint(0, 6, (4, 9), generator=g)
    y[1, 4:] = 77  # out-of-range labels in the padding: ignored, not an error
    ce = mtlab.losses.CrossEntropy(output="o", target="y")
    loss, norm = ce({"y": y}, {"o": logits}, {"y": lens})
    (grad,) = torch.autograd.grad(loss, logits)
    ref_loss, ref_norm = previous_frame_ce(logits, y.clamp(max=5), lens)
    (ref_grad,) = torch.autograd.grad(ref_loss, logits)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert norm.dtype == dtype and float(norm) == float(ref_norm) == 21
    assert float(grad[1, 4:].abs().sum()) == 0.0  # padded frames get no gradient
    assert y[1, 5] == 77  # the caller's targets are not changed


def test_frame_cross_entropy_without_lengths_counts_every_frame():
    g = torch.Generator().manual_seed(3)
    logits, y = torch.randn(2, 5, 3, generator=g), torch.randint(0, 3, (2, 5), generator=g)
    loss, norm = mtlab.losses.CrossEntropy(output="o", target="y")({"y": y}, {"o": logits}, {})
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(10, 3), y.reshape(10), reduction="sum"))
    assert float(norm) == 10


def test_mse_equals_the_previous_form_and_padding_gets_no_gradient():
    g = torch.Generator().manual_seed(4)
    lens = torch.tensor([3, 6])
    out = torch.randn(2, 6, 4, 2, generator=g, dtype=torch.float64)
    out[0, 3:] = float("nan")  # whatever sits in the padding must not matter
    out.requires_grad_(True)
    tgt = torch.randn(2, 6, 4, 2, generator=g, dtype=torch.float64)
    loss, norm = mtlab.losses.MSE(output="o", target="t")({"t": tgt}, {"o": out}, {"o": lens})
    (grad,) = torch.autograd.grad(loss, out)
    mask = (torch.arange(6)[None] < lens[:, None])[..., None, None]
    clean = torch.where(mask, out, tgt)
    ref = ((clean - tgt) ** 2).sum()
    (ref_grad,) = torch.autograd.grad(ref, out)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)
    assert float(norm) == 9 * 8 and not grad[0, 3:].any()
    loss_all, norm_all = mtlab.losses.MSE(output="o", target="t")({"t": tgt}, {"o": clean.detach()}, {})
    torch.testing.assert_close(loss_all, ((clean.detach() - tgt) ** 2).sum())
    assert float(norm_all) == clean.numel()


def test_cross_entropy_takes_the_originals_b_by_1_speaker_ids():
    """The original as written, ``nabu/neuralnetworks/loss_computers/crossentropy_loss.py:33-39`` and
    ``components/ops.py:1513-1520``::

        spkids = tf.squeeze(targets['spkids'], 1)
        logits = logits['spkest']
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=spkids, logits=logits))
        norm = tf.to_float(batch_size)

    transcribed in NumPy (a full batch: the original's norm is the configured batch size)."""
    import numpy as np

    g = torch.Generator().manual_seed(7)
    logits, spkids = torch.randn(4, 6, generator=g, dtype=torch.float64), torch.randint(0, 6, (4, 1), generator=g)
    z = logits.numpy()
    labels = np.squeeze(spkids.numpy(), 1)
    log_softmax = z - z.max(1, keepdims=True) - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))
    expected = -log_softmax[np.arange(4), labels].sum()
    loss, norm = mtlab.losses.CrossEntropy(output="spkest", target="spkids")({"spkids": spkids}, {"spkest": logits}, {})
    assert abs(float(loss) - expected) < 1e-12 and float(norm) == 4.0
    with pytest.raises(mtlab.BatchError, match="frame-level target"):  # [B, 2] is not the original's form
        mtlab.losses.CrossEntropy(output="o", target="y")({"y": torch.zeros(4, 2, dtype=torch.long)},
                                                          {"o": logits}, {})
