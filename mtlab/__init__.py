"""mtlab: notebook-first multi-task training with explicit, stepwise gradient accumulation."""

from . import data, distributed, losses, models
from .batching import collate
from .errors import (
    BatchError,
    ConfigError,
    GraphError,
    MtlabError,
    NonFiniteError,
    PhaseError,
    ZeroNormError,
)
from .graph import ModelGraph, Node
from .task import LinkedSet, Task, TaskState
from .trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "BatchError", "ConfigError", "GraphError", "LinkedSet", "ModelGraph", "MtlabError", "Node",
    "NonFiniteError", "PhaseError", "Task", "TaskState", "Trainer", "ZeroNormError", "collate", "data", "losses", "models",
]
