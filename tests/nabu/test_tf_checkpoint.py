"""Original trained models (TensorFlow checkpoints) converted to mtlab weights: the pure-Python checkpoint
reader, and each converted model against a per-frame numpy re-implementation of the original's cells on
the checkpoint's weights. ``nabu_tf_fixture/original.ckpt`` was written once by TensorFlow
(``nabu_tf_fixture/make_fixture.py``) with the original's variable names; with TensorFlow installed (the
``tensorflow`` extra) a further test writes fresh checkpoints and compares the reader with TensorFlow's."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.nabu import replace_in, write_recipe
from helpers.tf_fixtures import FIXTURE, FIXTURE_PREFIX, F, H, fixture_values

from mtlab.apps.cli import main
from mtlab.apps.recipe import from_recipe, load_initial_weights
from mtlab.base.errors import ConfigError
from mtlab.models import build_model
from mtlab.nabu import import_nabu, make_sample_root
from mtlab.nabu.tf_checkpoint import CheckpointFormatError, TFCheckpoint
from mtlab.nabu.tf_convert import convert_checkpoint, convert_models

pytestmark = pytest.mark.usefixtures("one_thread")



# the recipe of helpers.nabu (write_recipe) with 2-unit models, whose names and sizes the fixture's variables have
SMALL_MODEL = """[hyper]
model_names = main outlayer ff concat pitlayer

[main]
architecture = dblstm
num_units = 2
num_layers = 2
input_noise = 0
dropout = 1.0
recurrent_dropout = 1.0
layer_norm = False

[outlayer]
architecture = linear
output_dims = 129 3
input_noise = 0
dropout = 1.0

[ff]
architecture = feedforward
num_units = 2
num_layers = 2
input_noise = 0
dropout = 1.0

[concat]
architecture = concat
expand_dim_to_first_input = False False

[pitlayer]
architecture = linear
output_dims = 258
input_noise = 0
dropout = 1.0
"""


# ------------------------------------------------------------------ the oracles: the original's cells in numpy
def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def tf_lstm(x: np.ndarray, h: np.ndarray, c: np.ndarray, kernel: np.ndarray, bias: np.ndarray,
            forget_bias: float = 1.0, leak: float = 1.0, inonly: tuple | None = None) -> tuple:
    """One frame of the original's cells as TensorFlow computes them: ``[x, h] @ kernel + bias`` split
    ``i, j, f, o``; ``c = sig(f + forget_bias) c + sig(i) tanh(j)``; ``h = sig(o) tanh(c)``; the state
    kept for the next frame is ``leak * c``. A kernel with ``len(x)`` rows reads ``x`` only (notrec);
    ``inonly = (kernel, bias)`` gives ``i, j`` from ``x`` and the kernel ``f, o`` (iznotrec)."""
    args = np.concatenate([x, h]) if kernel.shape[0] > len(x) else x
    z = args @ kernel + bias
    if inonly is not None:
        f, o = np.split(z, 2)
        i, j = np.split(x @ inonly[0] + inonly[1], 2)
    else:
        i, j, f, o = np.split(z, 4)
    c = c * sigmoid(f + forget_bias) + sigmoid(i) * np.tanh(j)
    h = np.tanh(c) * sigmoid(o)
    return h, leak * c


def tf_rnn(x: np.ndarray, h: np.ndarray, c: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> tuple:
    """One frame of TensorFlow's BasicRNNCell: ``h = tanh([x, h] @ kernel + bias)``."""
    h = np.tanh(np.concatenate([x, h]) @ kernel + bias)
    return h, c


def bidirectional(x: np.ndarray, length: int, layers: list, step) -> np.ndarray:
    """``[T, 2H]`` of stacked bidirectional layers over one sequence as ``bidirectional_dynamic_rnn`` runs
    them: the backward cell reads the ``length`` valid frames reversed; padded frames give zeros.
    ``layers``: per layer, ``(forward weights, backward weights)``, each passed on to ``step``."""
    frames = list(x[:length])
    for fw, bw in layers:
        outs = []
        for weights, order in ((fw, frames), (bw, frames[::-1])):
            h = c = np.zeros(H)
            hs = []
            for f in order:
                h, c = step(f, h, c, *weights)
                hs.append(h)
            outs.append(hs if weights is fw else hs[::-1])
        frames = [np.concatenate([a, b]) for a, b in zip(*outs)]
    out = np.zeros((x.shape[0], 2 * H))
    out[:length] = np.stack(frames)
    return out


def cell_weights(values: dict, model: str, layer: int, keys: tuple[str, ...]) -> tuple:
    """((forward weights), (backward weights)) of one layer, in ``keys`` order, from the checkpoint's values."""
    def find(direction: str, key: str) -> np.ndarray:
        [name] = [n for n in values if n.startswith(f"{model}/layer{layer}/") and f"/{direction}/" in n
                  and n.endswith(f"/{key}")]
        return values[name].astype(np.float64)

    return tuple(tuple(find(d, k) for k in keys) for d in ("fw", "bw"))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch ``[3, 6, F]`` with lengths 6, 4, 1 (its padding filled with values that must not matter)."""
    x = torch.randn(3, 6, F, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return x, torch.tensor([6, 4, 1])


@pytest.fixture(scope="module")
def ckpt() -> TFCheckpoint:
    return TFCheckpoint(FIXTURE_PREFIX)


@pytest.fixture
def small_recipe(tmp_path: Path) -> Path:
    return write_recipe(tmp_path / "MERL_SMALL", **{"model.cfg": SMALL_MODEL})


# ------------------------------------------------------------------ the reader
def test_the_reader_gives_every_variable_of_a_tensorflow_written_checkpoint(ckpt: TFCheckpoint) -> None:
    expected = fixture_values()
    assert ckpt.shapes() == {n: tuple(s) for n, s in FIXTURE.items()}
    for name, value in expected.items():
        got = ckpt.read(name)
        assert got.dtype == value.dtype and np.array_equal(got, value), name
    assert TFCheckpoint(f"{FIXTURE_PREFIX}.index").shapes() == ckpt.shapes()  # a file of it names it too


def test_a_corrupted_or_missing_checkpoint_is_an_error_naming_the_file(tmp_path: Path) -> None:
    for suffix in (".index", ".data-00000-of-00001"):
        shutil.copy(f"{FIXTURE_PREFIX}{suffix}", tmp_path / f"bad.ckpt{suffix}")
    data = tmp_path / "bad.ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    entry = TFCheckpoint(tmp_path / "bad.ckpt").entries["ff/fully_connected_1/weights"]
    raw[entry.offset + 3] ^= 0x40
    data.write_bytes(bytes(raw))
    reader = TFCheckpoint(tmp_path / "bad.ckpt")
    assert np.array_equal(reader.read("ff/fully_connected/weights"), fixture_values()["ff/fully_connected/weights"])
    with pytest.raises(CheckpointFormatError, match="'ff/fully_connected_1/weights' fails its CRC32C check"):
        reader.read("ff/fully_connected_1/weights")
    index = tmp_path / "bad.ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[10] ^= 0x01
    index.write_bytes(bytes(raw))
    with pytest.raises(CheckpointFormatError, match="CRC32C does not match"):
        TFCheckpoint(tmp_path / "bad.ckpt")
    with pytest.raises(CheckpointFormatError, match="nothere.ckpt.index not found"):
        TFCheckpoint(tmp_path / "nothere.ckpt")


# ------------------------------------------------------------------ converted models against the oracles
@pytest.mark.parametrize("keep", ["1.0", "0.9"])  # 0.9: BLSTM keeps one nn.LSTM per layer (dropout after each)
def test_the_converted_blstm_matches_the_original_cell_per_frame_in_both_directions(ckpt: TFCheckpoint,
                                                                                       small_recipe: Path,
                                                                                       keep: str) -> None:
    replace_in(small_recipe, "model.cfg", "dropout = 1.0\nrecurrent_dropout", f"dropout = {keep}\nrecurrent_dropout")
    states = convert_checkpoint(ckpt, small_recipe)
    spec = dict(import_nabu(small_recipe)["models"]["main"])
    assert (spec["layer_dropout"] > 0) == (keep != "1.0")
    model = build_model(spec.pop("type"), **spec).double().eval()
    model.load_state_dict(states["main"])
    x, lengths = batch()
    got = model(x, lengths).detach().numpy()
    values = fixture_values()
    layers = [cell_weights(values, "main", layer, ("kernel", "bias")) for layer in range(2)]
    for b, length in enumerate(lengths.tolist()):
        np.testing.assert_allclose(got[b], bidirectional(x[b].numpy(), length, layers, tf_lstm), atol=1e-6)


def test_the_converted_dense_layers_match_the_original_per_frame(ckpt: TFCheckpoint, small_recipe: Path) -> None:
    states = convert_checkpoint(ckpt, small_recipe)
    assert states["concat"] == {} and set(states) == {"main", "outlayer", "ff", "concat", "pitlayer"}
    specs = import_nabu(small_recipe)["models"]
    v = {k: a.astype(np.float64) for k, a in fixture_values().items()}
    x = torch.randn(2, 5, F, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    models = {}
    for name in ("outlayer", "ff", "pitlayer"):
        spec = dict(specs[name])
        models[name] = build_model(spec.pop("type"), **spec).double().eval()
        models[name].load_state_dict(states[name])
    ff = np.tanh(np.tanh(x.numpy() @ v["ff/fully_connected/weights"] + v["ff/fully_connected/biases"])
                 @ v["ff/fully_connected_1/weights"] + v["ff/fully_connected_1/biases"])  # tanh: feedforward's default
    np.testing.assert_allclose(models["ff"](x).detach().numpy(), ff, atol=1e-9)
    hidden = torch.randn(2, 5, 2 * H + 2, dtype=torch.float64)
    pit = hidden.numpy() @ v["pitlayer/fully_connected/weights"] + v["pitlayer/fully_connected/biases"]
    np.testing.assert_allclose(models["pitlayer"](hidden).detach().numpy(), pit, atol=1e-9)
    out = hidden[..., :2 * H].numpy() @ v["outlayer/fully_connected/weights"] + v["outlayer/fully_connected/biases"]
    np.testing.assert_allclose(models["outlayer"](hidden[..., :2 * H]).detach().numpy(), out.reshape(2, 5, 129, 3),
                               atol=1e-9)  # TensorFlow's row-major reshape to output_dims


@pytest.mark.parametrize("name,recurrent,layers", [("leaky", "all", 2), ("leakyiz", "forget_output", 1),
                                                   ("leakynotrec", "none", 1)])
def test_the_converted_leaky_lstms_match_the_original_cells_per_frame(ckpt: TFCheckpoint, name: str, recurrent: str,
                                                                     layers: int) -> None:
    spec = {"type": "LeakyBLSTM", "input_dim": 3, "hidden": H, "num_layers": layers, "leak": 0.7,
            "recurrent": recurrent, "forget_bias": 1.0}
    states = convert_models(ckpt, {name: spec})
    model = build_model("LeakyBLSTM", **{k: v for k, v in spec.items() if k != "type"}).double().eval()
    model.load_state_dict(states[name])
    x, lengths = batch()
    x = x[..., :3]
    values = fixture_values()
    keys = ("kernel", "bias", "kernel_inonly", "bias_inonly") if recurrent == "forget_output" else ("kernel", "bias")

    def step(f: np.ndarray, h: np.ndarray, c: np.ndarray, *w: np.ndarray) -> tuple:
        return tf_lstm(f, h, c, w[0], w[1], leak=0.7, inonly=(w[2], w[3]) if len(w) == 4 else None)

    weights = [cell_weights(values, name, layer, keys) for layer in range(layers)]
    got = model(x, lengths).detach().numpy()
    for b, length in enumerate(lengths.tolist()):
        np.testing.assert_allclose(got[b], bidirectional(x[b].numpy(), length, weights, step), atol=1e-6)


def test_the_converted_reset_lstm_steps_as_the_original_reset_cell(ckpt: TFCheckpoint) -> None:
    """The reset cell is the LSTM cell on a replica's state (ResetBLSTM's replicas are tested against
    the original's scheme in tests/models/test_recurrent_reset.py): one step of each direction's converted ``nn.LSTM``
    from a non-zero state equals the original's cell on the checkpoint's kernel."""
    spec = {"type": "ResetBLSTM", "input_dim": 3, "hidden": H, "num_layers": 1, "t_reset": 4}
    states = convert_models(ckpt, {"reset": spec})
    model = build_model("ResetBLSTM", **{k: v for k, v in spec.items() if k != "type"}).double()
    model.load_state_dict(states["reset"])
    fw, bw = cell_weights(fixture_values(), "reset", 0, ("kernel", "bias"))
    rng = np.random.default_rng(2)
    for lstm, (kernel, bias) in ((model.forward_lstms[0], fw), (model.backward_lstms[0], bw)):
        x, h, c = rng.normal(size=3), rng.normal(size=H), rng.normal(size=H)
        _, (h2, c2) = lstm(torch.tensor(x).view(1, 1, 3), (torch.tensor(h).view(1, 1, H), torch.tensor(c).view(1, 1, H)))
        want_h, want_c = tf_lstm(x, h, c, kernel, bias)
        np.testing.assert_allclose(h2.detach().numpy().ravel(), want_h, atol=1e-9)
        np.testing.assert_allclose(c2.detach().numpy().ravel(), want_c, atol=1e-9)


def test_the_converted_brnn_matches_the_original_cell_per_frame(ckpt: TFCheckpoint) -> None:
    spec = {"type": "BRNN", "input_dim": 3, "hidden": H, "num_layers": 1}
    states = convert_models(ckpt, {"brnn": spec})
    model = build_model("BRNN", input_dim=3, hidden=H).double().eval()
    model.load_state_dict(states["brnn"])
    x, lengths = batch()
    x = x[..., :3]
    weights = [cell_weights(fixture_values(), "brnn", 0, ("kernel", "bias"))]
    got = model(x, lengths).detach().numpy()
    for b, length in enumerate(lengths.tolist()):
        np.testing.assert_allclose(got[b], bidirectional(x[b].numpy(), length, weights, tf_rnn), atol=1e-9)


# ------------------------------------------------------------------ the command and init_file
def test_the_command_writes_weights_that_init_file_loads(ckpt: TFCheckpoint, small_recipe: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "model.pt"
    assert main(["import-nabu-checkpoint", str(FIXTURE_PREFIX), "--recipe", str(small_recipe), "-o", str(out)]) == 0
    assert "5 model(s)" in capsys.readouterr().out
    make_sample_root(import_nabu(small_recipe, data_root=tmp_path / "data"), limit=4)
    replace_in(small_recipe, "trainer.cfg", "init_file = /models/previous/network.ckpt", f"init_file = {out}")
    exp = from_recipe(small_recipe, data_root=tmp_path / "data")
    converted = convert_checkpoint(ckpt, small_recipe)
    for name, model in exp.trainer.models.items():
        for key, value in model.state_dict().items():
            assert torch.equal(value, converted[name][key]), (name, key)
    # the original's checkpoint itself as init_file: the error says how to convert it
    with pytest.raises(ConfigError, match="is a TensorFlow checkpoint.*convert it with `mtlab import-nabu-checkpoint"):
        load_initial_weights(exp.trainer, FIXTURE_PREFIX)


# ------------------------------------------------------------------ a checkpoint that does not fit the recipe
def test_a_wrong_shape_names_the_variable_the_model_and_both_shapes(ckpt: TFCheckpoint, small_recipe: Path) -> None:
    replace_in(small_recipe, "model.cfg", "num_units = 2\nnum_layers = 2", "num_units = 3\nnum_layers = 2")
    with pytest.raises(ConfigError) as err:
        convert_checkpoint(ckpt, small_recipe)
    message = str(err.value)
    assert "'main/layer0/bidirectional_rnn/fw/layer_norm_basic_lstm_cell/kernel' of model 'main'" in message
    assert "shape [131, 8]" in message and "expects [132, 12]" in message


def test_a_missing_or_left_over_variable_is_an_error(ckpt: TFCheckpoint, small_recipe: Path) -> None:
    replace_in(small_recipe, "model.cfg", "num_units = 2\nnum_layers = 2", "num_units = 2\nnum_layers = 3")
    with pytest.raises(ConfigError, match=r"model 'main' \(BLSTM\) needs variable main/layer2/.../fw/.../kernel of "
                                          r"shape \[6, 8\]; the checkpoint has none"):
        convert_checkpoint(ckpt, small_recipe)
    replace_in(small_recipe, "model.cfg", "num_units = 2\nnum_layers = 3", "num_units = 2\nnum_layers = 1")
    with pytest.raises(ConfigError, match=r"model 'main' \(BLSTM\) has variables the recipe's model does not "
                                          r"\(\['main/layer1/"):
        convert_checkpoint(ckpt, small_recipe)
    with pytest.raises(ConfigError, match=r"no variable of model 'absent' \(the checkpoint's models: \['brnn', 'ff',"):
        convert_models(ckpt, {"absent": {"type": "BRNN", "input_dim": 3, "hidden": H}})


def test_layer_normalization_weights_are_refused(ckpt: TFCheckpoint) -> None:
    entries = dict(ckpt.entries)  # the fixture's entries plus a layer-normalized cell's gain
    entries["brnn/layer0/bidirectional_rnn/fw/basic_rnn_cell/input/gamma"] = entries["brnn/layer0/bidirectional_rnn/fw/basic_rnn_cell/bias"]
    ckpt_ln = TFCheckpoint.__new__(TFCheckpoint)
    ckpt_ln.prefix, ckpt_ln.entries, ckpt_ln.num_shards = ckpt.prefix, entries, ckpt.num_shards
    with pytest.raises(ConfigError, match="model 'brnn' has layer normalization weights .*mtlab's BRNN has no layer "
                                          "normalization"):
        convert_models(ckpt_ln, {"brnn": {"type": "BRNN", "input_dim": 3, "hidden": H}})


# ------------------------------------------------------------------ against TensorFlow itself, where installed
@pytest.mark.slow  # importing TensorFlow takes seconds and starts a subprocess
def test_the_reader_agrees_with_tensorflow_on_fresh_checkpoints(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow", reason="TensorFlow writes the checkpoint: pip install -e .[tensorflow]")
    rng = np.random.default_rng(3)
    values = {"a/kernel": rng.normal(size=(300, 257)).astype(np.float32), "a/bias": np.arange(5, dtype=np.float64),
              "b/int": rng.integers(-9, 9, size=(2, 3, 4)).astype(np.int32), "step": np.array(7, dtype=np.int64),
              **{f"many/v{k:03d}": rng.normal(size=(k % 7 + 1,)).astype(np.float16) for k in range(200)}}
    names = list(values)
    tf.raw_ops.SaveV2(prefix=str(tmp_path / "fresh.ckpt"), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[values[n] for n in names])
    theirs = tf.train.load_checkpoint(str(tmp_path / "fresh.ckpt"))
    ours = TFCheckpoint(tmp_path / "fresh.ckpt")
    assert {n: list(s) for n, s in ours.shapes().items()} == theirs.get_variable_to_shape_map()
    for name in names:
        assert np.array_equal(ours.read(name), theirs.get_tensor(name)), name
    fixture = tf.train.load_checkpoint(str(FIXTURE_PREFIX))  # the committed fixture is what TensorFlow reads too
    for name, value in fixture_values().items():
        assert np.array_equal(fixture.get_tensor(name), value), name
