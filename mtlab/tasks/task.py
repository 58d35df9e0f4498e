"""Tasks and their linked sets (weighted alternative data sources): configuration only."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..base.errors import ConfigError
from .graph import ModelGraph, Node
from .loaders import is_loader, loader_origin, name_fields
from .sources import FieldExamples, reads_audio


LossComputer = Callable[[Mapping[str, Tensor], Mapping[str, Tensor], Mapping[str, Tensor]], tuple[Tensor, Tensor]]

def check_models(models: Any) -> None:
    """A non-empty dict name -> nn.Module whose names contain no '.', or a ConfigError saying what is wrong."""
    if not isinstance(models, Mapping) or not models:
        raise ConfigError("models must be a non-empty dict name -> torch.nn.Module")
    for name, model in models.items():
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model {name!r} is a {type(model).__name__}, expected a torch.nn.Module")
        if "." in name:
            raise ConfigError(f"model name {name!r} contains '.', which separates model and parameter names")


def check_tasks(tasks: Any) -> list[Task]:
    """One Task or a sequence of Tasks with unique names, as a list."""
    tasks = [tasks] if isinstance(tasks, Task) else list(tasks)
    if not tasks:
        raise ConfigError("give at least one mtlab.Task")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ConfigError(f"task names must be unique, got {names}")
    return tasks


def check_count(value: Any, what: str, meaning: str) -> int:
    """An integer >= 1 (not a bool), or a ConfigError naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be an integer >= 1 ({meaning}), got {value!r}")
    return value


def _number(value: Any, what: str, ok: Callable[[float], bool], rule: str) -> float:
    if isinstance(value, (bool, str, bytes)):  # a flag or text where a number belongs: a mistake elsewhere
        raise ConfigError(f"{what} must be a number {rule}, got {value!r} ({type(value).__name__}); write it as "
                          "a number, e.g. 0.5")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number {rule}, got {value!r}") from None
    if not ok(v):
        raise ConfigError(f"{what} must be {rule}, got {value!r}")
    return v


def check_positive(value: Any, what: str, hint: str = "") -> float:
    """A positive finite float, or a ConfigError naming ``what`` (and ``hint``, e.g. how to turn it off)."""
    return _number(value, what, lambda v: v > 0 and math.isfinite(v), "> 0 and finite" + hint)


def check_weight(value: Any, what: str) -> float:
    """A finite, non-negative float, or a ConfigError naming ``what``. ``True`` or ``"0.25"`` are refused, not
    converted: a flag or a string where a weight belongs is a mistake elsewhere."""
    if isinstance(value, (bool, str, bytes)):
        raise ConfigError(f"{what} must be a number >= 0 and finite, got {value!r} ({type(value).__name__}); "
                          f"write it as a number, e.g. {what.split()[-1]}=0.5")
    return _number(value, what, lambda v: v >= 0 and math.isfinite(v), ">= 0 and finite")


LINKEDSET_WEIGHTS = ("absolute", "relative")  # how a linked set's weight is applied (see applied_weight)


def check_linkedset_weights(mode: Any) -> str:
    """``"absolute"`` or ``"relative"`` (see ``applied_weight``), or a ConfigError naming both."""
    if mode not in LINKEDSET_WEIGHTS:
        raise ConfigError(f"linkedset_weights must be one of {LINKEDSET_WEIGHTS} (absolute: each set's weight as "
                          f"given; relative: divided by the first set's weight, as Nabu-MSSS), got {mode!r}")
    return str(mode)


def applied_weight(task: Task, linkedset: str, mode: str = "absolute") -> float:
    """The factor on a minibatch's summed loss and norm from ``linkedset`` of ``task``.

    ``"absolute"`` (mtlab's default): the set's weight as given. ``"relative"`` (Nabu-MSSS, what imported recipes
    set): the weight divided by the first linked set's, so the first set always counts 1 (the original's
    ``task_trainer.py:57-60``: ``linkedset_weighting /= linkedset_weighting[0]``)."""
    w = task.linkedsets[linkedset].weight
    if mode == "absolute" or w == 0.0:
        return w
    check_relative_weights(task)
    return w / next(iter(task.linkedsets.values())).weight


def check_relative_weights(task: Task, changed: Mapping[str, float] | None = None) -> None:
    """Refuse relative linked-set weights whose first set has weight 0 while another has not (the original
    would divide by 0); ``changed`` checks weights about to be set, before setting them."""
    weights = {k: ls.weight for k, ls in task.linkedsets.items()} | dict(changed or {})
    first, *rest = weights
    if weights[first] == 0.0 and any(weights[k] > 0 for k in rest):
        raise ConfigError(f"task {task.name!r}: linked set weights are relative to the first set {first!r} "
                          f"(linkedset_weights='relative'), so {first!r} needs a positive weight while another set "
                          "has one; raise it, set the others to 0 too, or use linkedset_weights='absolute'")


class LinkedSet:
    """A weighted data source for a task: ``LinkedSet(examples, weight=0.5)``.

    ``examples`` is one of

    - a sequence (or map-style Dataset) of example dicts ``name -> tensor`` (numpy arrays and numbers are taken as
      tensors; other entries, such as ids, are carried along);
    - a Dataset of tuples (a ``TensorDataset``) with ``fields=("x", "y")`` naming their entries;
    - a ``torch.utils.data.DataLoader`` (or torchdata's ``StatefulDataLoader``): each draw is its next batch, its
      own batch size, sampler, ``collate_fn`` and workers decide (:mod:`mtlab.tasks.loaders`);
    - None, when every minibatch is passed explicitly.

    ``lengths`` (frames per example) spares reading a Dataset in full to learn them; a ``lengths`` attribute of
    the dataset does the same. ``valid`` optionally holds held-out examples (or a DataLoader) for
    ``Trainer.evaluate``. Both the summed loss and the norm of each minibatch are multiplied by ``weight``.
    """

    def __init__(self, examples: Any = None, weight: float = 1.0, valid: Any = None,
                 num_workers: int = 0, fields: Sequence[str] | None = None,
                 lengths: Sequence[int] | None = None) -> None:
        self.weight = check_weight(weight, "LinkedSet weight")
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
            raise ConfigError(f"LinkedSet num_workers must be an integer >= 0 (DataLoader worker processes; 0 reads "
                              f"in the training process), got {num_workers!r}")
        self.num_workers = num_workers
        self.fields = None if fields is None else tuple([fields] if isinstance(fields, str) else fields)
        self.loader_origin: list[Tensor] | None = None  # a DataLoader's generator states: where its streams start
        if is_loader(examples):
            if num_workers:
                raise ConfigError(f"LinkedSet(loader, num_workers={num_workers}): a DataLoader has its own workers; "
                                  f"build it with DataLoader(..., num_workers={num_workers}) and leave num_workers out "
                                  "here")
            if lengths is not None:
                raise ConfigError("LinkedSet(loader, lengths=...): a DataLoader's batches are made by its own "
                                  "sampler; give lengths= with a Dataset, or leave them out")
            if self.fields is not None:
                FieldExamples([], self.fields)  # the names' checks
            self.loader_origin = loader_origin(examples)
            name_fields(examples, self.fields)
        elif examples is not None:
            if not hasattr(examples, "__len__") or not hasattr(examples, "__getitem__"):
                raise ConfigError(
                    f"LinkedSet examples must be a sequence or Dataset of example dicts, or a DataLoader, got "
                    f"{type(examples).__name__}" + (" (an IterableDataset: wrap it in a DataLoader)"
                                                    if isinstance(examples, torch.utils.data.IterableDataset) else ""))
            if self.fields is not None or lengths is not None:
                if reads_audio(examples):
                    raise ConfigError("LinkedSet(..., fields=/lengths=) is for a Dataset of one's own; this split of "
                                      "mtlab.data describes its examples already: leave them out")
                examples = FieldExamples(examples, self.fields, lengths)
        elif self.fields is not None or lengths is not None:
            raise ConfigError("LinkedSet(fields=/lengths=) describe examples; give the examples (a Dataset) too")
        self.examples = examples
        if valid is not None and self.fields is not None:
            if is_loader(valid):
                name_fields(valid, self.fields)
            else:
                valid = FieldExamples(valid, self.fields)
        self.valid = valid

    @property
    def loader(self) -> Any:
        """The DataLoader this linked set draws from, or None."""
        return self.examples if is_loader(self.examples) else None

    def __repr__(self) -> str:
        if self.examples is None:
            n = "explicit batches"
        elif is_loader(self.examples):
            n = type(self.examples).__name__
        else:
            n = f"{len(self.examples)} examples"
        return f"LinkedSet({n}, weight={self.weight:g})"


def check_not_empty(task: str, name: str, ls: LinkedSet) -> None:
    """Refuse a linked set that has no example (or whose DataLoader gives no batch), naming task and linked set."""
    source = ls.examples
    if source is None:
        return
    try:
        count = len(source)
    except TypeError:  # a DataLoader over an IterableDataset without len: found out at the first draw
        return
    if count == 0:
        what = "DataLoader gives no batch (an empty dataset, or fewer examples than batch_size with drop_last)" \
            if is_loader(source) else "examples are empty"
        raise ConfigError(f"task {task!r}: linked set {name!r} has no data: its {what}; give it examples, or "
                          f"leave {name!r} out of the task's linkedsets")


class Task:
    """A named task: a graph of models, a loss computer and weighted linked sets."""

    def __init__(
        self,
        name: str,
        nodes: Sequence[Node],
        inputs: Sequence[str],
        targets: Sequence[str],
        outputs: Sequence[str],
        loss: LossComputer,
        linkedsets: Mapping[str, LinkedSet],
        batch_size: int = 8,
        weight: float = 1.0,
        numbuckets: int = 1,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a Task needs a non-empty string name, got {name!r}")
        self.name = name
        self.inputs = tuple([inputs] if isinstance(inputs, str) else inputs)
        self.targets = tuple([targets] if isinstance(targets, str) else targets)
        self.outputs = tuple([outputs] if isinstance(outputs, str) else outputs)
        clash = set(self.inputs) & set(self.targets)
        if clash:
            raise ConfigError(f"task {name!r}: {sorted(clash)} listed both as inputs and as targets")
        self.graph = ModelGraph(nodes, self.inputs, self.outputs, where=f"task {name!r}")
        self.nodes = self.graph.nodes
        if not callable(loss):
            raise ConfigError(
                f"task {name!r}: loss must be callable as loss(targets, outputs, seq_lengths) -> (loss_sum, norm), "
                f"got {type(loss).__name__}"
            )
        self.loss = loss
        if not isinstance(linkedsets, Mapping) or not linkedsets:
            raise ConfigError(f"task {name!r}: linkedsets must be a non-empty dict name -> mtlab.LinkedSet")
        for set_name, ls in linkedsets.items():
            if not isinstance(ls, LinkedSet):
                raise ConfigError(
                    f"task {name!r}: linked set {set_name!r} is a {type(ls).__name__}; wrap it as mtlab.LinkedSet(examples, weight=...)"
                )
            check_not_empty(name, set_name, ls)
        self.linkedsets: dict[str, LinkedSet] = dict(linkedsets)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"task {name!r}: batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        if not isinstance(numbuckets, int) or isinstance(numbuckets, bool) or numbuckets < 1:
            raise ConfigError(f"task {name!r}: numbuckets must be a positive integer, got {numbuckets!r}")
        self.numbuckets = numbuckets
        self.weight = check_weight(weight, f"task {name!r} weight")

    def __repr__(self) -> str:
        return (f"Task({self.name!r}, models={self.graph.model_names}, "
                f"linkedsets={ {k: v.weight for k, v in self.linkedsets.items()} }, weight={self.weight:g})")
