"""Recipes: parsing, the original's INI trainer.cfg, errors that name key and file, checkpoints."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import script_validations
from helpers.paths import REPO, TESTS

import mtlab
from mtlab.core.state import CheckpointError, load_safe, save_atomic
from mtlab.apps.recipe import from_recipe, load, load_recipe, load_trainer_cfg, trainer_settings
from helpers.recipes import TINY_TOML, write_tiny_recipe


pytestmark = pytest.mark.usefixtures("one_thread")


def test_demo_recipe_parses_without_loading_data() -> None:
    recipe = load_recipe(REPO / "recipes" / "demo.toml")
    settings = trainer_settings(recipe)
    assert list(recipe["tasks"]) == ["spk", "frames"]
    assert settings["nonfinite"] == "skip" and settings["numbatches_to_aggregate"] == 1
    assert recipe["tasks"]["spk"]["linkedsets"]["noisy"]["valid"] == {
        "corpus": "samples", "split": "dev", "linkedset": "noisy"}
    assert recipe["models"]["enc"]["type"] == "BLSTM"


@pytest.mark.slow  # over a second of CPU (tests/README.md)
def test_build_trainer_records_stats_and_derives_steps(tiny_corpus: Path, tmp_path: Path) -> None:
    path = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=0)
    exp = from_recipe(path)
    trainer = exp.trainer
    assert trainer.nonfinite == "skip" and trainer.clip_grad_value == 1.0 and trainer.device.type == "cpu"
    assert set(exp.recipe["stats"]) == {f"{tiny_corpus}:clean", f"{tiny_corpus}:noisy"}
    stats = mtlab.data.FeatureStats.from_dict(exp.recipe["stats"][f"{tiny_corpus}:clean"])
    ls = trainer.tasks["spk"].linkedsets["clean"]
    assert torch.equal(stats.mean, ls.examples.stats.mean) and ls.valid.stats is ls.examples.stats
    # num_epochs = 1 (default): ceil(1 x 8 utterances / (3 x 1)) = 3, the max over every linked set
    assert exp.schedule.num_steps == 3
    again = from_recipe(exp.recipe).trainer  # the recorded stats are used, nothing recomputed
    assert all(torch.equal(p, again.params[k]) for k, p in trainer.params.items())


def test_ini_trainer_cfg_is_read(tmp_path: Path, tiny_corpus: Path) -> None:
    cfg = load_trainer_cfg(REPO / "recipes" / "trainer.cfg")
    assert cfg["normalize_gradients"] is True and isinstance(cfg["numbatches_to_aggregate"], int)
    (tmp_path / "trainer.cfg").write_text(textwrap.dedent("""\
        [trainer]
        tasks = frames spk
        num_epochs = 2
        initial_learning_rate = 1e-3
        learning_rate_decay = 0.1
        clip_grad_value = 5
        normalize_gradients = False
        batch_size = 4
        numbatches_to_aggregate = 2
        numbuckets = 1
        valid_frequency = 10
        valid_adapt = True
        go_back = False
        num_tries = 5
        reset_tries = True
        task_weights = 0.5 1
        acc_steps = False
        normalize_weights_acc_steps = False
        """))
    cfg = load_trainer_cfg(tmp_path / "trainer.cfg")
    assert cfg["tasks"] == ["frames", "spk"] and cfg["task_weights"] == [0.5, 1.0]
    assert cfg["normalize_gradients"] is False and cfg["valid_adapt"] is True
    assert cfg["numbatches_to_aggregate"] == 2 and cfg["clip_grad_value"] == 5.0
    text = write_tiny_recipe(tmp_path / "r.toml", tiny_corpus).read_text()
    text = 'trainer_cfg = "trainer.cfg"\n' + text
    for line in ("batch_size = 3\n", "num_tries = 3\n", "numbatches_to_aggregate = 1\n"):
        text = text.replace(line, "")
    (tmp_path / "r.toml").write_text(text)
    recipe = load_recipe(tmp_path / "r.toml")
    settings = trainer_settings(recipe)
    assert settings["num_tries"] == 5 and settings["batch_size"] == 4  # from the INI
    assert settings["valid_frequency"] == 2  # the TOML table wins
    assert "trainer_cfg" not in recipe  # merged: the stored recipe is self-contained
    trainer = from_recipe(recipe).trainer
    assert list(trainer.tasks) == ["frames", "spk"] and trainer.tasks["frames"].weight == 0.5
    assert trainer.numbatches_to_aggregate == 2 and trainer.normalize_gradients is False


BAD = [
    ("numbatches_to_aggregate = 1", "numbatches_to_aggregate = 0", ["numbatches_to_aggregate", ">= 1"]),
    ("numbatches_to_aggregate = 1", "numbatches_to_agregate = 2", ["did you mean 'numbatches_to_aggregate'"]),
    ("batch_size = 3", 'batch_size = "3"', ["batch_size", "integer"]),
    ('nonfinite = "skip"', 'nonfinite = "ignore"', ["nonfinite", "raise, skip"]),
    ("weight = 0.5", "weight = -0.5", ["[tasks.frames.linkedsets.noisy]", "weight", ">= 0"]),
    ('model = "frame_head"', 'model = "frame_haed"', ["model 'frame_haed'", "did you mean 'frame_head'"]),
    ('type = "crossentropy", output = "logits", target = "spk"',
     'type = "crossentropi", output = "logits", target = "spk"', ["loss type", "did you mean 'crossentropy'", "mse"]),
    ('type = "BLSTM"', 'type = "BLTSM"', ["[models.enc]", "did you mean 'BLSTM'", "FeedForward"]),
    ('targets = ["spk"]', 'targets = ["speaker"]', ["data key 'speaker'", "spk_pair"]),
    ('name = "tiny"', 'name = "tiny"\nnum_epoch = 3', ["unknown key 'num_epoch'", "top level"]),
    ('out_features = 3', 'out_feature = 3', ["[models.frame_head]", "out_feature"]),
    ("hidden = 4", "hiden = 4", ["[models.enc]", "unknown setting 'hiden'", "did you mean 'hidden'", "input_dim"]),
]


@pytest.mark.parametrize("old,new,expect", BAD, ids=[b[1].split("=")[0].strip()[:24] for b in BAD])
def test_bad_recipes_name_the_key_and_the_file(tmp_path: Path, tiny_corpus: Path, old: str, new: str,
                                               expect: list[str]) -> None:
    path = write_tiny_recipe(tmp_path / "bad_recipe.toml", tiny_corpus)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(mtlab.ConfigError) as info:
        from_recipe(path)
    message = str(info.value)
    assert "bad_recipe.toml" in message
    for part in expect:
        assert part in message, message


@pytest.mark.parametrize("where", ["[tasks.spk.linkedsets.clean] data", "[tasks.spk.linkedsets.clean] valid"])
def test_a_missing_data_folder_names_the_recipe_and_the_key(tmp_path: Path, tiny_corpus: Path, where: str) -> None:
    path = write_tiny_recipe(tmp_path / "bad_recipe.toml", tiny_corpus)
    text = path.read_text()
    if "data" in where:  # the first linked set reads a corpus that is not there
        text = text.replace(f'root = "{tiny_corpus}"', 'root = "nowhere/corpus"', 1)
    else:  # its validation split is not there
        text = text.replace('valid = { split = "dev" }', 'valid = { split = "evaluation" }', 1)
    path.write_text(text)
    with pytest.raises(mtlab.MtlabError) as info:
        from_recipe(path)
    message = str(info.value)
    assert "bad_recipe.toml" in message and where in message, message
    assert ("nowhere" if "data" in where else "evaluation") in message, message


def test_bad_ini_value_and_bad_toml(tmp_path: Path) -> None:
    (tmp_path / "trainer.cfg").write_text("[trainer]\nnormalize_gradients = yes\n")
    with pytest.raises(mtlab.ConfigError, match=r"trainer.cfg: \[trainer\] normalize_gradients = 'yes' must be 'True'"):
        load_trainer_cfg(tmp_path / "trainer.cfg")
    (tmp_path / "trainer.cfg").write_text("[trainer]\nnumbatches_to_agregate = 2\n")
    with pytest.raises(mtlab.ConfigError, match="did you mean 'numbatches_to_aggregate'"):
        load_trainer_cfg(tmp_path / "trainer.cfg")
    with pytest.raises(mtlab.ConfigError, match="holds only the \\[trainer\\] settings"):
        from_recipe(REPO / "recipes" / "trainer.cfg")
    (tmp_path / "broken.toml").write_text("[trainer\n")
    with pytest.raises(mtlab.ConfigError, match="broken.toml: not valid TOML"):
        load_recipe(tmp_path / "broken.toml")


def test_load_rebuilds_the_experiment_from_the_checkpoint(tiny_corpus: Path, tmp_path: Path) -> None:
    exp = from_recipe(write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus))
    exp.trainer.step()
    exp.save(tmp_path / "ck.pt")
    other = load(tmp_path / "ck.pt")
    assert other.trainer.step_count == 1 and other.recipe == exp.recipe
    assert other.schedule.num_steps == exp.schedule.num_steps
    assert all(torch.equal(p, other.trainer.params[k]) for k, p in exp.trainer.params.items())
    exp.trainer.save(tmp_path / "plain.pt")  # Trainer.save writes the trainer state only: no recipe inside
    with pytest.raises(CheckpointError, match="carries no recipe"):
        load(tmp_path / "plain.pt")
    save_atomic({"format": "mtlab-trainer"}, tmp_path / "norecipe.pt")
    with pytest.raises(CheckpointError, match="carries no recipe"):
        load(tmp_path / "norecipe.pt")


CHILD = """
import os, sys, time
sys.path.insert(0, {tests!r})
import mtlab
from helpers import make_examples, make_models, task_a
ex = make_examples(12, 1)
tr = mtlab.Trainer(make_models(), [task_a((ex, ex))], lr=1e-2, device="cpu")
tr.step()
tr.save({path!r})
tr.step()
def slow_fsync(fd):
    print("writing", flush=True)
    time.sleep(60)
os.fsync = slow_fsync
tr.save({path!r})
"""


@pytest.mark.slow
def test_checkpoint_killed_mid_write_leaves_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "ck.pt"
    code = CHILD.format(tests=str(TESTS), path=str(path))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writing"  # the new state is on disk, not yet renamed
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".ck.pt.") for p in tmp_path.iterdir())  # the abandoned temporary file
    state = load_safe(path)
    assert state["step"] == 1


class _Touch:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_crafted_pickle_is_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": "mtlab-trainer", "payload": _Touch(marker)}, path)
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Touch(probe)))  # the payload works when unpickled unsafely
    assert probe.exists()
    with pytest.raises(CheckpointError, match="never unpickles other objects"):
        load_safe(path)
    with pytest.raises(CheckpointError):
        load(path)
    assert not marker.exists()
    assert not os.path.exists(marker)


@pytest.mark.slow
def test_resume_names_the_rule_that_stopped_the_run(monkeypatch: pytest.MonkeyPatch, tiny_corpus: Path,
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mtlab.apps.cli import main

    values = [1.0, 0.999, 0.998, 0.9985, 0.999, 0.9975]  # slow, then worse: the relative-improvement rule stops
    script_validations(monkeypatch, values)
    path = write_tiny_recipe(tmp_path / "tiny.toml", tiny_corpus, num_steps=6, valid_frequency=1)
    path.write_text(path.read_text().replace("num_tries = 3", "num_tries = 3\nrelative_improvement_threshold = 0.004\n"
                                             "relative_improvement_after_step = 3\ngo_back = false"
                                             ).replace("go_back = true\n", ""))
    exp = from_recipe(path)
    mtlab.run(exp, progress=False, expdir=tmp_path / "exp")
    assert exp.schedule.last_stop == "relative_improvement"
    assert main(["resume", str(tmp_path / "exp")]) == 0
    assert "nothing to resume, validation stopped it (relative_improvement)" in capsys.readouterr().out


def test_dynamic_mix_key_trains_a_step_and_bad_settings_name_it(tiny_corpus: Path, tmp_path: Path) -> None:
    from mtlab.data.dynamic import DynamicMix

    text = TINY_TOML.format(root=tiny_corpus, num_steps=2, valid_frequency=2)
    plain = 'linkedset = "noisy" }'
    assert plain in text
    path = tmp_path / "mixed.toml"
    path.write_text(text.replace(plain, 'linkedset = "noisy", dynamic_mix = { gain_db = [-5, 5], seed = 1 } }'))
    exp = from_recipe(path)
    ls = exp.trainer.tasks["frames"].linkedsets["noisy"]
    assert isinstance(ls.examples, DynamicMix) and ls.examples.settings.gain_db == (-5.0, 5.0)
    assert not isinstance(ls.valid, DynamicMix)  # validation reads the corpus's own mixtures
    assert not isinstance(exp.trainer.tasks["frames"].linkedsets["clean"].examples, DynamicMix)
    exp.trainer.step()
    assert exp.trainer.step_count == 1
    for setting, message in [("{ gain_db = [5, -5] }", r"mixed.toml: .*dynamic_mix gain_db = \[5, -5\] must be"),
                             ("{ gains = [0, 1] }", r"mixed.toml: .*unknown key\(s\) \['gains'\] in dynamic_mix"),
                             ("{ noise = \"nope.scp\" }", r"mixed.toml: .*dynamic_mix noise = 'nope.scp': no such list")]:
        path.write_text(text.replace(plain, f'linkedset = "noisy", dynamic_mix = {setting} }}'))
        with pytest.raises(mtlab.ConfigError, match=message):
            load_recipe(path)
    path.write_text(text.replace(plain, 'linkedset = "noisy", stream = false, dynamic_mix = {} }'))
    with pytest.raises(mtlab.ConfigError, match="dynamic_mix needs stream = true"):
        load_recipe(path)
