"""mtlab: notebook-first multi-task training with explicit, stepwise gradient accumulation.

The core (``Trainer``, ``Task``, ``LinkedSet``, ``Node``, the step pieces) imports without Jupyter or the
speech data package; ``mtlab.from_recipe``, ``mtlab.run``, ``mtlab.data``, ``mtlab.separation`` and
``mtlab.ui`` load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import losses, models
from .accumulator import Accumulator, MinibatchRecord, Phase, TaskState
from .batching import collate
from .errors import BatchError, ConfigError, GraphError, MtlabError, NonFiniteError, PhaseError, ZeroNormError
from .graph import ModelGraph, Node
from .task import LinkedSet, Task
from .trainer import Trainer
from .transforms import Chain, ClipByGlobalNorm, ClipByValue, Normalize

__version__ = "0.2.0"

_LAZY = {"from_recipe": ("recipe", "from_recipe"), "run": ("loop", "run"), "Schedule": ("loop", "Schedule"),
         "Experiment": ("recipe", "Experiment")}
_SUBMODULES = ("data", "separation", "ui", "distributed", "debug", "loop", "recipe", "loggers", "nabu", "launch")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'mtlab' has no attribute {name!r}")


__all__ = [
    "Accumulator", "BatchError", "Chain", "ClipByGlobalNorm", "ClipByValue", "ConfigError", "Experiment", "GraphError",
    "LinkedSet", "MinibatchRecord", "ModelGraph", "MtlabError", "Node", "Normalize", "NonFiniteError", "Phase",
    "PhaseError", "Schedule", "Task", "TaskState", "Trainer", "ZeroNormError", "collate", "from_recipe", "losses",
    "models", "run",
]
