"""Bad luck, round 4: a Ctrl-C at the final save, a skip that finds no readable file, half-loaded states, stale
caches, worker errors, documented imports, a busy machine, a wrong loss target and honest progress.
Each case says what it tried (tests/campaign.py); scripts/reliability_report.py prints the table."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

import mtlab
from campaign import record

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "recipes" / "demo.toml"
pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ 1. Ctrl-C while the final checkpoint is written
@pytest.mark.slow
def test_ctrl_c_while_final_pt_is_written_keeps_the_run(tmp_path, monkeypatch, capsys):
    from mtlab.apps import cli

    real = os.replace

    def interrupted_replace(src, dst, *args, **kwargs):
        if str(dst).endswith("final.pt"):
            os.kill(os.getpid(), signal.SIGINT)
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", interrupted_replace)
    exp = tmp_path / "e"
    code = cli.main(["train", str(DEMO), "--expdir", str(exp), "--steps", "2", "--threads", "1", "--no-progress"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    names = {p.name for p in exp.iterdir()}
    held = {"final.pt", "history.csv", "summary.txt"} <= names and "nothing saved" not in err
    record("Ctrl-C while final.pt is written", held)
    assert held, (names, err)
    assert mtlab.core.state.load_safe(exp / "final.pt")["step"] == 2
    assert code in (0, cli.EXIT_INTERRUPTED)


@pytest.mark.parametrize("phase", ["before", "after"])
def test_the_command_lines_ctrl_c_message_names_the_phase(phase, tmp_path, monkeypatch, capsys):
    """A Ctrl-C that escapes a command says what was saved: nothing before training, final.pt after it."""
    from mtlab.apps import cli

    exp = tmp_path / "e"
    exp.mkdir()
    if phase == "after":
        (exp / "final.pt").write_bytes(b"saved by this run")

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_elastic_train", interrupted)
    code = cli.main(["train", str(DEMO), "--expdir", str(exp), "--threads", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INTERRUPTED
    if phase == "before":
        assert "nothing saved" in err
    else:
        assert "nothing saved" not in err and "final.pt" in err and "resume" in err, err


# ------------------------------------------------------------------ 3. a state with other stream settings
def _trainer(batch_size: int = 4, numbuckets: int = 1, n: int = 16) -> mtlab.Trainer:
    from helpers import make_examples, make_models, task_a, task_b

    ex = make_examples(n, 31)
    return mtlab.Trainer(make_models(), [task_a((ex, ex), batch_size=batch_size, numbuckets=numbuckets),
                                         task_b(ex, batch_size=batch_size)],
                         numbatches_to_aggregate=2, device="cpu", lr=1e-2)


def _everything(tr: mtlab.Trainer) -> dict:
    state = tr.state_dict()
    state.pop("history")
    return state


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("other", ["batch_size", "numbuckets", "list_size"])
def test_a_state_with_other_stream_settings_is_refused_before_anything_changes(other):
    saved = _trainer()
    saved.step(); saved.step()
    state = saved.state_dict()
    kw = {"batch_size": {"batch_size": 2}, "numbuckets": {"numbuckets": 3}, "list_size": {"n": 12}}[other]
    tr = _trainer(**kw)
    tr.step()
    before = _everything(tr)
    with pytest.raises(mtlab.ConfigError, match=other.split("_")[0] if other != "list_size" else "size"):
        tr.load_state_dict(state)
    held = _same(before, _everything(tr))
    record(f"half-loaded state refused: other {other}", held)
    assert held
