"""Bad luck, round 5, around a run's folder: a kill at any moment then `mtlab resume`, the one rule for a folder that
holds a run (train, replay, resume), damaged journals, a full disk while the journal is written, replay's progress
and verdict. Each case says what it tried (tests/helpers/campaign.py); scripts/reliability_report.py prints the
table."""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import make_examples, make_models, task_a, task_b
from helpers.campaign import record
from helpers.paths import REPO
from helpers.recipes import write_tiny_recipe

import mtlab
from mtlab.apps import cli
from mtlab.core.journal import Journal
from mtlab.core.state import CheckpointError, load_safe
from mtlab.training.checkpoint import LATEST, choose_resume, resume_point

pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer() -> mtlab.Trainer:
    ex = make_examples(16, 31)
    return mtlab.Trainer(make_models(), [task_a((ex, ex), batch_size=4), task_b(ex, batch_size=4)],
                         numbatches_to_aggregate=2, device="cpu", lr=1e-2)


def _saved(folder: Path, name: str, steps: int, mid_step: bool = False) -> Path:
    tr = _trainer()
    for _ in range(steps):
        tr.step()
    if mid_step:
        tr.process_minibatch("a", "clean")
    return tr.save(folder / name)


# ------------------------------------------------------------------ 1. one checkpoint-choosing function
def test_resume_chooses_the_latest_checkpoint_taken_between_steps_and_says_which(tmp_path):
    _saved(tmp_path, "final.pt", 1)  # a resumed run killed later: its final.pt is older than latest.pt
    _saved(tmp_path, LATEST, 3)
    _saved(tmp_path, "best.pt", 2)
    choice = choose_resume(tmp_path)
    held = choice.path == tmp_path / LATEST and "step 3" in choice.why and "final.pt at step 1" in choice.why
    record("resume chooses: latest.pt newer than final.pt", held)
    assert held, choice
    assert resume_point(tmp_path) == tmp_path / LATEST  # the torchrun restart's path chooses the same way


def test_resume_chooses_final_pt_when_it_is_further_on(tmp_path):
    _saved(tmp_path, LATEST, 2)
    _saved(tmp_path, "final.pt", 3)  # Ctrl-C between two periodic checkpoints
    choice = choose_resume(tmp_path)
    held = choice.path == tmp_path / "final.pt" and "latest.pt at step 2" in choice.why
    record("resume chooses: final.pt newer than latest.pt", held)
    assert held, choice


def test_an_unreadable_checkpoint_is_passed_over_and_named(tmp_path):
    _saved(tmp_path, "final.pt", 1)
    (tmp_path / LATEST).write_bytes(b"half a checkpoint")
    choice = choose_resume(tmp_path)
    held = choice.path == tmp_path / "final.pt" and "latest.pt passed over" in choice.why
    record("resume chooses: damaged latest.pt passed over", held)
    assert held, choice


def test_fallbacks_a_mid_step_final_pt_then_best_pt_then_none(tmp_path):
    assert choose_resume(tmp_path).path is None and "no checkpoint" in choose_resume(tmp_path).why
    _saved(tmp_path, "best.pt", 1)
    assert choose_resume(tmp_path).path == tmp_path / "best.pt"
    _saved(tmp_path, "final.pt", 2, mid_step=True)  # a run stopped by an error saves final.pt mid-step
    choice = choose_resume(tmp_path)
    held = choice.path == tmp_path / "final.pt" and "middle of a step" in choice.why
    held = held and resume_point(tmp_path) is None  # a restart of a worker group never goes back to them
    record("resume chooses: fallbacks", held)
    assert held, choice


def test_resume_of_a_folder_without_checkpoint_says_so(tmp_path, capsys):
    code = cli.main(["resume", str(tmp_path), "--threads", "1", "--no-progress"])
    err = capsys.readouterr().err
    held = code == cli.EXIT_USAGE and "nothing to resume" in err and "mtlab train" in err
    record("folder holds a run: resume without one", held)
    assert held, err


# ------------------------------------------------------------------ 2. one rule: a folder that holds a run
@pytest.mark.parametrize("name", ["latest.pt", "final.pt", "best.pt"])
def test_train_refuses_a_folder_that_holds_any_checkpoint(tmp_path, name):
    (tmp_path / name).write_bytes(b"a killed run's checkpoint")
    with pytest.raises(mtlab.ConfigError) as info:
        cli._fresh_expdir(tmp_path, recipe="r.toml")
    held = name in str(info.value) and f"mtlab resume {tmp_path}" in str(info.value)
    record(f"folder holds a run: train refuses {name}", held)
    assert held, str(info.value)
    cli._fresh_expdir(tmp_path, overwrite=True)
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("name", ["latest.pt", "final.pt"])
def test_replay_refuses_an_output_folder_that_holds_a_run_before_replaying(tmp_path, capsys, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_bytes(b"a killed run's checkpoint")
    code = cli.main(["replay", str(tmp_path / "no-such-experiment"), "--expdir", str(out), "--threads", "1"])
    err = capsys.readouterr().err
    held = code == cli.EXIT_USAGE and str(out) in err and name in err and \
        (out / name).read_bytes() == b"a killed run's checkpoint"
    record(f"folder holds a run: replay --expdir refuses {name}", held)
    assert held, err


def test_demo_chooses_a_folder_no_run_holds(tmp_path, monkeypatch):
    """`mtlab demo` without --expdir skips exp/demo when a killed demo left only latest.pt there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp" / "demo").mkdir(parents=True)
    (tmp_path / "exp" / "demo" / LATEST).write_bytes(b"killed")
    chosen = []
    monkeypatch.setattr(cli, "_fresh_expdir", lambda path, *a, **k: chosen.append(path) or (_ for _ in ()).throw(
        KeyboardInterrupt))
    cli.main(["demo", "--threads", "1", "--no-progress"])
    held = chosen == [Path("exp/demo-2")]
    record("folder holds a run: demo skips a killed demo", held)
    assert held, chosen


# ------------------------------------------------------------------ 3. a damaged journal names the file and line
def _journal(tmp_path: Path) -> Path:
    tr = _trainer()
    tr.step()
    tr.lr = 5e-3
    tr.step()
    return tr.journal.write(tmp_path / "journal.jsonl")


DAMAGE = {
    "truncated last line": lambda lines: lines[:-1] + [lines[-1][: len(lines[-1]) // 2]],
    "garbage line": lambda lines: lines[:2] + ["#@! not json"] + lines[2:],
    "entry not an object": lambda lines: lines[:2] + ["[1, 2, 3]"] + lines[2:],
    "object not an entry": lambda lines: lines[:2] + ['{"step": 1}'] + lines[2:],
    "header not a journal": lambda lines: ['{"format": "something else"}'] + lines[1:],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_journal_is_refused_naming_file_and_line(tmp_path, damage):
    path = _journal(tmp_path)
    lines = path.read_text().splitlines()
    damaged = DAMAGE[damage](lines)
    path.write_text("\n".join(damaged) + "\n")
    bad_line = next(i for i, (a, b) in enumerate(zip(damaged + [""], lines + [""]), start=1) if a != b)
    with pytest.raises(mtlab.ConfigError) as info:
        Journal.read_file(path)
    text = str(info.value)
    held = f"{path}, line {bad_line}:" in text
    record(f"damaged journal: {damage}", held)
    assert held, text


def test_replay_of_a_damaged_journal_exits_with_one_message(tmp_path, capsys):
    path = _journal(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1] + [lines[-1][:20]]) + "\n")
    code = cli.main(["replay", str(tmp_path), "--threads", "1"])
    err = capsys.readouterr().err
    held = code == cli.EXIT_USAGE and f"{path}, line {len(lines)}" in err and "Traceback" not in err
    record("damaged journal: mtlab replay exit code", held)
    assert held, err


# ------------------------------------------------------------------ 4. a full disk while the journal is written
def test_a_full_disk_while_the_journal_is_written_leaves_the_old_one_and_no_temporary_file(tmp_path, monkeypatch):
    path = _journal(tmp_path)
    before = path.read_bytes()
    tr = _trainer()
    tr.step(); tr.step(); tr.step()
    real = pathlib.Path.write_text

    def full(self, data, *args, **kwargs):
        real(self, data[: len(data) // 3], *args, **kwargs)  # part of it made it to the disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with pytest.raises(CheckpointError) as info:
        tr.journal.write(path)
    monkeypatch.undo()
    text = str(info.value)
    held = (str(path) in text and "No space left" in text and path.read_bytes() == before
            and sorted(p.name for p in tmp_path.iterdir()) == ["journal.jsonl"])
    record("disk full while journal.jsonl is written", held)
    assert held, (text, sorted(p.name for p in tmp_path.iterdir()))
    assert isinstance(info.value, mtlab.MtlabError) and isinstance(info.value, OSError)


# ------------------------------------------------------------------ the command line: resume after a kill
def _recipe(tmp_path: Path, corpus: Path, num_steps: int = 6) -> Path:
    path = write_tiny_recipe(tmp_path / "tiny.toml", corpus, num_steps=num_steps, valid_frequency=2)
    path.write_text(path.read_text().replace("[trainer]\n", "[trainer]\ncheckpoint_frequency = 1\n", 1))
    return path


def _same_run(a: Path, b: Path) -> bool:
    sa, sb = load_safe(a / "final.pt"), load_safe(b / "final.pt")
    same = sa["step"] == sb["step"] and sa["models"].keys() == sb["models"].keys() and all(
        sa["models"][m].keys() == sb["models"][m].keys()
        and all(torch.equal(v, sb["models"][m][k]) for k, v in sa["models"][m].items()) for m in sa["models"])
    return same and (a / "history.csv").read_text() == (b / "history.csv").read_text() and \
        (a / "validation.csv").read_text() == (b / "validation.csv").read_text()


@pytest.fixture(scope="module")
def reference(tiny_corpus, tmp_path_factory) -> tuple[Path, Path]:
    """The recipe and its uninterrupted run."""
    root = tmp_path_factory.mktemp("reference")
    recipe = _recipe(root, tiny_corpus)
    torch.set_num_threads(1)
    assert cli.main(["train", str(recipe), "--expdir", str(root / "exp"), "--no-progress", "--threads", "1"]) == 0
    return recipe, root / "exp"


@pytest.mark.slow  # trains a recipe twice in-process (a few seconds)
def test_resume_after_a_kill_continues_from_latest_pt(reference, tmp_path, capsys):
    recipe, ref = reference
    exp = tmp_path / "exp"
    assert cli.main(["train", str(recipe), "--expdir", str(exp), "--steps", "3", "--no-progress", "--threads",
                     "1"]) == 0
    for name in ("final.pt", "history.csv", "validation.csv", "journal.jsonl", "summary.json", "summary.txt"):
        (exp / name).unlink()  # what a SIGKILL after step 3 leaves: latest.pt (step 3) and best.pt (step 2)
    capsys.readouterr()
    assert cli.main(["resume", str(exp), "--no-progress", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    held = f"resuming from {exp / LATEST} (step 3" in err and _same_run(exp, ref)
    record("kill then resume: from latest.pt, bit-identical", held)
    assert held, err


KILLER = r"""
import os, signal, sys
from mtlab.apps import cli
where, at = sys.argv[1], int(sys.argv[2])

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

if where.endswith(".pt"):  # while that file is written: its temporary file is complete, not yet renamed
    real, seen = os.replace, []
    def replace(src, dst, *a, **k):
        if str(dst).endswith(where):
            seen.append(dst)
            if len(seen) == at:
                kill()
        return real(src, dst, *a, **k)
    os.replace = replace
else:  # at a trainer event of step `at`: after its first minibatch, after its update, at the loop's step event
    periodic = cli._periodic
    def with_kill(exp, expdir):
        found = periodic(exp, expdir)
        tr = exp.trainer
        tr.add_callback(lambda event, info: kill() if event == where and tr.step_count == at else None)
        return found
    cli._periodic = with_kill
sys.exit(cli.main(sys.argv[3:]))
"""

KILL_POINTS = {  # where: (event or file, step or count)
    "before the first checkpoint": ("minibatch", 0),
    "mid-step after a checkpoint": ("minibatch", 3),
    "after an update, before its checkpoint": ("apply", 4),
    "between a step and its validation": ("step", 4),
    "while latest.pt is written": ("latest.pt", 3),
    "while final.pt is written": ("final.pt", 1),
}


def _killed(where: str, at: int, *args: str) -> None:
    """``mtlab ARGS`` in a process killed with SIGKILL at ``where`` of step ``at`` (KILLER)."""
    proc = subprocess.run([sys.executable, "-c", KILLER, where, str(at), *args, "--no-progress", "--threads", "1"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == -9, proc.stderr[-2000:]  # killed, not finished


@pytest.mark.slow  # one `mtlab train` process per kill point, killed with SIGKILL, then `mtlab resume`
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_kill_at_any_moment_then_resume_ends_bit_identical(point, reference, tmp_path, capsys):
    recipe, ref = reference
    exp = tmp_path / "exp"
    where, at = KILL_POINTS[point]
    _killed(where, at, "train", str(recipe), "--expdir", str(exp))
    capsys.readouterr()
    code = cli.main(["resume", str(exp), "--no-progress", "--threads", "1"])
    err = capsys.readouterr().err
    if at == 0 and where == "minibatch":  # nothing saved yet: resume says so, train starts again in the folder
        assert code == cli.EXIT_USAGE and "nothing to resume" in err, err
        code = cli.main(["train", str(recipe), "--expdir", str(exp), "--no-progress", "--threads", "1"])
    held = code == 0 and _same_run(exp, ref)
    record(f"kill then resume: {point}", held)
    assert held, err


@pytest.mark.slow  # a `mtlab resume` process killed with SIGKILL, then `mtlab resume` again
def test_a_resumed_run_killed_later_continues_from_its_latest_pt_not_the_older_final_pt(reference, tmp_path, capsys):
    recipe, ref = reference
    exp = tmp_path / "exp"
    assert cli.main(["train", str(recipe), "--expdir", str(exp), "--steps", "2", "--no-progress", "--threads",
                     "1"]) == 0  # final.pt at step 2
    _killed("minibatch", 4, "resume", str(exp))  # latest.pt at step 4, final.pt still at step 2
    capsys.readouterr()
    assert cli.main(["resume", str(exp), "--no-progress", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    held = f"resuming from {exp / LATEST} (step 4" in err and "final.pt at step 2" in err and _same_run(exp, ref)
    record("kill then resume: a resumed run killed later", held)
    assert held, err


# ------------------------------------------------------------------ issue 44: replay shows progress and a verdict
@pytest.mark.slow  # trains a recipe and replays it twice (in-process, a few seconds)
def test_replay_shows_progress_and_ends_with_one_verdict_line(reference, tmp_path, capsys):
    import shutil

    _, ref = reference
    exp = tmp_path / "exp"
    shutil.copytree(ref, exp)
    capsys.readouterr()
    assert cli.main(["replay", str(exp), "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    last = out.strip().splitlines()[-1]
    held = "replay" in err and "6/6" in err and last.startswith("replay identical")
    rows = (exp / "history.csv").read_text().splitlines()
    header = rows[0].split(",")
    col = next(i for i, h in enumerate(header) if h.endswith("loss"))
    cells = rows[4].split(",")  # the history row of step 4
    step = cells[header.index("step")]
    cells[col] = "0.125"
    rows[4] = ",".join(cells)
    (exp / "history.csv").write_text("\n".join(rows) + "\n")
    assert cli.main(["replay", str(exp), "--threads", "1", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    last = out.strip().splitlines()[-1]
    held = held and last.startswith("replay differs") and f"first at step {step}" in last and header[col] in last \
        and "replay" not in err
    record("replay: progress and verdict", held)
    assert held, (last, err)
