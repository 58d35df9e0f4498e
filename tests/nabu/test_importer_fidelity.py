"""Fidelity checks against the original's source: its trainer.cfg files, trainset_frac under a segment stage,
linked-set weights and a mask head followed by a softmax loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.paths import NABU_RECIPES, RECIPES

from mtlab.base.errors import ConfigError
from mtlab.apps.settings import load_trainer_cfg

needs_recipes = pytest.mark.skipif(not NABU_RECIPES.is_dir(), reason="the original's recipe folders are not here")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_trainer_cfg_of_the_original_is_read(tmp_path: Path) -> None:
    (tmp_path / "trainer.cfg").write_text(
        "[trainer]\ntrainer = multi_task\ntasks = task_2spk\nsegment_lengths = 100 full\nnum_epochs = 100\n"
        "initial_learning_rate = 1e-3 5e-4\nbatch_size = 400 32\nnumbatches_to_aggregate = 2 4\nnum_tries = 3\n"
        "\n[task_2spk]\nloss_type = deepclustering\n")
    cfg = load_trainer_cfg(tmp_path / "trainer.cfg")
    assert cfg["tasks"] == ["task_2spk"]
    assert [s["segment_length"] for s in cfg["stages"]] == [100, "full"]
    assert [s["batch_size"] for s in cfg["stages"]] == [400, 32]
    assert [s["initial_learning_rate"] for s in cfg["stages"]] == [1e-3, 5e-4]
    assert cfg["batch_size"] == 32 and cfg["num_tries"] == 3  # the plain values: the last stage's
    (tmp_path / "trainer.cfg").write_text("[trainer]\ntrainer = single_task\ntasks = a\nsegment_lengths = full\n")
    with pytest.raises(ConfigError, match=r"trainer\.cfg: \[trainer\] trainer: 'single_task'.*multi_task"):
        load_trainer_cfg(tmp_path / "trainer.cfg")


@needs_recipes
def test_every_original_trainer_cfg_is_read() -> None:
    files = sorted(NABU_RECIPES.rglob("trainer.cfg"))
    assert len(files) == 60
    for path in files:
        cfg = load_trainer_cfg(path)
        assert cfg["tasks"] and cfg["relative_improvement_threshold"] == 0.004, path  # the original's stop rule


def test_trainset_frac_under_a_segment_stage_keeps_the_first_segments() -> None:
    """The original's task_trainer lists one entry per segment and keeps the first int(n x frac) of them."""
    import torch

    from mtlab.training.schedule import stage_view
    from mtlab.tasks.sources import trainset_fraction

    lengths = [250, 90, 430, 120]  # frames: 2 + 1 (short, kept whole) + 4 + 1 = 8 segments of 100
    utts = [{"features": torch.full((n, 1), float(i))} for i, n in enumerate(lengths)]
    head = trainset_fraction(utts, 0.5)
    assert len(head) == 2  # utterances in a "full" stage: the first 2 of 4
    segs = stage_view(head, 100)
    assert len(segs) == 4  # the first half of the 8 segments: 2 of utterance 0, 1 of 1, the first of 2
    assert [int(segs[j]["features"][0, 0]) for j in range(4)] == [0, 0, 1, 2]
    assert [segs[j]["features"].shape[0] for j in range(4)] == [100, 100, 90, 100]
    again = stage_view(segs, "full")  # the next stage reads whole utterances again: the first half of them
    assert len(again) == 2 and again[1]["features"].shape[0] == 90


def test_linked_set_weights_act_as_ratios() -> None:
    """The importer divides the weights by the first set's (as the original); a hand-built Trainer keeps them
    raw. Loss and norm both carry the weight, so the step (sum over sets / summed norm) is the same."""
    import torch

    import mtlab
    from helpers import clone_models, make_examples, make_models, task_a

    data = (make_examples(6, 1), make_examples(6, 2))
    models = make_models()
    params = []
    for weights in ((2.0, 1.0), (1.0, 0.5), (1.0, 1.0)):
        trainer = mtlab.Trainer(clone_models(models), [task_a(data, weights=weights)], lr=1e-2, seed=0)
        for _ in range(2):
            trainer.step()
        params.append({k: p.detach().clone() for k, p in trainer.params.items()})
    assert params[0].keys() == params[1].keys()
    for key in params[0]:
        torch.testing.assert_close(params[0][key], params[1][key], rtol=1e-12, atol=1e-12)
    # another ratio is another step: the weights are used, and only their ratios matter
    assert not torch.allclose(params[0]["enc.lin.weight"], params[2]["enc.lin.weight"])


def test_mask_head_then_pit_softmax_is_refused() -> None:
    import tomllib

    from mtlab.models import build_model
    from mtlab.separation.checks import check_mask_activation

    recipe = tomllib.loads((RECIPES / "separation_pit.toml").read_text())
    models = {name: build_model(spec.pop("type"), **spec) for name, spec in recipe["models"].items()}
    check_mask_activation(models, recipe["tasks"])  # as shipped: the loss's activation is "none"
    recipe["tasks"]["separation"]["loss"].pop("activation")  # the loss's default: softmax
    with pytest.raises(ConfigError, match=r"\[tasks.separation\] loss 'pit' applies activation = 'softmax'.*"
                                          r"model 'head' \(MaskHead, activation 'sigmoid'\).*activation = \"none\""):
        check_mask_activation(models, recipe["tasks"])


def test_from_recipe_refuses_mask_head_then_pit_softmax() -> None:
    import tomllib

    from mtlab.apps.recipe import from_recipe

    recipe = tomllib.loads((RECIPES / "separation_pit.toml").read_text())
    recipe["tasks"]["separation"]["loss"]["activation"] = "softmax"
    with pytest.raises(ConfigError, match="two activations"):
        from_recipe(recipe)


def test_a_missing_mixtomask_processor_cfg_takes_the_documented_default(tmp_path: Path) -> None:
    """Three DANet recipes name a mixtomask_processor.cfg the repository lacks; every one it has is the same."""
    from mtlab.nabu import import_nabu
    from mtlab.nabu.database import DEFAULT_PROCESSORS
    from helpers.nabu import write_recipe

    folder = write_recipe(tmp_path / "MERL_TEST", **{"mixtomask_processor.cfg": None})
    recipe = import_nabu(folder, data_root="/data")
    lset = recipe["tasks"]["task_pit"]["linkedsets"]["clean"]
    assert recipe["tasks"]["task_pit"]["loss"]["mixture"] == "mix_mag"
    assert lset["data"]["spectral"]["window"] == "sine" and lset["data"]["spectral"]["n_fft"] == 256
    assert DEFAULT_PROCESSORS["mixtomask_processor.cfg"]["processor"] == "audio_signal_processor"
    assert any("mixtomask_processor.cfg" in note for note in recipe["nabu"]["defaults"])
    (folder / "feature_processor.cfg").unlink()  # other processors have no default
    with pytest.raises(ConfigError, match="feature_processor.cfg' is neither in the recipe folder"):
        import_nabu(folder, data_root="/data")


@needs_recipes
def test_the_danet_recipes_without_their_mixtomask_processor_import() -> None:
    from mtlab.nabu import import_nabu

    folder = NABU_RECIPES / "papers" / "Journal_paper_reset_LSTM_2020"
    for name in ("MERL_DANet_statereset_2spk", "MERL_DANet_statereset_ivec10_2spk",
                 "MERL_DANet_Drude2018_statereset_2spk"):  # the third with its attractor layer
        recipe = import_nabu(folder / name, data_root="/data")
        assert recipe["tasks"] and recipe["nabu"]["defaults"], name
