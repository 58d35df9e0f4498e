"""The price of mtlab's guarantees, counted as ``bench/step_work.py`` counts them (never timed): how many of
mtlab's Python functions one stepwise cycle runs on the overhead-bound case of ``bench/peers.py`` (K=4 ``process_minibatch(batch=...)``, then
``finish()``: normalize, clip, apply). A per-call layer added on the step path (a wrapper, a listener relay, a
per-minibatch statistic) shows here as more calls; the bounds are today's counts with a small margin."""

from __future__ import annotations

import importlib
import sys
from collections import Counter

from helpers.paths import BENCH, MTLAB

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
peers = importlib.import_module("peers")

ROOT = str(MTLAB.resolve())
PER_MINIBATCH = 25  # mtlab functions one process_minibatch(batch=...) enters (today: 21 on a collated batch, 20 the
# third of a step, 24 a batch built by hand on its first use (its frame mask made); 31 before the forward's plumbing
# ran in plain loops over what the plan and graph prepare once)
PER_FINISH = 108  # finish(): normalize, clip, apply and the step's history row (today: 105, the step's sums naming
# the records they were made of; 100 with the step's sums of the records and the knob table; 80 before them, 104 before
# the step path lost its per-tensor generator expressions)
PER_CYCLE = 4 * PER_MINIBATCH + PER_FINISH


def mtlab_calls(fn) -> Counter:
    """(file, function) -> calls, for mtlab's own Python functions during ``fn()``."""
    seen: Counter = Counter()

    def profile(frame, event, arg):  # noqa: ANN001
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            seen[(frame.f_code.co_filename[len(ROOT) + 1:], frame.f_code.co_name)] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def stepwise():
    """mtlab on the overhead case's prebuilt batches (bench/peers.py), two cycles run: nothing is first use."""
    layers, hidden, batch, lo, hi, _ = peers.SETTINGS["overhead"]
    system = peers.plain_mtlab(peers.plain_model(layers, hidden), peers.plain_batches(batch, lo, hi, "cpu", n=8),
                               batch, "cpu")
    system.step()
    system.step()
    return system


def test_one_stepwise_cycle_stays_under_its_count_of_mtlab_calls():
    system = stepwise()
    calls = mtlab_calls(system.step)
    assert sum(calls.values()) <= PER_CYCLE, calls.most_common(15)


def test_a_minibatch_and_the_finish_each_stay_under_their_count():
    system = stepwise()
    tr = next(c.cell_contents for c in system.step.__closure__ if type(c.cell_contents).__name__ == "Trainer")
    batch = peers.plain_batches(*peers.SETTINGS["overhead"][2:5], "cpu", n=1)[0]
    ready = ({"x": batch[0], "y": batch[1]}, {"x": batch[2], "y": batch[2]})
    for _ in range(3):  # K - 1 minibatches, counted one by one
        calls = mtlab_calls(lambda: tr.process_minibatch("tag", "train", batch=ready))
        assert sum(calls.values()) <= PER_MINIBATCH, calls.most_common(15)
    tr.process_minibatch("tag", "train", batch=ready)
    calls = mtlab_calls(tr.finish)
    assert sum(calls.values()) <= PER_FINISH, calls.most_common(15)
    assert tr.step_count == 3  # the counted calls did their work


def test_each_public_call_enters_its_scope_and_journal_once():
    """The run's generator, lock and journal entry are paid once per public call, not per layer inside it."""
    system = stepwise()
    calls = mtlab_calls(system.step)
    public = 4 + 1 + 3  # 4 minibatches, finish, and finish's normalize, clip and apply
    assert calls[("core/scope.py", "__enter__")] == public
    assert calls[("core/journal.py", "enter_call")] == 5  # the outer calls only: minibatches and finish
    assert calls[("core/journal.py", "read")] <= public


def test_step_work_counts_a_minibatch_within_three_ops_of_the_users_own():
    """bench/step_work.py's per-minibatch count (the issue's figure): mtlab's ``process_minibatch`` on a collated
    batch against the user's forward, loss and backward, and the rest of each step, counted on the same batches."""
    step_work = importlib.import_module("step_work")
    per = step_work.minibatch_ops("overhead", steps=1)
    assert per["mtlab/minibatch"] - per[f"{peers.LOOP}/minibatch"] <= 3, per
    assert per[f"{peers.LOOP}/minibatch"] > 50  # the count saw the LSTM's forward and backward
    assert per["mtlab/rest"] < per[f"{peers.LOOP}/rest"], per  # the finish stays lighter than the loop's
