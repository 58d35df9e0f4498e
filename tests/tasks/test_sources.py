"""The one data-source protocol the stream reads (``DataSource``): lengths, per-frame keys and shards, carried
through the segment and head views; the original's segments and ``trainset_frac``."""
from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from helpers.runs import LENGTHS, SEGMENTS, utterances

from mtlab.base.errors import ConfigError
from mtlab.tasks.sources import DataSource, HeadExamples, SegmentedExamples, lengths_of, shard_parts, trainset_fraction


class Described:
    """A source of one's own that declares all three members (no mtlab.data base class)."""

    def __init__(self, lengths: Sequence[int], shard_of: Sequence[int] | None) -> None:
        self.lengths, self.shard_of = list(lengths), shard_of
        self.sequence_keys = ("x",)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        n = self.lengths[i]
        return {"x": torch.arange(float(n)), "w": torch.full((n,), float(i))}


def test_a_list_is_measured_from_its_examples_and_has_no_shards() -> None:
    examples = [{"x": torch.zeros(n)} for n in (3, 5, 2)]
    assert not isinstance(examples, DataSource)
    assert lengths_of(examples) == [3, 5, 2] and shard_parts(examples) is None


def test_a_described_source_is_not_read_for_its_lengths() -> None:
    class Unreadable(Described):
        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            raise AssertionError("lengths were read from the examples")

    source = Unreadable([4, 9, 2], [0, 1, 1])
    assert isinstance(source, DataSource)
    assert lengths_of(source) == [4, 9, 2] and shard_parts(source) == [0, 1, 1]


def test_segment_and_head_views_carry_shards_and_per_frame_keys() -> None:
    source = Described([4, 9, 2], [0, 1, 2])
    segments = SegmentedExamples(source, 4)  # 4 -> 1 segment, 9 -> 2, 2 -> 1 (whole)
    assert isinstance(segments, DataSource) and segments.lengths == [4, 4, 4, 2]
    assert shard_parts(segments) == [0, 1, 1, 2] and segments.sequence_keys == ("x",)
    # only "x" is per-frame: "w" is as long as the utterance but copied whole to each segment
    assert torch.equal(segments[2]["x"], torch.arange(4.0, 8.0)) and segments[2]["w"].shape == (9,)
    head = HeadExamples(segments, 3)
    assert isinstance(head, DataSource) and shard_parts(head) == [0, 1, 1] and head.sequence_keys == ("x",)
    again = SegmentedExamples(head, 2)
    assert shard_parts(again) == [0, 0, 1, 1, 1, 1] and again.sequence_keys == ("x",)
    unsharded = SegmentedExamples(Described([4], None), 2)
    assert shard_parts(unsharded) is None and shard_parts(HeadExamples(unsharded, 1)) is None


def test_segments_are_the_originals_cuts() -> None:
    ex = utterances()
    segs = SegmentedExamples(ex, 5)
    assert len(segs) == 12 and segs.lengths == [n for _, _, n in SEGMENTS] and segs.source is ex
    for j, (i, start, n) in enumerate(SEGMENTS):
        assert torch.equal(segs[j]["x"], ex[i]["x"][start:start + n]) and torch.equal(segs[j]["y"], ex[i]["y"][start:start + n])
        assert torch.equal(segs[j]["spk"], ex[i]["spk"])  # per-utterance: copied to every segment
    only_x = SegmentedExamples(ex, 5, keys=["x"])
    assert torch.equal(only_x[0]["y"], ex[0]["y"])
    with pytest.raises(ConfigError, match="segment_length"):
        SegmentedExamples(ex, 0)


def test_trainset_frac_keeps_the_head_of_the_list() -> None:
    ex = utterances()
    head = trainset_fraction(ex, 0.5)
    assert len(head) == 3 and head.lengths == LENGTHS[:3] and all(head[i] is ex[i] for i in range(3))
    assert len(trainset_fraction(ex, 0.4)) == 2  # int(6 x 0.4) = int(2.4)
    with pytest.raises(IndexError):
        head[3]
    with pytest.raises(ConfigError, match="trainset_frac"):
        trainset_fraction(ex, 0.1)  # int(0.6) = 0 utterances
    with pytest.raises(ConfigError, match="trainset_frac"):
        trainset_fraction(ex, 1.5)
