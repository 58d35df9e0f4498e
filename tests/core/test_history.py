"""History: rows stay tensors until read, then one transfer; step is a column; truncate and state round-trip."""

from __future__ import annotations

import torch

from mtlab.core.history import History, knob_values, step_row


def test_rows_are_read_lazily_in_one_transfer(monkeypatch) -> None:
    h = History()
    h.append({"step": 1, "loss": torch.tensor(0.5), "skipped": torch.tensor(False)})
    h.append({"step": 2, "loss": torch.tensor(0.25), "skipped": torch.tensor(True)})
    assert isinstance(h.last()["loss"], torch.Tensor)  # nothing read yet
    stacks = []
    real = torch.stack
    monkeypatch.setattr(torch, "stack", lambda ts, *a, **k: stacks.append(len(ts)) or real(ts, *a, **k))
    rows = h.rows()
    assert stacks == [4]  # every pending value in one stack -> one device-to-host copy
    assert rows == [{"step": 1, "loss": 0.5, "skipped": False}, {"step": 2, "loss": 0.25, "skipped": True}]
    frame = h.frame()
    assert list(frame["step"]) == [1, 2] and frame.index.name is None and list(frame.index) == [0, 1]


def test_state_dict_round_trip() -> None:
    h = History()
    for i in range(1, 3):
        h.append({"step": i, "loss": torch.tensor(float(i))})
    assert [r["step"] for r in h.rows()] == [1, 2]
    other = History()
    other.load_state_dict(h.state_dict())
    assert other.rows() == h.rows() and len(other) == 2
    assert list(History().frame().columns) == ["step", "lr", "skipped"]


def test_step_row_names_every_weight_and_only_the_tasks_that_took_part() -> None:
    class LS:
        weight = 0.5

    class T:
        weight = 1.0
        linkedsets = {"clean": LS()}

    class Acc:
        totals = torch.tensor([6.0, 3.0], dtype=torch.float64)  # Σ w·loss, Σ w·normalizer
        set_totals = {"clean": torch.tensor([4.0, 2.0])}
        grad_norm = grad_norm_clipped = torch.tensor(1.0)
        clip_fraction = torch.tensor(0.0)
        minibatches = 3
        stats = {"scale": torch.tensor(0.5)}  # what a user's transform measured

    row = step_row(7, 1e-3, False, knob_values({"a": T(), "b": T()}), {"a": Acc()})
    assert row["step"] == 7 and row["a/weight"] == 1.0 and row["b/clean/weight"] == 0.5
    assert float(row["a/loss"]) == 2.0 and float(row["a/clean/loss"]) == 2.0 and row["a/minibatches"] == 3 and float(row["a/scale"]) == 0.5
    assert "b/loss" not in row


def test_column_names_are_built_and_parsed_in_one_place() -> None:
    from mtlab.core.columns import (Column, combine_column, cosine_column, direction_column, parse_column,
                                    set_column, task_column, weighting_column)

    cases = {task_column("a", "loss"): Column("loss", task="a"),
             set_column("a", "clean", "loss"): Column("loss", task="a", linkedset="clean"),
             task_column("b", "grad_norm_clipped"): Column("grad_norm_clipped", task="b"),
             weighting_column("a"): Column("weighting", task="a"),
             combine_column("enc+dec", "b"): Column("combine", task="b", group="enc+dec"),
             cosine_column("enc", "a", "b"): Column("cos", group="enc", pair=("a", "b")),
             direction_column("enc"): Column("direction_norm", group="enc"),
             direction_column(): Column("direction_norm"), "step": Column("step")}
    assert list(cases)[:3] == ["a/loss", "a/clean/loss", "b/grad_norm_clipped"]
    for name, parsed in cases.items():
        assert parse_column(name) == parsed, name
