"""Loggers through the listener interface: the files each one writes are read back offline."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers.paths import REPO, TESTS

import mtlab
from mtlab.base.errors import ConfigError
from mtlab.training.loggers import CSVLogger, LoggerGroup, make

SAMPLES = REPO / "data_samples"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 training and 4 dev utterances of data_samples/ (absolute-path lists)."""
    root = tmp_path_factory.mktemp("corpus")
    for split, n in {"train": 8, "dev": 4}.items():
        (root / split).mkdir()
        for name in ("mix_clean.scp", "mix_noisy.scp", "s1.scp", "s2.scp", "spk.txt"):
            lines = (SAMPLES / split / name).read_text().splitlines()[:n]
            if name.endswith(".scp"):
                lines = [f"{k} {(SAMPLES / split / v).resolve()}" for k, v in (ln.split() for ln in lines)]
            (root / split / name).write_text("\n".join(lines) + "\n")
    (root / "speakers.tsv").write_text((SAMPLES / "speakers.tsv").read_text())
    return root


def recipe(root: Path, batch_size: int = 8, k: int = 1) -> dict:
    """Speaker id and frame dominance on a shared BLSTM, clean and noisy linked sets (noisy weighs 0.5)."""
    sets = {ls: {"weight": w, "data": {"root": str(root), "split": "train", "linkedset": ls}, "valid": {"split": "dev"}}
            for ls, w in (("clean", 1.0), ("noisy", 0.5))}
    node = {"name": "h", "model": "enc", "inputs": ["features"]}
    return {
        "name": "loggers",
        "trainer": {"num_steps": 3, "batch_size": batch_size, "numbatches_to_aggregate": k, "numbuckets": 1,
                    "initial_learning_rate": 1e-2, "clip_grad_value": 0.05, "seed": 0, "device": "cpu"},
        "models": {"enc": {"type": "BLSTM", "input_dim": 129, "hidden": 8}, "pool": {"type": "MeanPool"},
                   "spk_head": {"type": "Linear", "in_features": 16, "out_features": 10},
                   "frame_head": {"type": "Linear", "in_features": 16, "out_features": 3}},
        "tasks": {
            "spk": {"inputs": ["features"], "targets": ["spk"], "outputs": ["logits"],
                    "nodes": [node, {"name": "p", "model": "pool", "inputs": ["h"]},
                              {"name": "logits", "model": "spk_head", "inputs": ["p"]}],
                    "loss": {"type": "crossentropy", "output": "logits", "target": "spk"}, "linkedsets": sets},
            "frames": {"inputs": ["features"], "targets": ["frame_target"], "outputs": ["logits"],
                       "nodes": [node, {"name": "logits", "model": "frame_head", "inputs": ["h"]}],
                       "loss": {"type": "crossentropy", "output": "logits", "target": "frame_target"},
                       "linkedsets": sets},
        },
    }


def build(spec: dict):  # noqa: ANN201 (a Trainer)
    """The trainer of a recipe dict (``mtlab.from_recipe`` once the shell offers it)."""
    if hasattr(mtlab, "from_recipe"):
        return mtlab.from_recipe(spec).trainer
    from mtlab.apps.recipe import build_trainer

    return build_trainer(spec)


def validation_record(trainer) -> dict:  # noqa: ANN001
    """A validation record as the loop makes one: Σloss/Σnorm of every linked set's dev data."""
    record: dict = {"step": trainer.step_count}
    for tname, task in trainer.tasks.items():
        for sname in task.linkedsets:
            record[f"{tname}/{sname}"] = trainer.evaluate(tname, sname)
    record["loss"] = sum(v for k, v in record.items() if "/" in k)
    record["action"] = "better"  # a text: not a scalar, left out
    return record


def read_tensorboard(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_csv(path: Path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            out.setdefault(row["tag"], []).append((int(row["step"]), float(row["value"])))
    return out


@pytest.mark.slow
def test_logged_loss_and_step_axis_do_not_change_with_accumulation(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard comes with the loggers extra")
    logged = {}
    for batch_size, k in ((8, 1), (2, 4)):  # the same 8 utterances per step: one minibatch of 8, or 4 of 2
        trainer = build(recipe(corpus, batch_size, k))
        folder = tmp_path / f"k{k}"
        logger = make(["csv", "tensorboard"], folder).attach(trainer)
        for _ in range(3):
            trainer.step()
        logger.close()
        assert logger not in trainer.callbacks
        history = trainer.log.rows()
        events = read_tensorboard(folder / "tensorboard")
        lines = read_csv(folder / "scalars.csv")
        for tag in ("frames/loss", "spk/loss", "frames/clean/loss", "spk/noisy/loss", "lr", "frames/grad_norm",
                    "frames/grad_norm_clipped", "spk/clip_fraction", "spk/noisy/weight", "frames/weight"):
            expected = [(r["step"], float(r[tag])) for r in history]
            assert [s for s, _ in events[f"train/{tag}"]] == [1, 2, 3]  # optimizer steps, not minibatches
            assert [s for s, _ in lines[f"train/{tag}"]] == [1, 2, 3]
            for (_, got), (_, want) in zip(events[f"train/{tag}"], expected):
                assert got == pytest.approx(want, rel=1e-6)  # event files store float32
            assert [v for _, v in lines[f"train/{tag}"]] == [v for _, v in expected]
        assert events["train/spk/noisy/weight"][0][1] == 0.5
        assert 0 < events["train/frames/clip_fraction"][0][1] <= 1
        logged[k] = events
    for tag in ("train/frames/loss", "train/spk/loss", "train/frames/noisy/loss"):
        ones = [v for _, v in logged[1][tag]]
        fours = [v for _, v in logged[4][tag]]
        assert fours == pytest.approx(ones, rel=1e-4), tag


@pytest.mark.slow
def test_tensorboard_validation_and_buffering(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard comes with the loggers extra")
    trainer = build(recipe(corpus))
    logger = make({"type": "tensorboard", "flush_every": 100}, tmp_path).attach(trainer)
    trainer.step()
    assert "train/frames/loss" not in read_tensorboard(tmp_path / "tensorboard")  # buffered: no sync per step
    record = validation_record(trainer)
    logger("validation", {"step": trainer.step_count, "record": record})  # what the loop emits
    trainer.step()
    logger("run_end", {"step": trainer.step_count})
    events = read_tensorboard(tmp_path / "tensorboard")
    assert [s for s, _ in events["train/frames/loss"]] == [1, 2]
    assert events["valid/loss"] == [(1, pytest.approx(record["loss"], rel=1e-6))]
    assert events["valid/frames/noisy"][0][1] == pytest.approx(record["frames/noisy"], rel=1e-6)
    assert "valid/action" not in events
    logger.close()


@pytest.mark.slow
def test_rows_cut_by_a_restore_are_not_logged(corpus: Path, tmp_path: Path) -> None:
    trainer = build(recipe(corpus))
    logger = CSVLogger(tmp_path, flush_every=100).attach(trainer)
    trainer.step()
    snapshot = trainer.state_dict()
    trainer.step()
    trainer.step()
    trainer.load_state_dict(snapshot)  # go_back: steps 2 and 3 are undone
    trainer.step()
    logger.close()
    history = trainer.log.rows()
    assert [r["step"] for r in history] == [1, 2]
    assert read_csv(tmp_path / "scalars.csv")["train/frames/loss"] == [(r["step"], r["frames/loss"]) for r in history]


def test_rows_carried_by_the_event_need_no_trainer(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_every=1)
    logger("apply", {"step": 7, "row": {"step": 7, "lr": torch.tensor(0.5), "t/loss": 1.25, "skipped": False,
                                        "note": "text"}})
    logger.close()
    assert read_csv(tmp_path / "scalars.csv") == {"train/lr": [(7, 0.5)], "train/t/loss": [(7, 1.25)],
                                                  "train/skipped": [(7, 0.0)]}
    with pytest.raises(ConfigError, match=r"logger.attach\(trainer\)"):
        CSVLogger(tmp_path / "b")("apply", {"step": 1})


@pytest.mark.slow
def test_mlflow_store_reads_back(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="mlflow comes with the loggers extra")
    from mlflow.tracking import MlflowClient

    trainer = build(recipe(corpus))
    logger = make({"type": "mlflow", "experiment": "sep", "run_name": "k1", "params": {"batch_size": 8}},
                  tmp_path).attach(trainer)
    trainer.step()
    trainer.step()
    record = validation_record(trainer)
    logger("validation", {"step": 2, "record": record})
    logger("apply", {"step": 3, "row": {"step": 3, "pair/a,b": 2.0}})  # a name MLflow refuses as it is
    logger.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "k1" and run.data.params == {"batch_size": "8"}
    history = trainer.log.rows()
    for tag in ("frames/loss", "spk/clean/loss", "lr", "spk/grad_norm", "frames/clip_fraction", "spk/noisy/weight"):
        got = sorted((m.step, m.value) for m in client.get_metric_history(logger.run_id, f"train/{tag}"))
        assert got == [(r["step"], pytest.approx(float(r[tag]))) for r in history]
    # Names MLflow refuses (a "," as in the tasks pair "spk,frames") are written with "_".
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "train/pair/a_b")] == [(3, 2.0)]
    cosines = [k for k in history[0] if "," in k]
    for key in cosines:
        got = [m.value for m in client.get_metric_history(logger.run_id, "train/" + key.replace(",", "_"))]
        assert got == [pytest.approx(float(r[key])) for r in history]
    valid = client.get_metric_history(logger.run_id, "valid/loss")
    assert [(m.step, m.value) for m in valid] == [(2, pytest.approx(record["loss"]))]


@pytest.mark.slow
def test_trackio_local_store_reads_back(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("trackio", reason="trackio comes with the loggers extra")
    script = textwrap.dedent(f"""
        import json, sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(TESTS)!r}]  # this file and the helpers
        import torch
        torch.set_num_threads(1)
        from pathlib import Path
        from test_loggers import build, recipe
        from mtlab.training.loggers import make
        trainer = build(recipe(Path({str(corpus)!r})))
        logger = make({{"type": "trackio", "project": "sep", "run_name": "r1"}}, {str(tmp_path)!r}).attach(trainer)
        trainer.step(); trainer.step()
        logger.close()
        from trackio.sqlite_storage import SQLiteStorage
        logs = SQLiteStorage.get_logs("sep", "r1")
        print("RESULT " + json.dumps({{"logs": [{{k: v for k, v in d.items() if k.startswith("train/") or k == "step"}}
                                    for d in logs], "history": trainer.log.rows()}}))
    """)
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert (tmp_path / "trackio" / "sep.db").is_file()
    assert [d["step"] for d in out["logs"]] == [1, 2]
    for got, row in zip(out["logs"], out["history"]):
        for tag in ("frames/loss", "spk/noisy/loss", "lr", "frames/grad_norm", "spk/clean/weight"):
            assert got[f"train/{tag}"] == pytest.approx(row[tag])


def test_factory_names_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    group = make("csv, csv", tmp_path)
    assert isinstance(group, LoggerGroup) and [type(lg) for lg in group.loggers] == [CSVLogger, CSVLogger]
    group.close()
    with pytest.raises(ConfigError, match="unknown logger 'wandb'; choose from csv, tensorboard, mlflow, trackio"):
        make("wandb", tmp_path)
    with pytest.raises(ConfigError, match="needs type"):
        make({"experiment": "x"}, tmp_path)
    with pytest.raises(ConfigError, match="logger 'csv'.*colour"):
        make({"type": "csv", "colour": "red"}, tmp_path)
    with pytest.raises(ConfigError, match="flush_every must be >= 1"):
        make({"type": "csv", "flush_every": 0}, tmp_path)
    for name, module in (("tensorboard", "tensorboard"), ("mlflow", "mlflow"), ("trackio", "trackio")):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
        with pytest.raises(ImportError, match=r'pip install "mtlab\[loggers\]"'):
            make(name, tmp_path)


TOML = """\
name = "cli-log"
[trainer]
num_steps = 4
batch_size = 4
numbuckets = 1
valid_frequency = 2
initial_learning_rate = 0.01
device = "cpu"
[models.enc]
type = "BLSTM"
input_dim = 129
hidden = 8
[models.head]
type = "Linear"
in_features = 16
out_features = 3
[tasks.frames]
inputs = ["features"]
targets = ["frame_target"]
outputs = ["logits"]
nodes = [{{ name = "h", model = "enc", inputs = ["features"] }}, {{ name = "logits", model = "head", inputs = ["h"] }}]
loss = {{ type = "crossentropy", output = "logits", target = "frame_target" }}
[tasks.frames.linkedsets.clean]
data = {{ root = "{root}", split = "train", linkedset = "clean" }}
valid = {{ split = "dev" }}
"""


@pytest.mark.slow
def test_cli_log_option_writes_train_and_validation_scalars(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard comes with the loggers extra")
    from mtlab.apps.cli import main

    path = tmp_path / "r.toml"
    path.write_text(TOML.format(root=corpus))
    expdir = tmp_path / "exp"
    assert main(["train", str(path), "--expdir", str(expdir), "--no-progress", "--log", "csv,tensorboard"]) == 0
    events = read_tensorboard(expdir / "tensorboard")
    lines = read_csv(expdir / "scalars.csv")
    history = pd.read_csv(expdir / "history.csv")
    validation = pd.read_csv(expdir / "validation.csv")
    assert [s for s, _ in events["train/frames/loss"]] == list(history["step"]) == [1, 2, 3, 4]
    assert [v for _, v in lines["train/frames/loss"]] == pytest.approx(list(history["frames/loss"]))
    # The loop's validation records (every 2 steps), as validation.csv has them.
    assert [s for s, _ in events["valid/loss"]] == list(validation["step"]) == [2, 4]
    assert [v for _, v in lines["valid/frames/clean"]] == pytest.approx(list(validation["frames/clean"]))
    assert main(["train", str(path), "--expdir", str(tmp_path / "e2"), "--log", "wandb"]) == 2


@pytest.mark.slow
def test_recipe_log_key_chooses_the_loggers_and_names_a_bad_one(corpus: Path, tmp_path: Path) -> None:
    from mtlab.apps.cli import main

    path = tmp_path / "r.toml"
    path.write_text(TOML.format(root=corpus).replace('device = "cpu"', 'device = "cpu"\nlog = ["csv"]'))
    expdir = tmp_path / "exp"
    assert main(["train", str(path), "--expdir", str(expdir), "--no-progress"]) == 0
    lines = read_csv(expdir / "scalars.csv")
    history = pd.read_csv(expdir / "history.csv")
    assert [v for _, v in lines["train/frames/loss"]] == pytest.approx(list(history["frames/loss"]))
    bad = tmp_path / "bad.toml"
    bad.write_text(TOML.format(root=corpus).replace('device = "cpu"', 'device = "cpu"\nlog = ["tensorbord"]'))
    with pytest.raises(ConfigError, match="did you mean 'tensorboard'"):
        mtlab.from_recipe(bad)


def test_a_buffering_logger_adds_no_host_read_to_the_step(tmp_path: Path) -> None:
    from helpers import make_examples, make_models, task_a, task_b
    from helpers.trainers import no_host_reads

    ex = make_examples(24, 3)
    trainer = mtlab.Trainer(make_models(), [task_a((ex, ex)), task_b(ex, weight=0.5)], clip_grad_value=0.5,
                            numbatches_to_aggregate=2, device="cpu", nonfinite="skip")
    logger = make({"type": "csv", "flush_every": 100}, tmp_path).attach(trainer)
    trainer.step()  # the optimizer's state is created outside the guard
    with no_host_reads():
        for _ in range(3):
            trainer.step()
    items = []
    real_item = torch.Tensor.item
    torch.Tensor.item = lambda self: items.append(1) or real_item(self)  # type: ignore[method-assign]
    try:
        logger.close()  # the one read of all buffered rows, through the history: no .item() per value
    finally:
        torch.Tensor.item = real_item  # type: ignore[method-assign]
    assert items == []
    history = trainer.log.rows()
    assert read_csv(tmp_path / "scalars.csv")["train/a/loss"] == [(r["step"], r["a/loss"]) for r in history]
    assert len(history) == 4


@pytest.mark.slow  # MLflow creates its SQLite store: tens of seconds
def test_mlflow_resume_continues_the_same_run(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlflow", reason="mlflow comes with the loggers extra")
    from mlflow.tracking import MlflowClient

    trainer = build(recipe(corpus))
    first = make("mlflow", tmp_path).attach(trainer)
    trainer.step()
    trainer.step()
    first.close()
    second = make("mlflow", tmp_path).attach(trainer)  # what `mtlab resume --log mlflow` makes
    trainer.step()
    second.close()
    assert second.run_id == first.run_id
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "mtlab"]
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [first.run_id]
    assert [m.step for m in client.get_metric_history(first.run_id, "train/lr")] == [1, 2, 3]
    assert client.get_run(first.run_id).info.status == "FINISHED"
