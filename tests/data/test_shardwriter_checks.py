"""write_shards writes a corpus's own mixtures: a dynamic mix (new mixtures each epoch) is refused by name."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mtlab.data import DataError
from mtlab.data.shardwriter import write_shards


def test_a_dynamic_mix_is_refused_before_anything_is_written(corpus: Callable[..., Path], tmp_path: Path) -> None:
    root = corpus(["a", "b"]).parent
    out = tmp_path / "shards"
    with pytest.raises(DataError, match="not a DynamicMix: give no dynamic_mix"):
        write_shards(root, "train", "clean", out, progress=False, dynamic_mix={"gain_db": [-5, 5]})
    assert not out.exists()
