"""Training history that stays on the device until someone reads it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .columns import set_column, task_column

if TYPE_CHECKING:
    import pandas as pd


class History:
    """Rows of scalars (tensors or plain numbers); tensors are read back lazily, in one batch.

    ``frame()`` gives a pandas DataFrame, one row per applied step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a UI thread may read while the training thread appends
        self._rows: list[dict[str, Any]] = []
        self._ready = 0
        self._events: list[dict[str, Any]] = []
        self.branches: list[list[dict[str, Any]]] = []  # rows abandoned by Trainer.reinitialize(), oldest first

    def append(self, row: dict[str, Any]) -> None:
        """Add one step's row (values may still be device tensors)."""
        with self._lock:
            self._rows.append(row)

    def last(self) -> dict[str, Any] | None:
        """The newest row as appended (its values may still be tensors on the device)."""
        with self._lock:
            return self._rows[-1] if self._rows else None

    def __len__(self) -> int:
        return len(self._rows)

    def _materialize(self) -> None:
        with self._lock:
            pending = self._rows[self._ready:]
            tensors = [v for row in pending for v in row.values() if isinstance(v, Tensor)]
            if tensors:
                # One transfer for every pending value (a single sync point, at read time).
                flat = torch.stack([t.detach().reshape(()).to(torch.float64) for t in tensors]).cpu().tolist()
                it = iter(flat)
                for row in pending:
                    for k, v in row.items():
                        if isinstance(v, Tensor):
                            row[k] = bool(next(it)) if k == "skipped" else next(it)
            self._ready += len(pending)

    def rows(self) -> list[dict[str, Any]]:
        """The rows so far as plain numbers (device values read back once, here)."""
        self._materialize()
        with self._lock:
            return self._rows[: self._ready]

    def frame(self) -> pd.DataFrame:
        """The history as a pandas DataFrame, one row per step."""
        import pandas as pd  # imported here: `import mtlab` stays light until a frame is asked for

        rows = self.rows()
        if not rows:
            return pd.DataFrame(columns=["step", "lr", "skipped"])
        return pd.DataFrame(rows)  # "step" is a column (not also the index)

    def abandon(self, n: int) -> None:
        """Keep the first ``n`` rows; the rows after them become an abandoned branch (``branches``)."""
        rows = self.rows()
        if len(rows) > n:
            self.branches.append([dict(r) for r in rows[n:]])
        with self._lock:
            del self._rows[n:]
            self._ready = min(self._ready, n)

    def state_dict(self) -> list[dict[str, Any]]:
        """The rows, for a checkpoint."""
        return [dict(r) for r in self.rows()]

    def load_state_dict(self, rows: list[dict[str, Any]]) -> None:
        """Replace the rows by those of a checkpoint."""
        with self._lock:
            self._rows = [dict(r) for r in rows]
            self._ready = len(self._rows)


KnobValues = tuple[float, int | None, dict[str, float]]  # a task's weight, batch size and linked-set weights


ROW_STATS = ("grad_norm", "grad_norm_clipped", "clip_fraction", "minibatches")  # per task, after its loss


def knob_values(tasks: Mapping[str, Any]) -> dict[str, KnobValues]:
    """Task -> ``(weight, batch_size, {linked set: weight})`` as read now (a ``mtlab.Task`` each): what a step's
    history row shows."""
    return {n: (t.weight, getattr(t, "batch_size", None), {s: ls.weight for s, ls in t.linkedsets.items()})
            for n, t in tasks.items()}


def step_row(step: int, lr: float, skipped: Any, knobs: Mapping[str, KnobValues], accs: Mapping[str, Any],
             stats: Mapping[str, Any] | None = None, rounds: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The history row of one applied step: lr, weights and batch sizes (``knobs``, from ``knob_values``),
    minibatch rounds per step (``rounds``), and for each task in ``accs`` (an ``Accumulator`` each) its loss,
    per-linked-set losses, gradient norms, clip fraction and minibatches;
    then the update's ``stats`` (``weighting/<task>``, ``combine/<group>/<task>``, ``cos/<model>/<a>,<b>``,
    ``direction_norm/<group>``, ``direction_norm``: 0-d tensors, read back with the rest)."""
    row: dict[str, Any] = {"step": step, "lr": lr, "skipped": skipped}
    for name, (weight, batch_size, set_weights) in knobs.items():  # plain loops: this runs once per step
        row[task_column(name, "weight")] = weight
        for s, w in set_weights.items():
            row[set_column(name, s, "weight")] = w
        if batch_size is not None:
            row[task_column(name, "batch_size")] = batch_size
        if rounds is not None:
            row[task_column(name, "minibatches_per_step")] = rounds[name]
        acc = accs.get(name)
        if acc is not None:
            totals = acc.totals  # [Σ w·loss, Σ w·normalizer]: the loss is their ratio (as acc.normalized_loss)
            row[task_column(name, "loss")] = totals[0] / totals[1]
            for s, pair in acc.set_totals.items():
                row[set_column(name, s, "loss")] = pair[0] / pair[1]
            for k in ROW_STATS:
                row[task_column(name, k)] = getattr(acc, k)
            for k, v in acc.stats.items():
                row[task_column(name, k)] = v
    if stats:
        row.update(stats)
    return row
