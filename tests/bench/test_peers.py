"""bench/peers.py's plain cases: the baseline is the loop a user writes (no mtlab code runs in its step), and
mtlab, given the same model and the same prebuilt batches through its public API, takes the same steps."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from helpers.paths import BENCH, MTLAB

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
peers = importlib.import_module("peers")


def files_run_by(fn) -> set[str]:
    """The source files whose Python functions run during ``fn()``."""
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def under(folder: Path, files: set[str]) -> list[str]:
    return sorted(f for f in files if Path(f).resolve().is_relative_to(folder.resolve()))


def small(system: str, n: int = 4):
    """A plain system of the overhead case on ``n`` prebuilt batches."""
    layers, hidden, batch, lo, hi, _ = peers.SETTINGS["overhead"]
    make = {"mtlab": peers.plain_mtlab, peers.LOOP: peers.plain_loop}[system]
    return make(peers.plain_model(layers, hidden), peers.plain_batches(batch, lo, hi, "cpu", n=n), batch, "cpu")


def test_the_plain_loop_runs_no_mtlab_code_and_no_collate():
    loop = small(peers.LOOP)
    loop.step()
    files = files_run_by(loop.step)
    assert any(f.endswith("rnn.py") for f in files)  # the profile sees the step (torch's LSTM ran)
    assert under(MTLAB, files) == [] and not any(f.endswith("common.py") for f in files)


def test_mtlab_on_the_prebuilt_batches_runs_its_public_calls_and_collates_nothing():
    s = small("mtlab")
    with mock.patch("mtlab.base.batching.collate", side_effect=AssertionError("collate in a timed step")):
        files = files_run_by(s.step)
    assert any(f.endswith("trainer.py") for f in under(MTLAB, files))


def test_plain_mtlab_and_the_user_loop_take_the_same_steps():
    layers, hidden, batch, lo, hi, _ = peers.SETTINGS["overhead"]
    batches = peers.plain_batches(batch, lo, hi, "cpu", n=8)
    a, b = peers.plain_model(layers, hidden), peers.plain_model(layers, hidden)
    sa = peers.plain_mtlab(a, batches, batch, "cpu")
    sb = peers.plain_loop(b, batches, batch, "cpu")
    for _ in range(3):
        sa.step()
        sb.step()
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), peers.plain_model(layers, hidden).parameters()))
    assert moved > 1e-3
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)


def test_the_plain_batches_are_padded_with_ignored_targets():
    layers, hidden, batch, lo, hi, _ = peers.SETTINGS["overhead"]
    for x, y, n in peers.plain_batches(batch, lo, hi, "cpu", n=4):
        assert x.shape[:2] == y.shape and int(n.max()) == y.shape[1]
        valid = torch.arange(y.shape[1])[None] < n[:, None]
        assert bool((y[~valid] == peers.IGNORE).all()) and bool((y[valid] >= 0).all())
        assert float(x[~valid].abs().sum()) == 0


@pytest.mark.slow  # importing accelerate takes seconds
def test_plain_accelerate_runs_accumulate_on_the_same_batches():
    accelerate = pytest.importorskip("accelerate", reason="Accelerate is not installed (mtlab[bench])")
    with mock.patch.object(accelerate.Accelerator, "accumulate", autospec=True,
                           side_effect=accelerate.Accelerator.accumulate) as acc:
        s = peers.build("accelerate", "overhead", "cpu")
        s.step()
    assert acc.call_count == peers.K
