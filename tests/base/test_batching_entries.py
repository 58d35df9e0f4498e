"""What an example's entries may be (mtlab/base/batching.py): tensors, numpy arrays and numbers are collated as
tensors, as torch.as_tensor gives them; any other entry is carried along as a list, without a length."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mtlab
from mtlab.base.batching import example_length
from mtlab.base.errors import BatchError


def test_numpy_arrays_and_numbers_are_collated_as_tensors() -> None:
    a, b = np.arange(6.0).reshape(3, 2), np.arange(10.0).reshape(5, 2)
    data, lengths = mtlab.collate([{"x": a, "y": np.int64(2), "w": 0.5}, {"x": b, "y": 1, "w": 1.5}])
    expected = torch.zeros(2, 5, 2, dtype=torch.float64)
    expected[0, :3], expected[1] = torch.as_tensor(a), torch.as_tensor(b)
    assert torch.equal(data["x"], expected) and lengths["x"].tolist() == [3, 5]
    assert data["y"].tolist() == [2, 1] and data["y"].dtype == torch.int64
    assert data["w"].tolist() == [0.5, 1.5]
    assert example_length({"id": "u1", "x": a}) == 3  # the first tensor or array, past an id


def test_other_entries_are_carried_along_and_a_mix_is_refused() -> None:
    data, lengths = mtlab.collate([{"x": torch.ones(2), "id": "a"}, {"x": torch.ones(3), "id": "b"}])
    assert data["id"] == ["a", "b"] and "id" not in lengths
    with pytest.raises(BatchError, match="entry 'id' is a tensor or array in some examples and not in others"):
        mtlab.collate([{"id": "a"}, {"id": np.ones(2)}])
    with pytest.raises(BatchError, match="holds no tensor"):
        example_length({"id": "a"})
