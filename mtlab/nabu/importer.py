"""Import an original Nabu-MSSS recipe folder as an mtlab recipe dict.

Examples:
    >>> recipe_dir = "config/recipes/papers/ICASSP2018/MERL_DC_2spk"
    >>> recipe = import_nabu(recipe_dir, data_root="/data/wsjMix")  # doctest: +SKIP
    >>> write_toml(recipe, "merl_dc_2spk.toml")  # doctest: +SKIP

The folder's ``trainer.cfg`` (``[trainer]`` and the ``[task_*]`` sections), ``model.cfg``,
``loss.cfg``, ``database.conf``, the processor configs it names and ``validation_evaluator.cfg`` are
read. The result is an mtlab recipe (``trainer``, ``models``, ``tasks``: what ``mtlab.recipe`` reads):
per-stage values become ``[trainer] stages`` (the ``segment_lengths`` curriculum), the original's
stopping rules are switched on (``best_model_final``, ``validate_at_step_0``, the relative-improvement
stop, ``per_task_validation`` under ``acc_steps``), the original's update is chosen
(``optimizer = "adam_tf1"``, TensorFlow 1's Adam, and ``linkedset_weights = "relative"``: weights as written,
divided by the first set's), ``init_file``, ``num_tries = None`` (``"none"``) and
``trainset_frac`` are kept, ``database.conf`` paths are re-rooted under ``data_root`` and each linked
set's data carries the STFT settings of its processors (``spectral``) and, where its target processors' ``nrs``
is not 2, the speakers per mixture (``num_sources``: the loader reads s1 ... s<nrs>). ``recipe["nabu"]`` records the
source: the database sections, the original's task sections and validation evaluator settings, and the
evaluation configs (test evaluator, reconstructor, scorer), which ``mtlab train`` does not run.

A setting mtlab cannot honour is a ConfigError naming the file, the key and why (``strict=True``,
the default); with ``strict=False`` each one is listed in ``recipe["nabu"]["unsupported"]`` instead and
the import goes on. A key the original does not define is an "unknown key" error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from ..base.errors import ConfigError
from .capsule import capsnet_spec, dbr_capsnet_spec
from .cnn import encoder_decoder_spec
from .ini import read_ini, section, words

SAMPLE_RATE = 8000  # the original recipes' corpora (wav8k)

# The original's update, which mtlab's own recipes do not use by default: TensorFlow 1's Adam (epsilon on the
# uncorrected sqrt(v); mtlab.core.optimizers.AdamTF1) and linked-set weights divided by the first set's.
ORIGINAL_UPDATE = {"optimizer": "adam_tf1", "linkedset_weights": "relative"}
ORIGINAL_UPDATE_NOTE = ("it trains with the original's tf.train.AdamOptimizer ([trainer] optimizer = \"adam_tf1\"; "
                        "mtlab's own recipes use torch's Adam) and linked-set weights relative to the first set "
                        "([trainer] linkedset_weights = \"relative\")")

# The original's [trainer] keys: how each value is read. "stage" kinds may give one value per segment length.
TRAINER_KEYS: dict[str, str] = {
    "trainer": "str", "tasks": "names", "segment_lengths": "names", "init_file": "str",
    "num_epochs": "stage_float", "initial_learning_rate": "stage_float", "learning_rate_decay": "stage_float",
    "clip_grad_value": "stage_float", "normalize_gradients": "stage_bool", "batch_size": "stage_int",
    "numbatches_to_aggregate": "stage_int", "numbuckets": "stage_int", "valid_frequency": "stage_int",
    "valid_adapt": "stage_bool", "go_back": "stage_bool", "num_tries": "stage_tries", "reset_tries": "stage_bool",
    "task_weights": "floats", "acc_steps": "bool", "normalize_weights_acc_steps": "bool",
    "print_grads_stats": "bool", "print_var_updates": "bool",
}
# Keys of the plain mtlab [trainer] table that come from the stage settings.
STAGE_KEYS = tuple(k for k, kind in TRAINER_KEYS.items() if kind.startswith("stage_"))
TASK_KEYS = ("loss_type", "inputs", "outputs", "targets", "nodes", "linkedsets", "linkedset_weighting",
             "trainset_frac")
NODE_SUFFIXES = ("_model", "_inputs", "_output_names")
EVALUATOR_TASK_KEYS = (*TASK_KEYS, "requested_utts", "batch_size", "evaluator")

# What each original processor computes, as mtlab's data key (mtlab.data.TARGET_KEYS and "features").
PROCESSOR_KEYS: dict[tuple[str, str], str] = {
    ("audio_feat_processor", "logspec"): "features",
    ("onehotperfeature_target_processor", "magspec"): "binary_targets",
    ("scorelabelperfeature_processor", "magspec"): "usedbins",
    ("multi_target_processor", "magspec"): "src_mag",
    ("audio_signal_processor", "magspec"): "mix_mag",
    ("strlabel2index_processor", ""): "spk_pair",
    ("matrix2vector_processor", ""): "ivec",
}
VECTOR_MVN = {"global": "global", "None": "none"}  # matrix2vector_processor's mvn_type -> mtlab's VectorList mvn
FEATURE_MVN = {"local": "local", "none": "none", "None": "none"}  # audio_feat_processor's mvn_type -> data mvn
NUM_SOURCES = 2  # the corpus loader's default sources per mixture (s1, s2); a processor's nrs sets another

# The original's loss types mtlab has (same math, mtlab.separation.losses / mtlab.losses), with the
# fixed output and target names the original's loss computers read, mapped to mtlab's settings.
LOSS_NAMES: dict[str, dict[str, str]] = {
    "deepclustering": {"output": "bin_emb", "target": "binary_targets", "usedbins": "usedbins"},
    "deepclustering_flat": {"output": "bin_emb", "target": "binary_targets", "usedbins": "usedbins"},
    "pit": {"output": "bin_est", "target": "multi_targets", "mixture": "mix_to_mask"},
    "direct": {"output": "bin_est", "target": "multi_targets", "mixture": "mix_to_mask"},
    "deepattractornet": {"output": "bin_emb", "target": "multi_targets", "partition": "binary_targets",
                         "mixture": "mix_to_mask", "usedbins": "usedbins"},
    "crossentropy_multi": {"output": "spkest", "target": "spkids"},
    "crossentropy": {"output": "spkest", "target": "spkids"},
    "dummy": {}, "dummy_loss": {},  # zero loss, normalizer 1: the speaker-verification test tasks' loss
    "deepclusteringnoise": {"output": "bin_emb", "noise_filter": "noise_filter", "target": "binary_targets",
                            "usedbins": "usedbins", "noisybins": "noisybins", "ratio": "rel_speech_targets"},
}
# loss.cfg options per loss type: option -> how it maps (None: only its default value can be honoured).
LOSS_OPTIONS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "pit": {"activation": ("softmax", "sigmoid", "none", "None"), "no_perm": ("True", "False"),
            "logits_name": (), "rescale_recs": ("False",), "overspeakerized": ("False",), "transpose_order": None},
    "deepattractornet": {"activation": ("softmax", "sigmoid", "none", "None"), "frame_based": ("False", "false")},
    "crossentropy_multi": {"allow_permutation": ("True", "False"), "resh_logits": ("True", "true", "False", "false"),
                           "av_anchors_time_flag": ("False", "false")},
}
# Every loss_type the original's loss_computer_factory knows (a name outside it failed there too).
ORIGINAL_LOSS_TYPES = frozenset("""deepclustering deepclustering_flat deepclustering_2and3spk pit deepattractornet
anchor_deepattractornet anchor_deepattractornet_softmax anchor_normdeepattractornet_softmax
weighted_anchor_normdeepattractornet_softmax time_anchor_deepattractornet_softmax
time_anchor_normdeepattractornet_softmax time_anchor_read_heads_normdeepattractornet_softmax
time_anchor_read_heads_normdeepattractornet_softmax_framebased l41 pit_l41 deepclustering_l1
intravar2centervar_rat dist2mean_rat dist2mean_rat_squared dist2mean_rat_fracbins dist2mean_closest_rat
dist2mean_epsilon_closest_rat direct crossentropy crossentropy_multi dc_pit
deepclustering_full_crossentropy_multi_reshapelogits_avtime deepclusteringnoise deepattractornetnoisehard
deepattractornetnoisesoft noisefilter deepattractornet_noisefilter pit_noise deepclusteringnoise_rat_as_weight
deepclusteringnoise_alpha_as_weight deepclusteringnoise_snr_target deepclusteringnoise_dconly
deepclusteringnoise_noiseonly deepclustering_diar msl dummy_loss dummy""".split())
ARCHITECTURES = ("dblstm", "dbresetlstm", "dbresetlstm_insert_additional_input", "linear", "feedforward", "concat", "constant_generator",
                 "leaky_dblstm", "leaky_dblstm_notrec", "leaky_dblstm_iznotrec", "dbrnn", "encoder_decoder_cnn",
                 "attractor", "capsnet", "dbr_capsnet")
# The original's leaky LSTMs: which of their cell's gates read the recurrent output (LeakyBLSTM's recurrent).
LEAKY_RECURRENT = {"leaky_dblstm": "all", "leaky_dblstm_iznotrec": "forget_output", "leaky_dblstm_notrec": "none"}
# Processor configs some recipes name but the repository lacks, with the settings every copy it has holds
# (the mixture magnitude of the DANet and PIT losses: all 8 single-channel mixtomask_processor.cfg agree).
DEFAULT_PROCESSORS: dict[str, dict[str, str]] = {
    "mixtomask_processor.cfg": {"processor": "audio_signal_processor", "feature": "magspec", "winlen": "0.032",
                                "winstep": "0.008", "winfunc": "cosine", "nfft": "256", "preemph": "0.0",
                                "include_energy": "False"},
}
# The original's stopping rules, as its multi_task_trainer applies them.
# What a node gives, by its number of axes, and the architectures whose output has a fixed number of them.
RANKS = {2: "one vector per utterance", 3: "per frame", 4: "per time-frequency bin"}
OUTPUT_RANKS = {"constant_generator": 2, "encoder_decoder_cnn": 4}
STOPPING = {"best_model_final": True, "validate_at_step_0": True, "relative_improvement_threshold": 0.004,
            "relative_improvement_after_step": 1000, "relative_improvement_window": 0}


class Importer:
    """One import: collects what mtlab cannot honour (raising at once when ``strict``)."""

    def __init__(self, folder: Path, data_root: str, strict: bool) -> None:
        self.folder = folder
        self.data_root = data_root
        self.strict = strict
        self.unsupported: list[dict[str, str]] = []
        self.defaults: list[str] = []  # settings taken from a documented default (recipe["nabu"]["defaults"])

    # ------------------------------------------------------------------ messages
    def refuse(self, file: str, key: str, why: str) -> None:
        """A setting mtlab cannot honour: ConfigError (strict) or a recorded entry."""
        if self.strict:
            raise ConfigError(f"{self.folder / file}: {key}: {why}")
        self.unsupported.append({"file": file, "key": key, "why": why})

    def unknown(self, file: str, where: str, key: str, valid: tuple[str, ...] | list[str]) -> ConfigError:
        return ConfigError(f"{self.folder / file}: unknown key {key!r} in {where}; the original defines "
                           f"{', '.join(valid)}")

    # ------------------------------------------------------------------ [trainer]
    def trainer(self, conf: Mapping[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        """(plain mtlab [trainer] from the last stage, the stages, other [trainer] extras)."""
        file = "trainer.cfg"
        for key in conf:
            if key not in TRAINER_KEYS:
                raise self.unknown(file, "[trainer]", key, tuple(TRAINER_KEYS))
        for key in ("trainer", "tasks", "segment_lengths"):
            if key not in conf:
                raise ConfigError(f"{self.folder / file}: [trainer] needs {key!r} (the original reads it)")
        if conf["trainer"] != "multi_task":
            self.refuse(file, "[trainer] trainer", f"{conf['trainer']!r}: mtlab runs the original's multi_task "
                                                   "trainer only")
        lengths = words(conf["segment_lengths"])
        stages_n = len(lengths)
        for i, seg in enumerate(lengths):
            if seg != "full" and not (seg.isdigit() and int(seg) > 0):
                raise ConfigError(f"{self.folder / file}: [trainer] segment_lengths = {conf['segment_lengths']!r}: "
                                  "each must be a positive number of frames or 'full'")
            if seg == "full" and i != stages_n - 1:
                raise ConfigError(f"{self.folder / file}: [trainer] segment_lengths: 'full' must be the last stage "
                                  "(the original expects it last)")
        stages: list[dict[str, Any]] = [{"segment_length": int(s) if s.isdigit() else s} for s in lengths]
        extras: dict[str, Any] = {"trainer": conf["trainer"]}
        plain: dict[str, Any] = {"tasks": words(conf["tasks"])}
        for key, text in conf.items():
            kind = TRAINER_KEYS[key]
            if not kind.startswith("stage_"):
                continue
            values = words(text)
            if len(values) not in (1, stages_n):
                raise ConfigError(f"{self.folder / file}: [trainer] {key} = {text!r}: give one value, or one per "
                                  f"segment length ({stages_n}: {' '.join(lengths)})")
            values = values * stages_n if len(values) == 1 else values
            for stage, value in zip(stages, values):
                stage[key] = self.value(file, f"[trainer] {key}", kind[6:], value)
        for key in ("task_weights",):
            if key in conf:
                plain[key] = [self.value(file, f"[trainer] {key}", "float", v) for v in words(conf[key])]
        for key in ("acc_steps", "normalize_weights_acc_steps"):
            if key in conf:
                plain[key] = self.value(file, f"[trainer] {key}", "bool", conf[key])
        plain["normalize_weights_acc_steps"] = plain.get("acc_steps", False) and \
            plain.get("normalize_weights_acc_steps", False)  # the original ignores it without acc_steps
        for key in ("print_grads_stats", "print_var_updates"):
            if key in conf and self.value(file, f"[trainer] {key}", "bool", conf[key]):
                self.refuse(file, f"[trainer] {key}", "mtlab records gradient norms per step in history.csv and "
                                                      "the dashboard; it does not print them; set it to False")
        if "init_file" in conf:
            plain["init_file"] = conf["init_file"]
        for stage in stages:
            if stage.get("numbatches_to_aggregate") == 0:
                self.refuse(file, "[trainer] numbatches_to_aggregate", "0 asks for asynchronous training, which the "
                                                                       "original left broken; use 1 or more")
            if stage.get("num_tries", 0) is None:
                stage["num_tries"] = "none"  # TOML has no null: no tries limit is written as "none"
        last = stages[-1]
        for key in STAGE_KEYS:
            if key in last:
                plain[key] = last[key]
        if len(stages) > 1 or stages[0]["segment_length"] != "full":
            plain["stages"] = stages
        # the original's stopping rules (multi_task_trainer), which mtlab's schedule offers as settings
        plain.update(STOPPING)
        plain["per_task_validation"] = bool(plain.get("acc_steps", False))
        plain.update(ORIGINAL_UPDATE)
        return plain, stages, extras

    def value(self, file: str, key: str, kind: str, text: str) -> Any:
        try:
            if kind == "int":
                return int(text)
            if kind == "float":
                return float(text)
            if kind == "tries":
                return None if text == "None" else int(text)
        except ValueError:
            raise ConfigError(f"{self.folder / file}: {key} = {text!r} must be "
                              f"{'an integer' if kind != 'float' else 'a number'}"
                              f"{' or None' if kind == 'tries' else ''}") from None
        if kind == "bool":
            if text not in ("True", "False"):
                raise ConfigError(f"{self.folder / file}: {key} = {text!r} must be 'True' or 'False' (the original "
                                  "treats anything but 'True' as False)")
            return text == "True"
        return text

    # ------------------------------------------------------------------ model.cfg
    def models(self, parser: Any) -> dict[str, dict[str, str]]:
        """Original model sections as raw dicts (built into mtlab specs once input sizes are known)."""
        file = "model.cfg"
        path = self.folder / file
        names = words(section(parser, "hyper", path).get("model_names", ""))
        if not names:
            raise ConfigError(f"{path}: [hyper] needs model_names")
        return {name: section(parser, name, path) for name in names}

    def model_spec(self, name: str, conf: Mapping[str, str], input_dims: list[int | None],
                   stages: int, ranks: list[int] | None = None) -> tuple[dict[str, Any], int | None]:
        """(mtlab model spec, output size on the last axis) for one original model section; ``ranks`` gives
        each input's number of axes (RANKS: an i-vector has 2, per-frame features 3, the CNN's output 4)."""
        file = "model.cfg"
        arch = conf.get("architecture", "")
        where = f"[{name}]"

        def num(key: str, default: str | None = None, kind: str = "float") -> Any:
            text = conf.get(key, default)
            if text is None:
                raise ConfigError(f"{self.folder / file}: {where} needs {key!r} for architecture {arch!r}")
            values = words(text)
            if len(values) > 1:  # per-stage values: one model across the stages needs them equal
                if len(set(values)) != 1:
                    self.refuse(file, f"{where} {key}", f"{text!r}: mtlab keeps one model across the stages, so "
                                                        "a model setting must be the same in every stage")
                text = values[-1]
            return self.value(file, f"{where} {key}", kind, text)

        def keep_to_drop(key: str) -> float:
            keep = num(key, "1.0")
            if not 0 < keep <= 1:
                raise ConfigError(f"{self.folder / file}: {where} {key} = {keep}: a keep probability in (0, 1]")
            return 1.0 - keep

        def flag(key: str, default: str) -> str:
            return conf.get(key, default)

        if arch not in ARCHITECTURES:
            self.refuse(file, f"{where} architecture", f"{arch!r} has no mtlab implementation (mtlab has "
                                                       f"{', '.join(ARCHITECTURES)})")
            return {"type": f"nabu:{arch}"}, None
        if arch == "encoder_decoder_cnn":  # its keys and sizes: mtlab.nabu.cnn
            if len(input_dims) != 1:
                raise ConfigError(f"{self.folder / file}: {where} architecture {arch!r} reads one input (the "
                                  f"original raises otherwise), its nodes give {len(input_dims)}")
            return encoder_decoder_spec(self, where, conf)
        if arch in ("capsnet", "dbr_capsnet"):  # their keys and sizes: mtlab.nabu.capsule
            return (capsnet_spec if arch == "capsnet" else dbr_capsnet_spec)(self, where, conf, input_dims)
        known = {"architecture", "input_noise", "dropout", "trainable"}
        if flag("trainable", "True") != "True":
            self.refuse(file, f"{where} trainable", "frozen models: mtlab trains every model a task uses")
        dim = input_dims[0] if input_dims else None
        if arch == "dblstm":
            known |= {"num_units", "num_layers", "recurrent_dropout", "layer_norm", "fac_per_layer",
                      "activation_fn", "separate_directions"}
            if num("fac_per_layer", "1.0") != 1.0:
                self.refuse(file, f"{where} fac_per_layer", "mtlab's BLSTM has the same size in every layer")
            if num("recurrent_dropout", "1.0") != 1.0:
                self.refuse(file, f"{where} recurrent_dropout", "mtlab's BLSTM has no recurrent dropout")
            for key, default, why in (("layer_norm", "False", "mtlab's BLSTM has no layer normalization"),
                                      ("separate_directions", "False", "mtlab's BLSTM feeds both directions on")):
                if flag(key, default) != default:
                    self.refuse(file, f"{where} {key}", why)
            if flag("activation_fn", "tanh") != "tanh":
                self.refuse(file, f"{where} activation_fn", "mtlab's BLSTM cells use tanh")
            units = num("num_units", kind="int")
            spec = {"type": "BLSTM", "input_dim": dim, "hidden": units, "num_layers": num("num_layers", kind="int"),
                    "input_noise": num("input_noise", "0"), "layer_dropout": keep_to_drop("dropout")}
            out: int | None = 2 * units
        elif arch in ("dbresetlstm", "dbresetlstm_insert_additional_input"):
            inserts = arch == "dbresetlstm_insert_additional_input"
            if len(input_dims) != (2 if inserts else 1):
                raise ConfigError(f"{self.folder / file}: {where} architecture {arch!r} reads "
                                  f"{2 if inserts else 1} input(s), its nodes give {len(input_dims)}")
            known |= {"num_units", "num_layers", "t_reset", "group_size", "forward_reset", "backward_reset",
                      "separate_directions", "symmetric_context", "recurrent_dropout", "layer_norm", "activation_fn"}
            layers = num("num_layers", kind="int")
            per_layer: dict[str, list[int]] = {}
            for key, default in (("t_reset", None), ("group_size", "1")):
                text = conf.get(key, default)
                if text is None:
                    raise ConfigError(f"{self.folder / file}: {where} needs 't_reset' for architecture {arch!r}")
                values = [self.value(file, f"{where} {key}", "int", v) for v in words(text)]
                if len(values) not in (1, layers) or min(values, default=0) < 1:
                    raise ConfigError(f"{self.folder / file}: {where} {key} = {text!r}: give one positive integer, "
                                      f"or one per layer (num_layers = {layers})")
                per_layer[key] = values * layers if len(values) == 1 else values
            resets, groups = per_layer["t_reset"], per_layer["group_size"]
            if any(b < a for a, b in zip(resets, resets[1:])) or any(t % g for t, g in zip(resets, groups)):
                raise ConfigError(f"{self.folder / file}: {where} t_reset = {conf['t_reset']!r}, group_size = "
                                  f"{conf.get('group_size', '1')!r}: t_reset must not decrease from layer to layer "
                                  "and must be a multiple of its group_size (the original raises too)")
            if keep_to_drop("dropout") > 0:
                self.refuse(file, f"{where} dropout", "the original's dbresetlstm raises 'dropout not yet implemented' "
                                                      "in training; set it to 1.0")
            if num("recurrent_dropout", "1.0") != 1.0:
                self.refuse(file, f"{where} recurrent_dropout", "mtlab's ResetBLSTM has no recurrent dropout")
            if flag("layer_norm", "False") != "False":
                self.refuse(file, f"{where} layer_norm", "mtlab's ResetBLSTM has no layer normalization")
            if flag("activation_fn", "tanh") != "tanh":
                self.refuse(file, f"{where} activation_fn", "mtlab's ResetBLSTM cells use tanh")
            if flag("symmetric_context", "True") != "True":
                self.refuse(file, f"{where} symmetric_context", f"{conf['symmetric_context']!r}: the original's "
                            "dbresetlstm does not read it and always gives a deeper layer the replicas that restarted "
                            "at the same frame in both directions (symmetric context), as mtlab does; set it to True")
            directions = [self.value(file, f"{where} {key}", "bool", flag(key, default)) for key, default in
                          (("forward_reset", "True"), ("backward_reset", "True"), ("separate_directions", "False"))]
            if not (directions[0] or directions[1]):
                self.refuse(file, f"{where} forward_reset", "with backward_reset False too there is no reset left "
                                                            "(the original fails on it); use architecture = dblstm")
                directions[0] = True
            units = num("num_units", kind="int")
            spec = {"type": "ResetBLSTM", "input_dim": dim, "hidden": units, "num_layers": layers,
                    "t_reset": resets, "group_size": groups, "forward_reset": directions[0],
                    "backward_reset": directions[1], "separate_directions": directions[2],
                    "input_noise": num("input_noise", "0")}
            if inserts:
                known.add("combine_layer")
                combine = num("combine_layer", kind="int")
                if not 1 <= combine <= layers or not (directions[0] and directions[1]):
                    raise ConfigError(f"{self.folder / file}: {where} combine_layer = {combine}: a layer from 1 to "
                                      f"num_layers ({layers}), with forward_reset and backward_reset True (the "
                                      "original repeats the additional input over both directions' replicas)")
                spec.update(type="ResetBLSTMInsert", extra_dim=input_dims[1], combine_layer=combine)
                if input_dims[1] is None:
                    self.refuse(file, where, "the size of its additional input is unknown (it comes from data or "
                                             "a model mtlab cannot build)")
            out = 2 * units
        elif arch in LEAKY_RECURRENT or arch == "dbrnn":
            if len(input_dims) != 1:
                raise ConfigError(f"{self.folder / file}: {where} architecture {arch!r} reads one input (the "
                                  f"original raises otherwise), its nodes give {len(input_dims)}")
            known |= {"num_units", "num_layers", "recurrent_dropout", "layer_norm"}
            mtlab_type = "BRNN" if arch == "dbrnn" else "LeakyBLSTM"
            ignored = " (the original's dbrnn ignores it)" if arch == "dbrnn" else ""
            if num("recurrent_dropout", "1.0") != 1.0:
                self.refuse(file, f"{where} recurrent_dropout",
                            f"mtlab's {mtlab_type} has no recurrent dropout{ignored}")
            if flag("layer_norm", "False") != "False":
                self.refuse(file, f"{where} layer_norm", f"mtlab's {mtlab_type} has no layer normalization{ignored}")
            units = num("num_units", kind="int")
            spec = {"type": mtlab_type, "input_dim": dim, "hidden": units, "num_layers": num("num_layers", kind="int"),
                    "input_noise": num("input_noise", "0")}
            if arch == "dbrnn":  # the original drops after every layer
                spec["layer_dropout"] = keep_to_drop("dropout")
            else:  # the original drops after the last layer only; its cells add 1 to the forget gate
                known.add("leak_factor")
                spec.update(leak=num("leak_factor"), recurrent=LEAKY_RECURRENT[arch], forget_bias=1.0,
                            dropout=keep_to_drop("dropout"))
            out = 2 * units
        elif arch == "linear":
            known |= {"output_dims", "no_bias", "activation_func", "last_only"}
            shape = [self.value(file, f"{where} output_dims", "int", v) for v in words(conf.get("output_dims", ""))]
            if not shape:
                raise ConfigError(f"{self.folder / file}: {where} needs output_dims")
            if flag("last_only", "False") == "True":
                self.refuse(file, f"{where} last_only", "mtlab's Dense keeps every frame")
            act = flag("activation_func", "None")
            spec = {"type": "Dense", "input_dim": dim, "units": [math.prod(shape)],
                    "activation": "none" if act == "None" else act, "input_noise": num("input_noise", "0"),
                    "dropout": keep_to_drop("dropout"), "bias": flag("no_bias", "False") != "True"}
            if len(shape) > 1:
                spec["output_shape"] = shape
            out = shape[-1]
        elif arch == "feedforward":
            known |= {"num_units", "num_layers", "fac_per_layer", "activation_func", "recurrent_dropout", "layer_norm"}
            first, layers, fac = num("num_units", kind="int"), num("num_layers", kind="int"), num("fac_per_layer", "1.0")
            units = [int(math.ceil(first * fac**i)) for i in range(layers)]
            if flag("layer_norm", "False") != "False":
                self.refuse(file, f"{where} layer_norm", "the original's feedforward ignores it; mtlab has none")
            spec = {"type": "Dense", "input_dim": dim, "units": units, "activation": flag("activation_func", "tanh"),
                    "input_noise": num("input_noise", "0"), "dropout": keep_to_drop("dropout")}
            out = units[-1] if units else dim
        elif arch == "attractor":
            known = {"architecture", "normalization", "trainable"}
            if len(input_dims) != 3:
                self.refuse(file, where, f"its nodes give {len(input_dims)} inputs: mtlab's Attractor takes the "
                                         "original's three (embeddings, binary targets, usedbins), not the form with "
                                         "embeddings per speaker")
                return {"type": "Attractor"}, None
            emb, labels, bins = input_dims
            if emb is None or labels is None or bins is None or emb % bins or labels % bins:
                self.refuse(file, where, f"input sizes {input_dims}: the embeddings and binary targets must be known "
                                         "multiples of the usedbins' bins")
                return {"type": "Attractor"}, None
            spec = {"type": "Attractor", "bins": bins,
                    "normalize": self.value(file, f"{where} normalization", "bool", flag("normalization", "False"))}
            out = emb // bins
        elif arch == "constant_generator":
            known = {"architecture", "constant_value", "tensor_shape", "include_batch_size", "output_noise",
                     "trainable"}
            if "tensor_shape" not in conf:
                raise ConfigError(f"{self.folder / file}: {where} needs 'tensor_shape' for architecture {arch!r}")
            shape = [self.value(file, f"{where} tensor_shape", "int", v.strip())
                     for v in conf["tensor_shape"].split(",")]
            if flag("include_batch_size", "False") != "True":
                self.refuse(file, f"{where} include_batch_size", "mtlab batches every node's output: set it to True "
                                                                 "(one constant per utterance)")
            if len(shape) != 1:
                self.refuse(file, f"{where} tensor_shape", f"{conf['tensor_shape']!r}: mtlab's Constant gives one "
                                                           "vector per utterance ([B, D]), to be expanded by a concat")
            noise = [self.value(file, f"{where} output_noise", "float", v)
                     for v in words(conf.get("output_noise", "0"))]
            if len(noise) != 1:
                self.refuse(file, f"{where} output_noise", f"{conf['output_noise']!r}: give one standard deviation")
            spec = {"type": "Constant", "shape": shape, "value": num("constant_value", kind="float"),
                    "output_noise": noise[0] if noise else 0.0}
            out = shape[-1]
        else:  # concat
            known |= {"expand_dim_to_first_input", "select_inputs", "flatten_last_2_dims", "expand_dimension"}
            for key, plain_value in (("flatten_last_2_dims", "False"), ("select_inputs", "True")):
                if key in conf and set(words(conf[key])) != {plain_value}:
                    self.refuse(file, f"{where} {key}", f"{conf[key]!r}: mtlab's Concat joins all its inputs as they "
                                                        "are (no selecting or flattening)")
            if conf.get("expand_dimension", "-2") != "-2":
                self.refuse(file, f"{where} expand_dimension", f"{conf['expand_dimension']!r}: mtlab's Concat repeats "
                                                               "a [B, D] input over the time axis only (-2)")
            n = len(input_dims)
            expand = [self.value(file, f"{where} expand_dim_to_first_input", "bool", v)
                      for v in words(conf["expand_dim_to_first_input"])] if "expand_dim_to_first_input" in conf \
                else [False] + [True] * (n - 1)  # the original's default: every input after the first
            noise = [self.value(file, f"{where} input_noise", "float", v) for v in words(conf.get("input_noise", ""))]
            for key, values in (("expand_dim_to_first_input", expand), ("input_noise", noise)):
                if values and n and len(values) != n:
                    raise ConfigError(f"{self.folder / file}: {where} {key} = {conf.get(key)!r}: give one value per "
                                      f"input ({n}) of the nodes that use the model")
            if expand and expand[0]:
                raise ConfigError(f"{self.folder / file}: {where} expand_dim_to_first_input: the first input cannot "
                                  "be expanded (the others are repeated over its frames); make the first False")
            for i, (flag, rank) in enumerate(zip(expand, ranks or [])):
                why = concat_mismatch(flag, rank, ranks[0]) if i else None  # type: ignore[index]
                if why:
                    given = conf.get("expand_dim_to_first_input", "(the default, every input after the first)")
                    self.refuse(file, f"{where} expand_dim_to_first_input", f"{given!r}: input {i + 1} {why}")
            spec = {"type": "Concat"}
            if any(expand):
                spec["expand"] = expand
            if any(noise):
                spec["input_noise"] = noise
            out = None if any(d is None for d in input_dims) else sum(d for d in input_dims if d is not None)
        for key in conf:
            if key not in known:
                raise self.unknown(file, where, key, sorted(known))
        if spec.get("input_dim", 0) is None:
            self.refuse(file, f"{where}", "the size of its input is unknown (it comes from data or a model mtlab "
                                          "cannot build)")
        return spec, out

    # ------------------------------------------------------------------ database.conf and processors
    def database(self) -> tuple[Any, str, dict[str, str]]:
        for name in ("database.conf", "database.cfg"):
            parser = read_ini(self.folder / name, required=False)
            if parser is not None:
                globalvars = section(parser, "globalvars", self.folder / name) if parser.has_section("globalvars") \
                    else {}
                return parser, name, globalvars
        raise ConfigError(f"{self.folder}: no database.conf (or database.cfg); the original reads its data "
                          "sections from it")

    def rerooter(self, parser: Any) -> Callable[[str], str]:
        """Map an original absolute data path to the same path below ``data_root``: the common folder of
        every ``datafiles`` in database.conf is replaced by the data root."""
        paths = [PurePosixPath(v.strip()) for s in parser.sections() for k, v in parser.items(s)
                 if k == "datafiles" and v.strip().startswith("/") and " " not in v.strip()]
        common = PurePosixPath(os.path.commonpath([str(p.parent) for p in paths])) if paths else PurePosixPath("/")

        def reroot(path: str) -> str:
            p = PurePosixPath(path)
            if not p.is_absolute():
                return str(Path(self.data_root) / p)
            return str(Path(self.data_root) / p.relative_to(common)) if p.is_relative_to(common) else \
                str(Path(self.data_root) / p.relative_to("/"))
        return reroot

    def processor_path(self, given: str) -> Path:
        """A processor config the original names from its own root (``config/recipes/...``): the file of
        that name in the recipe folder, else the same path below the folder holding ``config/``."""
        local = self.folder / PurePosixPath(given).name
        if local.is_file():
            return local
        parts = self.folder.resolve().parts
        for i in range(len(parts) - 1, 0, -1):
            if parts[i] == "config":
                candidate = Path(*parts[:i]) / given
                if candidate.is_file():
                    return candidate
        return local

    def data_section(self, parser: Any, file: str, globalvars: Mapping[str, str], name: str,
                     reroot: Callable[[str], str]) -> dict[str, Any] | None:
        """One database section: re-rooted list, processor settings, mtlab data key and STFT settings."""
        from ..data.features import Spectral

        if not parser.has_section(name):
            raise ConfigError(f"{self.folder / file}: no [{name}] section, named by a task; sections: "
                              f"{', '.join(parser.sections())}")
        conf = {k: (globalvars.get(k, v) if v.strip() == "globalvars" else v).strip() for k, v in parser.items(name)}
        for need in ("datafiles", "processor_config"):
            if need not in conf:
                continued = [k for k, v in conf.items() if f"\n{need}" in v]
                hint = (f"; an indented '{need} = ...' line continues the value of {continued[0]!r} "
                        "(in the original's ConfigParser too)") if continued else ""
                self.refuse(file, f"[{name}] {need}", f"missing, so the original could not load this section "
                                                      f"either{hint}")
                return None
        proc_path = self.processor_path(conf["processor_config"])
        proc_file = proc_path.name if proc_path.parent == self.folder else str(proc_path)
        default = DEFAULT_PROCESSORS.get(proc_path.name)
        if not proc_path.is_file() and default is None:
            self.refuse(file, f"[{name}] processor_config", f"{conf['processor_config']!r} is neither in the recipe "
                                                            "folder nor below the recipes' root")
            return None
        if proc_path.is_file():
            proc = section(read_ini(proc_path), "processor", proc_path)  # type: ignore[arg-type]
        else:
            proc = dict(default or {})
            self.defaults.append(f"[{name}] processor_config: {conf['processor_config']!r} is absent; the settings of "
                                 f"every {proc_path.name} in the original's repository are used")
        kind, feature = proc.get("processor", ""), proc.get("feature", "")
        key = PROCESSOR_KEYS.get((kind, feature), PROCESSOR_KEYS.get((kind, "")))
        out: dict[str, Any] = {"datafiles": reroot(conf["datafiles"]), "processor_config": proc_file,
                               "processor": proc}
        if key is not None:
            out["key"] = key
        if "segment_lengths" in conf:
            out["segment_lengths"] = words(conf["segment_lengths"])
        if key is None:
            self.refuse(proc_file, "[processor] processor", f"{kind!r} (feature {feature!r}) computes data mtlab's "
                        f"corpus loader does not produce (it gives {', '.join(sorted(set(PROCESSOR_KEYS.values())))})")
            return out
        if "nrs" in proc and key != "ivec":
            out["nrs"] = self.sources(proc_file, proc)
        if key == "features" and proc.get("mvn_type", "global") != "global":
            if proc["mvn_type"] in FEATURE_MVN:
                out["mvn"] = FEATURE_MVN[proc["mvn_type"]]
            else:
                self.refuse(proc_file, "[processor] mvn_type", f"{proc['mvn_type']!r}: mtlab normalizes features with "
                            f"the training set's global mean and variance, per utterance or not at all "
                            f"({', '.join(['global', *FEATURE_MVN])})")
        if key == "ivec":
            return self.vector_section(proc_file, proc, out)
        if key == "usedbins" and float(proc.get("mag_thres", "100")) != 100.0:
            self.refuse(proc_file, "[processor] mag_thres", "mtlab's recipes use bins within 40 dB of the loudest "
                                                            "(mag_thres = 100)")
        if "winlen" in proc:
            try:
                spectral = Spectral.from_processor_config(proc, SAMPLE_RATE, origin=str(proc_path))
            except ConfigError as exc:
                self.refuse(proc_file, "[processor]", str(exc).split(": ", 1)[-1])
                return out
            out["spectral"] = {"win_length": spectral.win_length, "hop_length": spectral.hop_length,
                               "n_fft": spectral.n_fft, "window": spectral.window, "framing": spectral.framing,
                               "sample_scale": spectral.sample_scale, "preemph": spectral.preemph}

        return out

    def sources(self, proc_file: str, proc: Mapping[str, str]) -> int:
        """A target processor's ``nrs``: the speakers per mixture, which the loader reads as s1 ... s<nrs>."""
        nrs = self.value(proc_file, "[processor] nrs", "int", proc["nrs"])
        if nrs < 1:
            raise ConfigError(f"{self.folder / proc_file}: [processor] nrs = {proc['nrs']!r}: the number of speakers "
                              "per mixture must be positive")
        if "spk_select" in proc and words(proc["spk_select"]) != [str(i) for i in range(nrs)]:
            self.refuse(proc_file, "[processor] spk_select", f"{proc['spk_select']!r}: mtlab's targets cover every "
                                                             f"one of the nrs = {nrs} speakers, in order")
        return nrs

    def vector_section(self, proc_file: str, proc: Mapping[str, str], out: dict[str, Any]) -> dict[str, Any]:
        """A matrix2vector_processor section: its per-utterance vector settings (``out["ivec"]``)."""
        sizes = {}
        for key in ("nrcol", "nrs"):
            if key not in proc:
                raise ConfigError(f"{self.folder / proc_file}: [processor] needs {key!r} (matrix2vector_processor "
                                  "reads it)")
            sizes[key] = self.value(proc_file, f"[processor] {key}", "int", proc[key])
            if sizes[key] < 1:
                raise ConfigError(f"{self.folder / proc_file}: [processor] {key} = {proc[key]!r} must be positive")
        mvn = proc.get("mvn_type", "")
        if mvn not in VECTOR_MVN:
            raise ConfigError(f"{self.folder / proc_file}: [processor] mvn_type = {mvn!r}: matrix2vector_processor "
                              f"knows {' or '.join(VECTOR_MVN)} (its constructor rejects anything else)")
        out["ivec"] = {"nrcol": sizes["nrcol"], "nrs": sizes["nrs"], "mvn": VECTOR_MVN[mvn]}
        return out

    # ------------------------------------------------------------------ tasks
    def task(self, file: str, name: str, conf: Mapping[str, str], data: Callable[[str], dict[str, Any] | None],
             evaluator: bool = False) -> dict[str, Any]:
        """An original task section: its graph, loss type and per-linked-set data sections."""
        valid_keys = EVALUATOR_TASK_KEYS if evaluator else TASK_KEYS
        nodes = words(conf.get("nodes", ""))
        inputs, outputs = words(conf.get("inputs", "")), words(conf.get("outputs", ""))
        targets = words(conf.get("targets", ""))
        sets = words(conf.get("linkedsets", "")) or ["set0"]
        data_names = set(inputs) | set(targets)
        for key in conf:
            if key in valid_keys or any(key == f"{n}{s}" for n in nodes for s in NODE_SUFFIXES):
                continue
            if key in data_names or any(key == f"{s}_{d}" for s in sets for d in data_names):
                continue
            raise self.unknown(file, f"[{name}]", key, (*valid_keys, "<node>_model", "<node>_inputs",
                                                        "<node>_output_names", "<input or target> = <database section>",
                                                        "<linkedset>_<input or target> = <database section>"))
        for key in ("loss_type", "inputs", "outputs", "nodes"):
            if key not in conf:
                raise ConfigError(f"{self.folder / file}: [{name}] needs {key!r} (the original reads it)")
        graph = []
        for node in nodes:
            if f"{node}_model" not in conf or f"{node}_inputs" not in conf:
                raise ConfigError(f"{self.folder / file}: [{name}] node {node!r} needs {node}_model and {node}_inputs")
            graph.append({"name": node, "model": conf[f"{node}_model"], "inputs": words(conf[f"{node}_inputs"]),
                          **({"outputs": words(conf[f"{node}_output_names"])} if f"{node}_output_names" in conf
                             else {})})
        linked: dict[str, dict[str, Any]] = {}
        weights = [1.0] * len(sets)
        if "linkedset_weighting" in conf:
            weights = [float(w) for w in words(conf["linkedset_weighting"])]
            if len(weights) != len(sets) or weights[0] == 0:
                raise ConfigError(f"{self.folder / file}: [{name}] linkedset_weighting needs one weight per linked "
                                  f"set ({len(sets)}), the first not 0")
            # kept as written: [trainer] linkedset_weights = "relative" divides by the first, as the original
        for set_name, weight in zip(sets, weights):
            sections: dict[str, dict[str, Any] | None] = {}
            for item in (*inputs, *targets):
                key = item if set_name == "set0" else f"{set_name}_{item}"
                if key not in conf:
                    raise ConfigError(f"{self.folder / file}: [{name}] needs {key} = <database section> "
                                      f"(data for {item!r} of linked set {set_name!r})")
                names = words(conf[key])
                if len(names) != 1:
                    self.refuse(file, f"[{name}] {key}", f"{conf[key]!r}: mtlab reads one database section per input "
                                                         "or target")
                found = data(names[0]) if names else None
                sections[item] = {**(found or {}), "section": names[0] if names else ""}
            linked[set_name] = {"weight": weight, "sections": sections}
        out: dict[str, Any] = {"loss_type": conf["loss_type"], "inputs": inputs, "targets": targets,
                               "outputs": outputs, "nodes": graph, "linkedsets": linked}
        if "trainset_frac" in conf:
            frac = self.value(file, f"[{name}] trainset_frac", "float", conf["trainset_frac"])
            if not 0 < frac <= 1:
                raise ConfigError(f"{self.folder / file}: [{name}] trainset_frac = {frac}: a fraction in (0, 1]")
            out["trainset_frac"] = frac
        for key in ("requested_utts", "batch_size"):
            if key in conf:
                out[key] = self.value(file, f"[{name}] {key}", "int", conf[key])
        return out

    def loss(self, task: str, loss_type: str, losses: Any) -> tuple[str, dict[str, str]]:
        """(the loss type, its loss.cfg options): loss.cfg's section named by the task's loss_type."""
        if losses is None:
            return loss_type, {}
        path = self.folder / "loss.cfg"
        if not losses.has_section(loss_type):
            raise ConfigError(f"{path}: no [{loss_type}] section for task {task!r} (the original looks up the "
                              "task's loss_type there when loss.cfg exists)")
        options = section(losses, loss_type, path)
        if "loss_type" not in options:
            raise ConfigError(f"{path}: [{loss_type}] needs loss_type")
        return options.pop("loss_type"), options

    def loss_spec(self, task: str, kind: str, options: Mapping[str, str],
                  keys: Mapping[str, str]) -> dict[str, Any] | None:
        """The mtlab loss table: the original's fixed names mapped through the task's data keys."""
        file = "loss.cfg" if options else "trainer.cfg"
        if kind not in LOSS_NAMES:
            why = "has no mtlab implementation" if kind in ORIGINAL_LOSS_TYPES else \
                "is not a loss type of the original either (its factory rejects it; without loss.cfg the task's " \
                "loss_type is the type itself)"
            self.refuse(file, f"[{task}] loss_type", f"{kind!r} {why} (mtlab has {', '.join(LOSS_NAMES)})")
            return None
        allowed = LOSS_OPTIONS.get(kind, {})
        for key, value in options.items():
            if key not in allowed:
                self.refuse(file, f"[{kind}] {key}", f"not an option of the original's {kind!r} loss that mtlab "
                                                     f"honours (it honours {', '.join(allowed) or 'none'})")
            elif allowed[key] is not None and allowed[key] and value not in allowed[key]:  # type: ignore[operator]
                self.refuse(file, f"[{kind}] {key}", f"{value!r}: mtlab honours {', '.join(allowed[key] or ())}")
            elif allowed[key] is None:
                self.refuse(file, f"[{kind}] {key}", "mtlab's loss has no such option")
        names = dict(LOSS_NAMES[kind])
        if "logits_name" in options:
            names["output"] = options["logits_name"]
        spec: dict[str, Any] = {"type": kind}
        for setting, original in names.items():
            if setting in ("output", "noise_filter"):
                spec[setting] = original
            elif original in keys:
                spec[setting] = keys[original]
            else:
                self.refuse("trainer.cfg", f"[{task}] targets", f"the original's {kind!r} loss reads target "
                                                                f"{original!r}, which the task does not give")
        if kind in ("pit", "direct"):
            spec["layout"] = "speaker_major"  # the original reads flat logits speaker-major
        if kind == "deepattractornet" and "activation" not in options:
            self.refuse(file, f"[{kind}] activation", "the original's deepattractornet loss requires it")
        if "activation" in options:
            spec["activation"] = options["activation"].lower()
        if options.get("no_perm") == "True":
            spec["no_perm"] = True
        if "allow_permutation" in options:
            spec["allow_permutation"] = options["allow_permutation"] == "True"
        return spec


def import_nabu(recipe_dir: str | Path, data_root: str | Path = "data", strict: bool = True) -> dict[str, Any]:
    """The mtlab recipe dict (with ``recipe["nabu"]``) of an original recipe folder; see the module doc."""
    folder = Path(recipe_dir)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder; give an original recipe folder (with trainer.cfg)")
    imp = Importer(folder, str(data_root), strict)
    trainer_path = folder / "trainer.cfg"
    tparser = read_ini(trainer_path)
    assert tparser is not None
    plain, stages, extras = imp.trainer(section(tparser, "trainer", trainer_path))
    db, db_file, globalvars = imp.database()
    reroot = imp.rerooter(db)
    data_cache: dict[str, dict[str, Any] | None] = {}

    def data(name: str) -> dict[str, Any] | None:
        if name not in data_cache:
            data_cache[name] = imp.data_section(db, db_file, globalvars, name, reroot)
        return data_cache[name]

    losses = read_ini(folder / "loss.cfg", required=False)
    vparser = read_ini(folder / "validation_evaluator.cfg", required=False)
    veval = section(vparser, "evaluator", folder / "validation_evaluator.cfg") if vparser is not None and \
        vparser.has_section("evaluator") else {"evaluator": "None"}
    validating = veval.get("evaluator", "None") != "None"
    if validating and veval["evaluator"] != "task_loss_evaluator":
        imp.refuse("validation_evaluator.cfg", "[evaluator] evaluator", f"{veval['evaluator']!r}: mtlab validates "
                   "with each task's loss (the original's task_loss_evaluator)")
    tasks: dict[str, Any] = {}
    nabu_tasks: dict[str, Any] = {}
    for tname in plain["tasks"]:
        orig = imp.task("trainer.cfg", tname, section(tparser, tname, trainer_path), data)
        valid = None
        if validating:
            if not vparser.has_section(tname):  # type: ignore[union-attr]
                raise ConfigError(f"{folder / 'validation_evaluator.cfg'}: no [{tname}] section; the original "
                                  "validates every training task")
            valid = imp.task("validation_evaluator.cfg", tname,
                             section(vparser, tname, folder / "validation_evaluator.cfg"), data, evaluator=True)
            if valid["loss_type"] != orig["loss_type"]:
                imp.refuse("validation_evaluator.cfg", f"[{tname}] loss_type", f"{valid['loss_type']!r} differs from "
                           f"training's {orig['loss_type']!r}: mtlab validates with the task's own loss")
        tasks[tname], nabu_tasks[tname] = build_task(imp, tname, orig, valid, losses, veval)
    # models, sized by propagating per-frame sizes through every task's graph
    mparser = read_ini(folder / "model.cfg")
    models = size_models(imp, imp.models(mparser), tasks, len(stages))
    recipe: dict[str, Any] = {
        "name": folder.name,
        # the folder's name only: [nabu] recipe_dir has its full path (a description is read on other machines)
        "description": f"imported from the Nabu-MSSS recipe {folder.name}; {ORIGINAL_UPDATE_NOTE}",
        "trainer": plain,
        "models": models,
        "tasks": tasks,
        "nabu": {
            "recipe_dir": str(folder),
            "data_root": str(data_root),
            **extras,
            "tasks": nabu_tasks,
            "data": {k: v for k, v in data_cache.items() if v is not None},
            "evaluation": {f: str(folder / f) for f in ("test_evaluator.cfg", "reconstructor.cfg", "scorer.cfg",
                                                         "postprocessor.cfg") if (folder / f).is_file()},
        },
    }
    if imp.unsupported:
        recipe["nabu"]["unsupported"] = imp.unsupported
    if imp.defaults:
        recipe["nabu"]["defaults"] = imp.defaults
    return recipe


def build_task(imp: Importer, tname: str, orig: dict[str, Any], valid: dict[str, Any] | None, losses: Any,
               veval: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(mtlab task table, the task's extras) from an original task section and its validation section."""
    keys: dict[str, str] = {}  # the original's data names -> mtlab data keys
    for lset in orig["linkedsets"].values():
        for item, sec in lset["sections"].items():
            key = sec.get("key")
            if key is None:
                continue
            if keys.get(item, key) != key:
                imp.refuse("trainer.cfg", f"[{tname}] {item}", "its linked sets give it different kinds of data")
            keys[item] = key
    extra = extra_feature_inputs(imp, tname, orig, keys)
    keys.update({item: item for item in extra})
    if len(set(keys.values())) != len(keys):
        imp.refuse("trainer.cfg", f"[{tname}] inputs/targets", "two of them are the same kind of data for mtlab "
                                                              f"({keys})")
    kind, options = imp.loss(tname, orig["loss_type"], losses)
    loss = imp.loss_spec(tname, kind, options, keys) or {"type": f"nabu:{kind}"}
    rename = {name: keys.get(name, name) for name in orig["inputs"]}
    nodes = [{**n, "inputs": [rename.get(i, i) for i in n["inputs"]]} for n in orig["nodes"]]
    linkedsets: dict[str, Any] = {}
    # the linked set's audio folder comes from its first input that is not a vector list (read by its own path)
    first = next((i for i in orig["inputs"] if keys.get(i) != "ivec"), None)
    for set_name, lset in orig["linkedsets"].items():
        spec: dict[str, Any] = {"weight": lset["weight"]}
        sec = lset["sections"].get(first, {}) if first else {}
        vector = next(((i, s) for i, s in lset["sections"].items() if s.get("key") == "ivec"), None)
        if "datafiles" in sec:
            spec["data"] = data_spec(sec["datafiles"])
            if vector is not None and "datafiles" in vector[1]:
                spec["data"]["ivec"] = {"list": vector[1]["datafiles"], **vector[1]["ivec"]}
            if "mvn" in sec:
                spec["data"]["mvn"] = sec["mvn"]
            if extra:  # the other inputs' audio lists, featurized as the mixture is
                spec["data"]["feature_inputs"] = {i: lset["sections"][i]["datafiles"] for i in extra}
            folders = {str(Path(s["datafiles"]).parent) for i, s in lset["sections"].items()
                       if "datafiles" in s and s.get("key") != "ivec" and i not in extra}
            if len(folders) > 1:
                imp.refuse("trainer.cfg", f"[{tname}] linked set {set_name!r}", "its inputs and targets come from "
                           f"different folders ({sorted(folders)}); mtlab reads a linked set from one folder")
            spectral = [s["spectral"] for s in lset["sections"].values() if "spectral" in s and s.get("key") != "ivec"]
            if any(x != spectral[0] for x in spectral):
                imp.refuse("trainer.cfg", f"[{tname}] linked set {set_name!r}", "its processors frame the audio "
                           "differently; mtlab computes a linked set's features and targets with one STFT")
            if spectral:
                # the original's window, framing and int16 scale, for mtlab's loader
                spec["data"]["spectral"] = dict(spectral[0])
            nrs = source_count(imp, tname, set_name, lset["sections"])
            if nrs != NUM_SOURCES:
                spec["data"]["num_sources"] = nrs
        linkedsets[set_name] = spec
    extras: dict[str, Any] = {"loss_type": orig["loss_type"],
                              "sections": {s: {k: v["section"] for k, v in ls["sections"].items()}
                                           for s, ls in orig["linkedsets"].items()}}
    if valid is not None:
        extras["validation"] = {"evaluator": veval.get("evaluator"),
                                "requested_utts": valid.get("requested_utts", int(veval.get("requested_utts", "0"))),
                                "batch_size": valid.get("batch_size", int(veval.get("batch_size", "0")))}
        vsets = valid["linkedsets"]
        for set_name, spec in linkedsets.items():
            vset = vsets.get(set_name) or (vsets.get("set0") if set_name == next(iter(linkedsets)) else None)
            sec = vset["sections"].get(first, {}) if vset and first else {}
            if "datafiles" in sec and "data" in spec:
                vdata = data_spec(sec["datafiles"])
                spec["valid"] = {k: v for k, v in vdata.items() if spec["data"].get(k) != v} or \
                    {"split": vdata["split"]}
                if extra:
                    spec["valid"]["feature_inputs"] = {i: vset["sections"][i]["datafiles"]  # type: ignore[index]
                                                       for i in extra}
                vnrs = source_count(imp, tname, set_name, vset["sections"])  # type: ignore[index]
                if vnrs != spec["data"].get("num_sources", NUM_SOURCES):
                    spec["valid"]["num_sources"] = vnrs
                train_vectors = spec["data"].get("ivec")
                vvector = next((s for s in vset["sections"].values() if s.get("key") == "ivec"), None) if vset \
                    else None
                if train_vectors is not None and vvector is not None and "datafiles" in vvector:
                    # normalized with the training list's mean and variance (the original's meanandvar_dir)
                    spec["valid"]["ivec"] = {"list": vvector["datafiles"], **vvector["ivec"],
                                             "stats_list": train_vectors["list"]}
    task = {"inputs": [keys.get(i, i) for i in orig["inputs"]], "targets": [keys.get(t, t) for t in orig["targets"]],
            "outputs": orig["outputs"], "nodes": nodes, "loss": loss, "linkedsets": linkedsets}
    if "trainset_frac" in orig:
        task["trainset_frac"] = orig["trainset_frac"]
    return task, extras


def extra_feature_inputs(imp: Importer, tname: str, orig: Mapping[str, Any], keys: Mapping[str, str]) -> list[str]:
    """The task's inputs that are features of other audio than the mixture: every ``features`` input after the
    one that reads the mixture (named ``features``, else the first). Each keeps its own name as its data key, and
    its linked set's ``data.feature_inputs`` gives its audio list; it must be normalized as the mixture is."""
    same = [i for i in orig["inputs"] if keys.get(i) == "features"]
    if len(same) < 2:
        return []
    main = "features" if "features" in same else same[0]
    extra = [i for i in same if i != main]
    from ..data import TARGET_KEYS

    for item in extra:
        if item in TARGET_KEYS or item == "features":
            imp.refuse("trainer.cfg", f"[{tname}] {item}", f"an input of features named as mtlab's data key {item!r}; "
                       "rename it in the task (inputs and the nodes reading it)")
        for _set_name, lset in orig["linkedsets"].items():
            sec, ref = lset["sections"].get(item, {}), lset["sections"].get(main, {})
            mvn = sec.get("mvn", "global")
            if mvn != ref.get("mvn", "global") or mvn == "global":
                imp.refuse("trainer.cfg", f"[{tname}] {item}", f"its processor's mvn_type ({mvn!r}) must be the one of "
                           f"{main!r} ({ref.get('mvn', 'global')!r}), and per utterance (local) or none: mtlab "
                           "computes no separate statistics for the other inputs' audio")
    return extra


def source_count(imp: Importer, tname: str, set_name: str, sections: Mapping[str, Mapping[str, Any]]) -> int:
    """The speakers per mixture of a linked set: the ``nrs`` its target processors agree on (2 without one)."""
    counts = sorted({s["nrs"] for s in sections.values() if "nrs" in s})
    if len(counts) > 1:
        imp.refuse("trainer.cfg", f"[{tname}] linked set {set_name!r}", f"its processors give different nrs ({counts}); "
                   "mtlab reads one set of sources s1 ... s<nrs> per linked set")
    return counts[0] if counts else NUM_SOURCES


def data_spec(datafiles: str) -> dict[str, str]:
    """mtlab's data spec for a re-rooted mixture list ``<root>/<split>/mix_<linkedset>.scp``."""
    path = Path(datafiles)
    stem = path.stem
    return {"root": str(path.parent.parent), "split": path.parent.name,
            "linkedset": stem[4:] if stem.startswith("mix_") else stem}


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


def size_models(imp: Importer, raw: Mapping[str, Mapping[str, str]], tasks: Mapping[str, Any], stages: int) -> dict[str, dict[str, Any]]:
    """mtlab model specs with their input sizes, found by running each task's graph on per-frame sizes."""
    sizes_in: dict[str, list[int | None]] = {}
    ranks_in: dict[str, list[int]] = {}  # per model: its inputs' axes (RANKS)
    for tname, task in tasks.items():
        first = next(iter(task["linkedsets"].values()), {}).get("data", {})
        feature_dim = first.get("spectral", {}).get("n_fft", 256) // 2 + 1
        known = {"features": feature_dim, **{k: feature_dim for k in first.get("feature_inputs", {})},
                 "usedbins": feature_dim, "binary_targets": feature_dim * first.get("num_sources", NUM_SOURCES)}
        if "ivec" in first:
            known["ivec"] = first["ivec"]["nrcol"] * first["ivec"]["nrs"]
        sizes: dict[str, int | None] = {k: known.get(k) for k in task["inputs"]}
        ranks = {k: 2 if k == "ivec" else 3 for k in task["inputs"]}
        for node in task["nodes"]:
            model = node["model"]
            if model not in raw:
                raise ConfigError(f"{imp.folder / 'trainer.cfg'}: [{tname}] node {node['name']!r} uses model "
                                  f"{model!r}, not in model.cfg's model_names ({', '.join(raw)})")
            dims = [sizes.get(i) for i in node["inputs"]]
            flags = ranks_in.setdefault(model, [ranks.get(i, 3) for i in node["inputs"]])
            previous = sizes_in.setdefault(model, dims)
            if previous != dims:
                imp.refuse("model.cfg", f"[{model}]", f"used with input sizes {previous} and {dims}")
            quiet = Importer(imp.folder, imp.data_root, strict=False)
            _, out = quiet.model_spec(model, raw[model], dims, stages, flags)
            for name in node.get("outputs", [node["name"]]):
                sizes[name] = out
                # a constant is per utterance, the CNN per bin, others keep their first input's axes (a Concat
                # repeats the others over the frames or bins of its first input)
                ranks[name] = OUTPUT_RANKS.get(raw[model].get("architecture", ""), flags[0] if flags else 3)
    models: dict[str, dict[str, Any]] = {}
    for name, conf in raw.items():
        if name not in sizes_in:
            continue  # declared but used by no training task (e.g. only by an evaluator)
        spec, _ = imp.model_spec(name, conf, sizes_in[name], stages, ranks_in[name])
        models[name] = {k: v for k, v in spec.items() if v is not None}  # unknown sizes (refused) left out
    return models


def plain_recipe(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe without its ``nabu`` extras: what ``mtlab.recipe`` reads today."""
    return {k: v for k, v in recipe.items() if k != "nabu"}
