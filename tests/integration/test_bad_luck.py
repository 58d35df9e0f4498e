"""Bad luck, round 4: a Ctrl-C at the final save, a skip that finds no readable file, half-loaded states, stale
caches, worker errors, documented imports, a busy machine, a wrong loss target and honest progress.
Each case says what it tried (tests/helpers/campaign.py); scripts/reliability_report.py prints the table."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO
from helpers.campaign import record

import mtlab
import mtlab.data

ROOT = REPO
DEMO = ROOT / "recipes" / "demo.toml"
pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ 1. Ctrl-C while the final checkpoint is written
@pytest.mark.slow
def test_ctrl_c_while_final_pt_is_written_keeps_the_run(tmp_path, monkeypatch, capsys, sigint_raises):
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


def test_a_state_taken_at_another_batch_size_brings_its_batch_size_back():
    saved = _trainer()
    saved.step(); saved.step()
    tr = _trainer(batch_size=2)
    tr.step()
    tr.load_state_dict(saved.state_dict())  # a batch size is a knob: the state's comes back with it
    assert tr.tasks["a"].batch_size == tr.tasks["b"].batch_size == 4
    saved.step(); tr.step()
    parts = ("models", "update", "tasks", "streams", "knobs", "step")
    assert _same({k: _everything(saved)[k] for k in parts}, {k: _everything(tr)[k] for k in parts})


@pytest.mark.parametrize("other", ["numbuckets", "list_size"])
def test_a_state_with_other_stream_settings_is_refused_before_anything_changes(other):
    saved = _trainer()
    saved.step(); saved.step()
    state = saved.state_dict()
    kw = {"numbuckets": {"numbuckets": 3}, "list_size": {"n": 12}}[other]
    tr = _trainer(**kw)
    tr.step()
    before = _everything(tr)
    with pytest.raises(mtlab.ConfigError, match=other if other != "list_size" else "size"):
        tr.load_state_dict(state)
    held = _same(before, _everything(tr))
    record(f"half-loaded state refused: other {other}", held)
    assert held


# ------------------------------------------------------------------ 7. every documented module path imports
def _aliases() -> dict[str, str]:
    """``mtlab.<short>`` -> the module it names, for every short name mtlab documents."""
    return {name: f"mtlab.{target}" for name, target in mtlab._SUBMODULES.items()}


LIGHT = ["debug", "loop", "checkpoint", "state", "recipe", "launch", "cli", "combine", "weighting", "sampling",
         "distributed", "loggers"]


def test_documented_module_paths_import_in_process():
    import importlib

    for name in LIGHT:
        module = importlib.import_module(f"mtlab.{name}")
        assert module is importlib.import_module(_aliases()[name]), name
    from mtlab.debug import explain  # noqa: F401
    from mtlab.recipe import from_recipe  # noqa: F401
    import mtlab.loggers as loggers

    assert loggers is mtlab.training.loggers
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mtlab.no_such_module")


@pytest.mark.slow  # starts one fresh interpreter per documented module path
def test_every_documented_module_path_imports_in_a_fresh_interpreter():
    import subprocess
    import sys

    code = ("import importlib, sys; import mtlab.{name}; from mtlab.{name} import *; "
            "m = sys.modules['mtlab.{name}']; assert m is importlib.import_module('{target}'), m; "
            "assert mtlab.{name} is m")
    procs = {name: subprocess.Popen([sys.executable, "-c", code.format(name=name, target=target)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
             for name, target in _aliases().items()}
    failed = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            failed[name] = out.strip().splitlines()[-1:]
    record("documented module paths import", not failed)
    assert not failed, failed


# ------------------------------------------------------------------ 6. messages and exit codes
def test_a_checkpoint_from_a_newer_mtlab_is_refused_naming_the_file(tmp_path):
    tr = _trainer()
    path = tmp_path / "newer.pt"
    tr.save(path)
    state = torch.load(path, weights_only=True)
    state["version"] = 99
    mtlab.core.state.save_atomic(state, path)
    with pytest.raises(mtlab.MtlabError) as info:
        _trainer().load_checkpoint(path)
    held = str(path) in str(info.value) and "version" in str(info.value)
    record("message: newer checkpoint names the file", held)
    assert held, str(info.value)


def test_saving_under_a_path_that_is_a_regular_file_names_it(tmp_path):
    from mtlab.core.state import CheckpointError

    blocker = tmp_path / "runs"
    blocker.write_text("a file, not a folder")
    with pytest.raises(CheckpointError) as info:
        _trainer().save(blocker / "ck.pt")
    held = str(blocker) in str(info.value) and "not a folder" in str(info.value)
    record("message: saving under a regular file", held)
    assert held, str(info.value)


@pytest.mark.parametrize("workers", ["2", 1.5, -1, True])
def test_linkedset_num_workers_must_be_a_count(workers):
    with pytest.raises(mtlab.ConfigError, match="num_workers"):
        mtlab.LinkedSet([{"x": torch.zeros(2, 4)}], num_workers=workers)
    record("message: LinkedSet num_workers checked", True)


@pytest.mark.parametrize("weight", [True, "0.25"])
def test_weights_must_be_numbers(weight):
    from helpers import make_examples, task_b

    with pytest.raises(mtlab.ConfigError, match="weight"):
        mtlab.LinkedSet(make_examples(2, 0), weight=weight)
    with pytest.raises(mtlab.ConfigError, match="weight"):
        task_b(make_examples(2, 0), weight=weight)
    record("message: weights must be numbers", True)


@pytest.mark.parametrize("composite", ["step", "run"])
def test_a_refused_step_says_what_it_kept_in_its_message(composite, monkeypatch):
    """The dashboard's status line and the command line show str(exc): the promise must be in it."""
    tr = _trainer()
    tr.step()

    def fail(*args, **kwargs):
        raise mtlab.NonFiniteError("injected at apply")

    monkeypatch.setattr(tr.update, "step", fail)
    with pytest.raises(mtlab.NonFiniteError) as info:
        tr.step() if composite == "step" else mtlab.run(tr, steps=1, progress=False)
    text = str(info.value)
    held = text.startswith("injected at apply") and (
        "kept for inspection" in text if composite == "step" else
        "rolled back" in text and "kept for inspection" not in text)
    record(f"message: refused {composite}() says what it kept", held)
    assert held, text


# ------------------------------------------------------------------ 9. a wrong loss target
def _wrong_target(tmp_path: Path) -> Path:
    text = DEMO.read_text()
    bad = text.replace('target = "frame_target"', 'target = "frame_targets"', 1)
    assert bad != text
    path = tmp_path / "wrong.toml"
    path.write_text(bad)
    return path


def test_a_wrong_loss_target_is_named_before_any_data_work(tmp_path, monkeypatch):
    from mtlab.apps import recipe as recipes

    def no_data(*args, **kwargs):
        raise AssertionError("the data were loaded before the recipe was checked")

    monkeypatch.setattr(recipes, "_named_dataset", no_data)
    path = _wrong_target(tmp_path)
    with pytest.raises(mtlab.ConfigError) as info:
        recipes.from_recipe(path)
    text = str(info.value)
    held = str(path) in text and "tasks.frames" in text and "frame_targets" in text and "frame_target" in text
    record("wrong loss target: named before the data", held)
    assert held, text


def test_a_dead_experiment_folder_names_both_ways_out(tmp_path, capsys):
    from mtlab.apps import cli

    exp = tmp_path / "e"
    exp.mkdir()
    (exp / "final.pt").write_bytes(b"a run stopped by an error")
    (exp / "history.csv").write_text("step\n")
    with pytest.raises(mtlab.ConfigError) as info:
        cli._fresh_expdir(exp)
    text = str(info.value)
    assert "--overwrite" in text and f"mtlab resume {exp}" in text, text
    cli._fresh_expdir(exp, overwrite=True)  # starts again: the old run's files go
    held = not (exp / "final.pt").exists() and not (exp / "history.csv").exists()
    record("wrong loss target: train --overwrite starts again", held)
    assert held
    assert cli._parser().parse_args(["train", "r.toml", "--expdir", "e", "--overwrite"]).overwrite


# ------------------------------------------------------------------ 8. threads of the Python API on a busy machine
@pytest.fixture
def busy(monkeypatch):
    """Two CPUs at load 9, torch still at its own thread count (2), no MTLAB_THREADS."""
    from mtlab.base import threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "_STARTED", 2)
    monkeypatch.setattr(threads, "_CHOSEN", None)
    monkeypatch.setattr(threads, "_FIXED", False)
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.delenv("MTLAB_THREADS", raising=False)
    yield threads
    torch.set_num_threads(before)


def test_the_python_api_chooses_threads_from_the_free_cpus(busy, monkeypatch):
    _trainer()
    held = torch.get_num_threads() == 1
    record("busy machine: Trainer chooses threads", held)
    assert held
    torch.set_num_threads(2)
    monkeypatch.setenv("MTLAB_THREADS", "2")
    _trainer()
    assert torch.get_num_threads() == 2  # MTLAB_THREADS overrides the choice
    monkeypatch.delenv("MTLAB_THREADS")
    mtlab.run(_trainer(), steps=1, progress=False, threads=2)
    assert torch.get_num_threads() == 2  # and threads= of run
    _trainer()
    assert torch.get_num_threads() == 2  # which stays chosen (as the command line's --threads 2 does)


def test_a_program_that_chose_its_threads_keeps_them_and_hears_the_machine_is_busy(busy, caplog):
    torch.set_num_threads(3)  # the program's own count
    tr = _trainer()
    assert torch.get_num_threads() == 3
    with caplog.at_level("INFO", logger="mtlab"):
        mtlab.run(tr, steps=1, progress=False)
    held = "oversubscribed" in caplog.text and "MTLAB_THREADS" in caplog.text
    record("busy machine: run warns at the first step", held)
    assert held, caplog.text


# ------------------------------------------------------------------ 10. honest progress
def test_the_bar_never_goes_back_and_ends_full_after_a_go_back(monkeypatch):
    import tqdm.auto

    from mtlab.training.schedule import Schedule

    seen: list[tuple[int, int]] = []

    class Recorded(tqdm.auto.tqdm):
        def refresh(self, *args, **kwargs):
            seen.append((self.n, self.total))
            return super().refresh(*args, **kwargs)

        def update(self, n=1):
            seen.append((self.n, self.total))
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    tr = _trainer()
    saved: dict = {}

    def go_back() -> bool:  # as a worse validation at step 4 would: back to step 2
        if tr.step_count == 2 and not saved:
            saved.update(tr.state_dict())
        elif tr.step_count == 4 and "done" not in saved:
            saved["done"] = True
            tr.load_state_dict({k: v for k, v in saved.items() if k != "done"})
        return False

    run_schedule = Schedule(num_steps=6, initial_learning_rate=1e-2)
    mtlab.run(tr, schedule=run_schedule, between_steps=go_back, progress=True)
    counts = [n for n, _ in seen]
    held = counts == sorted(counts) and seen[-1][0] == seen[-1][1] == 8  # 8 steps run to reach step 6
    record("honest progress: the bar after a go-back", held)
    assert held, seen


def test_the_summary_explains_steps_undone_and_a_run_of_no_step():
    from mtlab.training.expdir import _text

    base = {"recipe": "demo", "step": 150, "num_steps": 375, "steps_run": 275, "start_step": 0, "stop": "num_tries",
            "wall_s": 412.5, "s_per_step": 1.5, "device": "cpu", "train_loss_first5": {}, "train_loss_last5": {},
            "best_validation": None, "skipped_steps": []}
    text = _text(base)
    assert "275 run this time" in text and "125 undone" in text and "best" in text, text
    text = _text({**base, "step": 0, "steps_run": 0, "wall_s": 0.4, "s_per_step": None})
    held = "None" not in text and "no step run" in text
    record("honest progress: summary of a run of no step", held)
    assert held, text


def test_load_split_in_memory_reports_progress(tmp_path):
    from helpers.corpora import make_corpus

    make_corpus(tmp_path, ["a", "b", "c", "d"])
    seen: list[tuple[int, int]] = []
    mtlab.data.load_split(tmp_path, split="train", linkedset="clean", progress=lambda d, t: seen.append((d, t)))
    held = bool(seen) and seen[-1] == (4, 4)
    record("honest progress: load_split reports", held)
    assert held, seen


def test_evaluate_names_the_split_flag(tmp_path, monkeypatch, capsys):
    from mtlab.apps import cli, recipe

    class Exp:
        trainer = _trainer()

    def no_such_split(exp, task, linkedset, split):
        raise mtlab.data.DataError(f"/corpus/{split}: list folder not found")

    monkeypatch.setattr(recipe, "load", lambda path, **kw: Exp())
    monkeypatch.setattr(recipe, "load_split_for", no_such_split)
    (tmp_path / "final.pt").write_bytes(b"")
    code = cli.main(["evaluate", str(tmp_path), "--split", "tset", "--threads", "1"])
    err = capsys.readouterr().err
    held = code == cli.EXIT_USAGE and "--split tset" in err
    record("honest progress: evaluate names --split", held)
    assert held, err


def test_prepare_prints_a_root_usable_from_a_recipe_anywhere(tmp_path, monkeypatch, capsys):
    from mtlab.apps import cli
    from helpers.corpora import make_layouts

    make_layouts.make_tree("wsj0-2mix", tmp_path / "corpus", 2)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["prepare", "wsj0-2mix", "corpus", "--out", "lists"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("recipe data:")][0]
    root = line.split('root = "')[1].split('"')[0]
    held = Path(root).is_absolute() and Path(root) == (tmp_path / "lists").resolve()
    record("honest progress: prepare prints a usable root", held)
    assert held, line


def test_an_imported_recipe_carries_no_absolute_path_in_its_description(tmp_path):
    from helpers.nabu import write_recipe

    from mtlab.nabu import import_nabu

    recipe = import_nabu(write_recipe(tmp_path / "MERL"))
    held = str(tmp_path) not in recipe["description"] and "MERL" in recipe["description"]
    record("honest progress: imported description", held)
    assert held, recipe["description"]
