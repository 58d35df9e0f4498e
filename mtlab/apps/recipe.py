"""Recipes: one TOML file that describes models, tasks and trainer settings.

Examples:
    >>> # models, tasks, data -> Experiment(trainer, schedule, recipe)
    >>> exp = from_recipe("recipes/demo.toml")  # doctest: +SKIP
    >>> exp = load("exp/demo/final.pt")          # rebuilt from the recipe stored in the checkpoint  # doctest: +SKIP

A recipe has ``[trainer]`` (the original's ``trainer.cfg`` key names, see ``TRAINER_KEYS``; a
``trainer_cfg = "trainer.cfg"`` top-level key reads the original INI file first), ``[models.NAME]``
(``type`` from ``mtlab.models.MODELS`` plus its settings) and ``[tasks.NAME]`` (nodes, inputs, targets,
outputs, ``loss = {type = ..., ...}`` from ``mtlab.losses.LOSSES`` and ``[tasks.NAME.linkedsets.SET]``
with ``weight``, ``data`` and ``valid``). Every mistake is a ``ConfigError`` naming the file and the key.

Feature statistics come from each linked set's training split; they are recorded in the recipe
(``stats``) so a checkpoint, which carries the recipe, always resumes with the same normalization.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..base.errors import ConfigError
from ..tasks.graph import Node
from ..base.report import say
from ..tasks.task import LinkedSet, Task
from ..training.distributed import attach_if_distributed
from ..training.checkpoint import save_checkpoint
from ..training.loop import run
from ..training.schedule import Schedule
from ..core.trainer import Trainer
from .settings import (CORPORA, DATA_KEYS, DEFAULT_ORIGIN, LINKEDSET_KEYS, NODE_KEYS, TASK_KEYS, TOP_KEYS,
                       TRAINER_KEYS, Key, as_names, as_table, unknown_key, check_value, load_trainer_cfg,
                       toml_value, trainer_settings)

# ---------------------------------------------------------------------------------- parsing and checking
def load_recipe(path: str | Path, data_root: str | Path | None = None) -> dict[str, Any]:
    """Parse and check a TOML recipe; returns the self-contained recipe dict (INI merged, paths absolute).
    An original Nabu-MSSS recipe folder (with trainer.cfg) is imported (``mtlab.nabu.import_nabu``), its
    data paths re-rooted under ``data_root`` (default: ``data`` in the current folder)."""
    path = Path(path)
    if path.is_dir() and (path / "trainer.cfg").is_file():
        from ..nabu import import_nabu

        return resolve_recipe(import_nabu(path, data_root if data_root is not None else "data"), origin=str(path))
    if not path.is_file():
        raise ConfigError(f"{path}: recipe file not found")
    if path.suffix in (".cfg", ".ini"):
        raise ConfigError(f"{path}: a trainer.cfg holds only the [trainer] settings; write a TOML recipe with "
                          f"[models] and [tasks] and put trainer_cfg = \"{path.name}\" at its top (see recipes/demo.toml)")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file; a recipe is a UTF-8 TOML file") from None
    trainer = raw.get("trainer")
    if isinstance(trainer, dict) and trainer.get("num_steps") and "num_epochs" in trainer:  # an INI's may be overridden
        raise ConfigError(f"{path}: [trainer] has both num_steps = {trainer['num_steps']!r} and num_epochs = "
                          f"{trainer['num_epochs']!r}; num_steps would win silently: keep one of them")
    return resolve_recipe(raw, origin=str(path), base=path.parent)


def resolve_recipe(raw: Mapping[str, Any], origin: str = DEFAULT_ORIGIN, base: Path | None = None) -> dict[str, Any]:
    """Check a recipe dict and make it self-contained: the INI ``trainer_cfg`` merged into ``trainer``
    (the TOML table wins) and data ``root`` paths absolute. Raises ConfigError naming the key."""
    recipe = copy.deepcopy(dict(raw))
    origin = str(recipe.get("source", origin))
    base = base if base is not None else Path.cwd()
    for key in recipe:
        if key not in TOP_KEYS:
            raise unknown_key(origin, "the recipe's top level", key, TOP_KEYS)
    trainer = as_table(recipe.get("trainer", {}), origin, "[trainer]")
    if "trainer_cfg" in recipe:
        cfg_path = base / str(recipe.pop("trainer_cfg"))
        trainer = {**load_trainer_cfg(cfg_path), **trainer}
    if isinstance(trainer.get("init_file"), str) and trainer["init_file"]:
        trainer["init_file"] = str((base / trainer["init_file"]).resolve())  # relative to the recipe file
    recipe["trainer"] = trainer
    recipe["source"] = origin
    settings = trainer_settings(recipe)
    models = as_table(recipe.get("models"), origin, "[models]") if "models" in recipe else {}
    if not models:
        raise ConfigError(f"{origin}: no [models.NAME] table; add at least one model, e.g. [models.enc] type = \"BLSTM\"")
    for name, spec in models.items():
        _model_spec(name, spec, origin)
    tasks = as_table(recipe.get("tasks"), origin, "[tasks]") if "tasks" in recipe else {}
    if not tasks:
        raise ConfigError(f"{origin}: no [tasks.NAME] table; add at least one task")
    for name in settings["tasks"] or []:
        if name not in tasks:
            raise unknown_key(origin, "[trainer] tasks", name, list(tasks), what="task")
    recipe["tasks"] = tasks = {name: _check_task(name, as_table(spec, origin, f"[tasks.{name}]"), models, origin, base)
                               for name, spec in tasks.items()}
    if settings["task_weights"] is not None:
        chosen = settings["tasks"] or list(tasks)
        if len(settings["task_weights"]) != len(chosen):
            raise ConfigError(f"{origin}: [trainer] task_weights has {len(settings['task_weights'])} values for "
                              f"{len(chosen)} tasks {chosen}; give one weight per task")
        both = [t for t in chosen if "weight" in tasks[t]]
        if both:
            raise ConfigError(f"{origin}: task weight given twice, in [trainer] task_weights and [tasks.{both[0]}] "
                              "weight; keep one of them")
    for key in ("stats", "fingerprints"):  # written by mtlab when a run starts
        if key in recipe:
            as_table(recipe[key], origin, key)
    return recipe


def _model_spec(name: str, spec: Any, origin: str) -> tuple[str, dict[str, Any]]:
    from ..models import MODELS

    spec = as_table(spec, origin, f"[models.{name}]")
    if "." in name:
        raise ConfigError(f"{origin}: model name {name!r} contains '.'; use letters, digits and '_'")
    kind = spec.pop("type", None)
    if not isinstance(kind, str):
        raise ConfigError(f"{origin}: [models.{name}] needs type = \"...\"; valid types: {', '.join(MODELS)}")
    if kind not in MODELS:
        raise unknown_key(origin, f"[models.{name}] type", kind, list(MODELS), what="model type")
    params = inspect.signature(MODELS[kind]).parameters.values()
    where = f"[models.{name}]"
    if not any(p.kind is p.VAR_KEYWORD for p in params):  # a typo gets the key's suggestion, as elsewhere
        valid = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key in spec:
            if key not in valid:
                raise unknown_key(origin, f"{where} (type {kind})", key, valid, what="setting")
        missing = [p.name for p in params if p.default is p.empty and p.name not in spec
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing:
            raise ConfigError(f"{origin}: {where} (type {kind}) needs {', '.join(missing)}; write e.g. "
                              f"{missing[0]} = 64 in {where}")
    for p in params:
        if p.name in spec:
            _check_model_setting(origin, where, kind, p, spec[p.name])
    return kind, spec


def _check_model_setting(origin: str, where: str, kind: str, param: inspect.Parameter, value: Any) -> None:
    """A model's setting against its constructor's annotation: int sizes >= 1 (>= 0 where the default is 0),
    finite numbers (dropout and noise >= 0), booleans, strings and lists of them."""
    hint = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
    kinds = [k.strip() for k in hint.split("|") if k.strip() != "None"]
    least = 0 if param.default == 0 else 1

    def fits(k: str, v: Any) -> bool:
        if k == "int":
            return isinstance(v, int) and not isinstance(v, bool) and v >= least
        if k == "float":
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            return ok and (v >= 0 or not any(w in param.name for w in ("dropout", "noise")))
        if k == "bool":
            return isinstance(v, bool)
        if k == "str":
            return isinstance(v, str) and bool(v)
        if k.startswith("list[") and k.endswith("]"):
            return isinstance(v, list) and bool(v) and all(fits(k[5:-1], x) for x in v)
        return True  # not checked here: the constructor's own checks

    if param.annotation is param.empty or any(fits(k, value) for k in kinds):
        return
    allowed = {"int": f"an integer >= {least}", "float": "a number" + (" >= 0" if any(
        w in param.name for w in ("dropout", "noise")) else ""), "bool": "true or false", "str": "a non-empty string"}
    said = " or ".join(allowed.get(k, f"a non-empty list ({k})") for k in kinds)
    example = param.default if param.default is not param.empty and param.default is not None else (
        {"int": 64, "float": 0.1, "bool": True, "str": "relu"}.get(kinds[0], [64]))
    raise ConfigError(f"{origin}: {where} {param.name} = {value!r} is not allowed for type {kind}: must be {said}; "
                      f"write e.g. {param.name} = {toml_value(example)}")


def _check_task(name: str, spec: dict[str, Any], models: Mapping[str, Any], origin: str, base: Path) -> dict[str, Any]:
    from ..data import TARGET_KEYS
    from ..losses import LOSSES

    where = f"[tasks.{name}]"
    for key in spec:
        if key not in TASK_KEYS:
            raise unknown_key(origin, where, key, TASK_KEYS)
    for key in ("inputs", "targets", "outputs", "nodes", "loss", "linkedsets"):
        if key not in spec:
            raise ConfigError(f"{origin}: {where} needs {key!r}; a task has {', '.join(TASK_KEYS[:6])}")
    example_keys: tuple[str, ...] = ("features", *TARGET_KEYS)
    if isinstance(spec.get("linkedsets"), Mapping):  # more inputs featurized from audio lists of their own
        example_keys += tuple(dict.fromkeys(
            k for s in spec["linkedsets"].values() if isinstance(s, Mapping) and isinstance(s.get("data"), Mapping)
            and isinstance(s["data"].get("feature_inputs"), Mapping) for k in s["data"]["feature_inputs"]))
    for key in ("inputs", "targets", "outputs"):
        spec[key] = as_names(spec[key], origin, f"{where} {key}")
        if not spec[key] and key != "targets":  # a loss of the outputs alone (a verification task) has none
            raise ConfigError(f"{origin}: {where} {key} = [] is not allowed: give at least one name; write e.g. "
                              f"{key} = [\"{'features' if key == 'inputs' else 'logits' if key == 'outputs' else 'spk'}\"]")
        for item in spec[key] if key != "outputs" else ():
            if item not in example_keys:
                raise unknown_key(origin, f"{where} {key}", item, example_keys, what="data key")
    nodes = spec["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise ConfigError(f"{origin}: {where} nodes = {nodes!r} is not allowed: must be a non-empty list of tables; "
                          "write e.g. nodes = [{ name = \"h\", model = \"enc\", inputs = [\"features\"] }]")
    for i, node in enumerate(nodes):
        node = as_table(node, origin, f"{where} nodes[{i}]")
        for key in node:
            if key not in NODE_KEYS:
                raise unknown_key(origin, f"{where} nodes[{i}]", key, NODE_KEYS)
        model = node.get("model")
        if not isinstance(node.get("name"), str) or not node["name"] or not isinstance(model, str) or "inputs" not in node:
            raise ConfigError(f"{origin}: {where} nodes[{i}] = {node!r} needs name, model and inputs; write e.g. "
                              "{ name = \"h\", model = \"enc\", inputs = [\"features\"] }")
        node["inputs"] = as_names(node["inputs"], origin, f"{where} nodes[{i}] inputs")
        if "outputs" in node:
            node["outputs"] = as_names(node["outputs"], origin, f"{where} nodes[{i}] outputs")
        nodes[i] = node
        if model not in models:
            raise unknown_key(origin, f"{where} nodes[{i}] (node {node['name']!r}) model", model, list(models),
                           what="model")
    loss = as_table(spec["loss"], origin, f"{where} loss")
    if not isinstance(loss.get("type"), str):
        raise ConfigError(f"{origin}: {where} loss needs type = \"...\"; valid: {', '.join(LOSSES)}")
    if loss["type"].lower() not in LOSSES:
        raise unknown_key(origin, f"{where} loss type", loss["type"], list(LOSSES), what="loss type")
    for key in ("weight",):
        if key in spec:
            check_value(key, Key("float", 1.0, "task weight in the update", 0), spec[key], origin, where)
    for key in ("batch_size", "numbuckets"):
        if key in spec:
            check_value(key, TRAINER_KEYS[key], spec[key], origin, where)
    if "trainset_frac" in spec:
        frac = spec["trainset_frac"]
        if not isinstance(frac, (int, float)) or isinstance(frac, bool) or not 0 < frac <= 1:
            raise ConfigError(f"{origin}: {where} trainset_frac = {frac!r} must be a fraction in (0, 1] (the first "
                              "int(n x trainset_frac) training utterances of each linked set are used)")
    sets = as_table(spec["linkedsets"], origin, f"{where} linkedsets")
    if not sets:
        raise ConfigError(f"{origin}: {where} linkedsets = {{}} is not allowed: a task needs at least one linked set; "
                          f"write e.g. [tasks.{name}.linkedsets.clean] with data = {{ root = \"path/to/corpus\" }}")
    for sname, sspec in sets.items():
        swhere = f"[tasks.{name}.linkedsets.{sname}]"
        sspec = as_table(sspec, origin, swhere)
        for key in sspec:
            if key not in LINKEDSET_KEYS:
                raise unknown_key(origin, swhere, key, LINKEDSET_KEYS)
        if "weight" in sspec:
            check_value("weight", Key("float", 1.0, "linked-set weight", 0), sspec["weight"], origin, swhere)
        if "data" not in sspec:
            raise ConfigError(f"{origin}: {swhere} needs data = {{ corpus = \"samples\", split = \"train\", "
                              f"linkedset = \"{sname}\" }}")
        data = _check_data(sspec["data"], origin, f"{swhere} data", base)
        sspec["data"] = data
        if sspec.get("valid", False) is not False:
            # validation reads the corpus's own mixtures unless its table asks for dynamic mixing itself
            inherited = {k: v for k, v in data.items() if k != "dynamic_mix"}
            sspec["valid"] = _check_data({**inherited, **as_table(sspec["valid"], origin, f"{swhere} valid")}, origin,
                                         f"{swhere} valid", base)
        uses = [k for k in ("inputs", "targets") if "ivec" in spec[k]]
        if uses and "ivec" not in data:
            raise ConfigError(f"{origin}: {swhere} data needs ivec = {{ list = \"path/to/vector list\", nrcol = <size> }}:"
                              f" the task's {uses[0]} have 'ivec'")
        sets[sname] = sspec
    spec["linkedsets"] = sets
    return spec


def _check_data(spec: Any, origin: str, where: str, base: Path) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{origin}: {where} = {spec!r} is not allowed: must be a table naming the corpus (a folder "
                          "of <split>/mix_<linkedset>.scp lists, e.g. from `mtlab prepare`); write e.g. data = "
                          "{ root = \"path/to/corpus\", split = \"train\", linkedset = \"clean\" }")
    spec = as_table(spec, origin, where)
    for key in spec:
        if key not in DATA_KEYS:
            raise unknown_key(origin, where, key, DATA_KEYS)
    for key, value in spec.items():
        if key == "spectral":  # the STFT settings (mtlab.data.features.Spectral), e.g. the original's
            from ..data.errors import DataError
            from ..data.features import Spectral

            try:
                Spectral(**as_table(value, origin, f"{where} spectral"))
            except (TypeError, DataError) as exc:
                fields = [p for p in inspect.signature(Spectral).parameters]
                raise ConfigError(f"{origin}: {where} spectral: {exc}; valid: {', '.join(fields)}") from None
        elif key == "ivec":  # the per-utterance vectors (mtlab.data.vectors.VectorList)
            from ..data.errors import DataError
            from ..data.vectors import VectorList

            try:
                vectors = VectorList.from_dict(as_table(value, origin, f"{where} ivec"), origin=f"{where} ivec")
            except (TypeError, DataError) as exc:
                raise ConfigError(f"{origin}: {where} ivec: {exc}; write e.g. ivec = {{ list = \"path/to/vectors.scp\", "
                                  "nrcol = 100 }") from None
            paths = {k: str((base / p).resolve()) for k in ("list", "stats_list") if (p := getattr(vectors, k))}
            spec[key] = {**vectors.to_dict(), **paths}
        elif key == "mvn":  # feature normalization: the training set's stats, per utterance, or none
            from ..data.features import MVN_TYPES

            if not isinstance(value, str) or value not in MVN_TYPES:
                raise unknown_key(origin, f"{where} mvn", value, MVN_TYPES, what="mvn")
        elif key == "num_sources":  # speakers per mixture: the lists s1.scp ... s<num_sources>.scp
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{origin}: {where} num_sources = {value!r} must be a positive integer (the "
                                  "speakers per mixture; the loader reads s1.scp ... s<num_sources>.scp)")
        elif key == "stream":  # read audio per batch, features on the device (False: everything in memory first)
            if not isinstance(value, bool):
                raise ConfigError(f"{origin}: {where} stream = {value!r} must be true (audio read per batch) or false "
                                  "(every example precomputed in memory)")
        elif key in ("num_workers", "stats_utterances"):  # data-loading processes; utterances the stats read
            low = 0 if key == "num_workers" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{origin}: {where} {key} = {value!r} must be an integer >= {low}")
        elif key == "dynamic_mix":  # a new mixture of the split's sources per example and epoch
            from ..data.dynamic import MixSettings
            from ..data.errors import DataError

            try:
                settings = MixSettings.from_dict(value, base)
            except DataError as exc:
                raise ConfigError(f"{origin}: {where} {exc}") from None
            spec[key] = {"gain_db": list(settings.gain_db), "noise_snr_db": list(settings.noise_snr_db),
                         "seed": settings.seed, **({"noise": settings.noise} if settings.noise else {})}
        elif key == "feature_inputs":  # more data keys: features of other audio lists, as the mixture's
            table = as_table(value, origin, f"{where} feature_inputs")
            for name, path in table.items():
                if not isinstance(path, str) or not path:
                    raise ConfigError(f"{origin}: {where} feature_inputs {name} must be the path of an audio list, "
                                      f"got {path!r}")
            spec[key] = {name: str((base / path).resolve()) for name, path in table.items()}
        elif key == "layout":  # root is a corpus tree (wsj0-2mix, wham, librimix) read in place, no list files
            from ..data.layouts import ALIASES, LAYOUTS

            if not isinstance(value, str) or ALIASES.get(value.lower(), value.lower()) not in LAYOUTS:
                raise unknown_key(origin, f"{where} layout", str(value), tuple(LAYOUTS), what="layout")
        elif key == "on_bad_data":  # a bad audio file mid-epoch: stop with its name, or skip and record it
            from ..data.streamed import BAD_DATA

            if not isinstance(value, str) or value not in BAD_DATA:
                raise unknown_key(origin, f"{where} on_bad_data", value, BAD_DATA, what="policy")
        elif not isinstance(value, str) or not value:
            raise ConfigError(f"{origin}: {where} {key} must be a non-empty string, got {value!r}")
    if ("corpus" in spec) == ("root" in spec):
        raise ConfigError(f"{origin}: {where} needs exactly one of corpus = \"samples\" or root = \"path/to/corpus\"")
    if "corpus" in spec and spec["corpus"] not in CORPORA:
        raise unknown_key(origin, f"{where} corpus", spec["corpus"], CORPORA, what="corpus")
    if "layout" in spec and ("root" not in spec or spec.get("stream") is False):
        raise ConfigError(f"{origin}: {where} layout = {spec['layout']!r} reads the corpus tree at root = \"...\" in "
                          "place, streamed: give root and leave stream = true")
    if "dynamic_mix" in spec and spec.get("stream") is False:
        raise ConfigError(f"{origin}: {where} dynamic_mix needs stream = true (mixtures are made per batch)")
    if "root" in spec and "://" not in spec["root"]:  # a URL (shards on an object store) stays as it is
        spec["root"] = str((base / spec["root"]).resolve())
    spec.setdefault("split", "train")
    return spec


# ---------------------------------------------------------------------------------- data
Datasets = dict  # (root, split, linked set, targets, stats fingerprint) -> dataset; one per experiment


def _root(data: Mapping[str, Any]) -> Path | str:
    from ..data import data_samples_dir

    if "://" in data.get("root", ""):  # shards at a URL: Path would fold its "//"
        return data["root"]
    return Path(data["root"]) if "root" in data else data_samples_dir()


def stats_key(data: Mapping[str, Any], linkedset: str) -> str:
    """Name of the feature statistics a data spec uses: its corpus (or root) and linked set."""
    return f"{data.get('corpus', data.get('root'))}:{data.get('linkedset', linkedset)}"


def _dataset(data: Mapping[str, Any], linkedset: str, targets: tuple[str, ...], stats: Any, cache: Datasets) -> Any:
    from ..data import load_split
    from ..data.corpus import NUM_SOURCES

    from ..data.features import MTLAB, Spectral

    from ..data.vectors import VectorList

    fingerprint = hashlib.sha1(json.dumps(stats.to_dict()).encode()).hexdigest() if stats is not None else None
    spectral = Spectral(**data["spectral"]) if "spectral" in data else MTLAB
    ivec = VectorList(**data["ivec"]) if "ivec" in data else None
    if ivec is None:  # another task of the experiment reads vectors; this linked set has none to give
        targets = tuple(t for t in targets if t != "ivec")
    mvn = data.get("mvn", "global")
    num_sources = data.get("num_sources", NUM_SOURCES)
    # streamed unless told otherwise: audio read per batch, features on the trainer's device
    streamed: dict[str, Any] = {"stream": True, **{k: data[k] for k in ("stream", "on_bad_data", "stats_utterances", "dynamic_mix",
                                                        "layout") if k in data}}
    inputs = dict(data.get("feature_inputs", {}))
    key = (str(_root(data)), data["split"], data.get("linkedset", linkedset), targets, repr(spectral), repr(ivec),
           mvn, num_sources, repr(sorted(streamed.items())), repr(sorted(inputs.items())), fingerprint)
    if key not in cache:
        cache[key] = load_split(_root(data), split=data["split"], linkedset=data.get("linkedset", linkedset),
                                targets=targets, stats=stats, spectral=spectral, ivec=ivec, mvn=mvn,
                                num_sources=num_sources, feature_inputs=inputs or None, **streamed)
        if stats is None:  # remember it under the stats it computed, as later lookups ask for it that way
            computed = cache[key].stats
            cache[key[:-1] + (hashlib.sha1(json.dumps(computed.to_dict()).encode()).hexdigest(),)] = cache[key]
    return cache[key]


def _named_dataset(origin: str, where: str, data: Mapping[str, Any], linkedset: str, targets: tuple[str, ...],
                   stats: Any, cache: Datasets) -> Any:
    """``_dataset``, with a data error prefixed by the recipe file and the key that named the data."""
    from ..data.errors import DataError

    try:
        return _dataset(data, linkedset, targets, stats, cache)
    except DataError as exc:
        shown = {k: v for k, v in data.items() if k in ("corpus", "root", "split", "linkedset")}
        root = data.get("root", "")
        moved = (f"; if the corpus moved, write its new place as root in {origin}"
                 if root and "://" not in root and not Path(root).exists() else "")
        raise DataError(f"{origin}: {where} {shown}: {exc}{moved}") from None


def fingerprint(source: Any) -> dict[str, Any]:
    """What identifies a linked set's data without reading its audio: the number of examples and a hash of their
    names and lengths (frames). Stored in the recipe (``fingerprints``) when a run starts; data moved to another
    place must match it."""
    from ..tasks.sources import lengths_of

    names = [str(n) for n in getattr(source, "names", None) or []]
    lengths = lengths_of(source)
    digest = hashlib.sha1(json.dumps([names, lengths]).encode()).hexdigest()
    return {"examples": len(lengths), "sha1": digest, "names": names[:3], "frames": sum(lengths)}


def _same_data(recipe: dict[str, Any], key: str, source: Any, origin: str, where: str, data: Mapping[str, Any]) -> None:
    """Record ``source``'s fingerprint under ``key``, or check it against the one recorded when the run started."""
    from ..data.errors import DataError

    now = fingerprint(source)
    was = recipe.setdefault("fingerprints", {}).setdefault(key, now)
    if was.get("sha1") == now["sha1"]:
        return
    if was.get("examples") != now["examples"]:
        what = f"{now['examples']} examples, the run trained on {was.get('examples')}"
    elif was.get("names") != now["names"]:
        what = f"its first utterances are {now['names']}, the run's were {was.get('names')}"
    elif was.get("frames") != now["frames"]:
        what = f"{now['frames']} frames in all, the run's had {was.get('frames')} (other audio under the same names)"
    else:
        what = "the names or lengths of its utterances differ from those the run trained on"
    shown = {k: v for k, v in data.items() if k in ("corpus", "root", "split", "linkedset")}
    raise DataError(f"{origin}: {where} {shown} is not the data this experiment was trained on: {what}; point it at "
                    f"the corpus the run used (edit {origin}), or train a new experiment on these data")


# ---------------------------------------------------------------------------------- building
@dataclass
class Experiment:
    """What a recipe builds: the trainer, its schedule and the resolved recipe (with feature stats).

    Examples:
        >>> exp = mtlab.from_recipe("recipes/demo.toml")  # doctest: +SKIP
        >>> exp.trainer.step(); mtlab.run(exp, steps=10)  # doctest: +SKIP
    """

    trainer: Trainer
    schedule: Schedule
    recipe: dict[str, Any]
    datasets: Datasets = field(default_factory=dict, repr=False)

    def run(self, **kwargs: Any) -> Schedule:
        """``mtlab.run(self, **kwargs)``: train with the schedule (see ``mtlab.run``)."""
        return run(self, **kwargs)

    def save(self, path: str | Path) -> Path | None:
        """Checkpoint with the recipe and schedule inside (``mtlab.recipe.load`` rebuilds from it)."""
        return save_checkpoint(self.trainer, self.schedule, path, recipe=self.recipe)


def _checked_loss(origin: str, tname: str, spec: Mapping[str, Any]) -> Any:
    """The loss computer of ``[tasks.NAME]``, its ``target`` and ``output`` checked against the task's targets and
    outputs: a misspelt key is refused before any data are read, naming the recipe file and the task."""
    from ..losses import get_loss

    from ..losses import LOSSES

    loss = dict(spec["loss"])
    kind = loss.pop("type")
    try:
        loss_fn = get_loss(kind, **loss)
    except (ConfigError, TypeError, ValueError) as exc:
        params = [p for p in inspect.signature(LOSSES[kind.lower()]).parameters if p not in ("self", "args", "kwargs")]
        raise ConfigError(f"{origin}: [tasks.{tname}] loss: {exc}; valid settings of loss type {kind!r}: "
                          f"{', '.join(params)}; write e.g. loss = {{ type = \"{kind}\", output = \"logits\", "
                          "target = \"spk\" }") from None
    for attr, key in (("target", "targets"), ("output", "outputs")):
        name, names = getattr(loss_fn, attr, None), list(spec.get(key, []))
        if isinstance(name, str) and name not in names:
            raise ConfigError(f"{origin}: [tasks.{tname}] loss {attr} = {name!r} is not one of the task's {key} "
                              f"{names}; write {attr} = {names[0]!r} in the loss table (or add {name!r} to {key})"
                              if names else f"{origin}: [tasks.{tname}] has no {key} for its loss {attr} {name!r}; "
                              f"write e.g. {key} = [{name!r}]".replace("'", '"'))
    return loss_fn


def from_recipe(recipe: str | Path | Mapping[str, Any], datasets: Datasets | None = None,
                init_weights: bool = True, data_root: str | Path | None = None,
                threads: int | None = None) -> Experiment:
    """An :class:`Experiment` from a TOML recipe, an original ``trainer.cfg`` or a dict. ``datasets`` may be
    shared between experiments built from the same corpora (loaded once). ``init_weights=False`` skips the
    recipe's ``init_file`` (``load`` does: the checkpoint's weights replace them anyway). An original Nabu-MSSS
    recipe folder is imported with its data under ``data_root`` (see ``load_recipe``). ``threads`` sets torch's
    CPU threads (default: ``MTLAB_THREADS``, else the free CPUs unless the program set them; ``mtlab.base.threads``)."""
    from ..base.threads import apply_threads
    from ..data import FeatureStats, TARGET_KEYS

    apply_threads(threads)  # before the data work: statistics and features run on these threads too
    from ..models import build_model
    from ..tasks.sources import trainset_fraction

    cache: Datasets = datasets if datasets is not None else {}

    recipe = load_recipe(recipe, data_root) if isinstance(recipe, (str, Path)) else resolve_recipe(recipe)
    origin = recipe["source"]
    settings = trainer_settings(recipe)
    torch.manual_seed(settings["seed"])  # the same recipe initializes the same weights
    models = {}
    for name, spec in recipe["models"].items():
        kind, kwargs = _model_spec(name, spec, origin)
        try:
            models[name] = build_model(kind, **kwargs)
        except (ConfigError, TypeError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"{origin}: [models.{name}] (type {kind}) {kwargs}: {exc}; fix the setting it "
                              "names") from None
    from ..separation.checks import check_mask_activation

    check_mask_activation(models, recipe["tasks"], origin)  # a MaskHead's masks squashed again by the loss
    chosen = settings["tasks"] or list(recipe["tasks"])
    weights = dict(zip(chosen, settings["task_weights"])) if settings["task_weights"] is not None else {}
    targets = tuple(sorted({k for t in chosen for k in (*recipe["tasks"][t]["targets"], *recipe["tasks"][t]["inputs"])}
                           & set(TARGET_KEYS)))
    recipe.setdefault("stats", {})
    losses = {tname: _checked_loss(origin, tname, recipe["tasks"][tname]) for tname in chosen}  # before any data
    tasks = []
    for tname in chosen:
        spec = recipe["tasks"][tname]
        sets = {}
        for sname, sspec in spec["linkedsets"].items():
            key = stats_key(sspec["data"], sname)
            stats = FeatureStats.from_dict(recipe["stats"][key], origin=f"{origin}: stats {key!r}") \
                if key in recipe["stats"] else None
            where = f"[tasks.{tname}.linkedsets.{sname}]"
            train = _named_dataset(origin, f"{where} data", sspec["data"], sname, targets, stats, cache)
            _same_data(recipe, f"{tname}/{sname}/train", train, origin, f"{where} data", sspec["data"])
            if stats is None:
                recipe["stats"][key] = train.stats.to_dict()
                stats = train.stats
            valid = (_named_dataset(origin, f"{where} valid", sspec["valid"], sname, targets, stats, cache)
                     if sspec.get("valid", False) else None)
            if valid is not None:
                _same_data(recipe, f"{tname}/{sname}/valid", valid, origin, f"{where} valid", sspec["valid"])
            if "trainset_frac" in spec:  # the original: the head of the training list (stats stay the full set's)
                try:
                    train = trainset_fraction(train, spec["trainset_frac"])
                except ConfigError as exc:
                    raise ConfigError(f"{origin}: [tasks.{tname}] linked set {sname!r}: {exc}") from None
            sets[sname] = LinkedSet(train, weight=sspec.get("weight", 1.0), valid=valid,
                                    num_workers=sspec["data"].get("num_workers", 0))
        loss_fn = losses[tname]
        nodes = [Node(n["name"], model=n["model"], inputs=n["inputs"], outputs=n.get("outputs")) for n in spec["nodes"]]
        tasks.append(Task(tname, nodes, spec["inputs"], spec["targets"], spec["outputs"], loss_fn, sets,
                          batch_size=spec.get("batch_size", settings["batch_size"]),
                          numbuckets=spec.get("numbuckets", settings["numbuckets"]),
                          weight=spec.get("weight", weights.get(tname, 1.0))))
    clip = settings["clip_grad_value"] if settings["clip_grad_value"] is not False else None
    try:
        trainer = Trainer(models, tasks, lr=settings["initial_learning_rate"], clip_grad_value=clip,
                          normalize_gradients=settings["normalize_gradients"],
                          numbatches_to_aggregate=settings["numbatches_to_aggregate"], device=settings["device"],
                          seed=settings["seed"], nonfinite=settings["nonfinite"], acc_steps=settings["acc_steps"],
                          normalize_weights_acc_steps=settings["normalize_weights_acc_steps"],
                          combine=settings["combine"], clip_grad_norm=settings["clip_grad_norm"] or None,
                          clip_grad_percentile=settings["clip_grad_percentile"] or None,
                          precision=settings["precision"], compile=settings["compile"],
                          optimizer=settings["optimizer"], linkedset_weights=settings["linkedset_weights"])
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    if settings["init_file"] and init_weights:
        load_initial_weights(trainer, settings["init_file"], origin=f"{origin}: [trainer] init_file")
    attach_if_distributed(trainer)
    return Experiment(trainer, Schedule.for_trainer(trainer, settings), recipe, cache)


def load_initial_weights(trainer: Trainer, path: str | Path, origin: str = "init_file") -> list[str]:
    """Load every model's weights from ``path`` (an mtlab checkpoint, or a file of ``{model: state_dict}``), as
    the original bootstraps from ``init_file``: weights only (optimizer, step and data start afresh). Every
    model of the trainer must be in the file; models the file has beyond them are left out (and named).
    Returns the names of the models loaded."""
    from ..core.state import CheckpointError, check_weights, load_safe

    path = Path(path)
    if not path.is_file():
        tf = Path(f"{path}.index").is_file()
        raise ConfigError(f"{origin}: {path} " + ("is a TensorFlow checkpoint; mtlab loads its own checkpoints "
                          "(final.pt, best.pt) or a torch file of {model name: state_dict}; convert it with `mtlab "
                          "import-nabu-checkpoint CKPT --recipe RECIPE_DIR -o model.pt`" if tf else
                          "not found; give an mtlab checkpoint (e.g. exp/other/final.pt) or a {model: state_dict} file"))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain containers only
        if isinstance(state, Mapping) and state.get("format") == "mtlab-trainer":
            state = load_safe(path)  # a checkpoint: its checksum checked too
    except CheckpointError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 (torch.load raises many kinds; all mean "not a weights file")
        raise ConfigError(f"{origin}: {path} is not a readable weights file ({type(exc).__name__}: "
                          f"{str(exc)[:200]})") from None
    models = state.get("models", state) if isinstance(state, Mapping) else None
    if not isinstance(models, Mapping):
        raise ConfigError(f"{origin}: {path} holds no model weights (expected an mtlab checkpoint or "
                          "{model name: state_dict})")
    missing = [m for m in trainer.models if m not in models]
    if missing:
        raise ConfigError(f"{origin}: {path} has no weights for models {missing} (it has {sorted(models)}); "
                          "initialize from a checkpoint of a recipe with the same model names")
    check_weights(trainer.models, models, f"{origin}: {path}")  # every shape first: a refusal changes nothing
    for name, model in trainer.models.items():
        try:
            model.load_state_dict(models[name])
        except (RuntimeError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{origin}: model {name!r} does not fit the weights in {path}: {exc}") from None
    extra = sorted(set(models) - set(trainer.models))
    if extra:
        say(f"{origin}: {path} also holds models {extra}, which this recipe does not have; they were left out")
    return list(trainer.models)


def load(path: str | Path, datasets: Datasets | None = None, recipe: Mapping[str, Any] | None = None) -> Experiment:
    """Rebuild the experiment of a checkpoint from the recipe it carries (or ``recipe``: the same with its data
    moved, ``mtlab.apps.relocate.relocated``), then load its state and schedule."""
    from ..core.state import VERSION, CheckpointError, check_state, load_safe

    state = load_safe(path)
    if not isinstance(state.get("recipe"), Mapping):
        raise CheckpointError(f"{path} carries no recipe; build the Trainer yourself and call "
                              "trainer.load_checkpoint(path)")
    if state.get("version") != VERSION:  # before building the recipe it carries (another mtlab's may not build)
        check_state(state, [], {}, False, source=f"checkpoint {path}")
    recipe = state["recipe"] if recipe is None else recipe
    exp = from_recipe(recipe, datasets, init_weights=False)
    if isinstance(state.get("schedule"), Mapping):
        exp.schedule = Schedule.from_state(state["schedule"])
        exp.schedule.apply_stage(exp.trainer)  # the stage's data and batch sizes, so the stream positions fit
    try:
        exp.trainer.load_state_dict(state)
    except ConfigError as exc:
        if str(path) in str(exc):
            raise
        raise ConfigError(f"checkpoint {path}: {exc}") from None
    if isinstance(state.get("schedule"), Mapping):
        exp.schedule = Schedule.from_state(state["schedule"], exp.trainer)
    return exp


def load_split_for(exp: Experiment, task: str, linkedset: str, split: str) -> Any:
    """Another split of a linked set's corpus, normalized with the stats the experiment was built with."""
    from ..data import FeatureStats, TARGET_KEYS

    recipe, trainer = exp.recipe, exp.trainer
    spec = recipe["tasks"][task]["linkedsets"][linkedset]
    key = stats_key(spec["data"], linkedset)
    stats = FeatureStats.from_dict(recipe["stats"][key], origin=f"{recipe.get('source')}: stats {key!r}")
    targets = tuple(sorted({k for t in trainer.tasks for k in (*recipe["tasks"][t]["targets"], *recipe["tasks"][t]["inputs"])}
                           & set(TARGET_KEYS)))
    return _dataset({**spec["data"], "split": split}, linkedset, targets, stats, exp.datasets)
