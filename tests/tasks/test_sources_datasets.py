"""One's own datasets as linked sets (mtlab/tasks/sources.py): tuple datasets named by fields, numpy entries, entries
no task reads, and lengths given so that a lazy dataset is not read in full; each against plain PyTorch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import mtlab
from mtlab.base.errors import BatchError, ConfigError
from mtlab.tasks.sources import LengthsWarning

X = torch.randn(10, 6, 3, dtype=torch.float64)
Y = torch.randn(10, 6, 2, dtype=torch.float64)


def mse(targets, outputs, seq_lengths):  # noqa: ANN001, ANN201
    d = outputs["pred"] - targets["y"]
    return (d ** 2).sum(), torch.tensor(float(d.numel()), dtype=torch.float64)


def regression(linkedset: mtlab.LinkedSet, batch_size: int = 4) -> mtlab.Trainer:
    torch.manual_seed(1)
    task = mtlab.Task("reg", nodes=[mtlab.Node("pred", "net", ["x"])], inputs=["x"], targets=["y"],
                      outputs=["pred"], loss=mse, linkedsets={"train": linkedset}, batch_size=batch_size)
    return mtlab.Trainer({"net": nn.Linear(3, 2).double()}, task, lr=1e-2, device="cpu")


def plain_sgd_steps(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> nn.Linear:
    torch.manual_seed(1)
    net = nn.Linear(3, 2).double()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for x, y in batches:
        opt.zero_grad()
        d = net(x) - y
        ((d ** 2).sum() / d.numel()).backward()
        opt.step()
    return net


def test_a_tensor_dataset_named_by_fields_trains_as_plain_pytorch_on_the_same_batches() -> None:
    tr = regression(mtlab.LinkedSet(TensorDataset(X, Y), fields=("x", "y")))
    drawn = []
    for _ in range(5):
        data, _ = next(tr.stream("reg", "train"))  # what the step will draw: peeked, then put back
        tr.stream("reg", "train").seek(*((lambda s: (s.epoch, s.position - 1))(tr.stream("reg", "train"))))
        drawn.append((data["x"], data["y"]))
        tr.step()
    net = plain_sgd_steps(drawn)
    torch.testing.assert_close(tr.params["net.weight"], net.weight, atol=1e-12, rtol=0)
    assert all(d[0].shape[0] in (4, 2) for d in drawn)  # the task's batch size


def test_a_dataloader_over_a_tensor_dataset_is_the_plain_loop() -> None:
    def loader() -> DataLoader:
        return DataLoader(TensorDataset(X, Y), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))

    tr = regression(mtlab.LinkedSet(loader(), fields=("x", "y")))
    for _ in range(6):
        tr.step()
    plain = loader()
    batches = [b for _ in range(2) for b in plain]  # two epochs of 3 batches
    net = plain_sgd_steps(batches)
    torch.testing.assert_close(tr.params["net.weight"], net.weight, atol=1e-12, rtol=0)


def test_fields_must_name_each_entry() -> None:
    with pytest.raises(BatchError, match=r"fields=\('x0', 'x1'\)"):
        next(regression(mtlab.LinkedSet(TensorDataset(X, Y))).stream("reg", "train"))
    with pytest.raises(BatchError, match="2 entries but fields names 3"):
        next(regression(mtlab.LinkedSet(TensorDataset(X, Y), fields=("x", "y", "z"))).stream("reg", "train"))
    with pytest.raises(ConfigError, match="distinct"):
        mtlab.LinkedSet(TensorDataset(X, Y), fields=("x", "x"))


class NumpyExamples(Dataset):
    """Examples as a feature extractor gives them: numpy arrays, a numpy label, and an id string."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.items = [{"x": rng.standard_normal((n, 3)), "y": rng.standard_normal((n, 2)), "id": f"utt{n}",
                       "label": np.int64(n % 2)} for n in (4, 6, 5, 3)]
        self.lengths = [4, 6, 5, 3]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def test_numpy_entries_are_tensors_and_an_id_is_carried_along() -> None:
    data, lengths = mtlab.collate([NumpyExamples()[0], NumpyExamples()[1]])
    assert torch.equal(data["x"][0, :4], torch.as_tensor(NumpyExamples().items[0]["x"]))
    assert data["x"].dtype == torch.float64 and lengths["x"].tolist() == [4, 6]
    assert data["label"].tolist() == [0, 0] and data["id"] == ["utt4", "utt6"] and "id" not in lengths
    tr = regression(mtlab.LinkedSet(NumpyExamples()), batch_size=2)
    for _ in range(3):
        tr.step()  # the task reads x and y; the id goes along unread


def test_an_entry_a_task_reads_must_be_numbers() -> None:
    task = mtlab.Task("reg", nodes=[mtlab.Node("pred", "net", ["id"])], inputs=["id"], targets=["y"],
                      outputs=["pred"], loss=mse, linkedsets={"train": mtlab.LinkedSet(NumpyExamples())})
    tr = mtlab.Trainer({"net": nn.Linear(3, 2).double()}, task, device="cpu")
    with pytest.raises(BatchError, match="reads 'id'.*list.*tensor or numpy array"):
        tr.process_minibatch("reg", "train")


class Lazy(Dataset):
    """A dataset that reads (here: counts) an example per __getitem__, like audio read from disk."""

    def __init__(self, lengths: list[int] | None = None) -> None:
        self.reads: list[int] = []
        if lengths is not None:
            self.lengths = lengths

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict:
        self.reads.append(i)
        return {"x": X[i, : 2 + i % 4], "y": Y[i, : 2 + i % 4]}


def test_given_lengths_spare_reading_a_lazy_dataset_and_give_the_same_run() -> None:
    lengths = [2 + i % 4 for i in range(10)]
    runs = []
    for given in (lengths, None):
        ds = Lazy()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tr = regression(mtlab.LinkedSet(ds, lengths=given))
            tr.step()
            tr.step()
        told = [w for w in caught if issubclass(w.category, LengthsWarning)]
        if not runs:
            drawn = len(ds.reads)  # two batches (of 4 or 2), each example read once, nothing else
            assert drawn < 10 and len(set(ds.reads)) == drawn and not told
        else:
            assert len(ds.reads) == 10 + drawn and len(told) == 1  # read in full once, and said so, with the fix
            assert "LinkedSet(dataset, lengths=[...])" in str(told[0].message)
        runs.append(tr.params["net.weight"].detach().clone())
    assert torch.equal(runs[0], runs[1])
    ds = Lazy([2 + i % 4 for i in range(10)])  # a dataset's own `lengths` attribute does the same
    tr = regression(mtlab.LinkedSet(ds))
    tr.step()
    assert len(ds.reads) == 4


def test_lengths_must_fit_the_dataset() -> None:
    with pytest.raises(ConfigError, match="3 entries for the 10 examples"):
        mtlab.LinkedSet(Lazy(), lengths=[1, 2, 3])
    with pytest.raises(ConfigError, match=r"lengths\[1\]"):
        mtlab.LinkedSet(Lazy(), lengths=[1, -2] + [1] * 8)
