"""Frame masks made once per batch (by collate), kept with the lengths tensor, and never stale."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mtlab
from mtlab.base.batching import to_device
from mtlab.base.frames import frame_mask


def reference(lengths: torch.Tensor, t: int) -> torch.Tensor:
    return torch.stack([torch.arange(t) < n for n in lengths.tolist()])


def test_collate_makes_the_mask_and_the_loss_only_reads_it() -> None:
    g = torch.Generator().manual_seed(0)
    examples = [{"x": torch.randn(n, 3, generator=g), "y": torch.randint(0, 4, (n,), generator=g)} for n in (5, 2, 7)]
    data, lens = mtlab.collate(examples)
    made = frame_mask(lens["y"], 7)
    assert torch.equal(made.valid, reference(lens["y"], 7)) and torch.equal(made.padding, ~made.valid)
    assert made.count(torch.float32).item() == 14 and made.count(torch.float32).dtype == torch.float32
    logits = torch.randn(3, 7, 4, generator=g)
    loss, norm = mtlab.losses.CrossEntropy(output="o", target="y")({"y": data["y"]}, {"o": logits}, lens)
    assert frame_mask(lens["y"], 7) is made  # the loss read the batch's mask, made none
    y = data["y"].masked_fill(~reference(lens["y"], 7), -100)  # the oracle: plain PyTorch
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(loss, expected)
    assert norm.item() == 14 and norm.dtype == logits.dtype


def test_a_changed_lengths_tensor_or_mask_is_noticed_and_the_mask_made_again() -> None:
    lengths = torch.tensor([3, 1])
    first = frame_mask(lengths, 4)
    lengths[1] = 4  # in place: the kept mask would disagree
    again = frame_mask(lengths, 4)
    assert again is not first and torch.equal(again.valid, reference(lengths, 4))
    again.valid[0, 0] = False  # a reader changed the mask it was handed
    third = frame_mask(lengths, 4)
    assert third is not again and torch.equal(third.valid, reference(lengths, 4))
    count = third.count(torch.float32)
    count.add_(1)  # a loss changed the normalizer it returned
    assert third.count(torch.float32).item() == 7
    assert torch.equal(frame_mask(lengths, 6).valid, reference(lengths, 6))  # another length: its own mask


def test_a_batch_built_by_hand_gets_its_mask_on_first_use_and_a_moved_batch_keeps_it() -> None:
    lengths = torch.tensor([2, 3])
    assert not hasattr(lengths, "_mtlab_frames")
    made = frame_mask(lengths, 3)
    assert frame_mask(lengths, 3) is made
    data, lens = mtlab.collate([{"y": torch.zeros(2, dtype=torch.long)}, {"y": torch.zeros(3, dtype=torch.long)}])
    meta = torch.device("meta")  # another device, no accelerator needed
    _, moved = to_device((data, lens), meta)
    kept = frame_mask(moved["y"], 3)
    assert kept.valid.device == meta and kept.padding.device == meta
    assert frame_mask(moved["y"], 3) is kept  # carried along, not made again
