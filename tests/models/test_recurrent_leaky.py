"""LeakyBLSTM (the original's leaky_dblstm, _notrec, _iznotrec) and BRNN (dbrnn) against per-frame
plain-PyTorch oracles written from the original's cells, and their import."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import assert_grads_reach_weights_and_valid_frames
from torch import Tensor, nn
from helpers.paths import NABU_RECIPES

from mtlab.base.errors import ConfigError
from mtlab.models import BLSTM, BRNN, LeakyBLSTM, build_model
from mtlab.nabu import import_nabu

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = ["all", "forget_output", "none"]


# ------------------------------------------------------------------ the oracles: one frame at a time
def leaky_cell(x: Tensor, h: Tensor, c: Tensor, kernel: Tensor, bias: Tensor, kernel_inonly: Tensor | None,
               bias_inonly: Tensor | None, leak: float, forget_bias: float) -> tuple[Tensor, Tensor]:
    """One frame of the original's leak LSTM cells, as written there: gates ``i, j, f, o`` from
    ``[x, h] @ kernel + bias`` (LayerNormBasicLeakLSTMCell); iznotrec splits them into ``f, o`` from
    ``[x, h]`` and ``i, j`` from ``x @ kernel_inonly + bias_inonly``; notrec has ``x @ kernel`` only."""
    H = h.shape[0]
    args = torch.cat((x, h)) if kernel.shape[0] > x.shape[0] else x
    concat = args @ kernel + bias
    if kernel_inonly is not None:
        f, o = concat.split(H)
        i, j = (x @ kernel_inonly + bias_inonly).split(H)
    else:
        i, j, f, o = concat.split(H)
    new_c = c * torch.sigmoid(f + forget_bias) + torch.sigmoid(i) * torch.tanh(j)
    new_h = torch.tanh(new_c) * torch.sigmoid(o)
    return new_h, new_c * leak


def cell_weights(model: LeakyBLSTM, layer: int, d: int) -> tuple:
    """The model's weights of one layer and direction as the original's kernels for ``leaky_cell``."""
    H = model.hidden
    wx, b = model.input_weights[layer][d], model.biases[layer][d]
    if model.recurrent == "all":
        return torch.cat((wx, model.recurrent_weights[layer][d])), b, None, None
    if model.recurrent == "forget_output":
        kernel = torch.cat((wx[:, 2 * H:], model.recurrent_weights[layer][d]))
        return kernel, b[2 * H:], wx[:, :2 * H], b[:2 * H]
    return wx, b, None, None


def leaky_oracle(model: LeakyBLSTM, x: Tensor, L: int) -> Tensor:
    """``[L, 2H]`` for one sequence of ``x`` ``[T, D]`` cut to its ``L`` valid frames."""
    frames = list(x[:L])
    for layer in range(model.num_layers):
        outs = []
        for d, order in ((0, frames), (1, frames[::-1])):
            weights = cell_weights(model, layer, d)
            h = c = torch.zeros(model.hidden, dtype=x.dtype)
            hs = []
            for f in order:
                h, c = leaky_cell(f, h, c, *weights, model.leak, model.forget_bias)
                hs.append(h)
            outs.append(hs if d == 0 else hs[::-1])
        frames = [torch.cat((a, b)) for a, b in zip(*outs)]
    return torch.stack(frames)


def rnn_oracle(model: BRNN, x: Tensor, L: int) -> Tensor:
    """``[L, 2H]``: ``h_t = tanh(W x_t + b_ih + U h_{t-1} + b_hh)`` per direction, frame by frame."""
    frames = list(x[:L])
    for rnn in model.layers:
        outs = []
        for suffix, order in (("", frames), ("_reverse", frames[::-1])):
            w, u = getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}")
            b = getattr(rnn, f"bias_ih_l0{suffix}") + getattr(rnn, f"bias_hh_l0{suffix}")
            h = torch.zeros(rnn.hidden_size, dtype=x.dtype)
            hs = []
            for f in order:
                h = torch.tanh(w @ f + u @ h + b)
                hs.append(h)
            outs.append(hs if suffix == "" else hs[::-1])
        frames = [torch.cat((a, b)) for a, b in zip(*outs)]
    return torch.stack(frames)


# ------------------------------------------------------------------ LeakyBLSTM
@pytest.mark.parametrize("recurrent", VARIANTS)
@pytest.mark.parametrize("num_layers, leak", [(1, 0.5), (2, 0.7), (2, 0.0)])
def test_matches_the_per_frame_oracle_on_padded_batches(recurrent: str, num_layers: int, leak: float) -> None:
    torch.manual_seed(0)
    model = LeakyBLSTM(3, 4, num_layers=num_layers, leak=leak, recurrent=recurrent).double()
    x = torch.randn(3, 11, 3, dtype=torch.float64)
    lengths = torch.tensor([11, 8, 2])
    y = model(x, lengths)
    for b, L in enumerate(lengths.tolist()):
        torch.testing.assert_close(y[b, :L], leaky_oracle(model, x[b], L))
        assert y[b, L:].abs().sum() == 0


def copy_lstm(model: LeakyBLSTM, lstms: list[nn.LSTM], forget_bias: float) -> None:
    """Give ``model`` the weights of one-layer bidirectional ``lstms`` (gates i, f, g, o -> i, j, f, o)."""
    with torch.no_grad():
        for layer, lstm in enumerate(lstms):
            for d, suffix in enumerate(("", "_reverse")):
                i, f, g, o = getattr(lstm, f"weight_ih_l0{suffix}").chunk(4)
                model.input_weights[layer][d] = torch.cat((i, g, f, o)).T
                i, f, g, o = getattr(lstm, f"weight_hh_l0{suffix}").chunk(4)
                model.recurrent_weights[layer][d] = torch.cat((i, g, f, o)).T
                i, f, g, o = (getattr(lstm, f"bias_ih_l0{suffix}") + getattr(lstm, f"bias_hh_l0{suffix}")).chunk(4)
                model.biases[layer][d] = torch.cat((i, g, f - forget_bias, o))


@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_leak_one_is_mtlabs_blstm(forget_bias: float) -> None:
    torch.manual_seed(1)
    blstm = BLSTM(5, 6, num_layers=2, layer_dropout=0.5).double().eval()  # one nn.LSTM per layer
    leaky = LeakyBLSTM(5, 6, num_layers=2, leak=1.0, forget_bias=forget_bias).double()
    copy_lstm(leaky, list(blstm.layers), forget_bias)
    x = torch.randn(3, 9, 5, dtype=torch.float64)
    lengths = torch.tensor([9, 5, 1])
    expected = blstm(x, lengths)
    torch.testing.assert_close(leaky(x, lengths), expected)
    leaky.leak = 0.5
    assert not torch.allclose(leaky(x, lengths), expected)


def test_the_leak_bounds_the_memory_of_the_state_only() -> None:
    torch.manual_seed(2)
    x = torch.randn(1, 9, 2, requires_grad=True)
    reached = {}
    for recurrent in VARIANTS:
        model = LeakyBLSTM(2, 3, leak=0.0, recurrent=recurrent)
        x.grad = None
        model(x, torch.tensor([9]))[0, 4, :3].sum().backward()  # the forward direction at frame 4
        assert x.grad is not None
        reached[recurrent] = (x.grad[0].abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert reached["none"] == [4]  # no leak left and nothing else recurrent: the frame alone
    assert reached["forget_output"] == reached["all"] == [0, 1, 2, 3, 4]  # h_{t-1} still carries the past


def test_padded_frames_never_change_valid_outputs() -> None:
    torch.manual_seed(3)
    for recurrent in VARIANTS:
        model = LeakyBLSTM(5, 6, num_layers=2, leak=0.6, recurrent=recurrent)
        x = torch.randn(4, 15, 5)
        lengths = torch.tensor([15, 11, 7, 1])
        y = model(x, lengths)
        noisy = x.clone()
        for b, L in enumerate(lengths.tolist()):
            noisy[b, L:] = 1e3 * torch.randn(15 - L, 5)
        torch.testing.assert_close(model(noisy, lengths), y)
        alone = model(x[1:2, :11], lengths[1:2])
        torch.testing.assert_close(alone[0], y[1, :11], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("recurrent", VARIANTS)
def test_gradients_reach_every_weight_and_only_valid_inputs(recurrent: str) -> None:
    torch.manual_seed(4)
    assert_grads_reach_weights_and_valid_frames(LeakyBLSTM(4, 5, num_layers=2, leak=0.5, recurrent=recurrent))


def test_dropout_on_the_output_only_and_in_training_only() -> None:
    torch.manual_seed(5)
    model = LeakyBLSTM(3, 8, num_layers=2, leak=0.5, dropout=0.5)
    x, lengths = torch.randn(2, 6, 3), torch.tensor([6, 6])
    model.eval()
    clean = model(x, lengths)
    model.train()
    dropped = model(x, lengths)
    kept = dropped != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(dropped[kept], 2 * clean[kept])  # the layers below ran without dropout


def test_settings_that_cannot_work_are_errors() -> None:
    with pytest.raises(ConfigError, match="recurrent = 'some'; valid: \\['all', 'forget_output', 'none'\\]"):
        LeakyBLSTM(2, 3, recurrent="some")
    model = build_model("LeakyBLSTM", input_dim=2, hidden=3, leak=0.5, recurrent="none")
    assert isinstance(model, LeakyBLSTM) and model.recurrent_weights is None


# ------------------------------------------------------------------ BRNN
def test_brnn_matches_the_per_frame_rnn_on_padded_batches() -> None:
    torch.manual_seed(6)
    model = BRNN(3, 4, num_layers=2).double()
    x = torch.randn(3, 10, 3, dtype=torch.float64)
    lengths = torch.tensor([10, 6, 1])
    y = model(x, lengths)
    for b, L in enumerate(lengths.tolist()):
        torch.testing.assert_close(y[b, :L], rnn_oracle(model, x[b], L))
        assert y[b, L:].abs().sum() == 0
    rnn = nn.RNN(3, 4, batch_first=True, bidirectional=True).double()
    rnn.load_state_dict(model.layers[0].state_dict())
    torch.testing.assert_close(model.layers[0](x)[0], rnn(x)[0])


def test_brnn_drops_after_every_layer_in_training_only() -> None:
    torch.manual_seed(7)
    model = BRNN(3, 8, num_layers=2, layer_dropout=0.5)
    x, lengths = torch.randn(2, 6, 3, requires_grad=True), torch.tensor([6, 3])
    model.eval()
    clean = model(x, lengths)
    model.train()
    dropped = model(x, lengths)
    assert (dropped[0] == 0).any() and not torch.allclose(dropped, clean)
    dropped.sum().backward()
    assert x.grad is not None and x.grad[1, 3:].abs().sum() == 0


# ------------------------------------------------------------------ the importer: model.cfg's leaky and dbrnn
LEAKY_MAIN = """[main]
architecture = leaky_dblstm
num_units = 8
num_layers = 2
input_noise = 0.2
dropout = 1.0
recurrent_dropout = 1.0
layer_norm = False
leak_factor = 0.5

"""


def model_recipe(folder: Path, main: str) -> Path:
    from helpers.nabu import MODEL, write_recipe

    start, end = MODEL.index("[main]"), MODEL.index("[outlayer]")
    return write_recipe(folder, **{"model.cfg": MODEL[:start] + main + MODEL[end:]})


@pytest.mark.parametrize("arch, recurrent", [("leaky_dblstm", "all"), ("leaky_dblstm_iznotrec", "forget_output"),
                                             ("leaky_dblstm_notrec", "none")])
def test_the_importer_maps_the_leaky_model_cfg_keys(tmp_path: Path, arch: str, recurrent: str) -> None:
    main = LEAKY_MAIN.replace("architecture = leaky_dblstm", f"architecture = {arch}").replace(
        "dropout = 1.0\nrecurrent", "dropout = 0.8\nrecurrent")
    recipe = import_nabu(model_recipe(tmp_path / "MERL_LEAKY", main))
    spec = recipe["models"]["main"]
    assert spec == {"type": "LeakyBLSTM", "input_dim": 129, "hidden": 8, "num_layers": 2, "input_noise": 0.2,
                    "leak": 0.5, "recurrent": recurrent, "forget_bias": 1.0, "dropout": pytest.approx(0.2)}
    assert recipe["models"]["outlayer"]["input_dim"] == 16
    model = build_model(spec["type"], **{k: v for k, v in spec.items() if k != "type"})
    assert isinstance(model, LeakyBLSTM) and model.leak == 0.5 and model.recurrent == recurrent
    assert model(torch.randn(2, 7, 129), torch.tensor([7, 4])).shape == (2, 7, 16)


def test_the_importer_maps_dbrnn(tmp_path: Path) -> None:
    main = LEAKY_MAIN.replace("architecture = leaky_dblstm", "architecture = dbrnn").replace(
        "leak_factor = 0.5\n", "").replace("dropout = 1.0\nrecurrent", "dropout = 0.9\nrecurrent")
    spec = import_nabu(model_recipe(tmp_path / "MERL_RNN", main))["models"]["main"]
    assert spec == {"type": "BRNN", "input_dim": 129, "hidden": 8, "num_layers": 2, "input_noise": 0.2,
                    "layer_dropout": pytest.approx(0.1)}
    model = build_model(spec["type"], **{k: v for k, v in spec.items() if k != "type"})
    assert isinstance(model, BRNN) and model(torch.randn(2, 5, 129), torch.tensor([5, 2])).shape == (2, 5, 16)


REFUSED = [
    ("leaky_dblstm", "recurrent_dropout = 1.0", "recurrent_dropout = 0.8",
     "\\[main\\] recurrent_dropout: mtlab's LeakyBLSTM has no recurrent dropout"),
    ("leaky_dblstm_notrec", "layer_norm = False", "layer_norm = True",
     "\\[main\\] layer_norm: mtlab's LeakyBLSTM has no layer normalization"),
    ("dbrnn", "layer_norm = False", "layer_norm = True", "\\[main\\] layer_norm: .* \\(the original's dbrnn ignores"),
]


@pytest.mark.parametrize("arch, old, new, message", REFUSED, ids=[f"{r[0]}-{r[2]}" for r in REFUSED])
def test_a_value_mtlab_cannot_honour_is_refused_naming_file_key_and_why(tmp_path: Path, arch: str, old: str,
                                                                        new: str, message: str) -> None:
    main = LEAKY_MAIN.replace("architecture = leaky_dblstm", f"architecture = {arch}")
    if arch == "dbrnn":
        main = main.replace("leak_factor = 0.5\n", "")
    folder = model_recipe(tmp_path / "MERL_LEAKY", main.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder / "model.cfg") in str(err.value)
    assert import_nabu(folder, strict=False)["nabu"]["unsupported"]


@pytest.mark.parametrize("old, new, message", [
    ("leak_factor = 0.5\n", "", "\\[main\\] needs 'leak_factor' for architecture 'leaky_dblstm'"),
    ("leak_factor = 0.5", "leak_factor = half", "leak_factor"),
    ("leak_factor = 0.5", "leak_factor = 0.5\nt_reset = 4", "unknown key 't_reset' in \\[main\\]"),
])
def test_malformed_leaky_settings_are_errors(tmp_path: Path, old: str, new: str, message: str) -> None:
    folder = model_recipe(tmp_path / "MERL_LEAKY", LEAKY_MAIN.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message) as err:
        import_nabu(folder)
    assert str(folder / "model.cfg") in str(err.value)


RECIPES = NABU_RECIPES


@pytest.mark.skipif(not RECIPES.is_dir(), reason="the original's recipes are not next to this checkout")
def test_the_original_leaky_and_rnn_recipes_map_their_model() -> None:
    folders = sorted({p.parent for p in RECIPES.rglob("model.cfg")
                      if any(f"architecture = {a}\n" in p.read_text() for a in
                             ("leaky_dblstm", "leaky_dblstm_notrec", "leaky_dblstm_iznotrec", "dbrnn"))})
    assert len(folders) == 9
    for folder in folders:
        recipe = import_nabu(folder, strict=False)
        assert not [u for u in recipe["nabu"].get("unsupported", []) if u["file"] == "model.cfg"], folder
        assert recipe["models"]["main"]["type"] in ("LeakyBLSTM", "BRNN"), folder
