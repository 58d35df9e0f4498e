"""mtlab: notebook-first multi-task training with explicit, stepwise gradient accumulation.

The core (``Trainer``, ``Task``, ``LinkedSet``, ``Node``, the step pieces) imports without Jupyter or the
speech data package; ``mtlab.from_recipe``, ``mtlab.run``, ``mtlab.data``, ``mtlab.separation`` and
``mtlab.ui`` load on first use.

Examples:
    One task on one linked set of in-memory examples, one step, its history row:

    >>> import torch
    >>> from torch import nn
    >>> import mtlab
    >>> _ = torch.manual_seed(0)
    >>> data = [{"x": torch.randn(5, 3), "y": torch.randint(0, 2, (5,))} for _ in range(16)]
    >>> task = mtlab.Task("tag", nodes=[mtlab.Node("logits", "net", ["x"])], inputs=["x"], targets=["y"],
    ...                   outputs=["logits"], loss=mtlab.losses.CrossEntropy(output="logits", target="y"),
    ...                   linkedsets={"train": mtlab.LinkedSet(data)}, batch_size=4)
    >>> trainer = mtlab.Trainer({"net": nn.Linear(3, 2)}, [task], lr=1e-2, numbatches_to_aggregate=2, device="cpu")
    >>> _ = trainer.process_minibatch("tag", "train")
    >>> str(trainer.phase()["tag"]), trainer.next_calls()
    ('accumulating', {'tag': 'normalize'})
    >>> trainer.apply()
    Traceback (most recent call last):
    ...
    mtlab.base.errors.PhaseError: ...
    >>> trainer.reset(); _ = trainer.step()
    >>> trainer.step_count, int(trainer.history["tag/minibatches"].iloc[0])
    (1, 2)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Any

from . import losses, models
from .core.accumulator import Accumulator, MinibatchRecord, Phase
from .base.batching import collate
from .base.errors import (BatchError, ConfigError, GraphError, MtlabError, NonFiniteError, PhaseError, ZeroNormalizerError,
                          ZeroNormError)
from .tasks.graph import ModelGraph, Node
from .tasks.task import LinkedSet, Task
from .core.trainer import Trainer
from .core.transforms import Call, Chain, ClipByGlobalNorm, ClipByHistory, ClipByValue, Normalize, Transform
from .core.journal import Journal
from .core.noise import NoiseScale

__version__ = "0.3.0"

_LAZY = {"from_recipe": ("apps.recipe", "from_recipe"), "run": ("training.loop", "run"),
         "Schedule": ("training.schedule", "Schedule"), "Experiment": ("apps.recipe", "Experiment"),
         "replay": ("training.replay", "replay"), "attach": ("remote.client", "attach")}
# Packages and modules reachable as attributes of ``mtlab`` (imported on first use) and importable as
# ``mtlab.<name>`` (``import mtlab.debug``, ``from mtlab.recipe import from_recipe``: see ``_Aliases``). The short
# names are the ones a notebook writes (``mtlab.debug.explain(trainer)``, ``mtlab.distributed.attach(trainer)``).
_SUBMODULES = {"data": "data", "separation": "separation", "ui": "ui", "nabu": "nabu",
               "base": "base", "tasks": "tasks", "core": "core", "training": "training", "apps": "apps",
               "distributed": "training.distributed", "debug": "training.debug", "loop": "training.loop",
               "loggers": "training.loggers", "plots": "training.plots", "checkpoint": "training.checkpoint", "state": "core.state",
               "recipe": "apps.recipe", "launch": "apps.launch", "cli": "apps.cli", "combine": "core.combine", "remote": "remote",
               "weighting": "core.weighting", "sampling": "tasks.sampling", "exercises": "training.exercises"}


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import mtlab.debug`` / ``from mtlab.recipe import from_recipe``: a short name of ``_SUBMODULES`` imports
    the module it names (``mtlab.training.debug``), registered under both names as one module object."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        prefix, _, short = fullname.partition(".")
        if prefix != __name__ or "." in short or _SUBMODULES.get(short, short) == short:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        module = importlib.import_module(f"{__name__}.{_SUBMODULES[spec.name.partition('.')[2]]}")
        spec.loader_state = module.__spec__  # the import system sets __spec__ to the alias's: put it back below
        return module

    def exec_module(self, module: Any) -> None:
        """The module ran when it was imported under its own name; it keeps its own spec (reload works)."""
        module.__spec__ = module.__spec__.loader_state


if not any(type(f).__name__ == "_Aliases" and getattr(f, "package", None) == __name__ for f in sys.meta_path):
    _finder = _Aliases()
    _finder.package = __name__  # type: ignore[attr-defined]  # one finder, also after importlib.reload(mtlab)
    sys.meta_path.append(_finder)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    raise AttributeError(f"module 'mtlab' has no attribute {name!r}")


__all__ = [
    "Accumulator", "BatchError", "Call", "Chain", "ClipByGlobalNorm", "ClipByHistory", "ClipByValue", "ConfigError",
    "Experiment", "GraphError", "Journal", "LinkedSet", "MinibatchRecord", "ModelGraph", "MtlabError", "Node",
    "NoiseScale", "Normalize", "NonFiniteError", "Phase", "PhaseError", "Schedule", "Task", "Trainer", "Transform",
    "ZeroNormError", "ZeroNormalizerError", "collate", "from_recipe", "losses", "models", "replay", "run",
]
