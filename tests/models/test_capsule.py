"""The original's capsule network (``architecture = capsnet``, ``models/capsnet.py`` with ``layer.Capsule`` and
``ops.squash``), checked against a numpy transcription of the original's TensorFlow code."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.paths import NABU_RECIPES
from helpers.nabu_oracles import original_bidirectional, original_capsnet, original_rec_capsule_cell, original_rnn_linear_out, original_squash

from mtlab.base.errors import ConfigError
from mtlab.models import CapsNet, build_model
from mtlab.nabu import import_nabu

pytestmark = pytest.mark.usefixtures("one_thread")


def tf_weights(model: CapsNet) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The model's weights in the original's layouts (dense kernel [in, out]; capsule kernel [Nin, Din, Nout,
    Dout]; init_logits [Nin, Nout])."""
    dense = model.primary.weight.detach().numpy().T
    kernels = [layer.kernel.detach().numpy() for layer in model.layers]
    logits = [layer.init_logits.detach().numpy() for layer in model.layers]
    return dense, kernels, logits


CASES = {
    "recipe-like": {"input_dim": 9, "num_capsules": 5, "capsule_dim": 3, "num_layers": 4, "routing_iters": 3},
    "one-layer": {"input_dim": 6, "num_capsules": 4, "capsule_dim": 2, "num_layers": 1, "routing_iters": 3},
    "no-routing": {"input_dim": 7, "num_capsules": 3, "capsule_dim": 4, "num_layers": 2, "routing_iters": 0},
    "long-routing": {"input_dim": 5, "num_capsules": 6, "capsule_dim": 2, "num_layers": 3, "routing_iters": 5},
}


@pytest.mark.parametrize("name", CASES)
def test_matches_the_numpy_oracle_of_the_original_in_float64(name: str) -> None:
    case = CASES[name]
    torch.manual_seed(0)
    model = CapsNet(**case).double().eval()
    with torch.no_grad():  # a learned prior: nonzero initial logits, so their tiling is checked too
        for layer in model.layers:
            layer.init_logits.copy_(torch.randn_like(layer.init_logits))
    x = np.random.default_rng(1).normal(size=(3, 7, case["input_dim"]))
    got = model(torch.from_numpy(x)).detach().numpy()
    dense, kernels, logits = tf_weights(model)
    want = original_capsnet(x, dense, kernels, logits, case["num_capsules"], case["capsule_dim"],
                            case["routing_iters"])
    assert got.shape == (3, 7, case["num_capsules"] * case["capsule_dim"])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert np.abs(want).max() > 1e-3


def test_float32_agrees_with_the_oracle_to_1e_5() -> None:
    case = CASES["recipe-like"]
    torch.manual_seed(2)
    model = CapsNet(**case).eval()
    x = np.random.default_rng(3).normal(size=(2, 11, case["input_dim"])).astype(np.float32)
    got = model(torch.from_numpy(x)).detach().numpy()
    dense, kernels, logits = tf_weights(model)
    want = original_capsnet(x.astype(np.float64), dense.astype(np.float64), [k.astype(np.float64) for k in kernels],
                            [l.astype(np.float64) for l in logits], case["num_capsules"], case["capsule_dim"],
                            case["routing_iters"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_squash_keeps_the_originals_epsilon_at_zero() -> None:
    from mtlab.models.capsule import squash

    s = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    out = squash(s)
    out.sum().backward()
    assert torch.equal(out, torch.zeros_like(out)) and torch.isfinite(s.grad).all()  # type: ignore[union-attr]
    v = np.random.default_rng(0).normal(size=(4, 5)) * np.array([[1e-4], [0.1], [1.0], [30.0]])
    np.testing.assert_allclose(squash(torch.from_numpy(v)).numpy(), original_squash(v), rtol=1e-12)


def test_frames_are_routed_independently_so_padding_stays_out() -> None:
    torch.manual_seed(0)
    model = CapsNet(**CASES["recipe-like"]).eval()
    x = torch.randn(2, 6, 9)
    padded = torch.cat((x, torch.randn(2, 3, 9) * 100), dim=1)
    torch.testing.assert_close(model(padded)[:, :6], model(x))
    torch.testing.assert_close(model(x[:1, 2:3]), model(x)[:1, 2:3])


def test_weights_start_as_the_originals() -> None:
    torch.manual_seed(0)
    model = CapsNet(input_dim=40, num_capsules=30, capsule_dim=10, num_layers=3, routing_iters=3)
    glorot = math.sqrt(6.0 / (40 + 300))
    assert model.primary.bias is None and model.primary.weight.abs().max() <= glorot
    assert model.primary.weight.abs().max() > 0.9 * glorot
    limit = math.sqrt(3.0 / ((10 + 10) / 2))  # capsule_initializer: fan_avg uniform over the capsule dimensions
    for layer in model.layers:
        assert layer.kernel.shape == (30, 10, 30, 10)
        assert limit * 0.9 < layer.kernel.abs().max() <= limit
        assert torch.equal(layer.init_logits, torch.zeros(30, 30))
    # the routing prior is a constant unless logits_prior = True, when it learns
    assert not any(p is layer.init_logits for layer in model.layers for p in model.parameters())
    learned = CapsNet(input_dim=4, num_capsules=3, capsule_dim=2, num_layers=2, logits_prior=True)
    assert any(p is learned.layers[0].init_logits for p in learned.parameters())


def test_gradients_reach_every_weight_through_the_routing_and_noise_and_dropout_only_train() -> None:
    torch.manual_seed(0)
    model = CapsNet(input_dim=5, num_capsules=4, capsule_dim=3, num_layers=3, logits_prior=True, input_noise=0.5,
                    dropout=0.5)
    x = torch.randn(2, 4, 5)
    model(x).square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    a, b = model(x), model(x)
    assert not torch.equal(a, b)
    model.eval()
    torch.testing.assert_close(model(x), model(x))


@pytest.mark.parametrize("settings, message", [
    ({"input_dim": 4, "num_capsules": 0, "capsule_dim": 2}, "num_capsules \\(0\\)"),
    ({"input_dim": 4, "num_capsules": 2, "capsule_dim": 2, "num_layers": 0}, "num_layers \\(0\\)"),
    ({"input_dim": 4, "num_capsules": 2, "capsule_dim": 2, "dropout": 1.0}, "dropout = 1.0"),
])
def test_bad_settings_are_errors(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model("CapsNet", **settings)


# ---------------------------------------------------------------- the importer
MAIN = """[main]
architecture = capsnet
num_capsules = 100
capsule_dim = 12
routing_iters = 3
num_layers = 4
input_noise = 0.0
dropout = 1.0

"""
OUTLAYER = """[outlayer]
architecture = linear
output_dims = 2580
input_noise = 0
dropout = 1.0
"""


def capsnet_recipe(folder: Path, main: str = MAIN) -> Path:
    """The test recipe of helpers.nabu (write_recipe) with SS/CapsNet/MERL_DC_2spk's one deep-clustering task and model."""
    from helpers.nabu import TASK
    from helpers.nabu import TRAINER, write_recipe

    trainer = TRAINER.format(num_tries="3")
    trainer = trainer[:trainer.index("[task_dc]")].replace("tasks = task_dc task_pit", "tasks = task_2spk").replace(
        "task_weights = 1 0.5", "task_weights = 1").replace("init_file = /models/previous/network.ckpt\n", "")
    task = TASK.format(split="train").replace("deepclustering_flat", "deepclustering").replace(
        "nodes = n0 n1 n2 n3 bin_emb", "nodes = n0 bin_emb").replace("bin_emb_inputs = n3", "bin_emb_inputs = n0")
    task = "\n".join(line for line in task.splitlines() if not line.startswith(("n1_", "n2_", "n3_"))) + "\n"
    valid = "[evaluator]\nevaluator = task_loss_evaluator\nrequested_utts = 4\nbatch_size = 2\n\n"
    model = "[hyper]\nmodel_names = main outlayer\n\n" + main + OUTLAYER
    return write_recipe(folder, **{"model.cfg": model, "trainer.cfg": trainer + task,
                                   "validation_evaluator.cfg": valid + task.replace("train", "dev"),
                                   "loss.cfg": None})


def test_the_importer_maps_the_capsnet_recipe_model(tmp_path: Path) -> None:
    recipe = import_nabu(capsnet_recipe(tmp_path / "MERL_DC_2spk"))
    models = recipe["models"]
    assert models["main"] == {"type": "CapsNet", "input_dim": 129, "num_capsules": 100, "capsule_dim": 12,
                              "num_layers": 4, "routing_iters": 3, "logits_prior": False, "input_noise": 0.0,
                              "dropout": 0.0}
    assert models["outlayer"]["input_dim"] == 1200 and models["outlayer"]["units"] == [2580]
    net = build_model("CapsNet", **{k: v for k, v in models["main"].items() if k != "type"})
    assert len(net.layers) == 3 and net.primary.weight.shape == (1200, 129)
    assert net(torch.randn(1, 2, 129)).shape == (1, 2, 1200)


@pytest.mark.parametrize("old, new, expected", [
    ("dropout = 1.0\n\n", "dropout = 0.8\nlogits_prior = True\n\n", {"dropout": pytest.approx(0.2),
                                                                     "logits_prior": True}),
    ("input_noise = 0.0", "input_noise = 0.3", {"input_noise": 0.3}),
    ("dropout = 1.0\n\n", "dropout = 1.0\nlogits_prior = true\n\n", {"logits_prior": False}),  # only 'True' is
])
def test_settings_as_the_original_reads_them(tmp_path: Path, old: str, new: str, expected: dict) -> None:
    spec = import_nabu(capsnet_recipe(tmp_path / "MERL_DC_2spk", MAIN.replace(old, new, 1)))["models"]["main"]
    assert {k: spec[k] for k in expected} == expected


@pytest.mark.parametrize("old, new, message", [
    ("routing_iters = 3\n", "", "needs 'routing_iters' for architecture 'capsnet'"),
    ("dropout = 1.0", "dropout = 0", "dropout = 0.0: a keep probability"),
    ("num_capsules = 100", "num_capsules = many", "num_capsules = 'many' must be an integer"),
    ("dropout = 1.0\n\n", "dropout = 1.0\nkernel = 3\n\n", "unknown key 'kernel' in \\[main\\]"),
])
def test_malformed_capsnet_settings_are_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = capsnet_recipe(tmp_path / "MERL_DC_2spk", MAIN.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder / "model.cfg") in str(err.value)


def test_a_frozen_capsnet_is_refused_naming_file_key_and_why(tmp_path: Path) -> None:
    main = MAIN.replace("dropout = 1.0", "dropout = 1.0\ntrainable = False")
    folder = capsnet_recipe(tmp_path / "MERL_DC_2spk", main)
    with pytest.raises(ConfigError, match="model.cfg: \\[main\\] trainable: frozen"):
        import_nabu(folder)


def test_shrink_caps_the_capsules_and_the_output_layer_follows(tmp_path: Path) -> None:
    from mtlab.nabu.shrink import shrink

    recipe = import_nabu(capsnet_recipe(tmp_path / "MERL_DC_2spk"))
    shrink(recipe, 32)
    models = recipe["models"]
    assert models["main"]["num_capsules"] == 8 and models["main"]["capsule_dim"] == 4
    assert models["main"]["num_layers"] == 4 and models["main"]["routing_iters"] == 3
    assert models["outlayer"]["input_dim"] == 32 and models["outlayer"]["units"] == [2580]  # a task output


RECIPES = NABU_RECIPES


@pytest.mark.skipif(not RECIPES.is_dir(), reason="the original's recipes are not next to this checkout")
def test_the_original_capsnet_recipe_imports() -> None:
    recipe = import_nabu(RECIPES / "SS/CapsNet/MERL_DC_2spk")
    assert recipe["models"]["main"]["type"] == "CapsNet" and recipe["models"]["main"]["num_capsules"] == 100
    assert recipe["models"]["outlayer"]["input_dim"] == 1200


@pytest.mark.slow
def test_a_recipe_with_the_capsnet_trains_a_step(tmp_path: Path) -> None:
    import mtlab
    from mtlab.nabu import make_sample_root, plain_recipe
    from mtlab.nabu.shrink import shrink

    recipe = import_nabu(capsnet_recipe(tmp_path / "MERL_DC_2spk"), data_root=tmp_path / "data")
    make_sample_root(recipe, limit=4)
    shrink(recipe, 8)
    exp = mtlab.from_recipe(plain_recipe(recipe))
    net = exp.trainer.models["main"]
    assert isinstance(net, CapsNet)
    before = [p.detach().clone() for p in net.parameters()]
    exp.trainer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, net.parameters()))


def original_dbr_capsnet(x: np.ndarray, lengths: list[int], model: torch.nn.Module, settings: dict) -> np.ndarray:
    """``DBRCapsNet._get_outputs`` in test mode, utterance by utterance, with ``model``'s weights."""
    n, d = settings["num_capsules"], settings["capsule_dim"]
    prim = [(lin.weight.detach().numpy().T, lin.bias.detach().numpy()) for lin in model.primary]
    layers = [[{k: v.detach().numpy() for k, v in [*cell.named_parameters(), *cell.named_buffers()]}
               for cell in cells] for cells in model.layers]
    flags = (settings.get("routing_iters", 3), settings.get("rec_only_vote", False),
             settings.get("recurrent_probability", "sigmoid"), settings.get("accumulate_input_logits", True),
             settings.get("accumulate_state_logits", True))
    outs = []
    for b, length in enumerate(lengths):
        h = original_bidirectional(x[b], length, lambda s: original_rnn_linear_out(s, *prim[0]),
                                   lambda s: original_rnn_linear_out(s, *prim[1]))
        h = original_squash(h.reshape(x.shape[1], 2 * n, d))
        for cells in layers:
            def run(w: dict):  # type: ignore[no-untyped-def]
                def go(seq: np.ndarray) -> np.ndarray:
                    state, out = np.zeros((n, d)), []
                    for frame in seq:
                        state = original_rec_capsule_cell(frame, state, w, *flags)
                        out.append(state)
                    return np.array(out).reshape(len(seq), n, d)
                return go
            h = original_bidirectional(h, length, run(cells[0]), run(cells[1]))
        outs.append(h.reshape(x.shape[1], 2 * n * d))
    return np.stack(outs)


DBR_CASES = {
    "recipe": {"input_dim": 6, "num_capsules": 3, "capsule_dim": 2, "num_layers": 2, "routing_iters": 3,
               "rec_only_vote": True, "recurrent_probability": "sigmoid", "accumulate_input_logits": True,
               "accumulate_state_logits": False},
    "plain-cell": {"input_dim": 5, "num_capsules": 2, "capsule_dim": 3, "num_layers": 3, "routing_iters": 2},
    "unit-no-accumulation": {"input_dim": 4, "num_capsules": 3, "capsule_dim": 2, "num_layers": 2,
                             "routing_iters": 3, "rec_only_vote": True, "recurrent_probability": "unit",
                             "accumulate_input_logits": False, "accumulate_state_logits": False},
}


@pytest.mark.parametrize("name", DBR_CASES)
def test_dbr_capsnet_matches_the_numpy_oracle_of_the_original(name: str) -> None:
    from mtlab.models import DBRCapsNet

    settings = DBR_CASES[name]
    torch.manual_seed(0)
    model = DBRCapsNet(**settings).double().eval()
    with torch.no_grad():  # nonzero biases and initial logits, so each is checked
        for p in [*model.parameters(), *model.buffers()]:
            if p.dim() <= 2:
                p.copy_(0.3 * torch.randn_like(p))
    x = np.random.default_rng(1).normal(size=(3, 6, settings["input_dim"]))
    lengths = [6, 4, 1]
    got = model(torch.from_numpy(x), torch.tensor(lengths)).detach().numpy()
    want = original_dbr_capsnet(x, lengths, model, settings)
    assert got.shape == (3, 6, 2 * settings["num_capsules"] * settings["capsule_dim"])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert np.abs(want[:, :1]).max() > 1e-3 and not got[1, 4:].any()


def test_dbr_capsnet_padding_stays_out_and_gradients_reach_every_weight() -> None:
    from mtlab.models import DBRCapsNet

    torch.manual_seed(0)
    model = DBRCapsNet(input_dim=4, num_capsules=3, capsule_dim=2, num_layers=3, rec_only_vote=True,
                       logits_prior=True)
    x = torch.randn(2, 5, 4)
    lengths = torch.tensor([5, 3])
    out = model(x, lengths)
    torch.testing.assert_close(out[1:, :3], model(x[1:, :3], lengths[1:]))  # padding never reaches valid frames
    out.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


DBR_MAIN = """[main]
architecture = dbr_capsnet
num_capsules = 50
capsule_dim = 12
routing_iters = 3
rec_only_vote = True
recurrent_probability_fn = sigmoid
num_layers = 2
input_noise = 0.0
dropout = 1.0
accumulate_inputs_logits = False
accumulate_state_logits = False

"""


def test_the_importer_maps_the_brcapsnet_recipe_model(tmp_path: Path) -> None:
    from mtlab.models import DBRCapsNet

    recipe = import_nabu(capsnet_recipe(tmp_path / "MERL_DC_2spk_2lay_reconlyvote", DBR_MAIN))
    models = recipe["models"]
    assert models["main"] == {"type": "DBRCapsNet", "input_dim": 129, "num_capsules": 50, "capsule_dim": 12,
                              "num_layers": 2, "routing_iters": 3, "logits_prior": False, "input_noise": 0.0,
                              "dropout": 0.0, "rec_only_vote": True, "recurrent_probability": "sigmoid",
                              "accumulate_input_logits": True, "accumulate_state_logits": False}
    # the misspelt key is not read by the original: said so, and its default kept
    assert any("accumulate_inputs_logits" in d for d in recipe["nabu"]["defaults"])
    assert models["outlayer"]["input_dim"] == 2 * 50 * 12
    net = build_model("DBRCapsNet", **{k: v for k, v in models["main"].items() if k != "type"})
    assert isinstance(net, DBRCapsNet) and net.layers[0][0].input_kernel.shape == (100, 12, 50, 12)
    from mtlab.nabu.shrink import shrink

    shrink(recipe, 32)
    assert recipe["models"]["main"]["num_capsules"] == 8 and recipe["models"]["main"]["capsule_dim"] == 4
    assert recipe["models"]["outlayer"]["input_dim"] == 64


@pytest.mark.parametrize("old, new, message", [
    ("recurrent_probability_fn = sigmoid", "recurrent_probability_fn = softmax",
     "recurrent_probability_fn = 'softmax': .*sigmoid and unit"),
    ("num_layers = 2", "num_layers = 2\nlayers = 2", "unknown key 'layers' in \\[main\\]"),
    ("capsule_dim = 12\n", "", "needs 'capsule_dim'"),
])
def test_malformed_dbr_capsnet_settings_are_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = capsnet_recipe(tmp_path / "MERL_DC_2spk_2lay_reconlyvote", DBR_MAIN.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder / "model.cfg") in str(err.value)


@pytest.mark.slow
def test_a_recipe_with_the_dbr_capsnet_trains_a_step(tmp_path: Path) -> None:
    import mtlab
    from mtlab.models import DBRCapsNet
    from mtlab.nabu import make_sample_root, plain_recipe
    from mtlab.nabu.shrink import shrink

    recipe = import_nabu(capsnet_recipe(tmp_path / "MERL_DC_2spk_2lay_reconlyvote", DBR_MAIN),
                         data_root=tmp_path / "data")
    make_sample_root(recipe, limit=4)
    shrink(recipe, 8)
    exp = mtlab.from_recipe(plain_recipe(recipe))
    net = exp.trainer.models["main"]
    assert isinstance(net, DBRCapsNet)
    before = [p.detach().clone() for p in net.parameters()]
    exp.trainer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
