"""The Nabu-MSSS recipe importer on small recipe folders written here in the original's formats."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import torch
from helpers.paths import NABU_RECIPES
from helpers.nabu import LOSS, VALID, replace_in, write_recipe

import mtlab
from mtlab.nabu import import_nabu, plain_recipe, toml_text, write_toml
from mtlab.tasks.task import applied_weight

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def recipe_dir(tmp_path: Path) -> Path:
    return write_recipe(tmp_path / "MERL_TEST")


# ---------------------------------------------------------------- what the import gives
def test_trainer_section_stages_and_stopping(recipe_dir: Path) -> None:
    r = import_nabu(recipe_dir, data_root="/data")
    t = r["trainer"]
    # the plain [trainer] holds the last stage ("full"); every stage is kept under nabu.stages
    assert t["tasks"] == ["task_dc", "task_pit"] and t["batch_size"] == 2 and t["numbatches_to_aggregate"] == 1
    assert t["initial_learning_rate"] == 5e-4 and t["learning_rate_decay"] == 0.5 and t["num_epochs"] == 10.0
    assert t["clip_grad_value"] == 2e7 and t["normalize_gradients"] is True and t["go_back"] is True
    assert t["task_weights"] == [1.0, 0.5] and t["acc_steps"] and t["normalize_weights_acc_steps"]
    stages = t["stages"]
    assert [s["segment_length"] for s in stages] == [100, "full"]
    assert [s["batch_size"] for s in stages] == [4, 2] and [s["learning_rate_decay"] for s in stages] == [1.0, 0.5]
    assert [s["numbatches_to_aggregate"] for s in stages] == [2, 1] and stages[0]["numbuckets"] == 1
    assert t["init_file"] == "/models/previous/network.ckpt" and r["nabu"]["trainer"] == "multi_task"
    # the original's stopping rules, switched on
    assert t["best_model_final"] and t["validate_at_step_0"] and t["per_task_validation"]  # acc_steps: per task
    assert (t["relative_improvement_threshold"], t["relative_improvement_after_step"]) == (0.004, 1000)
    assert t["relative_improvement_window"] == 0 and t["num_tries"] == 3  # the window is num_tries
    assert "unsupported" not in r["nabu"]
    # the original's update: TensorFlow 1's Adam, named in the recipe and its description
    assert t["optimizer"] == "adam_tf1" and "tf.train.AdamOptimizer" in r["description"]


def test_num_tries_none_and_a_single_full_stage(tmp_path: Path) -> None:
    folder = write_recipe(tmp_path / "r", num_tries="None")
    replace_in(folder, "trainer.cfg", "segment_lengths = 100 full", "segment_lengths = full")
    for key, both, one in (("initial_learning_rate", "1e-3 5e-4", "5e-4"), ("learning_rate_decay", "1 0.5", "0.5"),
                           ("batch_size", "4 2", "2"), ("numbatches_to_aggregate", "2 1", "1")):
        replace_in(folder, "trainer.cfg", f"{key} = {both}", f"{key} = {one}")
    t = import_nabu(folder)["trainer"]
    assert t["num_tries"] == "none" and "stages" not in t and t["batch_size"] == 2
    assert mtlab.recipe.trainer_settings({"trainer": t})["num_tries"] is None


def test_tasks_graph_data_keys_and_linked_sets(recipe_dir: Path) -> None:
    r = import_nabu(recipe_dir, data_root="/data")
    dc, pit = r["tasks"]["task_dc"], r["tasks"]["task_pit"]
    assert dc["inputs"] == ["features"] and dc["targets"] == ["binary_targets", "usedbins"]
    assert dc["nodes"] == [{"name": "n0", "model": "main", "inputs": ["features"]},
                           {"name": "bin_emb", "model": "outlayer", "inputs": ["n0"]}]
    assert dc["loss"] == {"type": "deepclustering", "output": "bin_emb", "target": "binary_targets",
                          "usedbins": "usedbins"}
    # the original's target names become mtlab's data keys
    assert pit["targets"] == ["src_mag", "mix_mag"]
    assert pit["loss"] == {"type": "pit", "output": "bin_est", "target": "src_mag", "mixture": "mix_mag",
                           "layout": "speaker_major", "activation": "sigmoid"}
    # database.conf paths re-rooted under the data root (common folder of every datafiles replaced)
    original_stft = {"win_length": 256, "hop_length": 64, "n_fft": 256, "window": "sine", "framing": "snip",
                     "sample_scale": 32768.0, "preemph": 0.0}
    assert dc["linkedsets"]["set0"] == {"weight": 1.0, "data": {"root": "/data/2speakers/wav8k/min", "split": "tr",
                                                                "linkedset": "wav", "spectral": original_stft},
                                        "valid": {"split": "cv"}}
    # linked-set weights as written (2 1), applied relative to the first set; validation attached to the first set
    assert set(pit["linkedsets"]) == {"clean", "noisy"}
    assert pit["linkedsets"]["clean"]["weight"] == 2.0 and pit["linkedsets"]["noisy"]["weight"] == 1.0
    assert r["trainer"]["linkedset_weights"] == "relative"
    assert pit["linkedsets"]["noisy"]["data"]["linkedset"] == "noisy"
    assert pit["linkedsets"]["clean"]["valid"] == {"split": "cv"} and "valid" not in pit["linkedsets"]["noisy"]
    assert dc["trainset_frac"] == 0.5 and "trainset_frac" not in pit
    extras = r["nabu"]["tasks"]
    assert extras["task_dc"]["validation"] == {"evaluator": "task_loss_evaluator", "requested_utts": 50,
                                               "batch_size": 10}
    assert extras["task_pit"]["validation"]["requested_utts"] == 20  # the task's own value wins
    assert extras["task_pit"]["sections"]["noisy"]["features"] == "trainspec_noisy"


def test_models_sized_through_the_graph_with_the_originals_dropout(recipe_dir: Path) -> None:
    m = import_nabu(recipe_dir)["models"]
    # dblstm: keep probability 0.9 -> drop 0.1 after every layer; per-stage equal values collapse
    assert m["main"] == {"type": "BLSTM", "input_dim": 129, "hidden": 8, "num_layers": 2, "input_noise": 0.2,
                         "layer_dropout": pytest.approx(0.1)}
    assert m["outlayer"] == {"type": "Dense", "input_dim": 16, "units": [387], "activation": "none",
                             "input_noise": 0.0, "dropout": 0.0, "bias": True, "output_shape": [129, 3]}
    assert m["ff"]["units"] == [6, 6] and m["ff"]["activation"] == "tanh" and m["ff"]["input_dim"] == 129
    assert m["concat"] == {"type": "Concat"} and m["pitlayer"]["input_dim"] == 16 + 6


def test_other_stft_sizes_follow_the_processor_configs(tmp_path: Path) -> None:
    folder = write_recipe(tmp_path / "r")
    for name in ("feature_processor.cfg", "target_processor.cfg", "usedbins_processor.cfg",
                 "multitarget_processor.cfg", "mixtomask_processor.cfg"):
        replace_in(folder, name, "winstep = 0.008", "winstep = 0.016")
        replace_in(folder, name, "nfft = 256", "nfft = 512")
    r = import_nabu(folder)
    assert r["tasks"]["task_dc"]["linkedsets"]["set0"]["data"]["spectral"]["hop_length"] == 128
    assert r["models"]["main"]["input_dim"] == 257 and r["models"]["ff"]["input_dim"] == 257
    replace_in(folder, "usedbins_processor.cfg", "winstep = 0.016", "winstep = 0.008")
    with pytest.raises(mtlab.ConfigError, match="its processors frame the audio differently"):
        import_nabu(folder)


def test_database_sections_processors_and_evaluation_files(recipe_dir: Path) -> None:
    n = import_nabu(recipe_dir, data_root="/data")["nabu"]
    spec = n["data"]["trainspec"]
    assert spec["datafiles"] == "/data/2speakers/wav8k/min/tr/mix_wav.scp" and spec["key"] == "features"
    assert spec["segment_lengths"] == ["100", "full"] and spec["processor"]["mvn_type"] == "global"
    assert spec["spectral"] == {"win_length": 256, "hop_length": 64, "n_fft": 256, "window": "sine",
                                "framing": "snip", "sample_scale": 32768.0, "preemph": 0.0}
    assert {n["data"][s]["key"] for s in ("traintargets", "trainusedbins", "trainmultitargets", "trainmixtomask")} \
        == {"binary_targets", "usedbins", "src_mag", "mix_mag"}
    assert "testspec3spk" not in n["data"]  # sections no training or validation task reads are not loaded
    assert n["evaluation"] == {"test_evaluator.cfg": str(recipe_dir / "test_evaluator.cfg")}


def test_toml_round_trip_and_the_plain_recipe_resolves(recipe_dir: Path, tmp_path: Path) -> None:
    from mtlab.apps.recipe import resolve_recipe

    r = import_nabu(recipe_dir, data_root="/data")
    path = write_toml(r, tmp_path / "out.toml")
    assert tomllib.loads(path.read_text()) == r
    assert toml_text(r) == path.read_text()
    resolved = resolve_recipe(plain_recipe(r))
    assert resolved["tasks"]["task_pit"]["loss"]["type"] == "pit"


def test_without_loss_cfg_the_task_loss_type_is_the_type(tmp_path: Path) -> None:
    folder = write_recipe(tmp_path / "r", **{"loss.cfg": None})
    text = (folder / "trainer.cfg").read_text().replace("loss_type = pit_sig", "loss_type = direct")
    (folder / "trainer.cfg").write_text(text)
    (folder / "validation_evaluator.cfg").write_text(VALID.replace("loss_type = pit_sig", "loss_type = direct"))
    r = import_nabu(folder)
    assert r["tasks"]["task_pit"]["loss"]["type"] == "direct" and "activation" not in r["tasks"]["task_pit"]["loss"]


@pytest.mark.slow
def test_an_imported_recipe_builds_and_trains_a_step(tmp_path: Path) -> None:
    """On data laid out as the recipe's database.conf says, made from the shipped samples."""
    from mtlab.data import data_samples_dir

    samples = data_samples_dir()
    root = tmp_path / "data" / "2speakers" / "wav8k" / "min"
    for split, source in (("tr", "train"), ("cv", "dev")):
        folder = root / split
        folder.mkdir(parents=True)
        for sub in ("mix_clean", "mix_noisy", "s1", "s2"):
            (folder / sub).symlink_to(samples / source / sub)
        shutil.copy(samples / source / "mix_clean.scp", folder / "mix_wav.scp")
        for name in ("mix_noisy.scp", "s1.scp", "s2.scp", "spk.txt"):
            shutil.copy(samples / source / name, folder / name)
    # read in place: no "train" folder beside the recipe's own "tr" (the training data gives the statistics)
    files = sorted(str(p) for p in root.rglob("*") if not p.name.endswith((".stats.json", ".samples.npz")))
    folder = write_recipe(tmp_path / "r")
    replace_in(folder, "trainer.cfg", "init_file = /models/previous/network.ckpt", "")  # a TF checkpoint path
    r = import_nabu(folder, data_root=tmp_path / "data")
    exp = mtlab.from_recipe(plain_recipe(r))
    assert [s["segment_length"] for s in exp.schedule.stages] == [100, "full"]
    trainer = exp.trainer
    # the original's update: one TensorFlow-1 Adam per task (acc_steps), linked sets relative to the first (2 1)
    assert trainer.optimizer_name == "adam_tf1" and trainer.linkedset_weights == "relative"
    assert {type(o).__name__ for o in trainer.task_optimizers.values()} == {"AdamTF1"}
    pit = trainer.tasks["task_pit"]
    assert [applied_weight(pit, s, "relative") for s in ("clean", "noisy")] == [1.0, 0.5]
    # the linked sets read their audio with the original's STFT (sine window, snip framing, int16 scale)
    from mtlab.data import read_wav
    from mtlab.data.features import ORIGINAL

    train = next(d for d in exp.datasets.values() if d.split == "tr" and d.linkedset == "wav")
    name = train.names[0]
    wav = read_wav(root / "tr" / "s1" / f"{name}.wav")
    torch.testing.assert_close(train[0]["src_mag"][..., 0], ORIGINAL.magnitude(wav))
    before = {k: p.detach().clone() for k, p in trainer.models["main"].named_parameters()}
    trainer.step()
    assert any(not torch.equal(before[k], p) for k, p in trainer.models["main"].named_parameters())
    assert {r.linkedset: r.weight for r in trainer.state("task_pit").records} == {"clean": 1.0, "noisy": 0.5}
    assert isinstance(trainer.models["outlayer"], mtlab.models.Dense)
    assert files == sorted(str(p) for p in root.rglob("*") if not p.name.endswith((".stats.json", ".samples.npz")))


REFUSED = [
    ("trainer.cfg", "trainer = multi_task", "trainer = single_task", "trainer.cfg: \\[trainer\\] trainer: 'single_task'"),
    ("trainer.cfg", "numbatches_to_aggregate = 2 1", "numbatches_to_aggregate = 0",
     "numbatches_to_aggregate: 0 asks for asynchronous training"),
    ("trainer.cfg", "numbuckets = 1", "numbuckets = 1\nprint_grads_stats = True", "print_grads_stats: mtlab records"),
    ("model.cfg", "architecture = dblstm", "architecture = dbresetgru", "\\[main\\] architecture: 'dbresetgru' has no"),
    ("model.cfg", "recurrent_dropout = 1.0", "recurrent_dropout = 0.8", "\\[main\\] recurrent_dropout: mtlab's BLSTM"),
    ("model.cfg", "layer_norm = False", "layer_norm = True", "\\[main\\] layer_norm: mtlab's BLSTM has no layer"),
    ("model.cfg", "num_layers = 2\ninput_noise", "num_layers = 2\nfac_per_layer = 0.5\ninput_noise",
     "\\[main\\] fac_per_layer"),
    ("model.cfg", "input_noise = 0.2 0.2", "input_noise = 0.2 0.3", "\\[main\\] input_noise: '0.2 0.3': mtlab keeps"),
    ("model.cfg", "output_dims = 129 3", "output_dims = 129 3\nlast_only = True", "\\[outlayer\\] last_only"),
    ("model.cfg", "expand_dim_to_first_input = False False", "expand_dim_to_first_input = False True",
     "\\[concat\\] expand_dim_to_first_input: 'False True': input 2 is per-frame"),
    ("loss.cfg", "activation = sigmoid", "activation = sigmoid\nrescale_recs = True",
     "loss.cfg: \\[pit\\] rescale_recs: 'True': mtlab honours False"),
    ("loss.cfg", "loss_type = deepclustering", "loss_type = l41", "\\[task_dc\\] loss_type: 'l41' has no mtlab"),
    ("target_processor.cfg", "nrs = 2", "nrs = 2\nspk_select = 1", "target_processor.cfg: \\[processor\\] spk_select"),
    ("feature_processor.cfg", "mvn_type = global", "mvn_type = from_files",
     "\\[processor\\] mvn_type: 'from_files'"),
    ("usedbins_processor.cfg", "mag_thres = 100", "mag_thres = 50", "\\[processor\\] mag_thres"),
    ("feature_processor.cfg", "include_energy = False", "include_energy = True", "include_energy = True"),
    ("feature_processor.cfg", "processor = audio_feat_processor", "processor = zero_processor",
     "'zero_processor' \\(feature 'logspec'\\) computes data"),
    ("validation_evaluator.cfg", "evaluator = task_loss_evaluator", "evaluator = other_evaluator",
     "\\[evaluator\\] evaluator: 'other_evaluator'"),
    ("trainer.cfg", "binary_targets = traintargets", "binary_targets = traintargets devtargets",
     "\\[task_dc\\] binary_targets: 'traintargets devtargets': mtlab reads one database section"),
    ("database.conf", "processor_config = config/recipes/mine/MERL_TEST/target_processor.cfg",
     "processor_config = config/recipes/elsewhere/gone.cfg", "\\[traintargets\\] processor_config: "),
    ("database.conf", "meanandvar_dir = globalvars\nprocessor_config = config/recipes/mine/MERL_TEST/target",
     "meanandvar_dir = globalvars\n  processor_config = config/recipes/mine/MERL_TEST/target",
     "processor_config: missing, .*an indented 'processor_config = ...' line continues"),
    ("validation_evaluator.cfg", "loss_type = deepclustering", "loss_type = deepclustering_flat",
     "\\[task_dc\\] loss_type: 'deepclustering_flat' differs from training"),
]


@pytest.mark.parametrize("file, old, new, message", REFUSED, ids=[r[3][:40] for r in REFUSED])
def test_each_setting_mtlab_cannot_honour_is_refused_with_file_key_and_why(recipe_dir: Path, file: str, old: str,
                                                                          new: str, message: str) -> None:
    replace_in(recipe_dir, file, old, new)
    with pytest.raises(mtlab.ConfigError, match=message) as err:
        import_nabu(recipe_dir)
    assert str(recipe_dir) in str(err.value) and "unknown key" not in str(err.value)
    lenient = import_nabu(recipe_dir, strict=False)  # the same finding, listed instead of raised
    assert lenient["nabu"]["unsupported"] and all(set(u) == {"file", "key", "why"}
                                                  for u in lenient["nabu"]["unsupported"])


def test_deepattractornet_needs_its_activation(tmp_path: Path) -> None:
    folder = write_recipe(tmp_path / "r", **{"loss.cfg": LOSS.replace("loss_type = deepclustering",
                                                                      "loss_type = deepattractornet")})
    replace_in(folder, "trainer.cfg", "targets = binary_targets usedbins\nbinary_targets = traintargets",
             "targets = binary_targets usedbins multi_targets mix_to_mask\nmulti_targets = trainmultitargets\n"
             "mix_to_mask = trainmixtomask\nbinary_targets = traintargets")
    with pytest.raises(mtlab.ConfigError, match="\\[deepattractornet\\] activation: the original's deepattractornet"):
        import_nabu(folder)
    (folder / "loss.cfg").write_text(LOSS.replace("loss_type = deepclustering",
                                                  "loss_type = deepattractornet\nactivation = softmax"))
    loss = import_nabu(folder)["tasks"]["task_dc"]["loss"]
    assert loss == {"type": "deepattractornet", "output": "bin_emb", "target": "src_mag",
                    "partition": "binary_targets", "mixture": "mix_mag", "usedbins": "usedbins",
                    "activation": "softmax"}


def test_loss_type_outside_the_originals_factory_says_so(tmp_path: Path) -> None:
    folder = write_recipe(tmp_path / "r", **{"loss.cfg": None})
    with pytest.raises(mtlab.ConfigError, match="'pit_sig' is not a loss type of the original either"):
        import_nabu(folder)


ERRORS = [
    ("trainer.cfg", "numbuckets = 1", "numbuckets = 1\nnum_bukets = 2",
     "unknown key 'num_bukets' in \\[trainer\\]; the original defines trainer, tasks"),
    ("trainer.cfg", "trainset_frac = 0.5", "trainset_frac = 0.5\nfoo = bar", "unknown key 'foo' in \\[task_dc\\]"),
    ("model.cfg", "num_units = 8", "num_units = 8\nnum_unitz = 9", "unknown key 'num_unitz' in \\[main\\]"),
    ("trainer.cfg", "batch_size = 4 2", "batch_size = 4 2 1", "batch_size = '4 2 1': give one value, or one per"),
    ("trainer.cfg", "go_back = True", "go_back = yes", "go_back = 'yes' must be 'True' or 'False'"),
    ("trainer.cfg", "segment_lengths = 100 full", "segment_lengths = full 100", "'full' must be the last stage"),
    ("trainer.cfg", "trainset_frac = 0.5", "trainset_frac = 1.5", "trainset_frac = 1.5: a fraction in \\(0, 1\\]"),
    ("trainer.cfg", "linkedset_weighting = 2 1", "linkedset_weighting = 2", "linkedset_weighting needs one weight"),
    ("trainer.cfg", "bin_emb_model = outlayer", "bin_emb_model = nosuchmodel", "uses model 'nosuchmodel', not in"),
    ("trainer.cfg", "usedbins = trainusedbins", "usedbins = nosection", "no \\[nosection\\] section, named by a task"),
    ("loss.cfg", "[pit_sig]", "[pit_other]", "loss.cfg: no \\[pit_sig\\] section for task 'task_pit'"),
    ("validation_evaluator.cfg", "[task_dc]", "[task_other]", "validation_evaluator.cfg: no \\[task_dc\\] section"),
]


@pytest.mark.parametrize("file, old, new, message", ERRORS, ids=[e[3][:40] for e in ERRORS])
def test_malformed_recipes_are_errors_naming_file_and_key(recipe_dir: Path, file: str, old: str, new: str,
                                                         message: str) -> None:
    replace_in(recipe_dir, file, old, new)
    with pytest.raises(mtlab.ConfigError, match=message):
        import_nabu(recipe_dir, strict=False)


def test_missing_files_and_folder(tmp_path: Path) -> None:
    with pytest.raises(mtlab.ConfigError, match="not a folder"):
        import_nabu(tmp_path / "nope")
    folder = write_recipe(tmp_path / "r", **{"database.conf": None})
    with pytest.raises(mtlab.ConfigError, match="no database.conf"):
        import_nabu(folder)
    folder = write_recipe(tmp_path / "s", **{"model.cfg": None})
    with pytest.raises(mtlab.ConfigError, match="model.cfg: not found"):
        import_nabu(folder)


@pytest.mark.slow
@pytest.mark.skipif(not NABU_RECIPES.is_dir(),
                    reason="the original's recipes are not next to this checkout")
def test_every_original_recipe_reads_leniently() -> None:
    recipes = NABU_RECIPES
    folders = sorted(p.parent for p in recipes.rglob("trainer.cfg"))
    assert len(folders) == 60
    for folder in folders:
        r = import_nabu(folder, strict=False)
        assert tomllib.loads(toml_text(r)) == r


def test_the_written_toml_loads_as_a_recipe_and_bad_stft_settings_are_named(recipe_dir: Path, tmp_path: Path) -> None:
    from mtlab.apps.recipe import load_recipe

    r = import_nabu(recipe_dir, data_root="corpus")
    path = write_toml(r, tmp_path / "merl.toml")
    loaded = load_recipe(path)  # [nabu] and the data's spectral tables are part of the schema
    data = loaded["tasks"]["task_dc"]["linkedsets"]["set0"]["data"]
    assert data["root"] == str((tmp_path / "corpus" / "2speakers" / "wav8k" / "min").resolve())  # relative to the file
    assert data["spectral"]["window"] == "sine" and loaded["nabu"]["trainer"] == "multi_task"
    assert loaded["trainer"]["stages"][0]["segment_length"] == 100
    r["tasks"]["task_dc"]["linkedsets"]["set0"]["data"]["spectral"]["window"] = "kaiser"
    with pytest.raises(mtlab.ConfigError, match="data spectral: Spectral window='kaiser'"):
        load_recipe(write_toml(r, tmp_path / "bad.toml"))
