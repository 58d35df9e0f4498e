"""A job's Steering, driven through mtlab.attach over its real socket, with the training loop in a thread of this
process (the real second process: test_client.py): commands at the next minibatch, journaled as attached and
replayed bit for bit; refusals that leave the job untouched; one steering client; the end said."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from collections.abc import Iterator

import pytest
import torch
from helpers import make_examples, make_models, task_a
from helpers.jobs import start_job

import mtlab
from mtlab.remote.wire import CONNECTION_FILE, AttachError, JobEnded, read_connection
from mtlab.training.loop import Schedule

pytestmark = pytest.mark.usefixtures("one_thread")


def build() -> mtlab.Trainer:
    task = task_a((make_examples(24, 1), make_examples(24, 2)))
    return mtlab.Trainer(make_models(), [task], lr=0.01, numbatches_to_aggregate=2, device="cpu", seed=3)


@contextmanager
def job(tmp_path: Path, steps: int = 100_000, paused: bool = False) -> Iterator[tuple[Any, Any]]:
    """A job training in a thread, attachable in ``tmp_path`` (``paused``: before its first step); yields
    (experiment, steering); stops it after."""
    exp = SimpleNamespace(trainer=build(), schedule=Schedule(num_steps=steps, initial_learning_rate=0.01,
                                                               learning_rate_decay=0.5), recipe={"name": "t"})
    steering, thread = start_job(exp, tmp_path)
    if paused:
        steering.paused.set()
    thread.start()
    try:
        yield exp, steering
    finally:
        steering.stopping.set()
        thread.join(30)


def test_a_change_takes_effect_at_a_minibatch_is_journaled_as_attached_and_replays_bit_for_bit(tmp_path) -> None:
    with job(tmp_path, steps=16, paused=True) as (exp, steering):
        client = mtlab.attach(tmp_path, timeout=10)
        assert client.state == "paused"
        client.resume()
        applied = client.set("weight", 0.25, task="a", linkedset="noisy")
        assert applied.in_force and applied.entry["source"] == "attached" and applied.delay_s is not None
        assert str(applied).startswith("a/noisy weight") and ": in force from step " in str(applied)
        lr = client.set("lr", 0.004)
        assert lr.in_force and lr.entry["kind"] == "lr"
        assert client.wait(timeout=60) == "ended" and client.ended.reason == "done"
    tr = exp.trainer
    assert tr.step_count == 16
    assert tr.get("weight", "a", "noisy") == 0.25
    entries = [e for e in tr.journal.changes() if e["source"] == "attached"]
    assert [(e["kind"], e["value"]) for e in entries] == [("weight", 0.25), ("lr", 0.004)]
    # the schedule's decay goes on from the lr set, instead of putting its own back at the next step
    assert exp.schedule.lr_at(lr.step) == pytest.approx(0.004)
    again = mtlab.replay(tr.journal, build())
    assert again.step_count == tr.step_count
    for k, p in tr.params.items():
        assert torch.equal(p, again.params[k]), k
    assert again.history.equals(tr.history)


def test_a_bad_value_or_knob_is_refused_and_the_job_goes_on_untouched(tmp_path) -> None:
    with job(tmp_path) as (exp, steering):
        client = mtlab.attach(tmp_path, timeout=10)
        before = len(exp.trainer.journal.changes())
        with pytest.raises(mtlab.ConfigError, match="refused, the job goes on unchanged: .*must be >= 0"):
            client.set("weight", -1.0, task="a", linkedset="noisy")
        with pytest.raises(mtlab.ConfigError, match="unknown knob 'nope'"):
            client.set("nope", 1)
        with pytest.raises(mtlab.ConfigError, match="task"):
            client.set("weight", 0.5, task="zz", linkedset="noisy")
        step = client.step
        while client.status()["step"] < step + 2:  # still training
            pass
        assert not [e for e in exp.trainer.journal.changes()[before:] if e["source"] == "attached"]
        assert exp.trainer.get("weight", "a", "noisy") == 0.5


def test_one_client_steers_others_watch_and_a_wrong_key_is_refused(tmp_path) -> None:
    with job(tmp_path) as (exp, steering):
        first = mtlab.attach(tmp_path, timeout=10)
        with pytest.raises(AttachError, match="another client steers this job"):
            mtlab.attach(tmp_path, timeout=5)
        watcher = mtlab.attach(tmp_path, timeout=5, steer=False)
        assert len(watcher.rows()) >= 0 and watcher.state in ("running", "pausing", "paused")
        with pytest.raises(AttachError, match="set refused: this client does not steer the job"):
            watcher.set("lr", 0.001)
        info, _ = read_connection(tmp_path)
        with pytest.raises(AttachError, match="signature does not match"):
            mtlab.attach({**info, "key": "0" * 64}, timeout=5)
        first.detach()
        with pytest.raises(AttachError, match="has detached"):
            first.pause()
        second = mtlab.attach(tmp_path, timeout=5)  # free again: it steers now, and sees the history so far
        assert second.pause() == "paused"
        paused_at = second.step
        assert len(second.rows()) == paused_at == exp.trainer.step_count
        assert second.resume() == "running"
        watcher.detach()


def test_the_end_is_said_to_the_client_and_in_the_connection_file(tmp_path) -> None:
    with job(tmp_path, steps=3) as (exp, steering):
        client = mtlab.attach(tmp_path, timeout=10)
        assert client.wait(timeout=30) == "ended"
    assert isinstance(client.ended, JobEnded) and client.ended.reason == "done" and client.ended.step == 3
    with pytest.raises(JobEnded, match=r"ended at step 3 \(done\)"):
        client.set("lr", 0.1)
    info, _ = read_connection(tmp_path)
    assert info is not None and "key" not in info and info["ended"]["reason"] == "done"
    with pytest.raises(JobEnded, match="ended at step 3"):
        mtlab.attach(tmp_path, timeout=1)
    assert (tmp_path / CONNECTION_FILE).stat().st_mode & 0o077 == 0
