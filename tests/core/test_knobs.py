"""Minibatches per step (K) per task, batch size per task and reinitialize(), with plain PyTorch as the oracle."""

from __future__ import annotations


import pytest
import torch
from helpers import clone_models, make_examples, make_models, task_a, task_b
from helpers.trainers import processed_grad
from helpers.trainers import assert_trees_equal

import mtlab


def two_tasks(k: int = 1, batch_size: int = 3, lr: float = 1e-2, **kw) -> mtlab.Trainer:
    ex_c, ex_n = make_examples(24, 40), make_examples(24, 41)
    return mtlab.Trainer(make_models(), [task_a((ex_c, ex_n), batch_size=batch_size), task_b(ex_c, batch_size=batch_size)],
                         numbatches_to_aggregate=k, device="cpu", lr=lr, **kw)


def test_minibatches_per_step_differing_per_task_matches_one_pass_of_plain_pytorch():
    tr = two_tasks()
    oracle = clone_models(tr.models)
    draw = two_tasks()  # same seeds: its streams give the batches tr's step() draws
    tr.set_minibatches_per_step(3, "a")
    assert tr.minibatches_per_step == {"a": 3, "b": 1} and tr.numbatches_to_aggregate == 1
    states = tr.step()
    assert states["a"].minibatches == 6 and states["b"].minibatches == 1
    plan_a = [(w, next(draw.stream("a", s))) for _ in range(3) for s, w in (("clean", 1.0), ("noisy", 0.5))]
    plan_b = [(1.0, next(draw.stream("b", "clean")))]
    ga, _ = processed_grad(clone_models(oracle), plan_a, task="a")
    gb, _ = processed_grad(clone_models(oracle), plan_b, task="b")
    for name in ("enc.lin.weight", "head_a.weight"):
        torch.testing.assert_close(tr.state("a").grads[name], ga[name], rtol=1e-12, atol=1e-12)
    for name in ("enc.lin.weight", "head_b.weight"):
        torch.testing.assert_close(tr.state("b").grads[name], gb[name], rtol=1e-12, atol=1e-12)
    row = tr.history.iloc[-1]
    assert row["a/minibatches_per_step"] == 3 and row["b/minibatches_per_step"] == 1


def test_numbatches_to_aggregate_is_the_all_tasks_value():
    tr = two_tasks()
    tr.set_minibatches_per_step(4, "b")
    tr.numbatches_to_aggregate = 2  # every task, as set_minibatches_per_step(2) does
    assert tr.minibatches_per_step == {"a": 2, "b": 2}
    tr.set_minibatches_per_step(5, "a")
    tr.set_minibatches_per_step(3)
    assert tr.minibatches_per_step == {"a": 3, "b": 3} and tr.numbatches_to_aggregate == 3


def test_minibatches_per_step_changed_during_a_step_acts_from_the_next_step():
    tr = two_tasks(k=2)
    seen = []

    def knob(event, info):
        if event == "minibatch" and not seen:
            seen.append(1)
            tr.set_minibatches_per_step(1)  # as a dashboard knob from another thread would
    tr.add_callback(knob)
    states = tr.step()
    assert states["a"].minibatches == 4 and states["b"].minibatches == 2  # the step kept the rounds it began with
    assert tr.history.iloc[-1]["a/minibatches_per_step"] == 2
    states = tr.step()
    assert states["a"].minibatches == 2 and states["b"].minibatches == 1


def test_batch_size_acts_from_the_next_minibatch_and_keeps_the_rest_of_the_epoch():
    tr = two_tasks(batch_size=4)  # 24 examples: 6 batches per epoch
    tr.step()
    stream = tr.stream("a", "clean")
    assert (stream.epoch, stream.position, len(stream)) == (0, 1, 6)
    rest = [i for b in stream.epoch_batches()[1:] for i in b]
    tr.set_batch_size("a", 2)
    tr.process_minibatch("a", "clean")
    assert tr.state("a").records[-1].num_examples == 2
    # the 20 examples not yet drawn, in their order, in 10 batches of 2
    assert (stream.epoch, stream.position, len(stream), stream.batch_size) == (0, 2, 11, 2)
    assert [i for b in stream.epoch_batches()[1:] for i in b] == rest
    assert tr.stream("b", "clean").batch_size == 4  # another task keeps its own
    tr.reset()
    tr.step()
    assert tr.history.iloc[-1]["a/batch_size"] == 2 and tr.history.iloc[-1]["b/batch_size"] == 4


def test_bad_knob_values_are_refused_naming_the_fix():
    tr = two_tasks()
    with pytest.raises(mtlab.ConfigError, match=r"integer >= 1.*set\('minibatches_per_step', 2\)"):
        tr.set_minibatches_per_step(0)
    with pytest.raises(mtlab.ConfigError, match=r"of task 'a'.*integer >= 1"):
        tr.set_minibatches_per_step(2.5, "a")
    with pytest.raises(mtlab.ConfigError, match=r"tasks: \['a', 'b'\]"):
        tr.set_minibatches_per_step(2, "zz")
    with pytest.raises(mtlab.ConfigError, match=r"batch size of task 'a'.*set\('batch_size', 8, task='a'\)"):
        tr.set_batch_size("a", -3)
    assert tr.minibatches_per_step == {"a": 1, "b": 1} and tr.tasks["a"].batch_size == 3


def test_a_state_brings_back_minibatches_per_step_and_the_batch_sizes():
    tr = two_tasks()
    tr.set_minibatches_per_step(2, "a")
    tr.step()
    snap = tr.state_dict()
    assert snap["tasks"]["b"]["batch_size"] == 3 and snap["tasks"]["a"]["minibatches_per_step"] == 2
    tr.set_minibatches_per_step(4)
    tr.set_batch_size("b", 5)
    tr.step()
    tr.load_state_dict(snap)  # the state's knobs, batch sizes included, come back through the knob table
    assert tr.minibatches_per_step == {"a": 2, "b": 1} and tr.step_count == 1 and tr.tasks["b"].batch_size == 3
    tr.step()
    assert tr.state("b").records[0].num_examples == 3


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
@pytest.mark.parametrize("combine", [None, "dwa"])
def test_reinitialize_is_bit_identical_to_a_freshly_built_trainer(combine):
    tr = two_tasks(k=2, clip_grad_value=0.5, combine=combine)
    for _ in range(3):
        tr.step()
    tr.process_minibatch("a", "clean")  # an accumulation in progress is discarded too
    tr.reinitialize()
    fresh = two_tasks(k=2, clip_grad_value=0.5, combine=combine)  # the same seeds: the same initial weights
    a, b = tr.state_dict(), fresh.state_dict()
    a.pop("journal"), b.pop("journal")  # the journal keeps what happened before (a replay redoes it)
    assert a["step"] == 0 and a["history"] == [] and len(tr.log.branches[0]) == 3
    assert_trees_equal(a, b)
    torch.manual_seed(7)
    for _ in range(2):
        tr.step()
    torch.manual_seed(7)
    for _ in range(2):
        fresh.step()
    assert_trees_equal({k: v for k, v in tr.state_dict().items() if k not in ("rng", "journal")},
                       {k: v for k, v in fresh.state_dict().items() if k not in ("rng", "journal")})


def test_reinitialize_keeps_the_knobs_and_follows_a_changed_combine_method():
    tr = two_tasks()
    tr.step()
    tr.set_weight("a", "noisy", 0.2)
    tr.set_minibatches_per_step(2, "b")
    tr.set_batch_size("a", 4)
    tr.set_combine("dwa")
    tr.lr = 3e-3
    events = []
    tr.add_callback(lambda e, i: events.append((e, dict(i))))
    tr.reinitialize()
    assert events == [("reinitialize", {"step": 0, "from_step": 1})]
    assert tr.weights()["a/noisy"] == 0.2 and tr.minibatches_per_step == {"a": 1, "b": 2}
    assert tr.tasks["a"].batch_size == 4 and tr.update.method == "dwa" and tr.lr == 3e-3
    fresh = two_tasks(combine="dwa", lr=3e-3)  # the lr knob lives in the optimizer's param groups
    assert_trees_equal(tr.state_dict()["update"], fresh.state_dict()["update"])
    tr.step()  # the current knobs act on the first step after it
    assert tr.state("b").minibatches == 2 and tr.state("a").records[0].num_examples == 4


def test_a_state_taken_between_set_batch_size_and_the_next_draw_restores_and_forks_exactly():
    """set_batch_size takes effect at the next draw; a state taken before that draw holds the streams at the old
    batch size and the task at the new one, and restoring or forking it continues exactly as the trainer does."""
    tr = two_tasks()
    tr.step()
    tr.set_batch_size("a", 5)
    snap = tr.state_dict()
    branch = tr.fork("bigger")
    tr.load_state_dict(snap)
    tr.step()
    branch.step()
    again = two_tasks()
    again.step()
    again.set_batch_size("a", 5)
    again.step()
    for other in (branch, again):
        assert_trees_equal(tr.state_dict()["models"], other.state_dict()["models"])
        assert tr.streams[("a", "clean")].state_dict() == other.streams[("a", "clean")].state_dict()


@pytest.mark.parametrize("attr,value", [("lr", True), ("lr", "0.5"), ("clip_grad_value", "1.0"),
                                        ("clip_grad_norm", True), ("clip_grad_percentile", "90")])
def test_a_flag_or_text_where_a_number_belongs_is_refused_as_for_weights(attr, value):
    tr = two_tasks()
    before = (tr.lr, tr.clip_settings(), len(tr.journal))
    with pytest.raises(mtlab.ConfigError, match="must be a number|give a percentile"):
        setattr(tr, attr, value)
    assert (tr.lr, tr.clip_settings(), len(tr.journal)) == before


def test_a_noise_scale_attached_under_loss_scaling_is_refused_as_by_the_constructor():
    tr = mtlab.Trainer(make_models(dtype=torch.float32), [task_b(make_examples(12, 1, dtype=torch.float32))],
                       device="cpu", precision="16-mixed")
    with pytest.raises(mtlab.ConfigError, match="16-mixed"):
        tr.noise_scale = mtlab.NoiseScale()
    assert tr.noise_scale is None


def test_a_chain_change_made_during_a_step_waits_for_the_step_boundary_and_replays():
    import threading

    def build():
        torch.manual_seed(0)
        return two_tasks(k=2, clip_grad_value=0.5)
    tr = build()
    tr.step()

    def steer(event, info):  # a slider moved from another thread in the middle of step 2
        if event == "minibatch" and tr.step_count == 1 and tr.state("a").minibatches == 1 and tr.clip_grad_value:
            t = threading.Thread(target=lambda: (tr.set("clip_grad_value", None), tr.set("combine", "mgda")))
            t.start(); t.join()
    tr.add_callback(steer)
    tr.step()  # finishes with the chain it started with
    assert tr.clip_grad_value is None and tr.update.method == "mgda" and tr.step_count == 2
    assert float(tr.history["a/clip_fraction"].iloc[1]) >= 0.0  # step 2 was clipped
    tr.remove_callback(steer)
    tr.step()
    entries = [e for e in tr.journal.changes() if e["kind"] in ("clip_grad_value", "combine")]
    assert [(e["step"], e["minibatch"]) for e in entries] == [(2, 0), (2, 0)]  # where step 2 ended
    replayed = mtlab.replay(tr.journal, build())
    for k, p in tr.params.items():
        assert torch.equal(p, replayed.params[k]), k
