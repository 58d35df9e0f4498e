"""EncoderDecoderCNN (the original's encoder_decoder_cnn) against a numpy oracle written from the original's
TensorFlow code, layer by layer in its NHWC layout; its shapes; and its import from model.cfg."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.paths import NABU_RECIPES
from helpers.nabu_oracles import oracle

from mtlab.base.errors import BatchError, ConfigError
from mtlab.models import Concat, EncoderDecoderCNN, build_model
from mtlab.nabu import import_nabu
from helpers.nabu import TASK

pytestmark = pytest.mark.usefixtures("one_thread")


def tf_weights(model: EncoderDecoderCNN) -> dict[str, list]:
    """The module's weights in the original's layouts: conv ``[kt, kf, in, out]``, transposed conv
    ``[kt, kf, out, in]``, and the batch-normalization gammas and betas."""
    def npy(t: torch.Tensor) -> np.ndarray:
        return t.detach().double().numpy()
    convs = [*model.encoder, *model.centre]
    norms = list(model.norms) if model.norms is not None else []
    return {"conv": [(npy(c.weight).transpose(2, 3, 1, 0), npy(c.bias)) for c in convs],
            "deconv": [(npy(c.weight).transpose(2, 3, 1, 0), npy(c.bias)) for c in model.decoder],
            "norm": [(npy(n.scale), npy(n.shift)) for n in norms]}


def original_kernels(first: list[float], fac: list[float], pools: list[list[int]]) -> list[list[int]]:
    """The original's kernel sizes per encoder layer: the ideal size times ``fac`` after each pooled axis, ceiled."""
    ideal, kernels = [float(k) for k in first], []
    for pool in pools:
        kernels.append([math.ceil(k) for k in ideal])
        ideal = [k * f if p == 2 else k for k, f, p in zip(ideal, fac, pool)]
    return kernels


CASES = {
    # the InterSpeech2019 hyper-parameter-search recipe's layout (filters shrunk): frequency pooled twice, unpool
    "recipe-unpool": {"filters": [4, 4], "kernels": original_kernels([12, 15], [0.8, 0.8], [[1, 2], [1, 2]]),
                          "pools": [[1, 2], [1, 2]], "output_filters": 5, "bypass": "unpool", "T": 11, "F": 129},
    "unpool-time-and-freq-odd": {"filters": [3, 4, 2], "kernels": [[3, 3], [2, 4], [3, 2]],
                                     "pools": [[2, 2], [1, 1], [2, 1]], "output_filters": 3, "bypass": "unpool", "T": 13, "F": 11,
                                     "activation": "tanh"},
    "concat-centre-layernorm": {"filters": [3, 5], "kernels": [[3, 3], [2, 4]], "pools": [[2, 2], [2, 1]],
                                    "output_filters": 4, "bypass": "True", "T": 9, "F": 13, "centre": 2, "centre_kernel": [2, 3],
                                    "layer_norm": True},
    "concat-no-centre": {"filters": [2, 3], "kernels": [[4, 3], [3, 3]], "pools": [[2, 1], [1, 2]], "output_filters": 2,
                             "bypass": "True", "T": 7, "F": 10, "activation": "sigmoid"},
    "plain-strided-kernel-below-stride": {"filters": [3, 2], "kernels": [[1, 1], [3, 2]], "pools": [[2, 2], [2, 2]],
                                              "output_filters": 3, "bypass": "False", "T": 9, "F": 11},
}
BYPASS = {"True": "concat", "False": "none", "unpool": "unpool"}


def build(case: dict) -> EncoderDecoderCNN:
    return EncoderDecoderCNN(case["filters"], case["kernels"], case["pools"], case["output_filters"],
                             num_centre_layers=case.get("centre", 0), centre_kernel=case.get("centre_kernel"),
                             bypass=BYPASS[case["bypass"]], activation=case.get("activation", "relu"),
                             layer_norm=case.get("layer_norm", False))


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_numpy_oracle_of_the_originals_layers(name: str) -> None:
    case = CASES[name]
    torch.manual_seed(3)
    model = build(case).double().eval()
    with torch.no_grad():  # biases and affines off their zero / one start, so every term counts
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, case["T"], case["F"], dtype=torch.float64)
    got = model(x).detach().numpy()
    w = tf_weights(model)
    for b in range(2):
        want = oracle(x[b].numpy(), w, case["pools"], case.get("centre", 0), case["bypass"],
                      case.get("activation", "relu"), case.get("layer_norm", False))
        assert got[b].shape == want.shape == (case["T"], case["F"], case["output_filters"])
        np.testing.assert_allclose(got[b], want, rtol=1e-9, atol=1e-9)


def test_float32_agrees_with_the_oracle_to_1e_5() -> None:
    case = CASES["recipe-unpool"]
    torch.manual_seed(5)
    model = build(case).eval()
    x = torch.randn(1, case["T"], case["F"])
    want = oracle(x[0].double().numpy(), tf_weights(model), case["pools"], 0, "unpool", "relu", False)
    np.testing.assert_allclose(model(x)[0].detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_unpool_ties_go_to_the_first_maximum_as_in_the_original() -> None:
    """After the ReLU whole windows are 0: the unpooled value goes to the window's first position."""
    model = EncoderDecoderCNN([1], [[1, 1]], [[1, 2]], 1, bypass="unpool").double()
    with torch.no_grad():
        model.encoder[0].weight.fill_(1.0)
        model.encoder[0].bias.zero_()
        model.decoder[0].weight.fill_(1.0)
        model.decoder[0].bias.fill_(0.5)
    x = torch.tensor([[[-1.0, -2.0, 3.0, 1.0, 2.0]]], dtype=torch.float64)  # relu: 0 0 | 3 1 | 2
    out = model(x)[0, 0, :, 0]
    # windows (0, 0) and (3, 1) pooled to 0 and 3, then unpooled to their first maxima; the 5th bin no window reached
    assert out.tolist() == [0.5, 0.5, 3.5, 0.5, 0.5]


@pytest.mark.parametrize("T", [4, 5, 6, 7, 9, 13])
def test_odd_lengths_come_back_at_their_length_as_the_original_pads(T: int) -> None:
    torch.manual_seed(0)
    for bypass in ("none", "concat", "unpool"):
        model = EncoderDecoderCNN([2, 3], [[3, 3], [3, 2]], [[2, 2], [2, 1]], 4, bypass=bypass)
        out = model(torch.randn(2, T, 9))
        assert out.shape == (2, T, 9, 4)
        if bypass != "unpool":  # the strided decoder is short by what pooling dropped: the last frame repeats
            assert torch.equal(out[:, -1], out[:, -2]) == (T % 2 == 1)


def test_too_short_for_its_pooling_is_an_error_naming_the_need() -> None:
    model = EncoderDecoderCNN([2, 2], [[3, 3], [3, 3]], [[2, 1], [2, 1]], 2)
    assert model(torch.randn(1, 4, 5)).shape == (1, 4, 5, 2)
    with pytest.raises(BatchError, match="3 frames x 5 bins is smaller than the 4 x 1 its pooling needs"):
        model(torch.randn(1, 3, 5))


def test_input_noise_in_training_only_and_gradients_reach_every_weight() -> None:
    torch.manual_seed(1)
    model = EncoderDecoderCNN([2, 3], [[3, 3], [2, 2]], [[1, 2], [2, 2]], 2, bypass="unpool", input_noise=0.5,
                              layer_norm=True, activation="tanh")
    x = torch.randn(2, 8, 9)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))
    model(x).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_weights_start_as_the_originals() -> None:
    torch.manual_seed(0)
    model = EncoderDecoderCNN([64], [[12, 15]], [[1, 2]], 32, bypass="unpool")
    conv, deconv = model.encoder[0], model.decoder[0]
    for layer, fan_in, fan_out in ((conv, 180, 180 * 64), (deconv, 180 * 64, 180 * 32)):
        limit = math.sqrt(6 / (fan_in + fan_out))  # glorot_uniform
        assert layer.weight.abs().max() <= limit and layer.weight.abs().max() > 0.9 * limit
        assert torch.count_nonzero(layer.bias) == 0


@pytest.mark.parametrize("settings, message", [
    ({"filters": [2], "kernels": [[3, 3]], "pools": [[2, 2]], "output_filters": 2, "bypass": "True"}, "bypass 'True'"),
    ({"filters": [2], "kernels": [[3, 3]], "pools": [[2, 2]], "output_filters": 2, "activation": "elu"}, "activation 'elu'"),
    ({"filters": [2, 2], "kernels": [[3, 3]], "pools": [[2, 2]], "output_filters": 2}, "one entry per encoder layer"),
    ({"filters": [2], "kernels": [[3, 0]], "pools": [[2, 2]], "output_filters": 2}, "kernels"),
    ({"filters": [2], "kernels": [[3, 3]], "pools": [[2, 2]], "output_filters": 2, "num_centre_layers": 1}, "centre_kernel"),
])
def test_bad_settings_are_errors(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EncoderDecoderCNN(**settings)


def test_concat_repeats_a_per_frame_input_over_the_bins_of_a_per_bin_first_input() -> None:
    """The original's concat with ``expand_dim_to_first_input = False True``: ``tf.expand_dims(x, -2)`` tiled to
    the first input's size on axis -2 (the bins of ``[B, T, F, C]``)."""
    bins, frames = torch.randn(2, 5, 7, 3), torch.randn(2, 5, 4)
    out = Concat(expand=[False, True])(bins, frames, seq_lengths=torch.tensor([5, 3]))
    want = torch.cat((bins, frames[:, :, None, :].repeat(1, 1, 7, 1)), dim=-1)
    assert torch.equal(out, want)
    with pytest.raises(BatchError, match="expanded input"):
        Concat(expand=[False, True])(bins, torch.randn(2, 4))


# ------------------------------------------------------------------ the importer
HYPER_MAIN = """[main]
architecture = encoder_decoder_cnn
bypass = unpool
num_filters_1st_layer = 80
num_output_filters = 80
fac_per_layer = 1.0
filter_size_t = 12
filter_size_t_fac_after_pool = 0.8
filter_size_f = 15
filter_size_f_fac_after_pool = 0.8
num_encoder_layers = 2
num_centre_layers = 0
f_pool_rate = 1
t_pool_rate = 3
activation_fn = relu
input_noise = 0.2
dropout = 1.0
layer_norm = False

"""
HYPER_REST = """[aux_lstm]
architecture = dblstm
num_units = 8
fac_per_layer = 1.0
num_layers = 2
input_noise = 0.2
dropout = 1.0
recurrent_dropout = 1.0
layer_norm = False
activation_fn = tanh

[concat]
architecture = concat
select_inputs = True True
flatten_last_2_dims = False False
expand_dim_to_first_input = False True

[feedforward]
architecture = feedforward
num_units = 16
fac_per_layer = 1.0
num_layers = 2
activation_func = relu
input_noise = 0
dropout = 1.0

[outlayer]
architecture = linear
output_dims = 20
input_noise = 0
dropout = 1.0
"""


def cnn_recipe(folder: Path, main: str = HYPER_MAIN) -> Path:
    """The test recipe of helpers.nabu (write_recipe) with the hyper-parameter-search recipe's task and model graph."""
    from helpers.nabu import TRAINER, write_recipe

    trainer = TRAINER.format(num_tries="3")
    trainer = trainer[:trainer.index("[task_dc]")].replace("tasks = task_dc task_pit", "tasks = task_2spk").replace(
        "task_weights = 1 0.5", "task_weights = 1").replace("init_file = /models/previous/network.ckpt\n", "")
    valid = "[evaluator]\nevaluator = task_loss_evaluator\nrequested_utts = 4\nbatch_size = 2\n\n"
    model = "[hyper]\nmodel_names = main aux_lstm concat feedforward outlayer\n\n" + main + HYPER_REST
    return write_recipe(folder, **{"model.cfg": model, "trainer.cfg": trainer + TASK.format(split="train"),
                                   "validation_evaluator.cfg": valid + TASK.format(split="dev"), "loss.cfg": None})


def test_the_importer_maps_the_hyper_parameter_search_model(tmp_path: Path) -> None:
    recipe = import_nabu(cnn_recipe(tmp_path / "MERL_DC_CNN"))
    models = recipe["models"]
    assert models["main"] == {"type": "EncoderDecoderCNN", "filters": [80, 80], "kernels": [[12, 15], [12, 12]],
                              "pools": [[1, 2], [1, 2]], "output_filters": 80, "bypass": "unpool",
                              "activation": "relu", "layer_norm": False, "input_noise": 0.2}
    assert models["concat"] == {"type": "Concat", "expand": [False, True]}
    assert models["feedforward"]["input_dim"] == 80 + 16  # the CNN's 80 channels and the BLSTM's 2 x 8 per bin
    assert models["outlayer"]["input_dim"] == 16 and models["outlayer"]["units"] == [20]
    net = build_model("EncoderDecoderCNN", **{k: v for k, v in models["main"].items() if k != "type"})
    assert [c.out_channels for c in net.encoder] == [80, 80] and [c.out_channels for c in net.decoder] == [80, 80]
    assert [list(c.kernel_size) for c in net.decoder] == [[12, 12], [12, 15]]
    assert [list(c.stride) for c in net.decoder] == [[1, 1], [1, 1]]


@pytest.mark.parametrize("edit, expected", [
    # filters: the first kernel as given; factors then default to 1; fac_per_layer grows the channels (ceiled)
    ({"filter_size_t = 12": "filters = 3 5", "filter_size_t_fac_after_pool = 0.8\n": "",
      "filter_size_f = 15\n": "", "filter_size_f_fac_after_pool = 0.8\n": "", "fac_per_layer = 1.0": "fac_per_layer = 1.5",
      "num_encoder_layers = 2": "num_encoder_layers = 3", "t_pool_rate = 3": "t_pool_rate = 2",
      "bypass = unpool": "bypass = True"},
     {"filters": [80, 120, 180], "kernels": [[3, 5]] * 3, "pools": [[1, 2], [2, 2], [1, 2]], "bypass": "concat"}),
    # the ideal size keeps its fraction from pool to pool (15 * 0.7 = 10.5 -> 11, 10.5 * 0.7 = 7.35 -> 8); time
    # pools after the third layer, so no kernel shrinks in time
    ({"filter_size_f_fac_after_pool = 0.8": "filter_size_f_fac_after_pool = 0.7", "num_encoder_layers = 2":
      "num_encoder_layers = 3", "bypass = unpool": "bypass = False", "layer_norm = False": "layer_norm = True",
      "activation_fn = relu": "activation_fn = tanh"},
     {"kernels": [[12, 15], [12, 11], [12, 8]], "pools": [[1, 2], [1, 2], [2, 2]], "bypass": "none",
      "layer_norm": True, "activation": "tanh", "filters": [80, 80, 80]}),
])
def test_kernel_sizes_pooling_and_bypass_as_the_original_computes_them(tmp_path: Path, edit: dict, expected: dict
                                                                       ) -> None:
    main = HYPER_MAIN
    for old, new in edit.items():
        main = main.replace(old, new, 1)
    spec = import_nabu(cnn_recipe(tmp_path / "MERL_DC_CNN", main))["models"]["main"]
    assert {k: spec[k] for k in expected} == expected
    model = build_model("EncoderDecoderCNN", **{k: v for k, v in spec.items() if k != "type"})
    assert model(torch.randn(1, 8, 129)).shape == (1, 8, 129, 80)


REFUSED = [
    ("dropout = 1.0\nlayer_norm", "dropout = 0.8\nlayer_norm", "\\[main\\] dropout: .*raises in training"),
    ("num_centre_layers = 0", "num_centre_layers = 2", "\\[main\\] num_centre_layers: .*TypeError"),
    ("fac_per_layer = 1.0\n", "", "\\[main\\] fac_per_layer: missing"),
    ("bypass = unpool\n", "", "\\[main\\] bypass: missing"),
    ("num_output_filters = 80\n", "", "\\[main\\] num_output_filters: missing"),
    ("num_encoder_layers = 2", "num_encoder_layers = 0", "\\[main\\] num_encoder_layers: 0"),
]


@pytest.mark.parametrize("old, new, message", REFUSED, ids=[r[2].split(":")[0][3:-2] for r in REFUSED])
def test_a_setting_mtlab_cannot_honour_is_refused_naming_file_key_and_why(tmp_path: Path, old: str, new: str,
                                                                          message: str) -> None:
    folder = cnn_recipe(tmp_path / "MERL_DC_CNN", HYPER_MAIN.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder / "model.cfg") in str(err.value)
    assert import_nabu(folder, strict=False)["nabu"]["unsupported"]


@pytest.mark.parametrize("old, new, message", [
    ("bypass = unpool", "bypass = sideways", "bypass = 'sideways'.*True, False, unpool"),
    ("activation_fn = relu", "activation_fn = elu", "activation_fn = 'elu'.*relu, tanh, sigmoid"),
    ("filter_size_t = 12\n", "", "needs 'filters' or 'filter_size_t' and 'filter_size_f'"),
    ("t_pool_rate = 3", "t_pool_rate = 0", "t_pool_rate = 0: .*at least 1"),
    ("layer_norm = False", "layer_norm = False\nkernel = 3", "unknown key 'kernel' in \\[main\\]"),
])
def test_malformed_cnn_settings_are_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = cnn_recipe(tmp_path / "MERL_DC_CNN", HYPER_MAIN.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder / "model.cfg") in str(err.value)


def test_shrink_caps_the_filters_and_the_sizes_that_follow(tmp_path: Path) -> None:
    from mtlab.nabu.shrink import shrink

    recipe = import_nabu(cnn_recipe(tmp_path / "MERL_DC_CNN"))
    shrink(recipe, 32)
    models = recipe["models"]
    assert models["main"]["filters"] == [8, 8] and models["main"]["output_filters"] == 8  # a quarter of the cap
    assert models["main"]["kernels"] == [[3, 3], [3, 3]] and models["main"]["pools"] == [[1, 2], [1, 2]]
    assert models["feedforward"]["input_dim"] == 8 + 16


RECIPES = NABU_RECIPES


@pytest.mark.skipif(not RECIPES.is_dir(), reason="the original's recipes are not next to this checkout")
def test_the_original_cnn_recipes_import_or_are_refused_by_name() -> None:
    hyper = import_nabu(RECIPES / "papers/InterSpeech2019/MERL_DC_hyper_param_search")
    assert hyper["models"]["main"]["kernels"] == [[12, 15], [12, 12]]
    assert hyper["models"]["feedforward"]["input_dim"] == 80 + 688
    with pytest.raises(ConfigError, match="model.cfg: \\[main\\] fac_per_layer: missing"):
        import_nabu(RECIPES / "SS/DCNN/MERL_DC_2spk")
    keys = {u["key"] for u in import_nabu(RECIPES / "SS/DCNN/MERL_DC_2spk", strict=False)["nabu"]["unsupported"]}
    assert keys == {"[main] fac_per_layer", "[main] num_output_filters", "[main] bypass", "[main] num_centre_layers"}


@pytest.mark.slow
def test_a_recipe_with_the_cnn_trains_a_step(tmp_path: Path) -> None:
    import mtlab
    from mtlab.nabu import make_sample_root, plain_recipe
    from mtlab.nabu.shrink import shrink

    recipe = import_nabu(cnn_recipe(tmp_path / "MERL_DC_CNN"), data_root=tmp_path / "data")
    make_sample_root(recipe, limit=4)
    shrink(recipe, 4)
    exp = mtlab.from_recipe(plain_recipe(recipe))
    net = exp.trainer.models["main"]
    assert isinstance(net, EncoderDecoderCNN)
    before = [p.detach().clone() for p in net.parameters()]
    exp.trainer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, net.parameters()))
