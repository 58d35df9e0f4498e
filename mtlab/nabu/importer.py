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

from collections.abc import Callable, Mapping
from configparser import ConfigParser
from pathlib import Path
from typing import Any

from ..base.errors import ConfigError
from .database import DataSections
from .ini import read_ini, section, words
from .lossconf import loss_options, loss_spec
from .specs import OUTPUT_RANKS, model_spec

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

NUM_SOURCES = 2  # the corpus loader's default sources per mixture (s1, s2); a processor's nrs sets another

# The original's stopping rules, as its multi_task_trainer applies them.
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
    def models(self, parser: ConfigParser) -> dict[str, dict[str, str]]:
        """Original model sections as raw dicts (built into mtlab specs once input sizes are known)."""
        file = "model.cfg"
        path = self.folder / file
        names = words(section(parser, "hyper", path).get("model_names", ""))
        if not names:
            raise ConfigError(f"{path}: [hyper] needs model_names")
        return {name: section(parser, name, path) for name in names}

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


def import_nabu(recipe_dir: str | Path, data_root: str | Path = "data", strict: bool = True) -> dict[str, Any]:
    """The mtlab recipe dict (with ``recipe["nabu"]``) of an original recipe folder; see the module doc."""
    folder = Path(recipe_dir)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder; give an original recipe folder (with trainer.cfg)")
    imp = Importer(folder, str(data_root), strict)
    trainer_path = folder / "trainer.cfg"
    tparser = read_ini(trainer_path)
    plain, stages, extras = imp.trainer(section(tparser, "trainer", trainer_path))
    data = DataSections(imp, imp.data_root)
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
        if validating and vparser is not None:
            if not vparser.has_section(tname):
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
    models = size_models(imp, imp.models(mparser), tasks)
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
            "data": {k: v for k, v in data.found.items() if v is not None},
            "evaluation": {f: str(folder / f) for f in ("test_evaluator.cfg", "reconstructor.cfg", "scorer.cfg",
                                                         "postprocessor.cfg") if (folder / f).is_file()},
        },
    }
    if imp.unsupported:
        recipe["nabu"]["unsupported"] = imp.unsupported
    if imp.defaults:
        recipe["nabu"]["defaults"] = imp.defaults
    return recipe


def build_task(imp: Importer, tname: str, orig: dict[str, Any], valid: dict[str, Any] | None, losses: ConfigParser | None,
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
    kind, options = loss_options(imp, tname, orig["loss_type"], losses)
    loss = loss_spec(imp, tname, kind, options, keys) or {"type": f"nabu:{kind}"}
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
            if vset is not None and "datafiles" in sec and "data" in spec:  # (no vset: sec is {})
                vdata = data_spec(sec["datafiles"])
                spec["valid"] = {k: v for k, v in vdata.items() if spec["data"].get(k) != v} or \
                    {"split": vdata["split"]}
                if extra:
                    spec["valid"]["feature_inputs"] = {i: vset["sections"][i]["datafiles"] for i in extra}
                vnrs = source_count(imp, tname, set_name, vset["sections"])
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


def size_models(imp: Importer, raw: Mapping[str, Mapping[str, str]], tasks: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """mtlab model specs with their input sizes, found by running each task's graph on per-frame sizes."""
    sizes_in: dict[str, list[int | None]] = {}
    ranks_in: dict[str, list[int]] = {}  # per model: its inputs' axes (RANKS)
    for tname, task in tasks.items():
        linkedsets: list[Mapping[str, Any]] = list(task["linkedsets"].values())
        first: Mapping[str, Any] = linkedsets[0].get("data", {}) if linkedsets else {}
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
            _, out = model_spec(quiet, model, raw[model], dims, flags)
            for name in node.get("outputs", [node["name"]]):
                sizes[name] = out
                # a constant is per utterance, the CNN per bin, others keep their first input's axes (a Concat
                # repeats the others over the frames or bins of its first input)
                ranks[name] = OUTPUT_RANKS.get(raw[model].get("architecture", ""), flags[0] if flags else 3)
    models: dict[str, dict[str, Any]] = {}
    for name, conf in raw.items():
        if name not in sizes_in:
            continue  # declared but used by no training task (e.g. only by an evaluator)
        spec, _ = model_spec(imp, name, conf, sizes_in[name], ranks_in[name])
        models[name] = {k: v for k, v in spec.items() if v is not None}  # unknown sizes (refused) left out
    return models


def plain_recipe(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe without its ``nabu`` extras: what ``mtlab.recipe`` reads today."""
    return {k: v for k, v in recipe.items() if k != "nabu"}
