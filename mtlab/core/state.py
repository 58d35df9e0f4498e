"""Checkpoint files: atomic writes, and loads that never unpickle arbitrary objects."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import tempfile
import zipfile
from types import SimpleNamespace
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..base.errors import ConfigError, MtlabError

logger = logging.getLogger("mtlab")
VERSION = 2  # of the trainer state: 2 = accumulators with flat buffers and an update piece


class CheckpointError(MtlabError, OSError):
    """A checkpoint that cannot be written or read; the message names the file."""


def digest(obj: Any) -> str:
    """SHA-256 over a nested structure of tensors and plain values (tensor bytes included), so a
    checkpoint whose bytes were damaged is refused instead of loading wrong weights."""
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().contiguous().cpu()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            h.update(b"{")
            for k in sorted(x, key=str):
                h.update(repr(k).encode())
                walk(x[k])
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


def save_atomic(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save`` (with a checksum of the contents) to a temporary file in the same folder,
    fsync, then rename over ``path``: a crash mid-write leaves the previous file intact."""
    path = Path(path)
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k != "checksum"}
        obj["checksum"] = digest(obj)
    blocker = next((p for p in [path.parent, *path.parent.parents] if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise CheckpointError(f"could not write checkpoint {path}: {blocker} is a file, not a folder; choose "
                              "another path (or move that file away)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise CheckpointError(f"could not write checkpoint {path}: {exc.strerror or exc}; "
                                  "the previous checkpoint (if any) is intact. Free disk space or choose another path") from exc
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


def load_safe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: tensors and plain containers only."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError,
            TypeError, AttributeError, IndexError) as exc:
        if isinstance(exc, pickle.UnpicklingError):  # torch's text advises weights_only=False: not mtlab's way
            why = "it holds objects other than tensors and plain containers"
        else:
            why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}; it may be truncated or corrupted"
        raise CheckpointError(
            f"{path} is not a readable mtlab checkpoint ({why}). mtlab loads checkpoints with weights_only=True "
            "and never unpickles other objects; use an earlier checkpoint of the run (latest.pt, best.pt) or one "
            "written by Trainer.save / mtlab train"
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != "mtlab-trainer":
        raise CheckpointError(f"{path} is not an mtlab trainer checkpoint (no 'format': 'mtlab-trainer' entry)")
    saved = obj.pop("checksum", None)
    if saved is None or saved != digest(obj):
        raise CheckpointError(
            f"{path} is damaged: its contents do not match the checksum written with it "
            f"({'missing' if saved is None else 'mismatch'}); use an earlier checkpoint (e.g. best.pt) instead"
        )
    return obj


def clone_tree(obj: Any) -> Any:
    """A deep copy of nested dicts/lists/tuples whose tensors are detached clones."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clone_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clone_tree(v) for v in obj)
    return obj


def check_state(state: Any, models: list[str], task_params: dict[str, list[str]], acc_steps: bool,
                source: str = "the state") -> None:
    """Refuse a trainer state that does not fit a trainer, naming ``source`` and what differs (nothing is changed)."""
    if not isinstance(state, dict) or state.get("format") != "mtlab-trainer":
        raise ConfigError(f"{source}: not an mtlab trainer state (expected the dict Trainer.state_dict() returns)")
    if state.get("version") != VERSION:
        version = state.get("version")
        newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
        raise ConfigError(f"{source}: trainer state version {version!r} is not supported by this mtlab "
                          f"({VERSION}); it was written by {'a newer' if newer else 'another'} mtlab version: "
                          f"{'upgrade mtlab (pip install -U mtlab) to' if newer else 'with that version,'} "
                          "continue it")
    missing_models = sorted(set(models) ^ set(state["models"]))
    missing_tasks = sorted(set(task_params) ^ set(state["tasks"]))
    if missing_models or missing_tasks:
        raise ConfigError(f"the state does not match this trainer: models differ by {missing_models}, tasks by "
                          f"{missing_tasks}; load it into a trainer built from the same recipe")
    for name, st in state["tasks"].items():
        unknown = set(st["grads"]) - set(task_params[name])
        if unknown:
            raise ConfigError(f"the state's task {name!r} has gradients for unknown parameters {sorted(unknown)}")
    if ("task_optimizers" in state["update"]) != acc_steps:
        raise ConfigError(f"the state was saved with acc_steps={not acc_steps} but this trainer has "
                          f"acc_steps={acc_steps}; build the trainer with the same setting")


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def check_weights(models: Mapping[str, nn.Module], weights: Mapping[str, Any], source: str,
                  grads: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Refuse saved weights (``{model: state_dict}``; and saved gradients ``{task: {param: grad}}``) whose
    names or shapes do not fit ``models``, naming the source, model, parameter and both shapes. Called before
    anything is loaded, so a refusal changes nothing."""
    problems: list[str] = []
    ours_all: dict[str, torch.Tensor] = {}
    for name, model in models.items():
        theirs = weights.get(name)
        ours = {f"{name}.{k}": v for k, v in model.state_dict().items()}
        ours_all.update(ours)
        if not isinstance(theirs, Mapping):
            problems.append(f"model {name!r} has no weights saved")
            continue
        theirs = {f"{name}.{k}": v for k, v in theirs.items()}
        missing, unexpected = [k for k in ours if k not in theirs], [k for k in theirs if k not in ours]
        if missing or unexpected:
            problems.append(f"model {name!r}: " + "; ".join(
                [*([f"not saved: {missing}"] if missing else []), *([f"saved but not in the model: {unexpected}"]
                                                                    if unexpected else [])]))
        problems += [f"model {name!r} parameter {k}: {_shape(theirs[k])} saved, {_shape(v)} in this trainer"
                     for k, v in ours.items() if k in theirs and _shape(theirs[k]) != _shape(v)]
    for task, saved in (grads or {}).items():
        problems += [f"task {task!r} gradient of {k}: {_shape(g)} saved, {_shape(ours_all[k])} in this trainer"
                     for k, g in saved.items() if k in ours_all and _shape(g) != _shape(ours_all[k])]
    if problems:
        raise ConfigError(f"{source} does not fit this trainer's models ({len(problems)} difference(s)); nothing "
                          "was loaded: " + "; ".join(problems) + ". Load it into a trainer built from the same "
                          "recipe (same model sizes)")
def check_precision_state(state: dict[str, Any], mode: str) -> None:
    """Refuse a state taken mid-accumulation under another loss scaling: its gradients would be read as
    scaled when they are not, or the other way round. Between steps any precision may continue any state."""
    saved = state.get("precision", {}).get("mode", "32")
    if (saved == "16-mixed") == (mode == "16-mixed"):
        return
    busy = sorted(n for n, st in state["tasks"].items() if st["phase"] == "accumulating")
    if busy:
        raise ConfigError(f"the state was saved with precision={saved!r} while task(s) {busy} were accumulating, "
                          f"and this trainer has precision={mode!r}: build it with precision={saved!r}, or load a "
                          "state taken between steps")


def optimizer_layout(trainer: Any) -> list[dict[str, Any]]:
    """Each optimizer of the trainer as ``{"class", "groups"}`` (parameters per param group): what a state's
    optimizer state must fit."""
    opts = [trainer.optimizer] if trainer.optimizer is not None else list(trainer.task_optimizers.values())
    return [{"class": f"{type(o).__module__}.{type(o).__qualname__}", "groups": [len(g["params"]) for g in o.param_groups],
             "hypers": sorted({k for g in o.state_dict()["param_groups"] for k in g if k != "params"})}
            for o in opts]


def check_optimizer_state(state: dict[str, Any], name: str, layout: list[dict[str, Any]] | None = None) -> None:
    """Refuse a state whose optimizer state is another optimizer's (another class, or another layout of param
    groups), naming both: it would load and continue silently with the other update, or fail at the next step."""
    saved = state.get("settings", {}).get("optimizer", "adam")
    if saved != name and "custom" not in (saved, name):
        raise ConfigError(f"the state was saved with optimizer={saved!r} and this trainer has optimizer={name!r}; "
                          f"build it with optimizer={saved!r} (a recipe's [trainer] optimizer)")
    theirs = state.get("optimizers")
    if layout is None:
        return
    if theirs is None:  # a state written before optimizers were recorded: their param groups' hyperparameters
        update = state.get("update", {})
        saved_opts = [update["optimizer"]] if "optimizer" in update else list(update.get("task_optimizers", {}).values())
        for mine, other in zip(layout, saved_opts):
            keys = sorted(k for g in other.get("param_groups", []) for k in g if k != "params")
            if mine.get("hypers") is not None and set(keys) != set(mine["hypers"]):
                raise ConfigError(f"the state's optimizer has the hyperparameters {sorted(set(keys))} and this trainer's "
                                  f"{mine['class']} {sorted(mine['hypers'])}: it was saved with another optimizer; "
                                  "nothing was loaded. Build the trainer with the same optimizer to continue it")
        return
    for mine, other in zip(layout, theirs):
        if mine["class"] != other.get("class"):
            raise ConfigError(f"the state was saved with the optimizer {other.get('class')} and this trainer has "
                              f"{mine['class']}; nothing was loaded. Build the trainer with the same optimizer "
                              "(Trainer(optimizer=...)) to continue it, or load only the weights "
                              "(model.load_state_dict(state['models'][name]))")
        if mine["groups"] != other.get("groups"):
            raise ConfigError(f"the state's optimizer ({other.get('class')}) has param groups of "
                              f"{other.get('groups')} parameters and this trainer's {mine['groups']}; nothing was "
                              "loaded. Build the optimizer with the same param groups to continue it")


def save_trainer(state: dict[str, Any], path: str | os.PathLike[str], rank: int = 0,
                 extra: Mapping[str, Any] | None = None) -> Path | None:
    """Write a trainer state (plus ``extra`` entries such as the recipe) atomically. Data parallel: only rank 0
    writes (every rank holds the same state); other ranks log that they did not and return None."""
    if rank != 0:
        logger.info("rank %d does not write %s: rank 0 writes checkpoints for every rank", rank, path)
        return None
    extra = dict(extra or {})
    return save_atomic({**state, **extra, "extra_keys": sorted(extra)}, path)


def trainer_state(trainer: Any) -> dict[str, Any]:
    """``Trainer.state_dict()``: weights, optimizer, accumulators, data positions, RNG, step, settings,
    weights and history, as plain containers (loadable with ``weights_only=True``)."""
    tr = trainer
    rounds = tr.minibatches_per_step
    tasks = {n: {**tr.state(n).state_dict(), "weight": t.weight,
                 "linkedset_weights": {k: ls.weight for k, ls in t.linkedsets.items()},
                 "batch_size": t.batch_size, "minibatches_per_step": rounds[n]}
             for n, t in tr.tasks.items()}
    return clone_tree({
        "format": "mtlab-trainer", "version": VERSION,
        "models": {k: m.state_dict() for k, m in tr.models.items()},
        "update": tr.update.state_dict(), "tasks": tasks, "streams": tr.streams.state_dict(),
        "rng": tr.rng.state_dict(), "step": tr.step_count, "knobs": tr.knobs(),
        "optimizers": optimizer_layout(tr), "scheduler": tr.schedule.state_dict(),
        "chain": tr.chain.state_dict(), "history": tr.log.state_dict(), "journal": tr.journal.state_dict(),
        "precision": tr.precision.state_dict(),
        **({"noise_scale": tr.noise_scale.state_dict()} if tr.noise_scale is not None else {}),
        "settings": {"normalize_gradients": tr.normalize_gradients, "nonfinite": tr.nonfinite,
                     "numbatches_to_aggregate": tr.numbatches_to_aggregate, "seed": tr.seed,
                     "acc_steps": tr.acc_steps, "normalize_weights_acc_steps": tr.normalize_weights_acc_steps,
                     "optimizer": tr.optimizer_name, "linkedset_weights": tr.linkedset_weights},
    })


def initial_state(trainer: Any) -> dict[str, Any]:
    """What ``Trainer.reinitialize()`` goes back to, taken when the trainer is built: parameters, optimizer,
    update, accumulators, chain, precision and RNG, as CPU copies (no second copy on the device)."""
    tr = trainer
    return to_cpu({"models": {k: m.state_dict() for k, m in tr.models.items()}, "update": tr.update.state_dict(),
                   "scheduler": tr.schedule.state_dict(),
                   "tasks": {n: tr.state(n).state_dict() for n in tr.tasks}, "chain": tr.chain.state_dict(),
                   "precision": tr.precision.state_dict(), "rng": tr.rng.state_dict(),
                   "method": getattr(tr.update, "method", None)})


def to_cpu(obj: Any) -> Any:
    """``clone_tree`` with every tensor on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def load_initial_state(trainer: Any, init: Mapping[str, Any]) -> None:
    """The state part of ``Trainer.reinitialize()``: parameters, optimizer and update state (for the combine
    method chosen now), accumulators, chain, precision, RNG, fresh data streams. Knobs and history untouched."""
    tr = trainer
    for k, m in tr.models.items():
        m.load_state_dict(init["models"][k])
    method = getattr(tr.update, "method", None)
    if method == init["method"] or not hasattr(tr.update, "calls"):
        tr.update.load_state_dict(clone_tree(init["update"]))
    else:  # switched since: the current method, with the fresh state it starts with
        tr.update.optimizer.load_state_dict(clone_tree(init["update"]["optimizer"]))
        tr.update.calls = 0
        tr.update.set_method(method)
    for name in tr.tasks:
        tr.state(name).load_state_dict(init["tasks"][name])
    tr.schedule.load_state_dict(clone_tree(init["scheduler"]))
    tr.chain.load_state_dict(clone_tree(init["chain"]))
    tr.precision.load_state_dict(clone_tree(init["precision"]))
    tr.streams.clear()  # recreated on first use, from the start, as in a fresh trainer
    tr.streams.reported = 0
    tr.rng.load_state_dict(init["rng"])
    if tr.noise_scale is not None:
        tr.noise_scale.clear()  # its averages belong to the abandoned run: a fresh trainer has none


def check_trainer_state(trainer: Any, state: Any, source: str = "the state") -> None:
    """Refuse, naming ``source`` and what differs, a state ``load_trainer_state`` could not load (changes nothing)."""
    tr = trainer
    check_state(state, list(tr.models), {n: tr.task_params[n] for n in tr.tasks}, tr.acc_steps, source)
    check_weights(tr.models, state["models"], source, {n: st["grads"] for n, st in state["tasks"].items()})
    check_precision_state(state, tr.precision.mode)
    # entries of the caller's own beside the trainer's ({**trainer.state_dict(), "epoch": 3}) are theirs; each
    # piece of the trainer's refuses what it does not read
    for name, keys in PIECE_KEYS.items():  # each piece's own entries
        if isinstance(state.get(name), Mapping):
            refuse_unknown(state[name], keys, source, f"'{name}'")
    for name, st in state["tasks"].items():
        refuse_unknown(st, TASK_KEYS, source, f"task {name!r}")
    check_optimizer_state(state, tr.optimizer_name, optimizer_layout(tr))
    tr.schedule.check_state(state.get("scheduler", {}), source)
    if "knobs" in state:
        tr.check_knobs(state["knobs"], source)
    declared = {n: st.get("batch_size") for n, st in state["tasks"].items()}
    # the batch sizes the state's knobs will set (before its data positions are restored) are those to agree with
    sizes = {e["task"]: e["value"] for e in state.get("knobs", ()) if e.get("name") == "batch_size"}
    as_restored = {n: SimpleNamespace(linkedsets=t.linkedsets, numbuckets=t.numbuckets,
                                      batch_size=sizes.get(n, t.batch_size)) for n, t in tr.tasks.items()}
    tr.streams.check_state_dict(state["streams"], as_restored, declared)
    if "weighting" in state["update"] and getattr(tr.update, "weighting", None) is None:
        raise ConfigError("the state holds a loss weighting's state but this trainer has none; build it with "
                          "the same combine method")


def load_trainer_state(trainer: Any, state: Any, history: bool = True, source: str = "the state") -> None:
    """``Trainer.load_state_dict()``: checks ``state`` against the trainer, then restores every piece."""
    tr = trainer
    check_trainer_state(tr, state, source)  # every check before the first change
    declared = {n: st.get("batch_size") for n, st in state["tasks"].items()}
    for k, m in tr.models.items():
        m.load_state_dict(state["models"][k])
    tr.update.load_state_dict(clone_tree(state["update"]))  # the optimizer's param groups: lrs included
    tr.schedule.load_state_dict(clone_tree(state.get("scheduler", {})))
    for name, saved in state["tasks"].items():
        tr.state(name).load_state_dict(saved)
    tr.load_knobs(state["knobs"] if "knobs" in state else legacy_knobs(state))  # through the knob table's path
    tr.streams.load_state_dict(state["streams"], tr.tasks, declared)
    tr.rng.load_state_dict(state["rng"])
    tr.precision.load_state_dict(state.get("precision", {}))
    tr.step_count = int(state["step"])
    tr.chain.load_state_dict(state.get("chain", []))
    if tr.noise_scale is not None and "noise_scale" in state:
        tr.noise_scale.load_state_dict(state["noise_scale"], tr.device)
    if history:
        tr.log.load_state_dict(state["history"])


def legacy_knobs(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``knobs`` list of a state written before the knob table (its knobs as separate entries)."""
    out: list[dict[str, Any]] = [{"name": "lr", "task": None, "linkedset": None, "value": state["lr"]}]
    out += [{"name": k, "task": None, "linkedset": None, "value": state.get(k)}
            for k in ("clip_grad_value", "clip_grad_norm", "clip_grad_percentile")]
    settings = state.get("settings", {})
    if "numbatches_to_aggregate" in settings:
        out.append({"name": "minibatches_per_step", "task": None, "linkedset": None,
                    "value": int(settings["numbatches_to_aggregate"])})
    for name, saved in state["tasks"].items():
        out.append({"name": "task_weight", "task": name, "linkedset": None, "value": float(saved["weight"])})
        out += [{"name": "weight", "task": name, "linkedset": s, "value": float(w)}
                for s, w in saved["linkedset_weights"].items()]
        if "batch_size" in saved:
            out.append({"name": "batch_size", "task": name, "linkedset": None, "value": saved["batch_size"]})
        if "minibatches_per_step" in saved:
            out.append({"name": "minibatches_per_step", "task": name, "linkedset": None,
                        "value": int(saved["minibatches_per_step"])})
    return out


# the entries of each piece of a trainer state (a piece's load_state_dict reads these and nothing else)
PIECE_KEYS = {"update": {"optimizer", "calls", "method", "weighting", "combine", "task_optimizers"},
              "scheduler": {"type", "state"}, "precision": {"mode", "scaler"}, "rng": {"torch", "cuda"},
              "journal": {"json", "position"}}
TASK_KEYS = {"phase", "position", "minibatches", "records", "totals", "set_totals", "grads", "grad_norm",
             "grad_norm_clipped", "clip_fraction", "model_norms", "model_norms_clipped", "stats", "weight",
             "linkedset_weights", "batch_size", "minibatches_per_step"}


def refuse_unknown(entries: Mapping[str, Any], known: set[str], source: str, where: str = "") -> None:
    """Refuse entries of a state (or of one of its pieces) that no piece reads, naming them: a state written by
    another mtlab version, or edited, is not half understood."""
    unknown = sorted(str(k) for k in set(entries) - known)
    if unknown:
        raise ConfigError(f"{source}{' ' + where if where else ''} holds entries this trainer does not know: "
                          f"{unknown}; nothing was loaded. It was written by another mtlab version or edited: load it "
                          "with the mtlab that wrote it")
