"""An original Nabu-MSSS trained model (a TensorFlow checkpoint) as mtlab weights.

``convert_checkpoint(ckpt, recipe_dir)`` builds the recipe's models as the importer maps them and fills
them from the checkpoint's variables, found by the original's variable scopes: ``{model}/layer{l}/.../
{fw|bw}/.../kernel`` and ``bias`` for the recurrent layers (``kernel_inonly``/``bias_inonly`` too for
``leaky_dblstm_iznotrec``), ``{model}/fully_connected{_n}/weights`` and ``biases`` for ``linear`` and
``feedforward``. Optimizer slots (``.../kernel/Adam``) and other models' variables are left out.

The names of the other models follow the original's code (its ``layer.py``, ``rnn_cell.py`` and models, at the
revision in ``ORIGIN.md``):

- ``encoder_decoder_cnn``: ``{model}/{encoder|centre|decoder}/layer_{l}/Conv2D/{conv2d|conv2d_transpose}/kernel``
  (``[kt, kf, in, out]``; ``[kt, kf, out, in]`` transposed) and ``bias``, and with ``layer_norm``
  ``{model}/.../layer_{l}/batch_normalization/{gamma, beta, moving_mean, moving_variance}``. The original never
  updates the moving statistics (it calls ``batch_normalization`` without ``training``), so they stay 0 and 1;
  whatever they hold is folded into the per-channel scale and shift of ``FixedStatsNorm`` exactly.
- ``capsnet``: ``{model}/primary_capsule/dense/kernel`` (no bias), ``{model}/layer{l}/capsule/kernel`` and
  ``init_logits``.
- ``dbr_capsnet``: ``{model}/primary_capsule/BRNNLayer/bidirectional_rnn/{fw|bw}/rnn_cell_linear_out/kernel``
  and ``bias``, ``{model}/layer{l}/BRCapsuleLayer/bidirectional_rnn/{fw|bw}/rec_capsule_cell[_rec_only_vote]/``
  ``input_kernel``, ``recurrent_kernel``, ``init_input_logits`` and ``init_recurrent_logits``.

The original's LSTM cells (TensorFlow's ``LayerNormBasicLSTMCell`` and the reset cells) hold one kernel
``[input + hidden, 4 * hidden]`` with the gates in the order ``i, j, f, o`` and add a forget bias of 1 at
run time; ``nn.LSTM`` keeps ``weight_ih [4H, input]`` and ``weight_hh [4H, H]`` in the order ``i, f, g, o``
(``g`` is TensorFlow's ``j``), so the rows are reordered and the forget bias is folded into ``bias_ih``.
``LeakyBLSTM`` keeps the original's gate order and its forget bias, so its weights are copied as they are.

    mtlab import-nabu-checkpoint model/network.ckpt --recipe RECIPE_DIR -o model.pt
    # then init_file = "model.pt" in the recipe's [trainer], or load_initial_weights(trainer, "model.pt")
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from ..base.errors import ConfigError
from ..models import BLSTM, BRNN, CapsNet, DBRCapsNet, Dense, EncoderDecoderCNN, LeakyBLSTM, ResetBLSTM
from .tf_checkpoint import TFCheckpoint

M = TypeVar("M", bound=nn.Module)

# the original's variable names (last scope) and the name older TensorFlow layers gave the same variable
_KEYS = {"kernel": "kernel", "weights": "kernel", "bias": "bias", "biases": "bias", "kernel_inonly": "kernel_inonly",
         "bias_inonly": "bias_inonly", "gamma": "gamma", "beta": "beta", "moving_mean": "moving_mean",
         "moving_variance": "moving_variance", "init_logits": "init_logits", "input_kernel": "input_kernel",
         "recurrent_kernel": "recurrent_kernel", "init_input_logits": "init_input_logits",
         "init_recurrent_logits": "init_recurrent_logits"}
_DIRECTIONS = {"fw": 0, "forward": 0, "bw": 1, "backward": 1}
_TF_TO_TORCH_GATES = [0, 2, 1, 3]  # torch's i, f, g, o are TensorFlow's blocks i, f, j, o
FORGET_BIAS = 1.0  # the original never sets its cells' forget_bias, so TensorFlow's default of 1 applies
_PARAMETERLESS = ("Concat", "Constant", "MeanPool")
_NORMALIZED = ("EncoderDecoderCNN",)  # kinds whose gamma and beta mtlab keeps (the CNN's batch normalization)
BATCH_NORM_EPSILON = 1e-3  # tf.layers.batch_normalization's default


class _ModelVariables:
    """The checkpoint variables of one original model, found by scope, with errors naming model and shapes."""

    def __init__(self, ckpt: TFCheckpoint, model: str, kind: str) -> None:
        self.ckpt, self.model, self.kind = ckpt, model, kind
        self.names = {n: _KEYS[n.rsplit("/", 1)[-1]] for n in ckpt.entries
                      if n.startswith(f"{model}/") and n.rsplit("/", 1)[-1] in _KEYS}
        self.used: set[str] = set()
        norms = sorted(n for n, k in self.names.items() if k in ("gamma", "beta"))
        if norms and kind not in _NORMALIZED:
            raise ConfigError(f"{ckpt.prefix}: model {model!r} has layer normalization weights ({norms[0]}, ...); "
                              f"mtlab's {kind} has no layer normalization, so it cannot take them")

    def cell(self, layer: int, direction: int, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The ``key`` variable of layer ``layer``'s ``direction`` (0 forward, 1 backward), checked against ``shape``."""
        found = [n for n, k in self.names.items() if k == key and f"layer{layer}" in n.split("/")
                 and [_DIRECTIONS[p] for p in n.split("/") if p in _DIRECTIONS] == [direction]]
        where = f"{self.model}/layer{layer}/.../{('fw', 'bw')[direction]}/.../{key}"
        return self._take(found, where, shape)

    def at(self, scopes: tuple[str, ...], key: str, shape: tuple[int, ...], direction: int | None = None
           ) -> torch.Tensor:
        """The ``key`` variable under every scope in ``scopes`` (and of ``direction``: 0 forward, 1 backward)."""
        found = [n for n, k in self.names.items() if k == key and all(s in n.split("/")[:-1] for s in scopes)
                 and (direction is None or [_DIRECTIONS[p] for p in n.split("/") if p in _DIRECTIONS] == [direction])]
        where = "/.../".join([self.model, *scopes, *([("fw", "bw")[direction]] if direction is not None else []), key])
        return self._take(found, where, shape)

    def dense(self) -> list[dict[str, str]]:
        """The ``fully_connected`` layers in creation order: ``[{"kernel": name, "bias": name}, ...]``."""
        scopes: dict[str, dict[str, str]] = {}
        for n, k in self.names.items():
            if k in ("kernel", "bias"):
                scopes.setdefault(n.rsplit("/", 1)[0], {})[k] = n

        def order(scope: str) -> tuple[int, str]:  # fully_connected, fully_connected_1, ..., fully_connected_10
            m = re.search(r"_(\d+)$", scope)
            return (int(m.group(1)) if m else 0), scope

        return [scopes[s] for s in sorted(scopes, key=order)]

    def take(self, name: str | None, where: str, shape: tuple[int, ...]) -> torch.Tensor:
        return self._take([name] if name else [], where, shape)

    def _take(self, found: list[str], where: str, shape: tuple[int, ...]) -> torch.Tensor:
        if not found:
            have = sorted(self.names)
            raise ConfigError(f"{self.ckpt.prefix}: model {self.model!r} ({self.kind}) needs variable {where} of shape "
                              f"{list(shape)}; the checkpoint has none (its variables of {self.model!r}: "
                              f"{have[:8] if have else 'none'}{' ...' if len(have) > 8 else ''})")
        if len(found) > 1:
            raise ConfigError(f"{self.ckpt.prefix}: model {self.model!r} ({self.kind}): several variables match "
                              f"{where}: {sorted(found)}")
        name = found[0]
        got = self.ckpt.entries[name].shape
        if tuple(got) != tuple(shape):
            raise ConfigError(f"{self.ckpt.prefix}: variable {name!r} of model {self.model!r} has shape {list(got)}; "
                              f"mtlab's {self.kind} built from the recipe expects {list(shape)} (check the recipe's "
                              f"model.cfg [{self.model}] sizes and the features' dimension)")
        self.used.add(name)
        return torch.from_numpy(np.ascontiguousarray(self.ckpt.read(name)))

    def check_all_used(self) -> None:
        left = sorted(set(self.names) - self.used)
        if left:
            raise ConfigError(f"{self.ckpt.prefix}: model {self.model!r} ({self.kind}) has variables the recipe's model "
                              f"does not ({left[:6]}{' ...' if len(left) > 6 else ''}): the recipe's model.cfg "
                              f"[{self.model}] does not describe the model of this checkpoint (more layers?)")


def _lstm_weights(kernel: torch.Tensor, bias: torch.Tensor, in_dim: int) -> tuple[torch.Tensor, ...]:
    """(weight_ih, weight_hh, bias_ih, bias_hh) of ``nn.LSTM`` from a TensorFlow LSTM kernel and bias."""
    H = bias.shape[0] // 4
    rows = torch.cat([torch.arange(g * H, (g + 1) * H) for g in _TF_TO_TORCH_GATES])
    w = kernel.T[rows]
    b = bias[rows].clone()
    b[H:2 * H] += FORGET_BIAS  # torch's forget block: the original adds it before the sigmoid
    return w[:, :in_dim], w[:, in_dim:], b, torch.zeros_like(b)


def _set(module: nn.Module, values: Mapping[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in values.items():
            param = getattr(module, name)
            param.copy_(value.to(param.dtype))


def _fill_lstm(lstm: nn.LSTM, layer_in_lstm: int, reverse: bool, v: _ModelVariables, layer: int, d: int) -> None:
    in_dim = getattr(lstm, f"weight_ih_l{layer_in_lstm}").shape[1]
    H = lstm.hidden_size
    kernel = v.cell(layer, d, "kernel", (in_dim + H, 4 * H))
    bias = v.cell(layer, d, "bias", (4 * H,))
    sfx = f"l{layer_in_lstm}" + ("_reverse" if reverse else "")
    _set(lstm, dict(zip((f"weight_ih_{sfx}", f"weight_hh_{sfx}", f"bias_ih_{sfx}", f"bias_hh_{sfx}"),
                        _lstm_weights(kernel, bias, in_dim))))


def _as(module: nn.Module, kind: type[M]) -> M:
    """``module`` as the ``kind`` the recipe's spec built (a TypeError naming both otherwise)."""
    if not isinstance(module, kind):
        raise TypeError(f"expected a {kind.__name__} module, found {type(module).__name__}")
    return module


def _fill(model: nn.Module, kind: str, v: _ModelVariables) -> None:
    """Copy the original's variables into ``model`` (built from the recipe), in place."""
    if kind == "BLSTM":
        blstm = _as(model, BLSTM)
        # one LSTM per layer with the original's dropout after each (mtlab's BLSTM forward), else one stacked LSTM
        lstms = [(_as(m, nn.LSTM), 0) for m in blstm.layers] if blstm.layer_dropout > 0 else \
            [(blstm.lstm, layer) for layer in range(blstm.lstm.num_layers)]
        for layer, (lstm, index) in enumerate(lstms):
            for d in (0, 1):
                _fill_lstm(lstm, index, d == 1, v, layer, d)
    elif kind in ("ResetBLSTM", "ResetBLSTMInsert"):
        reset = _as(model, ResetBLSTM)
        for layer, (fw, bw) in enumerate(zip(reset.forward_lstms, reset.backward_lstms)):
            _fill_lstm(_as(fw, nn.LSTM), 0, False, v, layer, 0)
            _fill_lstm(_as(bw, nn.LSTM), 0, False, v, layer, 1)
    elif kind == "BRNN":
        for layer, module in enumerate(_as(model, BRNN).layers):
            rnn = _as(module, nn.RNN)
            in_dim, H = rnn.input_size, rnn.hidden_size
            for d, sfx in ((0, "l0"), (1, "l0_reverse")):
                kernel = v.cell(layer, d, "kernel", (in_dim + H, H))
                bias = v.cell(layer, d, "bias", (H,))
                _set(rnn, {f"weight_ih_{sfx}": kernel[:in_dim].T, f"weight_hh_{sfx}": kernel[in_dim:].T,
                           f"bias_ih_{sfx}": bias, f"bias_hh_{sfx}": torch.zeros_like(bias)})
    elif kind == "LeakyBLSTM":
        _fill_leaky(_as(model, LeakyBLSTM), v)
    elif kind == "Dense":
        linears = [_as(m, nn.Linear) for m in _as(model, Dense).layers]
        found = v.dense()
        if len(found) != len(linears):
            raise ConfigError(f"{v.ckpt.prefix}: model {v.model!r} (Dense) has {len(linears)} layer(s) in the "
                              f"recipe, the checkpoint {len(found)} ({[sorted(f.values()) for f in found]})")
        for i, (linear, names) in enumerate(zip(linears, found)):
            where = f"{v.model}/fully_connected{'_' + str(i) if i else ''}"
            values = {"weight": v.take(names.get("kernel"), f"{where}/weights",
                                       (linear.in_features, linear.out_features)).T}
            if linear.bias is not None:
                values["bias"] = v.take(names.get("bias"), f"{where}/biases", (linear.out_features,))
            _set(linear, values)
    elif kind == "EncoderDecoderCNN":
        _fill_cnn(_as(model, EncoderDecoderCNN), v)
    elif kind == "CapsNet":
        caps = _as(model, CapsNet)
        _set(caps.primary, {"weight": v.at(("primary_capsule",), "kernel", tuple(caps.primary.weight.shape[::-1])).T})
        for l, capsules in enumerate(caps.layers, start=1):
            _set(capsules, {k: v.at((f"layer{l}",), k, tuple(getattr(capsules, k).shape))
                            for k in ("kernel", "init_logits")})
    elif kind == "DBRCapsNet":
        dbr = _as(model, DBRCapsNet)
        for d, module in enumerate(dbr.primary):
            linear = _as(module, nn.Linear)
            _set(linear, {"weight": v.at(("primary_capsule",), "kernel", tuple(linear.weight.shape[::-1]), d).T,
                          "bias": v.at(("primary_capsule",), "bias", tuple(linear.bias.shape), d)})
        for l, cells in enumerate(dbr.layers, start=1):
            for d, cell in enumerate(_as(cells, nn.ModuleList)):
                _set(cell, {k: v.at((f"layer{l}",), k, tuple(getattr(cell, k).shape), d)
                            for k in ("input_kernel", "recurrent_kernel", "init_input_logits", "init_recurrent_logits")})
    else:
        raise ConfigError(f"model {v.model!r}: mtlab cannot convert original weights into a {kind!r} model "
                          f"(converted: BLSTM, ResetBLSTM, ResetBLSTMInsert, LeakyBLSTM, BRNN, Dense, "
                          f"EncoderDecoderCNN, CapsNet, DBRCapsNet)")
    v.check_all_used()


def _fill_cnn(model: EncoderDecoderCNN, v: _ModelVariables) -> None:
    """``EncoderDecoderCNN`` from the original's ``Conv2D`` layers: kernels to torch's layouts (``[out, in, kt,
    kf]``, transposed ``[in, out, kt, kf]``: both ``permute(3, 2, 0, 1)``) and each batch normalization folded
    into ``FixedStatsNorm``: ``(x - mean) / sqrt(var + eps) * gamma + beta = x / sqrt(1 + eps) * scale + shift``."""
    layers: list[tuple[str, int, nn.Conv2d | nn.ConvTranspose2d, str]] = [
        *(("encoder", i, _as(c, nn.Conv2d), "conv2d") for i, c in enumerate(model.encoder)),
        *(("centre", i, _as(c, nn.Conv2d), "conv2d") for i, c in enumerate(model.centre)),
        *(("decoder", i, _as(c, nn.ConvTranspose2d), "conv2d_transpose") for i, c in enumerate(model.decoder))]
    for index, (part, i, conv, op) in enumerate(layers):
        scope = (part, f"layer_{i}")
        kt, kf = conv.kernel_size
        channels = (conv.in_channels, conv.out_channels) if op == "conv2d" else (conv.out_channels, conv.in_channels)
        kernel = v.at((*scope, op), "kernel", (kt, kf, *channels))
        _set(conv, {"weight": kernel.permute(3, 2, 0, 1), "bias": v.at((*scope, op), "bias", (conv.out_channels,))})
        if model.norms is None:
            continue
        stats = {k: v.at((*scope, "batch_normalization"), k, (conv.out_channels,)).double()
                 for k in ("gamma", "beta", "moving_mean", "moving_variance")}
        factor = stats["gamma"] / torch.sqrt(stats["moving_variance"] + BATCH_NORM_EPSILON)
        _set(model.norms[index], {"scale": factor * (1.0 + BATCH_NORM_EPSILON) ** 0.5,
                                  "shift": stats["beta"] - stats["moving_mean"] * factor})


def _fill_leaky(model: LeakyBLSTM, v: _ModelVariables) -> None:
    """``LeakyBLSTM`` per layer and direction from the original's leak cells: ``all`` reads one kernel
    ``[in + H, 4H]``; ``forget_output`` (iznotrec) a kernel ``[in + H, 2H]`` for ``f, o`` and a
    ``kernel_inonly`` ``[in, 2H]`` for ``i, j``; ``none`` (notrec) a kernel ``[in, 4H]``."""
    H = model.hidden
    values: dict[str, list[list[torch.Tensor]]] = {"input_weights": [], "biases": [], "recurrent_weights": []}
    for layer in range(model.num_layers):
        in_dim = model.input_weights[layer].shape[1]
        per_dir: dict[str, list[torch.Tensor]] = {k: [] for k in values}
        for d in (0, 1):
            if model.recurrent == "all":
                kernel = v.cell(layer, d, "kernel", (in_dim + H, 4 * H))
                per_dir["input_weights"].append(kernel[:in_dim])
                per_dir["recurrent_weights"].append(kernel[in_dim:])
                per_dir["biases"].append(v.cell(layer, d, "bias", (4 * H,)))
            elif model.recurrent == "forget_output":
                kernel = v.cell(layer, d, "kernel", (in_dim + H, 2 * H))
                inonly = v.cell(layer, d, "kernel_inonly", (in_dim, 2 * H))
                per_dir["input_weights"].append(torch.cat((inonly, kernel[:in_dim]), dim=1))
                per_dir["recurrent_weights"].append(kernel[in_dim:])
                per_dir["biases"].append(torch.cat((v.cell(layer, d, "bias_inonly", (2 * H,)),
                                                    v.cell(layer, d, "bias", (2 * H,)))))
            else:
                per_dir["input_weights"].append(v.cell(layer, d, "kernel", (in_dim, 4 * H)))
                per_dir["biases"].append(v.cell(layer, d, "bias", (4 * H,)))
        with torch.no_grad():
            for key, tensors in per_dir.items():
                if tensors:
                    param = getattr(model, key)[layer]
                    param.copy_(torch.stack(tensors).to(param.dtype))


def convert_models(checkpoint: str | Path | TFCheckpoint,
                   specs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{model name: state_dict}`` of mtlab models built from ``specs`` (``{name: {"type": ..., settings}}``,
    as a recipe's ``[models]``), filled from the checkpoint's variables of the original model of that name.
    Models without weights (concat, constant_generator) get an empty state dict."""
    from ..models import build_model

    ckpt = checkpoint if isinstance(checkpoint, TFCheckpoint) else TFCheckpoint(checkpoint)
    out: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        settings = dict(spec)
        kind = settings.pop("type")
        if kind in _PARAMETERLESS:
            out[name] = {}
            continue
        if not any(n.startswith(f"{name}/") for n in ckpt.entries):
            scopes = sorted({n.split("/", 1)[0] for n in ckpt.entries if "/" in n})
            raise ConfigError(f"{ckpt.prefix}: no variable of model {name!r} (the checkpoint's models: {scopes}); "
                              "the recipe's model.cfg model_names must be those of the trained model")
        model = build_model(kind, **settings)
        _fill(model, kind, _ModelVariables(ckpt, name, kind))
        out[name] = model.state_dict()
    return out


def convert_checkpoint(checkpoint: str | Path | TFCheckpoint, recipe_dir: str | Path) -> dict[str, dict[str, Any]]:
    """``{model name: state_dict}`` for every model of the original recipe folder ``recipe_dir`` (imported as
    ``mtlab import-nabu`` does), from the TensorFlow checkpoint ``checkpoint`` (its prefix, one of its files,
    or its folder), so that ``init_file`` finds every model of the recipe."""
    from .importer import import_nabu

    return convert_models(checkpoint, import_nabu(recipe_dir)["models"])


def write_converted(checkpoint: str | Path, recipe_dir: str | Path, output: str | Path) -> dict[str, int]:
    """Convert (see ``convert_checkpoint``) and save ``{model: state_dict}`` to ``output`` with ``torch.save``;
    returns the number of tensors written per model."""
    states = convert_checkpoint(checkpoint, recipe_dir)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(states, output)
    return {name: len(state) for name, state in states.items()}
