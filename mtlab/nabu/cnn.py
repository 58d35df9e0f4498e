"""model.cfg's ``encoder_decoder_cnn`` as an :class:`mtlab.models.EncoderDecoderCNN` spec, with the sizes the
original's ``_get_outputs`` computes from its keys."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..base.errors import ConfigError
from .ini import SpecReader, words

KEYS = frozenset({"architecture", "filters", "filter_size_t", "filter_size_f", "filter_size_t_fac_after_pool",
                  "filter_size_f_fac_after_pool", "f_pool_rate", "t_pool_rate", "num_encoder_layers",
                  "num_centre_layers", "num_filters_1st_layer", "fac_per_layer", "num_output_filters", "bypass",
                  "layer_norm", "activation_fn", "input_noise", "dropout", "trainable"})
BYPASS = {"True": "concat", "False": "none", "unpool": "unpool"}  # model.cfg's bypass -> EncoderDecoderCNN's
ACTIVATIONS = ("relu", "tanh", "sigmoid")
# What a missing key stands in for once refused, so a lenient import goes on sizing the graph.
PLACEHOLDERS = {"fac_per_layer": "1.0", "num_output_filters": "0", "bypass": "False", "layer_norm": "False",
                "input_noise": "0", "dropout": "1.0"}


def encoder_decoder_spec(imp: SpecReader, where: str, conf: Mapping[str, str]) -> tuple[dict[str, Any], int]:
    """(EncoderDecoderCNN spec, channels per time-frequency bin) of one ``encoder_decoder_cnn`` section."""
    file = "model.cfg"
    path = imp.folder / file

    def text(key: str) -> str:
        """A key the original reads with ``self.conf[key]``: missing, it fails there (KeyError)."""
        if key in conf:
            return conf[key]
        if key in PLACEHOLDERS:
            imp.refuse(file, f"{where} {key}", "missing: the original's encoder_decoder_cnn reads it "
                                               "(a KeyError there), so it cannot build this model either")
            return PLACEHOLDERS[key]
        raise ConfigError(f"{path}: {where} needs {key!r} for architecture 'encoder_decoder_cnn'")

    def value(key: str, kind: str) -> Any:
        return imp.value(file, f"{where} {key}", kind, text(key))

    for key in conf:
        if key not in KEYS:
            raise imp.unknown(file, where, key, sorted(KEYS))
    if conf.get("trainable", "True") != "True":
        imp.refuse(file, f"{where} trainable", "frozen models: mtlab trains every model a task uses")
    sized = "filter_size_t" in conf and "filter_size_f" in conf
    if "filters" in conf:
        first = [imp.value(file, f"{where} filters", "int", v) for v in words(conf["filters"])]
        if len(first) != 2:
            raise ConfigError(f"{path}: {where} filters = {conf['filters']!r}: give the time and frequency sizes")
    elif sized:
        first = [value("filter_size_t", "int"), value("filter_size_f", "int")]
    else:
        raise ConfigError(f"{path}: {where} needs 'filters' or 'filter_size_t' and 'filter_size_f' (the "
                          "original's 'Kernel convolution size not specified')")
    # the kernel grows by these factors after each pooling of its axis (only with filter_size_t/_f, as there)
    fac = [value("filter_size_t_fac_after_pool", "float"), value("filter_size_f_fac_after_pool", "float")] \
        if sized else [1.0, 1.0]
    rates = [value("t_pool_rate", "int"), value("f_pool_rate", "int")]
    for key, rate in zip(("t_pool_rate", "f_pool_rate"), rates):
        if rate < 1:
            raise ConfigError(f"{path}: {where} {key} = {rate}: pool every that many encoder layers, at least 1")
    n, centre = value("num_encoder_layers", "int"), value("num_centre_layers", "int")
    first_filters, growth = value("num_filters_1st_layer", "int"), value("fac_per_layer", "float")
    output_filters = value("num_output_filters", "int")
    bypass = text("bypass")
    if bypass not in BYPASS:
        raise ConfigError(f"{path}: {where} bypass = {bypass!r}: the original's encoder_decoder_cnn knows "
                          f"{', '.join(BYPASS)}")
    layer_norm = value("layer_norm", "bool")
    activation = conf.get("activation_fn", "relu")
    if activation not in ACTIVATIONS:
        raise ConfigError(f"{path}: {where} activation_fn = {activation!r}: the original knows "
                          f"{', '.join(ACTIVATIONS)}")
    if n < 1:
        imp.refuse(file, f"{where} num_encoder_layers", f"{n}: the original then passes its input through "
                   "unchanged ([B, T, F], no channel axis); leave the model out of the task's nodes instead")
        n = 1
    if centre > 0:
        imp.refuse(file, f"{where} num_centre_layers", f"{centre}: the original's encoder_decoder_cnn cannot build "
                   "centre layers (its map(int(math.ceil()), ...) raises TypeError); set it to 0")
    if float(text("dropout")) < 1:
        imp.refuse(file, f"{where} dropout", f"{text('dropout')}: the original's encoder_decoder_cnn raises in "
                   "training ('have to check whether dropout is implemented correctly'); set it to 1.0")
    filters = [math.ceil(first_filters * growth ** layer) for layer in range(n)]
    ideal: list[float] = [float(k) for k in first]
    kernels, pools = [], []
    for layer in range(n):
        kernels.append([math.ceil(k) for k in ideal])
        pool = [2 if (layer + 1) % rate == 0 else 1 for rate in rates]
        ideal = [k * f if p == 2 else k for k, f, p in zip(ideal, fac, pool)]  # the original's float arithmetic
        pools.append(pool)
    spec: dict[str, Any] = {"type": "EncoderDecoderCNN", "filters": filters, "kernels": kernels, "pools": pools,
                            "output_filters": output_filters, "bypass": BYPASS[bypass], "activation": activation,
                            "layer_norm": layer_norm, "input_noise": value("input_noise", "float")}
    if centre > 0:
        spec.update(num_centre_layers=centre, centre_kernel=[math.ceil(k) for k in ideal])
    return spec, output_filters
