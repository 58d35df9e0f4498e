"""mtlab: notebook-first multi-task training with explicit, stepwise gradient accumulation.

The core (``Trainer``, ``Task``, ``LinkedSet``, ``Node``, the step pieces) imports without Jupyter or the
speech data package; ``mtlab.from_recipe``, ``mtlab.run``, ``mtlab.data``, ``mtlab.separation`` and
``mtlab.ui`` load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import losses, models
from .core.accumulator import Accumulator, MinibatchRecord, Phase
from .base.batching import collate
from .base.errors import BatchError, ConfigError, GraphError, MtlabError, NonFiniteError, PhaseError, ZeroNormError
from .tasks.graph import ModelGraph, Node
from .tasks.task import LinkedSet, Task
from .core.trainer import Trainer
from .core.transforms import Chain, ClipByGlobalNorm, ClipByValue, Normalize

__version__ = "0.3.0"

_LAZY = {"from_recipe": ("apps.recipe", "from_recipe"), "run": ("training.loop", "run"),
         "Schedule": ("training.schedule", "Schedule"), "Experiment": ("apps.recipe", "Experiment")}
# Packages and modules reachable as attributes of ``mtlab`` (imported on first use). The short names are
# the ones a notebook writes (``mtlab.debug.explain(trainer)``, ``mtlab.distributed.attach(trainer)``).
_SUBMODULES = {"data": "data", "separation": "separation", "ui": "ui", "nabu": "nabu",
               "base": "base", "tasks": "tasks", "core": "core", "training": "training", "apps": "apps",
               "distributed": "training.distributed", "debug": "training.debug", "loop": "training.loop",
               "loggers": "training.loggers", "plots": "training.plots", "checkpoint": "training.checkpoint", "state": "core.state",
               "recipe": "apps.recipe", "launch": "apps.launch", "cli": "apps.cli", "combine": "core.combine",
               "weighting": "core.weighting", "sampling": "tasks.sampling"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f".{_SUBMODULES[name]}", __name__)
    raise AttributeError(f"module 'mtlab' has no attribute {name!r}")


__all__ = [
    "Accumulator", "BatchError", "Chain", "ClipByGlobalNorm", "ClipByValue", "ConfigError", "Experiment", "GraphError",
    "LinkedSet", "MinibatchRecord", "ModelGraph", "MtlabError", "Node", "Normalize", "NonFiniteError", "Phase",
    "PhaseError", "Schedule", "Task", "Trainer", "ZeroNormError", "collate", "from_recipe", "losses",
    "models", "run",
]
