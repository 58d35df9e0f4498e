"""Original trained encoder-decoder CNNs and capsule networks (TensorFlow checkpoints) converted to mtlab weights,
each against the numpy transcription of the original's model (``helpers.nabu_oracles``) on the
checkpoint's values. The variable names are those the original's code gives (``nabu/neuralnetworks/models/
encoder_decoder_cnn.py``, ``capsnet.py``, ``dbr_capsnet.py``; ``components/layer.py`` ``Conv2D``, ``Capsule``,
``BRNNLayer``, ``BRCapsuleLayer``; ``components/rnn_cell.py`` ``RNNCellLinearOut``, ``RecCapsuleCell``).

``nabu_tf_fixture/models.ckpt`` is written by ``nabu_tf_fixture/make_models_fixture.py`` with ``tf_bundle``
(TensorFlow's tensor bundle format without TensorFlow): ``tf_bundle`` writes the TensorFlow-written
``original.ckpt`` fixture back byte for byte (data) and entry for entry (index), and with TensorFlow installed
(the ``tensorflow`` extra) a slow test reads ``models.ckpt`` with TensorFlow itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.nabu_oracles import original_bidirectional, original_capsnet, original_rec_capsule_cell, original_rnn_linear_out, original_squash
from helpers.nabu_oracles import oracle as original_cnn
from helpers.tf_fixtures import FIXTURE_PREFIX, fixture_values
from helpers.tf_bundle import write_bundle
from helpers.tf_fixtures import MODELS_FIXTURE, MODELS_PREFIX, models_fixture_values

from mtlab.base.errors import ConfigError
from mtlab.models import build_model
from mtlab.nabu.tf_checkpoint import TFCheckpoint
from mtlab.nabu.tf_convert import convert_models

pytestmark = pytest.mark.usefixtures("one_thread")


# mtlab specs of the fixture's models, as the importer maps their model.cfg sections
SPECS = {
    # two encoder layers (2 and 3 filters; pooling frequency, then both), bypass = True, layer_norm = True
    "cnn": {"type": "EncoderDecoderCNN", "filters": [2, 3], "kernels": [[3, 3], [3, 2]], "pools": [[1, 2], [2, 2]],
            "output_filters": 2, "bypass": "concat", "activation": "relu", "layer_norm": True},
    "caps": {"type": "CapsNet", "input_dim": 5, "num_capsules": 3, "capsule_dim": 2, "num_layers": 3,
             "routing_iters": 3},
    "dbrcaps": {"type": "DBRCapsNet", "input_dim": 4, "num_capsules": 2, "capsule_dim": 2, "num_layers": 2,
                "routing_iters": 2, "rec_only_vote": True, "recurrent_probability": "sigmoid",
                "accumulate_input_logits": True, "accumulate_state_logits": False},
}


@pytest.fixture(scope="module")
def ckpt() -> TFCheckpoint:
    return TFCheckpoint(MODELS_PREFIX)


def converted(ckpt: TFCheckpoint, name: str) -> torch.nn.Module:
    states = convert_models(ckpt, {name: SPECS[name]})
    spec = {k: v for k, v in SPECS[name].items() if k != "type"}
    model = build_model(SPECS[name]["type"], **spec).double().eval()
    model.load_state_dict(states[name])
    return model


def values64() -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) for k, v in models_fixture_values().items()}


# ------------------------------------------------------------------ the fixture and its writer
def test_the_fixture_holds_the_originals_names_and_the_writer_reproduces_a_tensorflow_checkpoint(
        ckpt: TFCheckpoint, tmp_path: Path) -> None:
    expected = models_fixture_values()
    assert ckpt.shapes() == MODELS_FIXTURE
    for name, value in expected.items():
        assert np.array_equal(ckpt.read(name), value), name
    # the writer on the TensorFlow-written fixture's values: the same data bytes and index entries
    write_bundle(tmp_path / "again.ckpt", fixture_values())
    assert TFCheckpoint(tmp_path / "again.ckpt").entries == TFCheckpoint(FIXTURE_PREFIX).entries
    assert (tmp_path / "again.ckpt.data-00000-of-00001").read_bytes() == \
        Path(f"{FIXTURE_PREFIX}.data-00000-of-00001").read_bytes()


# ------------------------------------------------------------------ converted models against the oracles
def test_the_converted_encoder_decoder_cnn_matches_the_original(ckpt: TFCheckpoint) -> None:
    model = converted(ckpt, "cnn")
    v = values64()

    def conv(scope: str, op: str) -> tuple[np.ndarray, np.ndarray]:
        return v[f"cnn/{scope}/Conv2D/{op}/kernel"], v[f"cnn/{scope}/Conv2D/{op}/bias"]

    scopes = ["encoder/layer_0", "encoder/layer_1", "decoder/layer_0", "decoder/layer_1"]
    w = {"conv": [conv(s, "conv2d") for s in scopes[:2]], "deconv": [conv(s, "conv2d_transpose") for s in scopes[2:]],
         "norm": [(v[f"cnn/{s}/batch_normalization/gamma"], v[f"cnn/{s}/batch_normalization/beta"]) for s in scopes]}
    x = torch.randn(2, 7, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    got = model(x).detach().numpy()
    for b in range(2):
        want = original_cnn(x[b].numpy(), w, SPECS["cnn"]["pools"], 0, "True", "relu", True)
        np.testing.assert_allclose(got[b], want, rtol=1e-6, atol=1e-7)
    assert np.abs(got).max() > 0.1


def test_moving_statistics_are_folded_into_the_scale_and_shift_exactly(tmp_path: Path) -> None:
    """Whatever the moving statistics hold, ``tf.layers.batch_normalization(training=False)``'s
    ``(x - moving_mean) / sqrt(moving_variance + 1e-3) * gamma + beta`` is what the converted layer computes."""
    values = models_fixture_values()
    scope = "cnn/decoder/layer_0/batch_normalization"
    values[f"{scope}/moving_mean"] = np.array([0.3, -1.2], np.float32)
    values[f"{scope}/moving_variance"] = np.array([2.5, 0.4], np.float32)
    model = converted(TFCheckpoint(write_bundle(tmp_path / "stats.ckpt", values)), "cnn")
    x = torch.randn(3, 2, 4, 5, dtype=torch.float64)
    v = {k: values[f"{scope}/{k}"].astype(np.float64)[:, None, None]
         for k in ("gamma", "beta", "moving_mean", "moving_variance")}
    want = (x.numpy() - v["moving_mean"]) / np.sqrt(v["moving_variance"] + 1e-3) * v["gamma"] + v["beta"]
    np.testing.assert_allclose(model.norms[2](x).detach().numpy(), want, rtol=1e-6, atol=1e-7)


def test_the_converted_capsnet_matches_the_original(ckpt: TFCheckpoint) -> None:
    model = converted(ckpt, "caps")
    v = values64()
    x = np.random.default_rng(5).normal(size=(2, 4, 5))
    got = model(torch.from_numpy(x)).detach().numpy()
    want = original_capsnet(x, v["caps/primary_capsule/dense/kernel"],
                            [v[f"caps/layer{l}/capsule/kernel"] for l in (1, 2)],
                            [v[f"caps/layer{l}/capsule/init_logits"] for l in (1, 2)], 3, 2, 3)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_the_converted_dbr_capsnet_matches_the_original(ckpt: TFCheckpoint) -> None:
    model = converted(ckpt, "dbrcaps")
    v = values64()
    x = np.random.default_rng(6).normal(size=(3, 5, 4))
    lengths = [5, 3, 1]
    got = model(torch.from_numpy(x), torch.tensor(lengths)).detach().numpy()
    prim = "dbrcaps/primary_capsule/BRNNLayer/bidirectional_rnn"
    cell = "dbrcaps/layer1/BRCapsuleLayer/bidirectional_rnn/{}/rec_capsule_cell_rec_only_vote/{}"
    keys = ("input_kernel", "recurrent_kernel", "init_input_logits", "init_recurrent_logits")
    weights = {d: {k: v[cell.format(d, k)] for k in keys} for d in ("fw", "bw")}

    def primary(d: str):  # type: ignore[no-untyped-def]
        return lambda s: original_rnn_linear_out(s, v[f"{prim}/{d}/rnn_cell_linear_out/kernel"],
                                                 v[f"{prim}/{d}/rnn_cell_linear_out/bias"])

    def capsules(d: str):  # type: ignore[no-untyped-def]
        def go(seq: np.ndarray) -> np.ndarray:
            state, out = np.zeros((2, 2)), []
            for frame in seq:
                state = original_rec_capsule_cell(frame, state, weights[d], 2, True, "sigmoid", True, False)
                out.append(state)
            return np.array(out).reshape(len(seq), 2, 2)
        return go

    for b, length in enumerate(lengths):
        h = original_squash(original_bidirectional(x[b], length, primary("fw"), primary("bw")).reshape(5, 4, 2))
        want = original_bidirectional(h, length, capsules("fw"), capsules("bw")).reshape(5, 8)
        np.testing.assert_allclose(got[b], want, rtol=1e-6, atol=1e-7)
    assert np.abs(got[0]).max() > 1e-3


# ------------------------------------------------------------------ a checkpoint that does not fit
def test_a_model_that_does_not_fit_names_the_variable_and_both_shapes(ckpt: TFCheckpoint) -> None:
    wider = {**SPECS["caps"], "num_capsules": 4}
    with pytest.raises(ConfigError, match=r"'caps/primary_capsule/dense/kernel' of model 'caps' has shape \[5, 6\]; "
                                          r"mtlab's CapsNet built from the recipe expects \[5, 8\]"):
        convert_models(ckpt, {"caps": wider})
    deeper = {**SPECS["dbrcaps"], "num_layers": 3}
    with pytest.raises(ConfigError, match=r"needs variable dbrcaps/.../layer2/.../fw/.../input_kernel"):
        convert_models(ckpt, {"dbrcaps": deeper})
    plain = {**SPECS["cnn"], "layer_norm": False}  # the checkpoint's batch normalization would be left over
    with pytest.raises(ConfigError, match=r"model 'cnn' \(EncoderDecoderCNN\) has variables the recipe's model does "
                                          r"not \(\['cnn/decoder/layer_0/batch_normalization/beta'"):
        convert_models(ckpt, {"cnn": plain})


# ------------------------------------------------------------------ against TensorFlow itself, where installed
@pytest.mark.slow  # importing TensorFlow takes seconds
def test_tensorflow_reads_the_models_fixture_as_written() -> None:
    tf = pytest.importorskip("tensorflow", reason="TensorFlow reads the checkpoint: pip install -e .[tensorflow]")
    theirs = tf.train.load_checkpoint(str(MODELS_PREFIX))
    assert theirs.get_variable_to_shape_map() == {n: list(s) for n, s in MODELS_FIXTURE.items()}
    for name, value in models_fixture_values().items():
        assert np.array_equal(theirs.get_tensor(name), value), name
