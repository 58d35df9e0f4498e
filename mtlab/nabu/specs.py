"""model.cfg's architectures as mtlab model specs: one spec function per architecture, in ``ARCHITECTURES``.

A spec function reads one model section (a :class:`Section`) with the sizes of its inputs on the last axis and
their numbers of axes (``RANKS``), and returns (mtlab model spec, output size on the last axis, None if unknown).
Adding an architecture is writing its function and naming it in ``ARCHITECTURES``.

Examples:
    >>> from pathlib import Path
    >>> class Strict:  # what an import gives a spec function (mtlab.nabu.ini.SpecReader)
    ...     folder, defaults = Path("recipe"), []
    ...     def refuse(self, file, key, why): raise ValueError(why)
    ...     def unknown(self, file, where, key, valid): return ValueError(key)
    ...     def value(self, file, key, kind, text): return int(text) if kind == "int" else float(text)
    >>> conf = {"architecture": "linear", "output_dims": "129"}
    >>> model_spec(Strict(), "outlayer", conf, [600])[1]
    129
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..base.errors import ConfigError
from .capsule import capsnet_spec, dbr_capsnet_spec
from .cnn import encoder_decoder_spec
from .ini import SpecReader, words

FILE = "model.cfg"
# What a node gives, by its number of axes, and the architectures whose output has a fixed number of them.
RANKS = {2: "one vector per utterance", 3: "per frame", 4: "per time-frequency bin"}
OUTPUT_RANKS = {"constant_generator": 2, "encoder_decoder_cnn": 4}
# The keys every architecture outside mtlab.nabu.cnn / .capsule reads besides its own.
COMMON_KEYS = frozenset({"architecture", "input_noise", "dropout", "trainable"})
# The original's leaky LSTMs: which of their cell's gates read the recurrent output (LeakyBLSTM's recurrent).
LEAKY_RECURRENT = {"leaky_dblstm": "all", "leaky_dblstm_iznotrec": "forget_output", "leaky_dblstm_notrec": "none"}

Spec = tuple[dict[str, Any], int | None]


@dataclass(frozen=True)
class Section:
    """One model.cfg section being read: typed values, refusals and errors that name the file and section."""

    imp: SpecReader
    name: str
    conf: Mapping[str, str]
    arch: str

    @property
    def where(self) -> str:
        return f"[{self.name}]"

    def error(self, text: str) -> ConfigError:
        """A ConfigError ``<folder>/model.cfg: [name] <text>``."""
        return ConfigError(f"{self.imp.folder / FILE}: {self.where} {text}")

    def refuse(self, key: str, why: str) -> None:
        """A setting of ``key`` mtlab cannot honour (the whole section with ``key=""``)."""
        self.imp.refuse(FILE, f"{self.where} {key}" if key else self.where, why)

    def value(self, key: str, kind: str, text: str) -> Any:
        return self.imp.value(FILE, f"{self.where} {key}", kind, text)

    def flag(self, key: str, default: str) -> str:
        return self.conf.get(key, default)

    def num(self, key: str, default: str | None = None, kind: str = "float") -> Any:
        """A number; per-stage values must agree (one model spans the stages)."""
        text = self.conf.get(key, default)
        if text is None:
            raise self.error(f"needs {key!r} for architecture {self.arch!r}")
        values = words(text)
        if len(values) > 1:  # per-stage values: one model across the stages needs them equal
            if len(set(values)) != 1:
                self.refuse(key, f"{text!r}: mtlab keeps one model across the stages, so a model setting must be "
                                 "the same in every stage")
            text = values[-1]
        return self.value(key, kind, text)

    def keep_to_drop(self, key: str) -> float:
        """The original's keep probability as mtlab's drop probability."""
        keep = self.num(key, "1.0")
        if not 0 < keep <= 1:
            raise self.error(f"{key} = {keep}: a keep probability in (0, 1]")
        return 1.0 - keep

    def one_input(self, input_dims: list[int | None]) -> None:
        if len(input_dims) != 1:
            raise self.error(f"architecture {self.arch!r} reads one input (the original raises otherwise), its "
                             f"nodes give {len(input_dims)}")

    def trainable(self) -> None:
        if self.flag("trainable", "True") != "True":
            self.refuse("trainable", "frozen models: mtlab trains every model a task uses")

    def finish(self, spec: dict[str, Any], out: int | None, known: frozenset[str]) -> Spec:
        """The spec, once every key of the section is known and its input size too."""
        for key in self.conf:
            if key not in known:
                raise self.imp.unknown(FILE, self.where, key, sorted(known))
        if spec.get("input_dim", 0) is None:
            self.refuse("", "the size of its input is unknown (it comes from data or a model mtlab cannot build)")
        return spec, out


SpecFunction = Callable[[Section, list[int | None], list[int] | None], Spec]


def first_dim(input_dims: list[int | None]) -> int | None:
    """The size of the first input (None: unknown, or no input)."""
    return input_dims[0] if input_dims else None


def dblstm(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's BLSTM."""
    s.trainable()
    if s.num("fac_per_layer", "1.0") != 1.0:
        s.refuse("fac_per_layer", "mtlab's BLSTM has the same size in every layer")
    if s.num("recurrent_dropout", "1.0") != 1.0:
        s.refuse("recurrent_dropout", "mtlab's BLSTM has no recurrent dropout")
    for key, default, why in (("layer_norm", "False", "mtlab's BLSTM has no layer normalization"),
                              ("separate_directions", "False", "mtlab's BLSTM feeds both directions on")):
        if s.flag(key, default) != default:
            s.refuse(key, why)
    if s.flag("activation_fn", "tanh") != "tanh":
        s.refuse("activation_fn", "mtlab's BLSTM cells use tanh")
    units = s.num("num_units", kind="int")
    spec = {"type": "BLSTM", "input_dim": first_dim(input_dims), "hidden": units,
            "num_layers": s.num("num_layers", kind="int"), "input_noise": s.num("input_noise", "0"),
            "layer_dropout": s.keep_to_drop("dropout")}
    return s.finish(spec, 2 * units, COMMON_KEYS | {"num_units", "num_layers", "recurrent_dropout", "layer_norm",
                                                    "fac_per_layer", "activation_fn", "separate_directions"})


def reset_layers(s: Section, layers: int) -> tuple[list[int], list[int]]:
    """The dbresetlstm's t_reset and group_size, one per layer."""
    per_layer: dict[str, list[int]] = {}
    for key, default in (("t_reset", None), ("group_size", "1")):
        text = s.conf.get(key, default)
        if text is None:
            raise s.error(f"needs 't_reset' for architecture {s.arch!r}")
        values = [s.value(key, "int", v) for v in words(text)]
        if len(values) not in (1, layers) or min(values, default=0) < 1:
            raise s.error(f"{key} = {text!r}: give one positive integer, or one per layer (num_layers = {layers})")
        per_layer[key] = values * layers if len(values) == 1 else values
    resets, groups = per_layer["t_reset"], per_layer["group_size"]
    if any(b < a for a, b in zip(resets, resets[1:])) or any(t % g for t, g in zip(resets, groups)):
        raise s.error(f"t_reset = {s.conf['t_reset']!r}, group_size = {s.conf.get('group_size', '1')!r}: t_reset "
                      "must not decrease from layer to layer and must be a multiple of its group_size (the original "
                      "raises too)")
    return resets, groups


def dbresetlstm(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's ResetBLSTM, or ResetBLSTMInsert for ``dbresetlstm_insert_additional_input``."""
    s.trainable()
    inserts = s.arch == "dbresetlstm_insert_additional_input"
    if len(input_dims) != (2 if inserts else 1):
        raise s.error(f"architecture {s.arch!r} reads {2 if inserts else 1} input(s), its nodes give "
                      f"{len(input_dims)}")
    known = COMMON_KEYS | {"num_units", "num_layers", "t_reset", "group_size", "forward_reset", "backward_reset",
                           "separate_directions", "symmetric_context", "recurrent_dropout", "layer_norm",
                           "activation_fn"}
    layers = s.num("num_layers", kind="int")
    resets, groups = reset_layers(s, layers)
    if s.keep_to_drop("dropout") > 0:
        s.refuse("dropout", "the original's dbresetlstm raises 'dropout not yet implemented' in training; set it "
                            "to 1.0")
    if s.num("recurrent_dropout", "1.0") != 1.0:
        s.refuse("recurrent_dropout", "mtlab's ResetBLSTM has no recurrent dropout")
    if s.flag("layer_norm", "False") != "False":
        s.refuse("layer_norm", "mtlab's ResetBLSTM has no layer normalization")
    if s.flag("activation_fn", "tanh") != "tanh":
        s.refuse("activation_fn", "mtlab's ResetBLSTM cells use tanh")
    if s.flag("symmetric_context", "True") != "True":
        s.refuse("symmetric_context", f"{s.conf['symmetric_context']!r}: the original's dbresetlstm does not read it "
                 "and always gives a deeper layer the replicas that restarted at the same frame in both directions "
                 "(symmetric context), as mtlab does; set it to True")
    directions = [s.value(key, "bool", s.flag(key, default)) for key, default in
                  (("forward_reset", "True"), ("backward_reset", "True"), ("separate_directions", "False"))]
    if not (directions[0] or directions[1]):
        s.refuse("forward_reset", "with backward_reset False too there is no reset left (the original fails on "
                                  "it); use architecture = dblstm")
        directions[0] = True
    units = s.num("num_units", kind="int")
    spec = {"type": "ResetBLSTM", "input_dim": first_dim(input_dims), "hidden": units, "num_layers": layers,
            "t_reset": resets, "group_size": groups, "forward_reset": directions[0],
            "backward_reset": directions[1], "separate_directions": directions[2],
            "input_noise": s.num("input_noise", "0")}
    if inserts:
        known |= {"combine_layer"}
        combine = s.num("combine_layer", kind="int")
        if not 1 <= combine <= layers or not (directions[0] and directions[1]):
            raise s.error(f"combine_layer = {combine}: a layer from 1 to num_layers ({layers}), with forward_reset "
                          "and backward_reset True (the original repeats the additional input over both "
                          "directions' replicas)")
        spec.update(type="ResetBLSTMInsert", extra_dim=input_dims[1], combine_layer=combine)
        if input_dims[1] is None:
            s.refuse("", "the size of its additional input is unknown (it comes from data or a model mtlab cannot "
                         "build)")
    return s.finish(spec, 2 * units, known)


def recurrent(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """The leaky LSTMs as mtlab's LeakyBLSTM (``LEAKY_RECURRENT``), ``dbrnn`` as its BRNN."""
    s.trainable()
    s.one_input(input_dims)
    known = COMMON_KEYS | {"num_units", "num_layers", "recurrent_dropout", "layer_norm"}
    dbrnn = s.arch == "dbrnn"
    mtlab_type = "BRNN" if dbrnn else "LeakyBLSTM"
    ignored = " (the original's dbrnn ignores it)" if dbrnn else ""
    if s.num("recurrent_dropout", "1.0") != 1.0:
        s.refuse("recurrent_dropout", f"mtlab's {mtlab_type} has no recurrent dropout{ignored}")
    if s.flag("layer_norm", "False") != "False":
        s.refuse("layer_norm", f"mtlab's {mtlab_type} has no layer normalization{ignored}")
    units = s.num("num_units", kind="int")
    spec = {"type": mtlab_type, "input_dim": first_dim(input_dims), "hidden": units,
            "num_layers": s.num("num_layers", kind="int"), "input_noise": s.num("input_noise", "0")}
    if dbrnn:  # the original drops after every layer
        spec["layer_dropout"] = s.keep_to_drop("dropout")
    else:  # the original drops after the last layer only; its cells add 1 to the forget gate
        known |= {"leak_factor"}
        spec.update(leak=s.num("leak_factor"), recurrent=LEAKY_RECURRENT[s.arch], forget_bias=1.0,
                    dropout=s.keep_to_drop("dropout"))
    return s.finish(spec, 2 * units, known)


def linear(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's Dense with one layer, reshaped to ``output_dims`` when it has several."""
    s.trainable()
    shape = [s.value("output_dims", "int", v) for v in words(s.conf.get("output_dims", ""))]
    if not shape:
        raise s.error("needs output_dims")
    if s.flag("last_only", "False") == "True":
        s.refuse("last_only", "mtlab's Dense keeps every frame")
    act = s.flag("activation_func", "None")
    spec = {"type": "Dense", "input_dim": first_dim(input_dims), "units": [math.prod(shape)],
            "activation": "none" if act == "None" else act, "input_noise": s.num("input_noise", "0"),
            "dropout": s.keep_to_drop("dropout"), "bias": s.flag("no_bias", "False") != "True"}
    if len(shape) > 1:
        spec["output_shape"] = shape
    return s.finish(spec, shape[-1], COMMON_KEYS | {"output_dims", "no_bias", "activation_func", "last_only"})


def feedforward(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's Dense, each layer ``fac_per_layer`` times the size of the one before."""
    s.trainable()
    dim = first_dim(input_dims)
    first, layers = s.num("num_units", kind="int"), s.num("num_layers", kind="int")
    fac = s.num("fac_per_layer", "1.0")
    units = [int(math.ceil(first * fac**i)) for i in range(layers)]
    if s.flag("layer_norm", "False") != "False":
        s.refuse("layer_norm", "the original's feedforward ignores it; mtlab has none")
    spec = {"type": "Dense", "input_dim": dim, "units": units, "activation": s.flag("activation_func", "tanh"),
            "input_noise": s.num("input_noise", "0"), "dropout": s.keep_to_drop("dropout")}
    return s.finish(spec, units[-1] if units else dim, COMMON_KEYS | {
        "num_units", "num_layers", "fac_per_layer", "activation_func", "recurrent_dropout", "layer_norm"})


def attractor(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's Attractor over the original's three inputs (embeddings, binary targets, usedbins)."""
    s.trainable()
    if len(input_dims) != 3:
        s.refuse("", f"its nodes give {len(input_dims)} inputs: mtlab's Attractor takes the original's three "
                     "(embeddings, binary targets, usedbins), not the form with embeddings per speaker")
        return {"type": "Attractor"}, None
    emb, labels, bins = input_dims
    if emb is None or labels is None or bins is None or emb % bins or labels % bins:
        s.refuse("", f"input sizes {input_dims}: the embeddings and binary targets must be known multiples of the "
                     "usedbins' bins")
        return {"type": "Attractor"}, None
    spec = {"type": "Attractor", "bins": bins,
            "normalize": s.value("normalization", "bool", s.flag("normalization", "False"))}
    return s.finish(spec, emb // bins, frozenset({"architecture", "normalization", "trainable"}))


def constant_generator(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's Constant: one vector per utterance."""
    s.trainable()
    if "tensor_shape" not in s.conf:
        raise s.error(f"needs 'tensor_shape' for architecture {s.arch!r}")
    shape = [s.value("tensor_shape", "int", v.strip()) for v in s.conf["tensor_shape"].split(",")]
    if s.flag("include_batch_size", "False") != "True":
        s.refuse("include_batch_size", "mtlab batches every node's output: set it to True (one constant per "
                                       "utterance)")
    if len(shape) != 1:
        s.refuse("tensor_shape", f"{s.conf['tensor_shape']!r}: mtlab's Constant gives one vector per utterance "
                                 "([B, D]), to be expanded by a concat")
    noise = [s.value("output_noise", "float", v) for v in words(s.conf.get("output_noise", "0"))]
    if len(noise) != 1:
        s.refuse("output_noise", f"{s.conf['output_noise']!r}: give one standard deviation")
    spec = {"type": "Constant", "shape": shape, "value": s.num("constant_value", kind="float"),
            "output_noise": noise[0] if noise else 0.0}
    return s.finish(spec, shape[-1], frozenset({"architecture", "constant_value", "tensor_shape",
                                                "include_batch_size", "output_noise", "trainable"}))


def concat(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's Concat: its inputs joined on the last axis, the later ones repeated over the first's frames."""
    s.trainable()
    conf = s.conf
    for key, plain_value in (("flatten_last_2_dims", "False"), ("select_inputs", "True")):
        if key in conf and set(words(conf[key])) != {plain_value}:
            s.refuse(key, f"{conf[key]!r}: mtlab's Concat joins all its inputs as they are (no selecting or "
                          "flattening)")
    if conf.get("expand_dimension", "-2") != "-2":
        s.refuse("expand_dimension", f"{conf['expand_dimension']!r}: mtlab's Concat repeats a [B, D] input over the "
                                     "time axis only (-2)")
    n = len(input_dims)
    expand = [s.value("expand_dim_to_first_input", "bool", v) for v in words(conf["expand_dim_to_first_input"])] \
        if "expand_dim_to_first_input" in conf else [False] + [True] * (n - 1)  # the original's default
    noise = [s.value("input_noise", "float", v) for v in words(conf.get("input_noise", ""))]
    for key, values in (("expand_dim_to_first_input", expand), ("input_noise", noise)):
        if values and n and len(values) != n:
            raise s.error(f"{key} = {conf.get(key)!r}: give one value per input ({n}) of the nodes that use the "
                          "model")
    if expand and expand[0]:
        raise s.error("expand_dim_to_first_input: the first input cannot be expanded (the others are repeated over "
                      "its frames); make the first False")
    for i, (expanded, rank) in enumerate(zip(expand, ranks or [])):
        why = concat_mismatch(expanded, rank, ranks[0]) if i and ranks else None
        if why:
            given = conf.get("expand_dim_to_first_input", "(the default, every input after the first)")
            s.refuse("expand_dim_to_first_input", f"{given!r}: input {i + 1} {why}")
    spec: dict[str, Any] = {"type": "Concat"}
    if any(expand):
        spec["expand"] = expand
    if any(noise):
        spec["input_noise"] = noise
    out = None if any(d is None for d in input_dims) else sum(d for d in input_dims if d is not None)
    return s.finish(spec, out, COMMON_KEYS | {"expand_dim_to_first_input", "select_inputs", "flatten_last_2_dims",
                                              "expand_dimension"})


def concat_mismatch(expand: bool, rank: int, first: int) -> str | None:
    """Why the original's concat cannot join an input of ``rank`` axes to a first input of ``first`` axes with
    this ``expand_dim_to_first_input`` flag (it repeats a flagged input over axis -2 of the first), or None."""
    if expand == (rank == first - 1) and rank in (first, first - 1):
        return None
    if first == 3 and rank in (2, 3):  # an i-vector beside per-frame features
        return "is per-frame: only a per-utterance vector (an i-vector) is repeated over the frames" if expand \
            else "is one vector per utterance: it must be expanded (True) to join per-frame inputs"
    if rank == first - 1:
        return f"is {RANKS[rank]}: it must be expanded (True) to join the first input, {RANKS[first]}"
    if rank == first:
        return f"is {RANKS[rank]} like the first input: only an input with one axis fewer is expanded"
    return f"is {RANKS.get(rank, f'{rank}-d')}, the first input {RANKS.get(first, f'{first}-d')}: the original's " \
           "concat cannot join them"


def encoder_decoder_cnn(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's EncoderDecoderCNN (its keys and sizes: mtlab.nabu.cnn)."""
    s.one_input(input_dims)
    return encoder_decoder_spec(s.imp, s.where, s.conf)


def capsnet(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's CapsNet (its keys and sizes: mtlab.nabu.capsule)."""
    return capsnet_spec(s.imp, s.where, s.conf, input_dims)


def dbr_capsnet(s: Section, input_dims: list[int | None], ranks: list[int] | None) -> Spec:
    """mtlab's DBRCapsNet (its keys and sizes: mtlab.nabu.capsule)."""
    return dbr_capsnet_spec(s.imp, s.where, s.conf, input_dims)


# Every architecture of model.cfg mtlab builds, in the order the unknown-architecture refusal lists them.
ARCHITECTURES: dict[str, SpecFunction] = {
    "dblstm": dblstm, "dbresetlstm": dbresetlstm, "dbresetlstm_insert_additional_input": dbresetlstm,
    "linear": linear, "feedforward": feedforward, "concat": concat, "constant_generator": constant_generator,
    "leaky_dblstm": recurrent, "leaky_dblstm_notrec": recurrent, "leaky_dblstm_iznotrec": recurrent,
    "dbrnn": recurrent, "encoder_decoder_cnn": encoder_decoder_cnn, "attractor": attractor, "capsnet": capsnet,
    "dbr_capsnet": dbr_capsnet,
}


def model_spec(imp: SpecReader, name: str, conf: Mapping[str, str], input_dims: list[int | None],
               ranks: list[int] | None = None) -> Spec:
    """(mtlab model spec, output size on the last axis) for one original model section; ``ranks`` gives
    each input's number of axes (RANKS: an i-vector has 2, per-frame features 3, the CNN's output 4)."""
    arch = conf.get("architecture", "")
    build = ARCHITECTURES.get(arch)
    if build is None:
        imp.refuse(FILE, f"[{name}] architecture", f"{arch!r} has no mtlab implementation (mtlab has "
                                                   f"{', '.join(ARCHITECTURES)})")
        return {"type": f"nabu:{arch}"}, None
    return build(Section(imp, name, conf, arch), input_dims, ranks)
