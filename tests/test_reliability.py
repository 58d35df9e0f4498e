"""Fault campaign: non-finite values, failing calls, damaged checkpoints, a full disk, vanished data.
Each case says what it tried (tests/campaign.py); scripts/reliability_report.py prints the table."""

from __future__ import annotations

import errno
import os
import pickle
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mtlab
from campaign import record
from helpers import make_examples, make_models, task_a, task_b
from mtlab.core.state import CheckpointError, load_safe

EX = make_examples(16, 31)


def build(nonfinite="skip", **kw):
    return mtlab.Trainer(make_models(), [task_a((EX, EX), batch_size=4), task_b(EX, batch_size=4)],
                         clip_grad_value=1.0, numbatches_to_aggregate=2, device="cpu", nonfinite=nonfinite, **kw)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["input_nan", "input_inf", "grad_enc", "grad_head_b"])),
                     min_size=1, max_size=3))
def test_nonfinite_values_never_reach_the_parameters_under_skip(plan):
    tr = build()
    bad_steps = {s for s, _ in plan}
    kinds = {s: k for s, k in plan}
    for step in range(6):
        kind = kinds.get(step)
        handle = None
        if kind in ("grad_enc", "grad_head_b"):
            name = "enc.lin.weight" if kind == "grad_enc" else "head_b.weight"
            handle = tr.params[name].register_hook(lambda g: g * float("nan"))
        if kind in ("input_nan", "input_inf"):
            data, lens = mtlab.collate(EX[:3])
            data["x"][1, 0, 2] = float("nan") if kind == "input_nan" else float("inf")
            tr.reset()
            for t, sets in (("a", ["clean", "noisy"]), ("b", ["clean"])):
                for s in sets:
                    tr.process_minibatch(t, s, batch=(data, lens) if (t, s) == ("a", "noisy") else None)
            tr.normalize(); tr.clip(); tr.apply()
        else:
            tr.step()
        if handle is not None:
            handle.remove()
        ok = all(torch.isfinite(p).all() for p in tr.params.values())
        record("non-finite value injected" if kind else "clean step", ok)
        assert ok
    skipped = tr.history["skipped"].tolist()
    assert [i for i, s in enumerate(skipped) if s] == sorted(bad_steps)


@pytest.mark.parametrize("where", ["process_minibatch", "normalize", "clip", "apply"])
def test_an_exception_inside_a_call_leaves_the_state_before_it(where, monkeypatch):
    tr = build(nonfinite="raise")
    tr.step()
    if where != "process_minibatch":
        tr.process_minibatch("a", "clean"); tr.process_minibatch("b", "clean")
    if where in ("clip", "apply"):
        tr.normalize()
    if where == "apply":
        tr.clip()
    phases = tr.phase()
    params = {k: p.detach().clone() for k, p in tr.params.items()}
    grads = {t: {k: v.clone() for k, v in tr.state(t).grads.items()} for t in tr.tasks}
    opt_steps = {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()}

    class Injected(RuntimeError):
        pass

    def fail(*args, **kwargs):
        raise Injected(where)

    if where == "process_minibatch":
        monkeypatch.setattr(tr.tasks["a"], "loss", fail)
    elif where == "normalize":
        monkeypatch.setattr(mtlab.base.gradops, "div_", fail)
    elif where == "clip":
        monkeypatch.setattr(mtlab.base.gradops, "clamp_", fail)
    else:
        monkeypatch.setattr(tr.optimizer, "step", fail)
    with pytest.raises((Injected, mtlab.BatchError)):
        if where == "process_minibatch":
            tr.process_minibatch("a", "clean")
        else:
            getattr(tr, where)()
    monkeypatch.undo()
    held = (tr.phase() == phases
            and all(torch.equal(params[k], p) for k, p in tr.params.items())
            and all(torch.equal(grads[t][k], v) for t in tr.tasks for k, v in tr.state(t).grads.items())
            and {id(p): int(s["step"]) for p, s in tr.optimizer.state.items()} == opt_steps)
    record(f"exception inside {where}", held)
    assert held
    tr.reset(); tr.step()  # and it goes on
    assert tr.step_count == 2


def good_checkpoint(tmp_path):
    tr = build()
    tr.step()
    path = tmp_path / "ck.pt"
    tr.save(path)
    return tr, path


@pytest.mark.parametrize("damage", ["truncated", "flipped_bytes", "empty", "wrong_version", "not_mtlab",
                                    "crafted_pickle", "missing"])
def test_damaged_checkpoints_give_a_clear_error_and_run_nothing(damage, tmp_path):
    tr, path = good_checkpoint(tmp_path)
    bad = tmp_path / "bad.pt"
    marker = tmp_path / "executed"
    raw = path.read_bytes()
    if damage == "truncated":
        bad.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped_bytes":
        b = bytearray(raw)
        for i in range(len(b) // 3, len(b) // 3 + 64):
            b[i] ^= 0xFF
        bad.write_bytes(bytes(b))
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "wrong_version":
        state = torch.load(path, weights_only=True)
        state["version"] = 99
        torch.save(state, bad)
    elif damage == "not_mtlab":
        torch.save({"weights": torch.zeros(3)}, bad)
    elif damage == "crafted_pickle":
        class Evil:
            def __reduce__(self):
                return (open, (str(marker), "w"))
        torch.save({"format": "mtlab-trainer", "version": 1, "evil": Evil()}, bad)
    before = {k: p.detach().clone() for k, p in tr.params.items()}
    target = tmp_path / "nope.pt" if damage == "missing" else bad
    with pytest.raises((CheckpointError, mtlab.ConfigError)) as err:
        tr.load_checkpoint(target)
    msg = str(err.value)
    held = (str(target) in msg or "version" in msg) and not marker.exists() and \
        all(torch.equal(before[k], p) for k, p in tr.params.items())
    record(f"damaged checkpoint: {damage}", held)
    assert held, msg


def test_disk_full_while_saving_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    tr, path = good_checkpoint(tmp_path)
    old = path.read_bytes()
    tr.step()

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mtlab.core.state.torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="No space left.*previous checkpoint .* intact"):
        tr.save(path)
    monkeypatch.undo()
    held = path.read_bytes() == old and load_safe(path)["step"] == 1 and \
        not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    record("disk full while saving", held)
    assert held
    tr.save(path)  # space is back: saving works again
    assert load_safe(path)["step"] == 2


def test_a_data_file_deleted_mid_run(tmp_path):
    root = tmp_path / "data_samples"
    shutil.copytree(mtlab.data.data_samples_dir(), root)
    train = mtlab.data.load_split(root=root, split="train", linkedset="clean")
    models = {"enc": mtlab.models.BLSTM(129, 8), "head": torch.nn.Linear(16, 3)}
    task = mtlab.Task("frames", [mtlab.Node("h", "enc", ["features"]), mtlab.Node("o", "head", ["h"])],
                      ["features"], ["frame_target"], ["o"],
                      mtlab.losses.CrossEntropy(output="o", target="frame_target"),
                      {"clean": mtlab.LinkedSet(train)}, batch_size=4)
    tr = mtlab.Trainer(models, [task], device="cpu")
    tr.step()
    victim = sorted((root / "train").glob("**/*.wav"))[0]
    victim.unlink()
    tr.step()  # features live in memory: the run goes on
    with pytest.raises(mtlab.data.DataError) as err:
        mtlab.data.load_split(root=root, split="train", linkedset="clean")
    held = victim.name in str(err.value) and tr.step_count == 2
    record("data file deleted mid-run", held)
    assert held, str(err.value)
