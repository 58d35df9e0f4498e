"""The journal records every knob change where it took effect; mtlab.replay reproduces the run bit for bit."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import mtlab
from helpers import make_examples, make_models, task_a, task_b
from mtlab.base.errors import ConfigError
from mtlab.core.journal import Journal
from mtlab.core.state import digest

EX, EX2 = make_examples(24, 3), make_examples(24, 4)


def build(**kw) -> mtlab.Trainer:
    kw.setdefault("numbatches_to_aggregate", 2)
    kw.setdefault("clip_grad_value", 0.5)
    return mtlab.Trainer(make_models(), [task_a((EX, EX2)), task_b(EX)], lr=1e-2, device="cpu", **kw)


def fingerprint(tr: mtlab.Trainer) -> str:
    """Parameters, optimizer, accumulators, data positions, RNG, settings, history and journal."""
    return digest(tr.state_dict())


def replayed(journal, **kw) -> mtlab.Trainer:  # noqa: ANN001
    return mtlab.replay(journal, build(**kw))


def assert_same(a: mtlab.Trainer, want: str, b: mtlab.Trainer) -> None:
    assert b.step_count == a.step_count
    for name, p in a.params.items():
        assert torch.equal(p, b.params[name]), name
    assert b.history.equals(a.history)
    assert fingerprint(b) == want


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_weights_changed_between_two_minibatches_of_a_step():
    tr = build()
    tr.step()
    tr.process_minibatch("a", "clean")
    tr.set_weight("a", "noisy", 0.2)  # between two minibatches by hand
    tr.process_minibatch("a", "noisy")
    tr.set_task_weight("b", 0.3)
    tr.process_minibatch("b", "clean")
    tr.finish()

    def inside(event, info):  # noqa: ANN001 (a change made while step() runs, at its second minibatch)
        if event == "minibatch" and tr.state("a").minibatches == 2 and tr.step_count == 2:
            tr.set_weight("a", "clean", 0.7)
    tr.add_callback(inside)
    tr.step()
    tr.remove_callback(inside)
    tr.step()
    want = fingerprint(tr)
    inside_entries = [e for e in tr.journal.changes() if e["inside"]]
    assert [(e["kind"], e["step"], e["minibatch"]) for e in inside_entries] == [("weight", 2, 2)]
    assert_same(tr, want, replayed(tr.journal))


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
@pytest.mark.parametrize("acc_steps", [False, True])
def test_lr_and_clip_changed_at_a_step_boundary(acc_steps):
    tr = build(acc_steps=acc_steps)
    tr.step()
    tr.lr = 3e-3
    tr.clip_grad_value = 0.05
    tr.step()
    tr.clip_grad_value = None
    tr.clip_grad_norm = 0.2
    tr.step()
    want = fingerprint(tr)
    kinds = [e["kind"] for e in tr.journal.changes()]
    assert kinds == ["lr", "clip_grad_value", "clip_grad_value", "clip_grad_norm"]
    assert_same(tr, want, replayed(tr.journal, acc_steps=acc_steps))


def test_combination_method_switched():
    tr = build()
    tr.step()
    tr.set_combine("mgda")
    tr.step()
    tr.set_combine("sum")
    tr.step()
    want = fingerprint(tr)
    assert [e["value"] for e in tr.journal.changes()] == ["mgda", "sum"]
    assert_same(tr, want, replayed(tr.journal))


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_minibatches_per_step_changed():
    tr = build()
    tr.step()
    tr.numbatches_to_aggregate = 3
    tr.step()
    tr.numbatches_to_aggregate = 1
    tr.step()
    want = fingerprint(tr)
    assert [(e["kind"], e["value"]) for e in tr.journal.changes()] == [("minibatches_per_step", 3),
                                                                      ("minibatches_per_step", 1)]
    assert tr.history["a/minibatches"].tolist() == [4, 6, 2]
    assert_same(tr, want, replayed(tr.journal))


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_a_restored_snapshot_and_a_fork_replay():
    tr = build()
    tr.step()
    snap = tr.state_dict()
    tr.step()
    tr.lr = 5e-2
    tr.step()
    tr.load_state_dict(snap)  # back to step 1: the abandoned steps stay in the journal
    tr.set_weight("a", "noisy", 0.1)
    tr.step()
    branch = tr.fork("low-lr")
    branch.lr = 1e-4
    branch.step()
    tr.step()
    want, want_branch = fingerprint(tr), fingerprint(branch)
    assert [e["kind"] for e in tr.journal.changes()] == ["lr", "restore", "weight", "fork"]
    assert branch.journal.changes()[-2:] == [tr.journal.changes()[-1], branch.journal.changes()[-1]]
    assert branch.journal.lineage[-1]["id"] == tr.journal.id
    assert_same(tr, want, replayed(tr.journal))
    assert_same(branch, want_branch, replayed(branch.journal))
    assert not torch.equal(branch.params["enc.lin.weight"], tr.params["enc.lin.weight"])


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_replay_across_a_checkpoint_resume(tmp_path):
    first = build()
    first.step()
    first.set_weight("a", "clean", 0.4)
    first.step()
    first.save(tmp_path / "mid.pt")
    resumed = build()
    resumed.load_checkpoint(tmp_path / "mid.pt")  # a fresh trainer continues the run and its journal
    assert resumed.journal.id == first.journal.id and resumed.journal.entries[-1]["kind"] == "resume"
    resumed.lr = 2e-3
    resumed.step()
    resumed.step()
    want = fingerprint(resumed)
    assert_same(resumed, want, replayed(resumed.journal))


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_replay_after_a_json_round_trip(tmp_path):
    tr = build(noise_scale=True)
    tr.step()
    tr.set_weight("a", "noisy", 0.25)
    tr.lr = 4e-3
    tr.step()
    want = fingerprint(tr)
    text = tr.journal.to_json()
    again = Journal.from_json(json.dumps(json.loads(text)))
    assert again.to_dict() == tr.journal.to_dict()
    assert_same(tr, want, replayed(text, noise_scale=True))
    path = tr.journal.write(tmp_path / "journal.jsonl")
    assert_same(tr, want, replayed(path, noise_scale=True))


def test_a_background_run_steered_through_the_dashboard_controller(one_thread):
    from mtlab.ui.controller import Controller

    tr = build()
    c = Controller(tr)
    done = threading.Event()
    seen = []

    def steer(event, info):  # noqa: ANN001 (the "user" moves sliders from another thread while steps run)
        if event == "minibatch" and tr.step_count in (2, 5) and not seen.count(tr.step_count):
            seen.append(tr.step_count)
            t = threading.Thread(target=lambda: (c.set_weight("a", "noisy", 0.1 * (len(seen) + 1)),
                                                 c.set_lr(1e-3 * len(seen)), done.set()))
            t.start()
            t.join()
    tr.add_callback(steer)
    assert c.start(8)
    c.set_clip(0.1)  # queued: at the end of the current step
    c.wait(60)
    c.close()
    tr.remove_callback(steer)
    assert done.is_set() and tr.step_count == 8
    want = fingerprint(tr)
    changes = tr.journal.changes()
    assert {e["source"] for e in changes} == {"dashboard"}
    assert any(e["inside"] for e in changes) and any(e["kind"] == "clip_grad_value" for e in changes)
    assert_same(tr, want, replayed(tr.journal))


def test_a_journal_of_another_graph_is_refused_and_nothing_changes():
    tr = build()
    tr.step()
    other = mtlab.Trainer(make_models(), [task_b(EX)], device="cpu")
    before = digest(other.state_dict())
    with pytest.raises(ConfigError, match="tasks: the journal has \\['a', 'b'\\], the trainer \\['b'\\]"):
        mtlab.replay(tr.journal, other)
    assert digest(other.state_dict()) == before
    other_lr = mtlab.Trainer(make_models(), [task_a((EX, EX2)), task_b(EX)], lr=1e-3, device="cpu",
                             numbatches_to_aggregate=2, clip_grad_value=0.5)
    with pytest.raises(ConfigError, match="initial lr: 0.01 in the journal, 0.001 in the trainer"):
        mtlab.replay(tr.journal, other_lr)
    used = build()
    used.step()
    with pytest.raises(ConfigError, match="fresh one"):
        mtlab.replay(tr.journal, used)


def test_a_minibatch_passed_by_hand_is_refused_before_anything_changes():
    tr = build()
    tr.process_minibatch("a", "clean", batch=next(tr.stream("a", "clean")))
    tr.finish()
    fresh = build()
    before = digest(fresh.state_dict())
    with pytest.raises(ConfigError, match="passed by hand"):
        mtlab.replay(tr.journal, fresh)
    assert digest(fresh.state_dict()) == before


def test_the_journal_is_in_the_state_and_names_sources():
    tr = build()
    with tr.journal.source("schedule"):
        tr.lr = 1e-3
    tr.set_weight("a", "clean", 0.5)
    tr.set_weight("a", "clean", 0.5)  # no change, no entry
    state = tr.state_dict()
    assert Journal.from_json(state["journal"]["json"]).changes() == tr.journal.changes()
    assert [(e["kind"], e["source"]) for e in tr.journal.changes()] == [("lr", "schedule"), ("weight", "code")]
    with pytest.raises(ConfigError, match="not one of"):
        with tr.journal.source("slider"):
            pass


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_a_loop_with_lr_decay_validation_go_back_and_halved_lr_replays(monkeypatch):
    from helpers import script_validations

    ex = make_examples(12, 6)
    a = task_a((EX, EX2))
    a.linkedsets["clean"].valid = ex
    tr = mtlab.Trainer(make_models(), [a, task_b(EX)], device="cpu", numbatches_to_aggregate=2)
    script_validations(monkeypatch, [1.0, 2.0, 0.5, 3.0] + [0.4 - 0.01 * i for i in range(30)], first=("a", "clean"))
    schedule = mtlab.Schedule(num_steps=10, initial_learning_rate=1e-2, learning_rate_decay=0.1, valid_frequency=2,
                              go_back=True, valid_adapt=True, num_tries=None)
    mtlab.run(tr, schedule, progress=False)
    want = fingerprint(tr)
    sources = {(e["kind"], e["source"]) for e in tr.journal.changes()}
    assert {("lr", "schedule"), ("restore", "validation"), ("data_position", "validation")} <= sources
    fresh = mtlab.Trainer(make_models(), [a, task_b(EX)], device="cpu", numbatches_to_aggregate=2)
    assert_same(tr, want, mtlab.replay(tr.journal, fresh))


def test_a_staged_schedule_is_refused_by_replay_not_silently_rerun(monkeypatch):
    from helpers.runs import staged

    tr, schedule = staged()
    mtlab.run(tr, schedule, progress=False)
    assert [e["stage"] for e in tr.journal.changes() if e["kind"] == "stage"] == [0, 1]
    fresh, _ = staged()
    with pytest.raises(ConfigError, match="schedule stage"):
        mtlab.replay(tr.journal, fresh)


def test_a_refused_step_is_journaled_and_replayed_as_refused():
    bad = make_examples(24, 3)
    bad[0]["x"] = bad[0]["x"] * float("nan")
    build_bad = lambda: mtlab.Trainer(make_models(), [task_b(bad, batch_size=24)], lr=1e-2, device="cpu")  # noqa: E731
    tr = build_bad()
    with pytest.raises(mtlab.NonFiniteError):
        tr.step()
    tr.reset()
    tr.set_task_weight("b", 0.5)
    want = fingerprint(tr)
    assert [(e["kind"], e.get("failed")) for e in tr.journal.entries] == [
        ("step", "NonFiniteError"), ("reset", None), ("task_weight", None)]
    assert_same(tr, want, mtlab.replay(tr.journal, build_bad()))


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_relative_linkedset_weights_and_the_tf1_adam_replay_and_fork():
    tr = build(optimizer="adam_tf1", linkedset_weights="relative")
    tr.step()
    tr.set_weight("a", "noisy", 0.25)
    branch = tr.fork("b")
    tr.step(), branch.step()
    want, want_branch = fingerprint(tr), fingerprint(branch)
    assert_same(tr, want, replayed(tr.journal, optimizer="adam_tf1", linkedset_weights="relative"))
    assert_same(branch, want_branch, replayed(branch.journal, optimizer="adam_tf1", linkedset_weights="relative"))
    with pytest.raises(ConfigError, match="initial optimizer"):
        replayed(tr.journal)


@pytest.mark.slow  # about a second of CPU or more: the full suite runs it, the quick check does not
def test_minibatches_per_step_of_one_task_batch_size_and_reinitialize_replay():
    tr = build()
    tr.step()
    tr.set_minibatches_per_step(3, task="a")
    tr.set_batch_size("b", 5)
    tr.step()
    tr.reinitialize()  # back to the built state, knobs kept
    tr.step()
    tr.set_minibatches_per_step(1)
    tr.step()
    want = fingerprint(tr)
    assert [(e["kind"], e.get("task"), e.get("value")) for e in tr.journal.changes()] == [
        ("minibatches_per_step", "a", 3), ("batch_size", "b", 5), ("reinitialize", None, None),
        ("minibatches_per_step", None, 1)]
    assert_same(tr, want, replayed(tr.journal))
