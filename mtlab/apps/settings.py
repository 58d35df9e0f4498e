"""The keys a recipe may set, checked: ``[trainer]`` settings (``TRAINER_KEYS``, the original's names), the
keys of tasks, nodes, linked sets and data, the stages of a curriculum, and the original's INI ``trainer.cfg``.
Every mistake is a ``ConfigError`` naming the file and the key, with the closest valid key."""

from __future__ import annotations

import configparser
import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError
from ..core.precision import PRECISIONS
from ..training.schedule import STAGE_KEYS, check_stage

DEFAULT_ORIGIN = "<recipe dict>"


@dataclass(frozen=True)
class Key:
    """One setting: its kind, default, lower bound and a one-line meaning."""

    kind: str  # int, float, bool, str, names, floats, clip, tries (int or "none"), stages (list of tables)
    default: Any
    doc: str
    minimum: float | None = None
    strict: bool = False  # minimum excluded
    choices: tuple[str, ...] | None = None


TRAINER_KEYS: dict[str, Key] = {
    "tasks": Key("names", None, "tasks to train, in order (default: every [tasks.*] in file order)"),
    "num_epochs": Key("float", 1.0, "passes over the largest linked set's training data", 0, True),
    "num_steps": Key("int", 0, "mtlab: train exactly this many steps (0: derive from num_epochs)", 0),
    "initial_learning_rate": Key("float", 1e-3, "Adam learning rate at step 0", 0, True),
    "learning_rate_decay": Key("float", 1.0, "lr = initial_learning_rate x decay^(step / num_steps)", 0, True),
    "clip_grad_value": Key("clip", False, "clip gradients element-wise to +-value (false: no clipping)", 0, True),
    "clip_grad_norm": Key("clip", False, "mtlab: clip each task's global gradient norm to this (false: off)", 0, True),
    "clip_grad_percentile": Key("clip", False, "mtlab: AutoClip, each task's norm clipped to this percentile of its "
                                "norm history, e.g. 10 (false: off)", 0, True),
    "normalize_gradients": Key("bool", True, "divide accumulated gradients by the accumulated normalizer"),
    "batch_size": Key("int", 8, "utterances per minibatch", 1),
    "numbatches_to_aggregate": Key("int", 1, "minibatch rounds (every linked set once) per step", 1),
    "numbuckets": Key("int", 1, "length buckets for batching (1: plain shuffled batches)", 1),
    "valid_frequency": Key("int", 0, "validate every this many steps (0: never)", 0),
    "checkpoint_frequency": Key("int", 0, "mtlab: write latest.pt every this many steps (0: never); restarts resume from it", 0),
    "checkpoint_minutes": Key("float", 10.0, "mtlab: write latest.pt at the first step boundary this many minutes "
                              "after the last one (0: never), so a killed job loses minutes, not the run", 0),
    "valid_batches": Key("int", 0, "mtlab: minibatches per validation and linked set (0: all)", 0),
    "valid_adapt": Key("bool", False, "halve the learning rate after a worse validation"),
    "go_back": Key("bool", False, "return to the best validated state after a worse validation"),
    "num_tries": Key("tries", 3, "stop after this many worse validations (\"none\": never)", 1),
    "reset_tries": Key("bool", True, "a better validation zeroes the count of worse ones"),
    "best_model_final": Key("bool", False, "a validation stop restores the best validated model (the original: true)"),
    "validate_at_step_0": Key("bool", False, "validate the untrained model too (the original: true)"),
    "relative_improvement_threshold": Key("float", 0.0, "stop on a worse validation when the summed |relative "
                                          "improvement| of the last validations is under this (0: off; the original: "
                                          "0.004)", 0),
    "relative_improvement_after_step": Key("int", 1000, "the relative-improvement stop applies after this step", 0),
    "relative_improvement_window": Key("int", 0, "validations the relative-improvement stop sums (0: num_tries)", 0),
    "per_task_validation": Key("bool", False, "a best value and tries count per task; any task running out stops "
                                              "(the original's under acc_steps)"),
    "go_back_data": Key("str", "continue", "after go_back the data streams continue (or rewind with the state)",
                        choices=("continue", "rewind")),
    "stages": Key("stages", None, "the segment_lengths curriculum: one table per stage, segment_length "
                                  "(frames or \"full\") plus the stage's settings"),
    "init_file": Key("str", None, "initial model weights: an mtlab checkpoint or a {model: state_dict} file"),
    "task_weights": Key("floats", None, "weight of each task in the update, in task order"),
    "acc_steps": Key("bool", False, "one Adam per task (lr x task weight), applied one after another"),
    "normalize_weights_acc_steps": Key("bool", False, "acc_steps: divide by the summed weights of a parameter's tasks"),
    "optimizer": Key("str", "adam", "mtlab: adam (torch's Adam) or adam_tf1 (the original's tf.train.AdamOptimizer: "
                     "epsilon on the uncorrected sqrt(v); what imported recipes use)", choices=("adam", "adam_tf1")),
    "linkedset_weights": Key("str", "absolute", "mtlab: linked-set weights as given (absolute) or divided by the "
                             "task's first set's weight (relative, the original's; what imported recipes use)",
                             choices=("absolute", "relative")),
    "seed": Key("int", 0, "mtlab: seeds model initialization, shuffling and noise", 0),
    "nonfinite": Key("str", "raise", "mtlab: a NaN/inf step raises, or is skipped", choices=("raise", "skip")),
    "device": Key("str", "auto", "mtlab: auto, cpu, cuda or cuda:N"),
    "log": Key("names", None, "mtlab: loggers of mtlab train/demo/resume, e.g. [\"tensorboard\", \"mlflow\"] "
                "(csv, tensorboard, mlflow, trackio; files in the experiment folder; --log overrides)"),
    "precision": Key("str", "32", "mtlab: 32, bf16-mixed (autocast) or 16-mixed (autocast + loss scaling); "
                     "weights, gradients and optimizer stay float32", choices=PRECISIONS),
    "compile": Key("bool", False, "mtlab: torch.compile each model (dynamic shapes: no recompile per length)"),
    "combine": Key("str", "sum", "mtlab: how tasks' gradients become one direction: sum, an aggregator (upgrad, "
                   "mgda, pcgrad, ...), a loss weighting (uncertainty, dwa, famo, random_loss) or both (dwa+upgrad)"),
}
TOP_KEYS = ("name", "description", "trainer_cfg", "trainer", "models", "tasks", "stats", "fingerprints", "source",
            "nabu")
TASK_KEYS = ("inputs", "targets", "outputs", "nodes", "loss", "linkedsets", "weight", "batch_size", "numbuckets",
             "trainset_frac")
NODE_KEYS = ("name", "model", "inputs", "outputs")
LINKEDSET_KEYS = ("weight", "data", "valid")
DATA_KEYS = ("corpus", "root", "split", "linkedset", "spectral", "ivec", "mvn", "num_sources", "stream", "num_workers",
             "on_bad_data", "stats_utterances", "dynamic_mix", "feature_inputs", "layout")
CORPORA = ("samples",)


# ---------------------------------------------------------------------------------- messages
def _hint(key: str, valid: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key(origin: str, where: str, key: str, valid: list[str] | tuple[str, ...], what: str = "key") -> ConfigError:
    """The error for an unknown ``key`` in ``where``: the closest valid one, then every valid one."""
    return ConfigError(f"{origin}: unknown {what} {key!r} in {where}{_hint(str(key), valid)}; valid: "
                       f"{', '.join(valid)}")


def as_table(value: Any, origin: str, where: str) -> dict[str, Any]:
    """``value`` as a TOML table (a dict), or an error naming ``where``."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{origin}: {where} = {value!r} is not allowed: must be a table ({type(value).__name__} "
                          f"given); write it as {where if where.startswith('[') else '[' + where + ']'} with its keys "
                          "below, or inline as { key = value, ... }")
    return dict(value)


def as_names(value: Any, origin: str, where: str) -> list[str]:
    """``value`` as a list of names (a string is split on spaces), or an error naming ``where``."""
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{origin}: {where} = {value!r} is not allowed: must be a list of names; write e.g. "
                          f"{where.split()[-1]} = [\"features\"]")
    return list(value)


def toml_value(value: Any) -> str:
    """``value`` as TOML writes it (``true``, ``"auto"``, ``[1.0, 0.5]``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


EXAMPLES = {"names": ["a", "b"], "floats": [1.0, 0.5], "stages": None, "tries": 3}


def fix(key: str, spec: Key) -> str:
    """The fix an error about ``key`` ends with: an example of an allowed value, in the recipe's syntax."""
    example = spec.default if spec.default not in (None, False) or spec.kind == "bool" else EXAMPLES.get(spec.kind)
    if spec.choices:
        example = spec.default if spec.default in spec.choices else spec.choices[0]
    if spec.kind == "stages":
        return f"; write e.g. {key} = [{{segment_length = 100}}, {{segment_length = \"full\"}}]"
    if example is None:
        return ""
    return f"; write e.g. {key} = {toml_value(example)}"


DEVICE = re.compile(r"^(auto|cpu|mps|(cuda|xpu)(:\d+)?)$")


def check_value(key: str, spec: Key, value: Any, origin: str, where: str) -> Any:
    """``value`` checked against ``spec`` (already typed, as TOML gives it); ConfigError otherwise, naming the
    file, the key, what is allowed and an example of it."""
    name = f"{where} {key}"
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{origin}: {name} = {value!r} is not allowed: must be true or false ({spec.doc})"
                              f"{fix(key, spec)}")
        return value
    if spec.kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{origin}: {name} = {value!r} is not allowed: must be a string ({spec.doc})"
                              f"{fix(key, spec)}")
        if spec.choices and value not in spec.choices:
            raise ConfigError(f"{origin}: {name} = {value!r} is not allowed{_hint(value, spec.choices)}; valid: "
                              f"{', '.join(spec.choices)}{fix(key, spec)}")
        if key == "device" and not DEVICE.match(value):
            raise ConfigError(f"{origin}: {name} = {value!r} is not a device: valid: auto (a GPU if there is one), "
                              "cpu, cuda, cuda:N, mps; write e.g. device = \"cuda\" for the first GPU")
        return value
    if spec.kind == "names":
        names = as_names(value, origin, name)
        if not names:
            raise ConfigError(f"{origin}: {name} = [] is not allowed: give at least one name ({spec.doc}), or leave "
                              f"{key} out{fix(key, spec)}")
        return names
    if spec.kind == "tries" and value == "none":
        return None
    if spec.kind == "stages":
        return _stages(value, origin, name)
    if spec.kind == "floats":
        if (not isinstance(value, list) or not value
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise ConfigError(f"{origin}: {name} = {value!r} is not allowed: must be a list of numbers ({spec.doc})"
                              f"{fix(key, spec)}")
        for v in value:
            if not math.isfinite(v) or v < 0:
                raise ConfigError(f"{origin}: {name} = {value!r}: every weight must be a finite number >= 0")
        return [float(v) for v in value]
    if spec.kind == "clip" and value is False:
        return False
    if spec.kind in ("int", "tries"):
        ok = isinstance(value, int) and not isinstance(value, bool)
        kind = "an integer" if spec.kind == "int" else "an integer (or \"none\")"
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        kind = "a number" if spec.kind == "float" else "a number (or false for no clipping)"
    bound = "" if spec.minimum is None else f" {'>' if spec.strict else '>='} {spec.minimum:g}"
    if ok and spec.minimum is not None:
        ok = value > spec.minimum if spec.strict else value >= spec.minimum
    if not ok:
        raise ConfigError(f"{origin}: {name} = {value!r} is not allowed: must be {kind}{bound} ({spec.doc})"
                          f"{fix(key, spec)}")
    return float(value) if spec.kind in ("float", "clip") else value


def _stages(value: Any, origin: str, name: str) -> list[dict[str, Any]]:
    """The curriculum: a list of stage tables, each setting checked as the [trainer] key of that name."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{origin}: {name} must be a list of stage tables, e.g. [{{segment_length = 100, "
                          f"batch_size = 40}}, {{segment_length = \"full\", batch_size = 8}}], got {value!r}")
    out = []
    for i, stage in enumerate(value):
        where = f"{name}[{i}]"
        stage = as_table(stage, origin, where)
        for key in stage:
            if key not in STAGE_KEYS:
                raise unknown_key(origin, where, key, STAGE_KEYS)
        checked = {k: check_value(k, TRAINER_KEYS[k], v, origin, where) for k, v in stage.items() if k != "segment_length"}
        if checked.get("num_tries", 0) is None:
            checked["num_tries"] = "none"  # a plain TOML/JSON value; the schedule reads it as None
        checked["segment_length"] = stage.get("segment_length")
        check_stage(checked, f"{origin}: {where}")  # segment_length
        out.append(checked)
    return out


# ---------------------------------------------------------------------------------- INI trainer.cfg
def _from_string(key: str, spec: Key, text: str, origin: str) -> Any:
    text = text.strip()
    where = "[trainer]"
    try:
        if spec.kind == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError
            return check_value(key, spec, text.lower() == "true", origin, where)
        if spec.kind == "tries" and text.lower() == "none":
            return None
        if spec.kind == "stages":
            raise ConfigError(f"{origin}: [trainer] {key}: write the stages in the TOML recipe "
                              "(stages = [{segment_length = 100, ...}, ...]) or import the original recipe folder")
        if spec.kind in ("int", "tries"):
            return check_value(key, spec, int(text), origin, where)
        if spec.kind in ("float",):
            return check_value(key, spec, float(text), origin, where)
        if spec.kind == "clip":
            if text.lower() in ("none", "false", ""):
                return False
            return check_value(key, spec, float(text), origin, where)
        if spec.kind == "floats":
            return check_value(key, spec, [float(v) for v in text.split()], origin, where)
        if spec.kind == "names":
            return check_value(key, spec, text.split(), origin, where)
        return check_value(key, spec, text, origin, where)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        expect = {"bool": "'True' or 'False'", "int": "an integer", "float": "a number", "clip": "a number or None",
                  "floats": "space-separated numbers"}.get(spec.kind, "a value")
        raise ConfigError(f"{origin}: [trainer] {key} = {text!r} must be {expect} ({spec.doc})") from None


def load_trainer_cfg(path: str | Path) -> dict[str, Any]:
    """The ``[trainer]`` section of an INI ``trainer.cfg`` as typed recipe settings: mtlab's keys, one value
    each, or the original's file (``trainer = multi_task``, ``segment_lengths``, per-stage values), read as
    ``mtlab.nabu`` imports it (``stages`` and the original's stopping rules)."""
    path = Path(path)
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep key case as written (configparser's idiom)
    try:
        read = parser.read(path)
    except configparser.Error as exc:
        raise ConfigError(f"{path}: not a valid INI file ({exc.message if hasattr(exc, 'message') else exc})") from None
    if not read:
        raise ConfigError(f"{path}: trainer.cfg not found; give a path relative to the recipe file")
    if not parser.has_section("trainer"):
        raise ConfigError(f"{path}: no [trainer] section; sections: {parser.sections() or 'none'}")
    conf = dict(parser.items("trainer"))
    if _is_original(conf):
        # the original's own file (trainer = multi_task, segment_lengths, one value per stage): read as the
        # recipe importer reads it, so both give the same stages and stopping rules
        from ..nabu.importer import Importer

        plain, _, _ = Importer(path.parent, "data", strict=True).trainer(conf)
        return plain
    out: dict[str, Any] = {}
    for key, text in conf.items():
        if key not in TRAINER_KEYS:
            raise unknown_key(str(path), "[trainer]", key, list(TRAINER_KEYS))
        out[key] = _from_string(key, TRAINER_KEYS[key], text, str(path))
    return out


def _is_original(conf: Mapping[str, str]) -> bool:
    """Whether a ``[trainer]`` section is the original's: its ``trainer`` or ``segment_lengths`` key, or a
    per-stage list where mtlab's INI keys take one value."""
    if "trainer" in conf or "segment_lengths" in conf:
        return True
    single = ("int", "float", "bool", "clip", "tries")
    return any(key in TRAINER_KEYS and TRAINER_KEYS[key].kind in single and len(text.split()) > 1
               for key, text in conf.items())



def trainer_settings(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``TRAINER_KEYS`` setting of ``recipe``, checked, with defaults filled in."""
    origin = str(recipe.get("source", DEFAULT_ORIGIN))
    given = as_table(recipe.get("trainer", {}), origin, "[trainer]")
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key not in TRAINER_KEYS:
            raise unknown_key(origin, "[trainer]", key, list(TRAINER_KEYS))
        out[key] = check_value(key, TRAINER_KEYS[key], value, origin, "[trainer]")
    for key, spec in TRAINER_KEYS.items():
        out.setdefault(key, spec.default)
    if out["normalize_weights_acc_steps"] and not out["acc_steps"]:
        raise ConfigError(f"{origin}: [trainer] normalize_weights_acc_steps = true needs acc_steps = true")
    if out["log"] is not None:
        from ..training.loggers import NAMES

        for name in out["log"]:
            if name.lower() not in NAMES:
                raise ConfigError(f"{origin}: [trainer] log = {out['log']!r}: unknown logger {name!r}"
                                  f"{_hint(name.lower(), NAMES)}; choose from {', '.join(NAMES)}")
    return out
