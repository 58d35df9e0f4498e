"""Training history that stays on the device until someone reads it."""

from __future__ import annotations

import threading
from typing import Any

import pandas as pd
import torch
from torch import Tensor


def _host(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


class History:
    """Rows of scalars (tensors or plain numbers); tensors are read back lazily, in one batch.

    ``frame()`` gives a pandas DataFrame, one row per applied step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a UI thread may read while the training thread appends
        self._rows: list[dict[str, Any]] = []
        self._ready = 0
        self._events: list[dict[str, Any]] = []

    def append(self, row: dict[str, Any]) -> None:
        with self._lock:
            self._rows.append(row)

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
        self._materialize()
        with self._lock:
            return self._rows[: self._ready]

    def frame(self) -> pd.DataFrame:
        rows = self.rows()
        if not rows:
            return pd.DataFrame(columns=["step", "lr", "skipped"])
        return pd.DataFrame(rows).set_index("step", drop=False)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` rows (used when restoring an earlier state)."""
        with self._lock:
            del self._rows[n:]
            self._ready = min(self._ready, n)

    def state_dict(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows()]

    def load_state_dict(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self._rows = [dict(r) for r in rows]
            self._ready = len(self._rows)
