"""bench/accumulation.py: its oracle (the big-batch step) against plain PyTorch written out here, its table, and
that each peer's row comes from the peer's own API (each peer test skips only when that peer is not installed)."""

from __future__ import annotations

import importlib
import sys
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from helpers.paths import BENCH


def _load():
    """bench/accumulation.py by its own name, with bench/ on the path: the gloo workers it spawns import it."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("accumulation")


A = _load()


def rows(system: str, setting: str):
    return next(r for r in A.ROWS if r.system == system and r.setting == setting)


def big_batch_steps(state, minibatches, per_window):
    """The oracle written out: per window, w -= lr * d/dw (Σ frame losses / frames), with a mask on padding."""
    w = {k: v.to(torch.float64).clone().requires_grad_(True) for k, v in state.items()}
    for start in range(0, len(minibatches), per_window):
        window = [e for mb in minibatches[start:start + per_window] for e in mb]
        x, y = A.padded(window, torch.float64)
        mask = y != A.IGNORE
        h = torch.tanh(x @ w["inp.weight"].T + w["inp.bias"])
        per_frame = F.cross_entropy((h @ w["out.weight"].T + w["out.bias"]).transpose(1, 2), y.clamp(min=0),
                                    reduction="none")
        grads = torch.autograd.grad((per_frame * mask).sum() / mask.sum(), list(w.values()))
        with torch.no_grad():
            for p, g in zip(w.values(), grads):
                p -= A.LR * g
    return {k: v.detach() for k, v in w.items()}


def test_the_data_has_the_spread_a_ragged_last_window_and_a_short_last_minibatch():
    for spread, k in [(1, 1), (30, 4), (10, 8)]:
        mbs = A.make_minibatches(spread, k)
        lengths = [e["x"].shape[0] for mb in mbs for e in mb]
        assert min(lengths) == A.MIN_LEN and max(lengths) == A.MIN_LEN * spread
        wins = A.windows(mbs, k)
        assert [len(w) for w in wins] == [k] * A.FULL_WINDOWS + [max(1, k // 2)]
        assert [len(mb) for mb in mbs] == [A.BATCH] * (len(mbs) - 1) + [A.BATCH - 1]
        assert all(torch.equal(e["y"], e["y"].clamp(0, A.CLASSES - 1)) for mb in mbs for e in mb)


@pytest.mark.parametrize("spread,k", [(1, 2), (30, 4)])
def test_the_reference_is_one_step_on_every_frame_of_each_window(spread, k):
    state, mbs = A.initial_state(), A.make_minibatches(spread, k)
    got, expected = A.reference(state, mbs, k), big_batch_steps(state, mbs, k)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-12, rtol=0)
    assert A.difference(expected, A.initial_state())[0] > 1e-2  # the steps moved the weights


def test_the_oracle_tells_the_exact_loop_from_the_mean_of_means():
    dw_exact, _ = A.measure(rows("plain PyTorch, summed loss / window's frames", "fp32"), 30, 4)
    dw_means, rel = A.measure(rows("plain PyTorch, mean of per-minibatch means", "float64"), 30, 4)
    assert dw_exact < 1e-6 < 1e-3 < dw_means
    assert rel == pytest.approx(dw_means / max(float(v.abs().max()) for v in A.reference(
        A.initial_state(), A.make_minibatches(30, 4), 4).values()))
    # equal lengths and full windows: the mean of means is the big batch (only the ragged tail breaks it)
    state, mbs = A.initial_state(), A.make_minibatches(1, 4)
    full = mbs[:4 * A.FULL_WINDOWS]
    assert A.difference(A.run_mean_of_means(state, full, 4, torch.float64), A.reference(state, full, 4))[0] < 1e-12


@pytest.mark.parametrize("setting,limit", [("fp32", 1e-6), ("float64", 1e-12)])
def test_mtlab_rows_sit_at_the_float_floor(setting, limit):
    row = rows("mtlab", setting)
    assert row.limit == limit
    for spread, k in [(30, 4), (3, 1)]:
        assert A.measure(row, spread, k)[0] <= limit


def test_mtlab_bf16_sits_at_the_bf16_floor_of_the_exact_loop():
    got = A.measure(rows("mtlab", "bf16-mixed"), 30, 4)[0]
    floor = A.measure(rows("plain PyTorch, summed loss / window's frames", "bf16 autocast"), 30, 4)[0]
    assert got == pytest.approx(floor, rel=0.05) and got < 1e-3


def test_a_missing_peer_is_a_row_saying_so_and_an_mtlab_row_above_its_floor_fails():
    missing = A.Row("nowhere", "fp32", lambda s, m, k: s, needs="no_such_package_for_mtlab")
    off = A.Row("mtlab", "broken", lambda s, m, k: {n: v + 1e-3 for n, v in A.reference(s, m, k).items()}, limit=1e-6)
    results = A.evaluate([missing, off], spreads=(3,), ks=(2,))
    text = A.table(results)
    assert "| nowhere | fp32 | not installed (pip install no_such_package_for_mtlab) | |" in text
    assert "| mtlab | broken | 1.0e-03 |" in text
    assert text.splitlines()[0] == "| system | setting | max abs dw | relative to the weights |"
    assert A.failures(results) == ["mtlab / broken: 1.00e-03 > 1e-06"]


def test_write_docs_replaces_the_block_between_the_markers(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text(f"intro\n{A.BEGIN}\nold\n{A.END}\nafter\n")
    A.write_docs("| new |", doc)
    assert doc.read_text() == f"intro\n{A.BEGIN}\n| new |\n{A.END}\nafter\n"
    assert A.BEGIN in A.DOCS.read_text() and A.END in A.DOCS.read_text()


# ----------------------------------------------------------------------------- each peer through its own API
def mean_of_means_by_count(state, minibatches, k):
    """The per-minibatch means divided by the number of minibatches the window really holds."""
    model = A.tagger(state, torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=A.LR)
    for win in A.windows(minibatches, k):
        opt.zero_grad()
        for mb in win:
            x, y = A.padded(mb, torch.float64)
            (A.frame_loss(model, x, y, "mean") / len(win)).backward()
        opt.step()
    return A.final(model)


@pytest.mark.slow  # importing transformers takes seconds
def test_transformers_rows_come_from_its_trainer_and_num_items_in_batch():
    transformers = pytest.importorskip("transformers", reason="HF Transformers is not installed (mtlab[bench])")
    state, mbs, k = A.initial_state(), A.make_minibatches(30, 4), 4
    seen = []
    real = A.HFTaggerItems.forward

    def forward(self, x, labels, **kwargs):
        seen.append(kwargs.get("num_items_in_batch"))
        return real(self, x, labels, **kwargs)

    train = mock.patch.object(transformers.Trainer, "train", autospec=True, side_effect=transformers.Trainer.train)
    with train as called, mock.patch.object(A.HFTaggerItems, "forward", forward):
        got = A.run_transformers(state, mbs, k, items=True)
    assert called.call_count == 1
    counts = [int(sum(int((mb_y != A.IGNORE).sum()) for mb_y in (A.padded(mb)[1] for mb in win)))
              for win in A.windows(mbs, k)]
    assert [int(n) for n in seen] == [c for win, c in zip(A.windows(mbs, k), counts) for _ in win]
    assert A.difference(got, A.reference(state, mbs, k))[0] < 1e-6
    # without loss kwargs the Trainer divides each minibatch's mean by the window's real count of minibatches
    without = A.run_transformers(state, mbs, k, items=False)
    assert A.difference(without, mean_of_means_by_count(state, mbs, k))[0] < 1e-6
    assert A.difference(without, A.reference(state, mbs, k))[0] > 1e-3


@pytest.mark.slow  # importing accelerate takes seconds
def test_accelerate_rows_come_from_its_accumulate_and_backward():
    accelerate = pytest.importorskip("accelerate", reason="Accelerate is not installed (mtlab[bench])")
    state, mbs, k = A.initial_state(), A.make_minibatches(30, 4), 4
    backward = mock.patch.object(accelerate.Accelerator, "backward", autospec=True,
                                 side_effect=accelerate.Accelerator.backward)
    accumulate = mock.patch.object(accelerate.Accelerator, "accumulate", autospec=True,
                                   side_effect=accelerate.Accelerator.accumulate)
    with backward as b, accumulate as acc:
        mean = A.run_accelerate(state, mbs, k, "mean")
    assert b.call_count == acc.call_count == len(mbs)
    # accumulate() steps at the end of the data too, but backward divides the ragged window by K as well
    assert A.difference(mean, A.run_mean_of_means(state, mbs, k, torch.float64))[0] < 1e-6
    with backward as b:
        items = A.run_accelerate(state, mbs, k, "items")
    assert b.call_count == len(mbs)
    assert A.difference(items, A.reference(state, mbs, k))[0] < 1e-6


@pytest.mark.slow  # importing lightning takes seconds
def test_lightning_row_comes_from_its_trainer_with_accumulate_grad_batches():
    L = pytest.importorskip("lightning", reason="Lightning is not installed (mtlab[bench])")
    state, mbs, k = A.initial_state(), A.make_minibatches(30, 4), 4
    built = []
    init = L.Trainer.__init__

    def record(self, *args, **kwargs):
        built.append(kwargs)
        init(self, *args, **kwargs)

    with mock.patch.object(L.Trainer, "__init__", record), \
         mock.patch.object(L.Trainer, "fit", autospec=True, side_effect=L.Trainer.fit) as fit:
        got = A.run_lightning(state, mbs, k)
    assert fit.call_count == 1 and [b["accumulate_grad_batches"] for b in built] == [k]
    # its last, ragged window is scaled by 1/K as the full ones, not by its real count
    assert A.difference(got, A.run_mean_of_means(state, mbs, k, torch.float64))[0] < 1e-6
    assert A.difference(got, mean_of_means_by_count(state, mbs, k))[0] > 1e-4


@pytest.mark.slow  # two gloo processes
def test_two_ranks_mtlab_is_the_big_batch_and_ddp_is_not():
    state = A.initial_state()
    cases = [(state, A.make_minibatches(30, 2, ranks=2), 2), (state, A.make_minibatches(10, 1, ranks=2), 1)]
    for system, exact in (("mtlab", True), ("ddp", False)):
        for (s, mbs, k), got in zip(cases, A.run_ranks(cases, system)):
            dw = A.difference(got, A.reference(s, mbs, 2 * k))[0]
            assert (dw < 1e-6) if exact else (dw > 1e-3), (system, k, dw)
