"""A Task's linked sets (mtlab/tasks/task.py): an empty one is refused when the Task is built, naming both."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import mtlab
from mtlab.base.errors import ConfigError


def task(linkedset: mtlab.LinkedSet) -> mtlab.Task:
    return mtlab.Task("frames", nodes=[mtlab.Node("pred", "net", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["pred"], loss=lambda t, o, s: (o["pred"].sum(), torch.tensor(1.0)),
                      linkedsets={"clean": mtlab.LinkedSet([{"x": torch.ones(2, 3), "y": torch.ones(2)}]),
                                  "noisy": linkedset})


@pytest.mark.parametrize("empty", [[], DataLoader([], batch_size=2),
                                   DataLoader([{"x": torch.ones(1)}], batch_size=2, drop_last=True)])
def test_an_empty_linked_set_is_refused_when_the_task_is_built(empty: object) -> None:
    with pytest.raises(ConfigError, match="task 'frames': linked set 'noisy' has no data"):
        task(mtlab.LinkedSet(empty))


def test_a_linked_set_refuses_what_is_not_data() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):  # noqa: ANN204
            yield {"x": torch.ones(2)}

    with pytest.raises(ConfigError, match="IterableDataset: wrap it in a DataLoader"):
        mtlab.LinkedSet(Stream())
    with pytest.raises(ConfigError, match="give the examples"):
        mtlab.LinkedSet(fields=("x", "y"))
