"""mtlab.data's splits share one base class, Split (the members of mtlab.tasks.sources.DataSource with their
defaults); AudioSplit derives lengths and per-frame keys from its featurizer once for every streamed split."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mtlab.data import StreamedSplit, load_split
from mtlab.data import features as F
from mtlab.data.dynamic import DynamicMix
from mtlab.data.ondevice import Featurizer
from mtlab.data.source import AudioSplit, Split
from mtlab.tasks.sources import DataSource, HeadExamples, SegmentedExamples, lengths_of, shard_parts


def test_a_split_of_ones_own_gets_the_defaults_and_its_lengths_are_used() -> None:
    class Frames(Split):
        def __init__(self) -> None:
            self.lengths = [3, 7]

        def __len__(self) -> int:
            return 2

    split = Frames()
    assert isinstance(split, DataSource) and split.sequence_keys is None and split.shard_of is None
    assert lengths_of(split) == [3, 7]  # Split.__getitem__ raises: the lengths were not read from examples
    with pytest.raises(NotImplementedError, match="Frames must define __getitem__"):
        split[0]


def test_audio_split_lengths_and_keys_come_from_the_featurizer() -> None:
    featurizer = Featurizer(frozenset({"usedbins", "spk"}), F.MTLAB, None)

    class Tones(AudioSplit):
        def __len__(self) -> int:
            return 2

    split = Tones(featurizer, [2000, 801])
    assert split.lengths == [F.MTLAB.num_frames(2000), F.MTLAB.num_frames(801)]
    assert split.sequence_keys == ("features", "usedbins") and split.samples.dtype.name == "int64"
    seg = SegmentedExamples(split, 5)
    assert seg.sequence_keys == ("features", "usedbins") and shard_parts(seg) is None


def test_every_split_load_split_gives_is_a_data_source(corpus: Callable[..., Path]) -> None:
    root = corpus(["a", "b", "c"], [1200, 900, 1500]).parent
    held = load_split(root, progress=False)
    streamed = load_split(root, stream=True, progress=False)
    mixed = load_split(root, stream=True, progress=False, dynamic_mix={"gain_db": [-5, 5]})
    assert isinstance(streamed, StreamedSplit) and isinstance(mixed, DynamicMix)
    for split in (held, streamed, mixed):
        assert isinstance(split, Split) and isinstance(split, DataSource)
        assert lengths_of(split) == held.lengths and split.sequence_keys == held.sequence_keys
        assert lengths_of(HeadExamples(split, 2)) == held.lengths[:2]
