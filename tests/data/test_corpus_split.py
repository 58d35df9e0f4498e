"""load_split as three pieces: read_split (the lists), split_statistics (the normalization), build_split."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mtlab.data import DataError, StreamedSplit, load_split
from mtlab.data import features as F
from mtlab.data.corpus import (ListedRows, SeparationDataset, SplitRequest, StreamedFiles, build_split, read_split,
                               split_statistics)


def request(root: Path, stream: bool = False, mvn: str = "global", keys: frozenset[str] = frozenset({"mix_mag", "spk"}),
            on_bad_data: str = "raise", dynamic_mix: dict[str, Any] | None = None,
            feature_inputs: dict[str, str] | None = None) -> SplitRequest:
    return SplitRequest.checked(root, "train", "clean", set(keys), F.MTLAB, F.USEDBINS_THRESHOLD_DB, None, mvn, 2, stream,
                                on_bad_data, None, False, dynamic_mix, feature_inputs)


def test_the_pieces_in_memory_give_what_load_split_gives(corpus: Callable[..., Path]) -> None:
    root = corpus(["a", "b", "c"], [1200, 900, 1500]).parent
    req = request(root)
    files = read_split(req)
    assert isinstance(files, ListedRows) and [r.name for r in files.rows] == ["a", "b", "c"]
    stats = split_statistics(req, files)
    # the training split's own statistics: plain mean and std over every frame of its log-magnitude features
    raw = load_split(root, targets=["mix_mag", "spk"], mvn="none", progress=False)
    frames = torch.cat([raw[i]["features"] for i in range(len(raw))]).double()
    torch.testing.assert_close(stats.features.mean, frames.mean(0).float())
    torch.testing.assert_close(stats.features.std, frames.std(0, unbiased=False).float())
    assert stats.raw_examples is not None and len(stats.raw_examples) == 3  # featurized once, reused by build
    split = build_split(req, files, stats)
    whole = load_split(root, targets=["mix_mag", "spk"], progress=False)
    assert isinstance(split, SeparationDataset) and split.names == whole.names
    for i in range(3):
        torch.testing.assert_close(split[i]["features"], (raw[i]["features"] - stats.features.mean)
                                   / stats.features.std)
        torch.testing.assert_close(split[i]["features"], whole[i]["features"])
        assert torch.equal(split[i]["mix_mag"], whole[i]["mix_mag"])


def test_given_statistics_are_used_as_they_are(corpus: Callable[..., Path]) -> None:
    root = corpus(["a", "b"]).parent
    given = F.FeatureStats(torch.full((129,), 2.0), torch.full((129,), 4.0), 10, "given")
    req = request(root)
    files = read_split(req)
    stats = split_statistics(req, files, given)
    assert stats.features is given and stats.raw_examples is None and stats.vectors is None
    split = build_split(req, files, stats)
    raw = load_split(root, targets=["mix_mag", "spk"], mvn="none", progress=False)
    torch.testing.assert_close(split[1]["features"], (raw[1]["features"] - 2.0) / 4.0)


def test_streamed_pieces_read_headers_and_build_a_streamed_split(corpus: Callable[..., Path]) -> None:
    root = corpus(["a", "b", "c"], [1200, 900, 1500]).parent
    req = request(root, stream=True)
    files = read_split(req)
    assert isinstance(files, StreamedFiles) and files.samples.tolist() == [1200, 900, 1500] and not files.skipped
    given = F.FeatureStats(torch.zeros(129), torch.ones(129), 1, "given")
    split = build_split(req, files, split_statistics(req, files, given))
    assert isinstance(split, StreamedSplit) and split.stats is given and len(split) == 3


def test_arguments_are_checked_before_any_list_is_read(corpus: Callable[..., Path]) -> None:
    root = corpus(["a"]).parent
    (root / "train" / "s1.scp").unlink()  # reading the lists would fail on this
    with pytest.raises(DataError, match="dynamic_mix needs stream=True"):
        request(root, dynamic_mix={"gain_db": [-5, 5]})
    with pytest.raises(DataError, match="on_bad_data='skip' needs stream=True"):
        request(root, on_bad_data="skip")
    with pytest.raises(DataError, match="feature_inputs"):
        request(root, stream=True, feature_inputs={"other": "x.scp"})  # mvn "global": no statistics of their own
    with pytest.raises(DataError, match=r"s1.scp"):
        read_split(request(root, keys=frozenset({"src_mag"})))
