"""The TensorFlow checkpoints in tests/nabu_tf_fixture/: their variables' names, shapes and values (the
folder's make_*.py scripts write them with TensorFlow)."""

from __future__ import annotations

import numpy as np

from helpers.paths import TF_FIXTURE

FIXTURE_PREFIX = TF_FIXTURE / "original.ckpt"
F, H = 129, 2  # the recipe's feature size; every recurrent layer has 2 units per direction


def _cells(model: str, cell: str, dims: list[int], keys: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The original's names for a bidirectional recurrent model: ``keys`` maps a variable to its columns,
    its rows are the layer's input (``+ H`` for a kernel that also reads the previous output)."""
    out = {}
    for layer, d in enumerate(dims):
        for direction in ("fw", "bw"):
            scope = f"{model}/layer{layer}/bidirectional_rnn/{direction}/{cell}"
            for key, cols in keys.items():
                rows = d + H if key == "kernel" and cell != "notrec" else d
                out[f"{scope}/{key}"] = (rows, cols) if key.startswith("kernel") else (cols,)
    return out


# name -> shape, in the order TensorFlow wrote them (the values come from ``fixture_values``)
FIXTURE: dict[str, tuple[int, ...]] = {
    **_cells("main", "layer_norm_basic_lstm_cell", [F, 2 * H], {"kernel": 4 * H, "bias": 4 * H}),
    "main/layer1/bidirectional_rnn/fw/layer_norm_basic_lstm_cell/kernel/Adam": (2 * H + H, 4 * H),
    "outlayer/fully_connected/weights": (2 * H, 129 * 3), "outlayer/fully_connected/biases": (129 * 3,),
    "ff/fully_connected/weights": (F, 2), "ff/fully_connected/biases": (2,),
    "ff/fully_connected_1/weights": (2, 2), "ff/fully_connected_1/biases": (2,),
    "pitlayer/fully_connected/weights": (2 * H + 2, 258), "pitlayer/fully_connected/biases": (258,),
    **_cells("leaky", "layer_norm_basic_leak_lstm_cell", [3, 2 * H], {"kernel": 4 * H, "bias": 4 * H}),
    **_cells("leakyiz", "layer_norm_iz_not_rec_leak_lstm_cell", [3],
             {"kernel": 2 * H, "bias": 2 * H, "kernel_inonly": 2 * H, "bias_inonly": 2 * H}),
    **_cells("leakynotrec", "notrec", [3], {"kernel": 4 * H, "bias": 4 * H}),
    **_cells("reset", "layer_norm_reset_lstm_cell", [3], {"kernel": 4 * H, "bias": 4 * H}),
    **_cells("brnn", "basic_rnn_cell", [3], {"kernel": H, "bias": H}),
    "global_step": (),
}


def fixture_values() -> dict[str, np.ndarray]:
    """The fixture's values, a deterministic function of each variable's position (no RNG to drift)."""
    out: dict[str, np.ndarray] = {}
    for k, (name, shape) in enumerate(FIXTURE.items()):
        if name == "global_step":
            out[name] = np.array(1234, dtype=np.int64)
            continue
        n = int(np.prod(shape))
        out[name] = (0.6 * np.sin(0.7 * np.arange(n) + k)).astype(np.float32).reshape(shape)
    return out


MODELS_PREFIX = TF_FIXTURE / "models.ckpt"


def _conv(scope: str, op: str, kt: int, kf: int, a: int, b: int, norm: bool) -> dict[str, tuple[int, ...]]:
    """One ``layer.Conv2D`` under ``scope``: its ``tf.layers`` kernel (``[kt, kf, in, out]`` for conv2d,
    ``[kt, kf, out, in]`` transposed: ``a, b``) and bias, and its ``batch_normalization`` (outside ``Conv2D``)."""
    out = b if op == "conv2d" else a
    names = {f"{scope}/Conv2D/{op}/kernel": (kt, kf, a, b), f"{scope}/Conv2D/{op}/bias": (out,)}
    if norm:
        names.update({f"{scope}/batch_normalization/{k}": (out,) for k in ("gamma", "beta", "moving_mean",
                                                                        "moving_variance")})
    return names


def _brnn(scope: str, cell: str, keys: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {f"{scope}/bidirectional_rnn/{d}/{cell}/{k}": s for d in ("fw", "bw") for k, s in keys.items()}


# name -> shape, in the order written (values: ``models_fixture_values``)
MODELS_FIXTURE: dict[str, tuple[int, ...]] = {
    # encoder: 1 -> 2 -> 3 channels; decoder: 3 -> 2, then (2 + 2 bypassed) -> 2
    **_conv("cnn/encoder/layer_0", "conv2d", 3, 3, 1, 2, True),
    **_conv("cnn/encoder/layer_1", "conv2d", 3, 2, 2, 3, True),
    **_conv("cnn/decoder/layer_0", "conv2d_transpose", 3, 2, 2, 3, True),
    **_conv("cnn/decoder/layer_1", "conv2d_transpose", 3, 3, 2, 4, True),
    "cnn/encoder/layer_0/Conv2D/conv2d/kernel/Adam": (3, 3, 1, 2),
    "cnn/decoder/layer_1/batch_normalization/beta/Adam_1": (2,),
    "caps/primary_capsule/dense/kernel": (5, 6),
    **{f"caps/layer{l}/capsule/{k}": s for l in (1, 2) for k, s in (("kernel", (3, 2, 3, 2)), ("init_logits", (3, 3)))},
    "caps/layer1/capsule/kernel/Adam": (3, 2, 3, 2),
    **_brnn("dbrcaps/primary_capsule/BRNNLayer", "rnn_cell_linear_out", {"kernel": (8, 4), "bias": (4,)}),
    **_brnn("dbrcaps/layer1/BRCapsuleLayer", "rec_capsule_cell_rec_only_vote",
            {"input_kernel": (4, 2, 2, 2), "recurrent_kernel": (2, 2, 2, 2), "init_input_logits": (4, 2),
             "init_recurrent_logits": (2, 2)}),
    "beta1_power": (), "global_step": (),
}


def models_fixture_values() -> dict[str, np.ndarray]:
    """Deterministic values per position; the moving statistics as the original leaves them (0 and 1: its
    ``batch_normalization`` runs without ``training``, so they are never updated)."""
    out: dict[str, np.ndarray] = {}
    for k, (name, shape) in enumerate(MODELS_FIXTURE.items()):
        if name == "global_step":
            out[name] = np.array(4321, dtype=np.int64)
        elif name.endswith("moving_mean"):
            out[name] = np.zeros(shape, np.float32)
        elif name.endswith("moving_variance"):
            out[name] = np.ones(shape, np.float32)
        else:
            n = int(np.prod(shape))
            out[name] = (0.5 * np.sin(0.9 * np.arange(n) + 1.3 * k)).astype(np.float32).reshape(shape)
    return out
